"""``leave_process_group``: no rank leaves before every rank has destroyed its groups, a missing
rank holds the others only as long as asked, and two gloo ranks exit cleanly run after run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from parallax_titan.teardown import leave_process_group
from tests._train_runs import REPO


DRIVER_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}


def driver_command(mode: str, out_dir) -> list[str]:
    """torchrun of ``tests/_teardown_driver.py`` on two ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "tests/_teardown_driver.py", mode, str(out_dir)]


def run_driver(mode: str, out_dir) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    """The driver's exit and, per rank that left, its times."""
    result = subprocess.run(driver_command(mode, out_dir), cwd=REPO, capture_output=True, text=True, timeout=120,
                            env=DRIVER_ENV)
    by_rank = {}
    for rank in (0, 1):
        path = os.path.join(out_dir, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                by_rank[rank] = json.load(f)
            os.remove(path)
    return result, by_rank


def test_without_a_process_group_it_does_nothing():
    assert not dist.is_initialized()
    leave_process_group(wait_s=0.1)
    assert not dist.is_initialized()


def test_the_first_rank_to_leave_waits_for_the_last(tmp_path):
    result, by_rank = run_driver("late", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert by_rank[0]["returned"] >= by_rank[1]["entered"], by_rank


def test_a_rank_that_never_leaves_holds_the_others_only_for_the_wait(tmp_path):
    result, by_rank = run_driver("absent", tmp_path)
    assert set(by_rank) == {0}, result.stdout[-2000:] + result.stderr[-3000:]
    assert 0.4 <= by_rank[0]["returned"] - by_rank[0]["entered"] < 2.5, by_rank
    assert "not every rank of 2 left the process group within 0.5 s" in result.stderr


@pytest.mark.slow
def test_two_gloo_ranks_exit_cleanly_run_after_run():
    # Without the wait, 1 to 3 of 20 such exits (two at a time) died with SIGABRT in C++ teardown
    # ("terminate called without an active exception", torch 2.13): this test then fails 5 times in 6.
    for attempt in range(6):
        runs = [subprocess.Popen(driver_command("titan", "unused"), cwd=REPO, env=DRIVER_ENV, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for run in runs:
            _, stderr = run.communicate(timeout=120)
            assert run.returncode == 0, f"attempt {attempt}: " + stderr[-3000:]
