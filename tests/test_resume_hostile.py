"""A researcher who changes things between runs: a checkpoint folder in which a run went back to an
earlier step (``checkpoint.load_step``) and ``checkpoint.keep_latest_k`` purges, a checkpoint folder
left without a complete step next to ``checkpoint.initial_load_path``, and a resume with another
dataset. In this process: managers of a 4x4 linear layer in a one-process gloo group, and the
config check on checkpoints laid out as the trainer writes them."""

from __future__ import annotations

import contextlib
import logging
import os

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
from tests._train_runs import train
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
