"""Interruptions lose nothing: a run stopped at step k (by config or SIGTERM) and rerun
reproduces the uninterrupted run's losses exactly; incomplete checkpoints are never loaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from parallax_titan.launch import child_pids
from tests._train_runs import REPO, TEST_CONFIG, losses, train

ARGS = [
    "--training.dataset", "default_corpus", "--training.steps", "6", "--checkpoint.interval", "100",
    "--optimizer.name", "Muon", "--lr_scheduler.decay_ratio", "0.5",
]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    dump = tmp_path_factory.mktemp("straight")
    train(dump, *ARGS)
    return losses(dump)


def test_stop_and_resume_is_exact(tmp_path, straight):
    train(tmp_path, *ARGS, "--reliability.stop_at_step", "3")
    assert os.path.isfile(tmp_path / "checkpoint" / "step-3" / ".metadata")
    assert sorted(losses(tmp_path)) == [1, 2, 3]
    # An interrupted write (no .metadata) must be ignored by the loader.
    (tmp_path / "checkpoint" / "step-5").mkdir()
    (tmp_path / "checkpoint" / "step-5" / "__0_0.distcp").write_bytes(b"partial")
    result = train(tmp_path, *ARGS, "--reliability.stop_at_step", "3")
    assert "Training starts at step 4" in result.stdout + result.stderr
    assert losses(tmp_path) == straight  # bit-exact: same data order, schedules, optimizer state


@pytest.mark.slow  # torchrun jobs, about a minute together; CI runs them with -m slow
def test_loader_process_trains_the_same_and_resumes_exactly(tmp_path, straight):
    """The GPU configs' ``[training.dataloader] num_workers = 1``: same losses as loading in the
    training process, and a stop/resume through the worker's checkpointed state is exact."""
    worker = ("--training.dataloader.num_workers", "1", "--training.dataloader.prefetch_factor", "2")
    train(tmp_path, *ARGS, *worker, "--reliability.stop_at_step", "2")
    train(tmp_path, *ARGS, *worker)
    assert losses(tmp_path) == straight


def test_sigterm_saves_and_exits_cleanly(tmp_path, straight):
    env = {**os.environ, "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29517", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "train.py", "--job.config_file", TEST_CONFIG, "--job.dump_folder", str(tmp_path),
           *ARGS, "--training.steps", "1000"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    step = max(losses(tmp_path))
    assert 2 <= step < 1000 and "SIGTERM" in output
    assert os.path.isfile(tmp_path / "checkpoint" / f"step-{step}" / ".metadata")


@pytest.mark.slow
@pytest.mark.parametrize("nonfinite", ["skip", "off"])  # the flags read by the guard, or a step later
def test_sigterm_to_one_rank_stops_every_rank_at_one_step(tmp_path, nonfinite):
    """Only one of two workers gets the signal; both agree (the step flags' all-reduce), save one
    checkpoint and exit 0."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           "--job.config_file", TEST_CONFIG, "--job.dump_folder", str(tmp_path), *ARGS, "--training.steps", "1000",
           "--reliability.nonfinite", nonfinite]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.5)
    workers = child_pids(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    step = max(losses(tmp_path))
    assert 2 <= step < 1000 and output.count("(SIGTERM); checkpoint saved") == 2
    assert os.path.isfile(tmp_path / "checkpoint" / f"step-{step}" / ".metadata")
