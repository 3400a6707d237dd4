"""Checkpoints are complete or absent, checked before a load, and a failed save loses nothing.

One 4-step run (checkpoints at steps 2 and 4) is copied for each case; each case damages or
constrains the copy and reruns ``train.py`` as one process (so its exit code is train.py's)."""

from __future__ import annotations

import os
import resource
import shutil

import pytest
import torch

from parallax_titan.checkpoint_files import complete_steps
from parallax_titan.checksums import MANIFEST_FILE, content_problems, read_manifest
from tests._train_runs import losses, run_single, train

ARGS = ["--training.dataset", "default_corpus", "--training.steps", "4", "--checkpoint.interval", "2"]
DATA_FILE = "__0_0.distcp"  # the one DCP data file of a one-rank save


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    dump = tmp_path_factory.mktemp("saved")
    train(dump, *ARGS)
    return dump


@pytest.fixture
def dump(saved, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(saved, copy)
    return copy


def checkpoint(dump, step: int):
    return dump / "checkpoint" / f"step-{step}"


def output(result) -> str:
    return result.stdout + result.stderr


def flip(path, offset: int, n: int = 1024) -> None:
    """Invert ``n`` bytes of ``path`` from ``offset`` (every one of them changes)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        block = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in block))


def test_every_checkpoint_has_a_manifest_that_matches(saved):
    folder = str(saved / "checkpoint")
    assert complete_steps(folder) == [2, 4]
    assert sorted(os.listdir(folder)) == ["step-2", "step-4"]  # no partial folder left
    for step in (2, 4):
        path = str(checkpoint(saved, step))
        manifest = read_manifest(path)
        assert set(manifest.files) == {".metadata", "settings.json", DATA_FILE}
        assert content_problems(path, manifest) == []


def test_overwritten_kilobyte_falls_back_to_the_previous_checkpoint(dump, saved):
    """1 KB inside a .distcp payload: the warning names the file, the run replays from step 2 with
    the original losses, and keep_latest_k counts complete checkpoints only (never the stray
    incomplete step-7, step-8 folders, which TorchTitan's purge would keep instead of step 4)."""
    flip(checkpoint(dump, 4) / DATA_FILE, 1 << 20)
    for stray in (7, 8):
        checkpoint(dump, stray).mkdir()
    result = run_single(dump, *ARGS, "--checkpoint.keep_latest_k", "2")
    assert result.returncode == 0, output(result)[-4000:]
    log = output(result)
    assert "checkpoint step-4 is not valid:" in log and f"step-4/{DATA_FILE}: bytes 0-" in log, log[-4000:]
    assert "checkpoint.on_corrupt = 'fallback': loading step-2 instead" in log
    assert f"step-4 is moved to '{dump / 'checkpoint' / 'corrupt-4'}'" in log
    assert "Training starts at step 3" in log
    assert losses(dump) == losses(saved)  # steps 3 and 4 replayed exactly (the rows of both runs are compared)
    folder = dump / "checkpoint"
    assert (folder / "corrupt-4" / DATA_FILE).is_file()
    assert complete_steps(str(folder)) == [2, 4] and checkpoint(dump, 7).is_dir() and checkpoint(dump, 8).is_dir()
    assert content_problems(str(checkpoint(dump, 4)), read_manifest(str(checkpoint(dump, 4)))) == []


def test_truncated_file_with_stop_policy_exits_naming_the_file(dump):
    data = checkpoint(dump, 4) / DATA_FILE
    size = data.stat().st_size
    os.truncate(data, size // 2)
    result = run_single(dump, *ARGS, "--training.steps", "6", "--checkpoint.on_corrupt", "stop")
    assert result.returncode == 4, output(result)[-4000:]
    assert f"{data}: {size // 2} bytes, {MANIFEST_FILE} lists {size} (truncated)" in result.stderr
    assert "checkpoint.on_corrupt = 'stop'" in result.stderr and "Traceback" not in result.stderr
    assert "Training starts" not in output(result)


def test_truncated_file_without_checksums_names_the_step_folder(dump):
    """checkpoint.verify = false: DCP's own EOFError becomes an error naming the checkpoint."""
    os.truncate(checkpoint(dump, 4) / DATA_FILE, 1000)
    result = run_single(dump, *ARGS, "--training.steps", "6", "--checkpoint.no-verify")
    assert result.returncode == 4, output(result)[-4000:]
    assert f"loading checkpoint '{checkpoint(dump, 4)}' failed (" in result.stderr
    assert "Traceback" not in result.stderr


def test_corrupt_initial_load_path_stops_naming_the_file(saved, tmp_path):
    """A folder given as checkpoint.initial_load_path is checked against its manifest like a resume
    step (no fallback): exit code 4, naming the key, the file and the off switch."""
    seed = tmp_path / "seed"
    shutil.copytree(checkpoint(saved, 2), seed)
    flip(seed / DATA_FILE, 1 << 20)
    result = run_single(tmp_path / "run", *ARGS, "--checkpoint.initial_load_path", str(seed))
    assert result.returncode == 4, output(result)[-4000:]
    assert (f"error: checkpoint.initial_load_path: '{seed}' is not a valid checkpoint: {seed / DATA_FILE}: bytes 0-"
            in result.stderr) and "(checkpoint.verify = false loads it unchecked)" in result.stderr
    assert "Training starts" not in output(result)


def _small_file_limit():
    """In the child: files may not grow beyond 4 MiB (a full disk for the 38 MB checkpoint file);
    Python ignores SIGXFSZ, so the write fails (EFBIG, which torch's file writer reports as a short
    write, as it does ENOSPC)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, resource.RLIM_INFINITY))


def test_failed_save_says_what_failed_and_keeps_the_previous_checkpoint(dump):
    result = run_single(dump, *ARGS, "--training.steps", "6", preexec_fn=_small_file_limit)
    assert result.returncode == 4, output(result)[-4000:]
    assert f"saving checkpoint step 6 to '{checkpoint(dump, 6)}' failed (" in result.stderr
    assert "a file could not be written in full" in result.stderr and "GiB free there" in result.stderr
    assert "the newest complete checkpoint is step-4" in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(dump / "checkpoint")) == ["step-2", "step-4"]  # nothing partial left behind
    rerun = run_single(dump, *ARGS, "--training.steps", "6")
    assert rerun.returncode == 0 and "Training starts at step 5" in output(rerun)


def test_unwritable_dump_folder_is_refused_before_the_build(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    result = run_single(tmp_path / "file" / "dump", *ARGS)
    assert result.returncode == 2
    assert f"job.dump_folder: '{tmp_path / 'file' / 'dump'}' is not writable (NotADirectoryError" in result.stderr


@pytest.mark.slow
def test_two_ranks_agree_on_a_corrupt_file_and_fall_back_together(tmp_path):
    """Each rank hashes half of the files; the damage to rank 1's file (checked by rank 0) sends both
    ranks back to step 2, and both finish the run."""
    two = [*ARGS, "--parallelism.data_parallel_shard_degree", "2"]
    train(tmp_path, *two, nproc=2)
    data = checkpoint(tmp_path, 4) / "__1_0.distcp"
    flip(data, 4096)
    result = train(tmp_path, *two, nproc=2)
    log = output(result)
    assert f"{data}: bytes 0-" in log and "loading step-2 instead" in log and "Training starts at step 3" in log
    assert complete_steps(str(tmp_path / "checkpoint")) == [2, 4]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_state_round_trips_through_a_checksummed_save(tmp_path):
    """On CUDA, DCP stages tensors through its overlapping CPU loader: the files it writes are the
    ones hashed, the manifest matches them, and a load brings back the saved weights exactly."""
    from scripts.bench.checkpoint import build_state, manager

    model, optimizers, schedulers = build_state("configs/test_cpu_2rank.toml", "cuda")
    mgr = manager("checksums", "configs/test_cpu_2rank.toml", str(tmp_path), model, optimizers, schedulers)
    mgr.save(curr_step=1, last_step=True)
    path = str(checkpoint(tmp_path, 1))
    manifest = read_manifest(path)
    assert DATA_FILE in manifest.files and content_problems(path, manifest) == []
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert mgr.load(step=1)
    assert all(torch.equal(a, b) for a, b in zip(saved, model.parameters()))
    mgr.close()
