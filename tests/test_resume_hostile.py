"""A researcher who changes things between runs: a checkpoint folder in which a run went back to an
earlier step (``checkpoint.load_step``) and ``checkpoint.keep_latest_k`` purges, a checkpoint folder
left without a complete step next to ``checkpoint.initial_load_path``, a resume with another
dataset (refused, or trained from its first document with the data loader's state excluded from
loading), and a data position the run cannot continue (another data order or number of ranks) or
whose newest step is truncated. In this process: managers of a 4x4 linear layer in a one-process
gloo group, and the config check on checkpoints laid out as the trainer writes them; through
train.py (or :mod:`tests._resume_batch_driver`): resumes of a tiny run's checkpoints."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from parallax_titan.checkpoint_files import CheckpointError, complete_steps, folder_problem, step_dir
from parallax_titan.checkpointing import ParallaxCheckpointManager
from parallax_titan.checksums import MANIFEST_FILE, default_algorithm, digest_files, write_manifest
from parallax_titan.config.sections import Checkpoint
from parallax_titan.resume import checkpoint_problems
from parallax_titan.resume_rules import applied, differences, refusals, run_settings, write_settings
from scripts.bench.checkpoint import StepCounter
from tests._train_runs import REPO, TEST_CONFIG, losses, run_single, train
from tests.test_checkpoint_integrity import DATA_FILE, flip
from tests.test_checkpoint_mismatch import job, save_checkpoint


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    managers: list[ParallaxCheckpointManager] = []
    yield managers
    for mgr in managers:
        with contextlib.suppress(CheckpointError):
            mgr.close()
    dist.destroy_process_group()


def manager(managers: list, dump, seed: int = 0, async_mode: str = "disabled", **config) -> ParallaxCheckpointManager:
    """A manager of ``dump``/checkpoint saving a 4x4 linear layer initialised from ``seed``."""
    torch.manual_seed(seed)
    mgr = ParallaxCheckpointManager(
        dataloader=StepCounter(), model_parts=[torch.nn.Linear(4, 4)], optimizers=StepCounter(),
        lr_schedulers=StepCounter(), states={"train_state": StepCounter()},
        checkpoint_config=Checkpoint(enable=True, interval=1, async_mode=async_mode, **config),
        sd_adapter=None, base_folder=str(dump))
    mgr.settings = {"optimizer.lr": 0.01}
    managers.append(mgr)
    return mgr


def output(result) -> str:
    return result.stdout + result.stderr


def weight(mgr: ParallaxCheckpointManager) -> torch.Tensor:
    return mgr.states["model"].model[0].weight.detach().clone()


# ---- keep_latest_k after going back to an earlier step --------------------------------------------

@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_keep_latest_k_never_deletes_the_step_just_saved(group, tmp_path, async_mode):
    """Steps 2-8 saved; the run goes back to step 2 (``checkpoint.load_step = 2``, say with a lower lr)
    and saves step 4. Steps 6 and 8 of the earlier run were counted as newer: keep_latest_k = 2 deleted
    the step just saved while the stop said "checkpoint saved, rerun to resume"."""
    first = manager(group, tmp_path, keep_latest_k=0)
    for step in (2, 4, 6, 8):
        first.save(curr_step=step)
    folder = str(tmp_path / "checkpoint")
    again = manager(group, tmp_path, seed=1, async_mode=async_mode, keep_latest_k=2)
    assert again.load(step=2)
    again.save(curr_step=4)
    again._async_wait()
    assert complete_steps(folder) == [2, 4, 6, 8]
    assert folder_problem(step_dir(folder, 4)) is None
    assert "superseded-4" in os.listdir(folder)  # the earlier run's step 4
    again.save(curr_step=6)
    again._async_wait()
    assert complete_steps(folder) == [4, 6, 8]  # two up to the step saved; step 8 is the earlier run's


def test_load_of_an_earlier_step_names_the_newer_ones(group, tmp_path, caplog):
    first = manager(group, tmp_path, keep_latest_k=0)
    for step in (2, 4, 6):
        first.save(curr_step=step)
    with caplog.at_level(logging.WARNING):
        assert manager(group, tmp_path, seed=1).load(step=2)
    assert (f"checkpoint.load_step = 2: '{tmp_path / 'checkpoint'}' holds newer steps of a run before this one "
            "(step-4, step-6); this run replaces each when it saves that step, and until then a rerun without "
            "checkpoint.load_step resumes step-6") in caplog.text


def test_the_step_a_fallback_chose_is_checked_before_any_of_it_is_read(group, tmp_path):
    """Steps 2 and 4 saved, step 4's tensor file damaged past what the check before the build reads:
    the load falls back to step 2, and ``check_step`` sees step 2 before its weights are read."""
    first = manager(group, tmp_path)
    for step in (2, 4):
        first.save(curr_step=step)
    flip(tmp_path / "checkpoint" / "step-4" / DATA_FILE, 64)
    rerun, checked = manager(group, tmp_path, seed=1), []
    before = weight(rerun)

    def refuse(step):
        checked.append(step)
        raise ValueError(f"step-{step} refused")

    rerun.check_step = refuse
    with pytest.raises(ValueError, match="step-2 refused"):
        rerun.load()
    assert checked == [2] and torch.equal(weight(rerun), before)


# ---- checkpoint.initial_load_path beside a checkpoint folder without a complete step ---------------

@pytest.mark.parametrize("left", [[], [".partial-3"], ["corrupt-2", "notes"]])
def test_initial_load_path_loads_where_the_folder_has_no_complete_step(group, tmp_path, left):
    """A killed first save leaves ``checkpoint/.partial-N``, a failed one an empty ``checkpoint``: the
    rerun trained from random weights, without a word about ``checkpoint.initial_load_path``."""
    seed = manager(group, tmp_path / "seed", seed=7)
    seed.save(curr_step=0)
    for name in left:
        os.makedirs(tmp_path / "run" / "checkpoint" / name)
    run = manager(group, tmp_path / "run", seed=1, initial_load_path=str(tmp_path / "seed" / "checkpoint" / "step-0"))
    assert not torch.equal(weight(run), weight(seed))
    assert run.load()
    assert torch.equal(weight(run), weight(seed))


def test_initial_load_path_is_checked_where_the_folder_has_no_complete_step(tmp_path):
    bigger = save_checkpoint(tmp_path / "init4", "parallax", n_layers=4)
    (tmp_path / "checkpoint" / ".partial-5").mkdir(parents=True)
    problems = checkpoint_problems(job(tmp_path, "--checkpoint.initial_load_path", bigger))
    assert any(p.startswith(f"checkpoint.initial_load_path: {bigger!r} is from another model") for p in problems)


# ---- another dataset on resume ------------------------------------------------------------------

def stopped_at(dump, step: int, *overrides: str) -> str:
    """``dump``/checkpoint/step-``step`` as the trainer writes it, with the settings of ``overrides``."""
    path = save_checkpoint(dump / "checkpoint" / f"step-{step}", "parallax", n_layers=2)
    write_settings(path, step, run_settings(job(dump, *overrides), 1))
    algorithm = default_algorithm()
    write_manifest(path, digest_files(path, sorted(set(os.listdir(path)) - {MANIFEST_FILE}), 1, algorithm), algorithm)
    return path


@pytest.mark.parametrize("dataset", ["default_corpus_validation", "local"])
def test_another_dataset_is_refused_on_resume(tmp_path, dataset):
    """The data loader's saved position (documents read, token buffer) is the old dataset's: the run
    went on at that offset of the other dataset, or failed in TorchTitan's loader with an AssertionError."""
    path = stopped_at(tmp_path, 3)
    data = tmp_path / "docs.jsonl"
    data.write_text('{"content": "a document"}\n')
    other = ["--training.dataset", dataset] + (["--training.dataset_path", str(data)] if dataset == "local" else [])
    problems = checkpoint_problems(job(tmp_path, *other))
    assert any(p.startswith(f"training.dataset: the checkpoint {path!r} was trained with 'default_corpus' and this "
                            f"run sets {dataset!r}; refused on resume") for p in problems), problems


def local_files(folder, *sizes: int):
    """``folder``/part-<i>.jsonl, one document each of about ``sizes[i]`` characters."""
    folder.mkdir(exist_ok=True)
    for i, size in enumerate(sizes):
        (folder / f"part-{i}.jsonl").write_text(json.dumps({"content": "x" * size}) + "\n")
    return ["--training.dataset", "local", "--training.dataset_path", str(folder)]


@pytest.mark.parametrize("change", ["added", "removed", "resized"])
def test_other_files_under_the_dataset_path_are_refused_on_resume(tmp_path, change):
    """The text loader's saved position is an index into the sorted file list: a file added under the
    folder (a requeued job after more data was downloaded) made the run go on from that index into
    another list, repeating or skipping documents, without a word."""
    data = tmp_path / "data"
    path = stopped_at(tmp_path, 3, *local_files(data, 10, 20))
    if change == "added":
        local_files(data, 10, 20, 30)
    elif change == "removed":
        (data / "part-0.jsonl").unlink()
    else:
        local_files(data, 10, 25)
    same_path = ["--training.dataset", "local", "--training.dataset_path", str(data)]
    problems = checkpoint_problems(job(tmp_path, *same_path))
    assert any(p.startswith(f"training.dataset_files: the checkpoint {path!r} was trained with '2 files, ")
               and "resume with the files the checkpoint's run read (training.dataset_path), set "
                   "checkpoint.exclude_from_loading = ['dataloader']" in p for p in problems), problems
    assert checkpoint_problems(job(tmp_path, *same_path, "--checkpoint.exclude_from_loading", "dataloader")) == []


def test_the_same_files_moved_elsewhere_resume(tmp_path):
    """Only training.dataset_path changes (applied and logged): the files, their relative paths and sizes
    are the same."""
    stopped_at(tmp_path, 3, *local_files(tmp_path / "data", 10, 20))
    moved = local_files(tmp_path / "elsewhere", 10, 20)
    assert checkpoint_problems(job(tmp_path, *moved)) == []


def test_another_dataset_path_is_logged_on_resume(tmp_path):
    """Files moved or replaced under the same dataset: applied, and said."""
    saved = run_settings(job(tmp_path, "--training.dataset", "local", "--training.dataset_path", "a.jsonl"), 1)
    current = run_settings(job(tmp_path, "--training.dataset", "local", "--training.dataset_path", "b.jsonl"), 1)
    changes = differences(saved, current)
    assert refusals(changes, "ck/step-3", 3, current) == []
    assert applied(changes, 3, current) == ["training.dataset_path: 'a.jsonl' -> 'b.jsonl' from step 4"]


# ---- through train.py: going back to an earlier step ---------------------------------------------

BACK = ["--training.dataset", "default_corpus", "--training.steps", "6", "--checkpoint.interval", "2"]


@pytest.mark.slow  # two train.py runs, about 25 s
def test_going_back_to_an_earlier_step_keeps_what_the_run_saves(tmp_path):
    """Steps 2 and 4 saved, then a rerun from step 2 with another lr, stopped after step 3. The load
    names step 4 as newer, the stop says to drop checkpoint.load_step (a rerun with it, such as a
    requeued job's, would load step 2 again, forever), and keep_latest_k = 2 deletes neither step 3
    nor the earlier run's step 4."""
    train(tmp_path, *BACK, "--reliability.stop_at_step", "4")
    log = output(train(tmp_path, *BACK, "--checkpoint.load_step", "2", "--checkpoint.keep_latest_k", "2",
                       "--optimizer.lr", "1e-3", "--reliability.stop_at_step", "3"))
    folder = tmp_path / "checkpoint"
    assert f"checkpoint.load_step = 2: '{folder}' holds newer steps of a run before this one (step-4)" in log
    assert ("Stopping after step 3 (reliability.stop_at_step = 3); checkpoint saved; rerun without "
            "checkpoint.load_step = 2 to resume from it (with that key a rerun loads step-2 again)") in log
    assert complete_steps(str(folder)) == [2, 3, 4]


# ---- the data position on resume, checked before the build --------------------------------------

# 1 rank accumulating 2 microbatches of 2 sequences: the same global batch as 2 ranks of 2
DATA = ["--training.dataset", "default_corpus", "--training.global_batch_size", "4"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of 2 steps in the sharded text order with a checkpoint after each (step-1, step-2)."""
    dump = tmp_path_factory.mktemp("trained")
    train(dump, *DATA, "--training.steps", "2", "--checkpoint.interval", "1")
    return dump


@pytest.fixture
def resumed(trained, tmp_path):
    """A copy of :func:`trained`'s dump folder, to resume or change."""
    return shutil.copytree(trained, tmp_path / "run")


def test_another_data_order_is_refused_before_the_build(resumed):
    """The data position's check ran while the data loader was built: a traceback and exit code 1."""
    result = run_single(resumed, *DATA, "--training.steps", "3", "--training.data_order", "global")
    assert result.returncode == 2, output(result)[-3000:]
    assert (f"checkpoint.folder: {str(resumed / 'checkpoint' / 'step-2')!r}: cannot resume the data position: the "
            "checkpoint's data-loader state (dp_rank_0, world_size) was not written with training.data_order = "
            "'global'") in output(result)
    assert "Traceback" not in output(result)


def test_another_number_of_ranks_in_the_sharded_order_is_refused_by_the_config_check(resumed, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    problems = checkpoint_problems(job(resumed, *DATA))
    assert any("cannot resume the data position: the checkpoint holds the data positions of 1 data-parallel ranks "
               "in training.data_order = 'sharded'" in p for p in problems), problems


def test_a_truncated_newest_step_falls_back_to_the_older_one(resumed):
    """A truncated .metadata in the newest step: checkpoint.on_corrupt = 'fallback' chooses step-1 before
    the build, and the data position's check reads step-1's, not the truncated one."""
    metadata = resumed / "checkpoint" / "step-2" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:40])
    result = run_single(resumed, *DATA, "--training.steps", "3")
    assert result.returncode == 0, output(result)[-3000:]
    assert "checkpoint.on_corrupt = 'fallback': loading step-1 instead" in output(result)
    assert sorted(losses(resumed)) == [1, 2, 3]


def test_a_fallback_to_a_data_position_of_another_order_is_refused_before_it_is_loaded(resumed):
    """Step 3 was written in the global order by a run that did not load step 2's sharded position;
    step 3's tensor file then fails its checksum (the check before the build reads sizes only). The
    load fell back to step 2 and died inside DCP with "Missing key ... dataloader.global_order", named
    as a damaged file; now step 2 gets the checks step 3 had, and the run stops naming the data order."""
    order = ["--training.data_order", "global", "--checkpoint.interval", "1"]
    result = run_single(resumed, *DATA, *order, "--training.steps", "3", "--checkpoint.exclude_from_loading",
                        "dataloader")
    assert result.returncode == 0, output(result)[-3000:]
    flip(resumed / "checkpoint" / "step-3" / DATA_FILE, 1 << 16)
    result = run_single(resumed, *DATA, *order, "--training.steps", "4")
    assert result.returncode == 2, output(result)[-3000:]
    assert "checkpoint.on_corrupt = 'fallback': loading step-2 instead" in output(result)
    assert (f"checkpoint.folder: {str(resumed / 'checkpoint' / 'step-2')!r}: cannot resume the data position: the "
            "checkpoint's data-loader state (dp_rank_0, world_size) was not written with training.data_order = "
            "'global'") in output(result)
    assert "Training starts" not in output(result) and "Traceback" not in output(result)


# ---- another dataset with the data loader's state not loaded --------------------------------------

NEW_DATA = ["--training.dataset", "default_corpus_validation", "--checkpoint.exclude_from_loading", "dataloader"]


def test_another_dataset_with_the_data_position_excluded_is_accepted(resumed):
    path = str(resumed / "checkpoint" / "step-2")
    refused = checkpoint_problems(job(resumed, *DATA, "--training.dataset", "default_corpus_validation"))
    way_out = "set checkpoint.exclude_from_loading = ['dataloader'] to start the new dataset at its first document"
    assert any(p.startswith(f"training.dataset: the checkpoint {path!r} was trained with 'default_corpus'")
               and way_out in p for p in refused), refused
    assert checkpoint_problems(job(resumed, *DATA, *NEW_DATA)) == []
    # the data order of the position not loaded does not matter either
    assert checkpoint_problems(job(resumed, *DATA, *NEW_DATA, "--training.data_order", "global")) == []


def test_another_local_batch_with_the_data_position_excluded_is_accepted(resumed):
    """The local batch's one reason to be refused is the sharded loader's saved position (it counts this
    rank's sequences): a run that does not load the position may change it (the global batch stays)."""
    local = ["--training.local_batch_size", "4"]  # the checkpoint's is 2, accumulated twice to the global 4
    refused = checkpoint_problems(job(resumed, *DATA, *local))
    assert any(p.startswith("training.local_batch_size: the checkpoint") and "exclude_from_loading" in p
               for p in refused), refused
    assert checkpoint_problems(job(resumed, *DATA, *local, "--checkpoint.exclude_from_loading", "dataloader")) == []


def test_another_dataset_with_the_data_position_excluded_trains_from_its_first_document(resumed):
    """The model and optimizer state load, the new dataset starts at its first batch, and the change is logged."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [sys.executable, "tests/_resume_batch_driver.py", "--job.config_file", TEST_CONFIG, "--job.dump_folder",
           str(resumed), *DATA, *NEW_DATA, "--training.steps", "3"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"step"')))
    assert report == {"step": 2, "model_loaded": True, "optimizer_loaded": True, "first_batch_is_fresh": True}
    assert "Resume: training.dataset: 'default_corpus' -> 'default_corpus_validation' from step 3" in output(result)
