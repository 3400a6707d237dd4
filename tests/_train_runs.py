"""Run ``train.py`` under torchrun from tests, and read what a run wrote (test helper)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_CONFIG = "configs/test_cpu_2rank.toml"


def run_train(dump, *args: str, nproc: int = 1, config: str = TEST_CONFIG, **popen) -> subprocess.CompletedProcess:
    """``torchrun --standalone train.py --job.config_file config --job.dump_folder dump *args``, whatever
    its exit code (standalone: a free port, so runs of tests in parallel do not meet on one);
    ``popen``: more arguments of ``subprocess.run`` (e.g. ``preexec_fn``). The console shows rank 0;
    every rank's output is also kept under ``<dump>.ranks`` (see :func:`other_ranks_stderr`)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--local-ranks-filter=0", "--tee=3", f"--log-dir={dump}.ranks",
           "train.py", "--job.config_file", config, "--job.dump_folder", str(dump), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env, **popen)


def run_single(dump, *args: str, config: str = TEST_CONFIG, **popen) -> subprocess.CompletedProcess:
    """``python train.py ...`` as one process without torchrun (so its exit code is train.py's own)."""
    cmd = [sys.executable, "train.py", "--job.config_file", config, "--job.dump_folder", str(dump), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**env, "OMP_NUM_THREADS": "1"}, **popen)


def train(dump, *args: str, nproc: int = 1, config: str = TEST_CONFIG) -> subprocess.CompletedProcess:
    """:func:`run_train`, asserting success (the message ends with the other ranks' stderr)."""
    result = run_train(dump, *args, nproc=nproc, config=config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:] + other_ranks_stderr(dump)
    return result


def other_ranks_stderr(dump) -> str:
    """The end of the stderr of each rank but 0 (the console's) from the last :func:`run_train` into
    ``dump``."""
    jobs = glob.glob(os.path.join(f"{dump}.ranks", "*"))  # one folder per run
    if not jobs:
        return ""
    paths = sorted(glob.glob(os.path.join(max(jobs, key=os.path.getmtime), "attempt_*", "*", "stderr.log")))
    texts = []
    for path in paths:
        rank = os.path.basename(os.path.dirname(path))
        if rank != "0":
            with open(path, errors="replace") as f:
                texts.append(f"\n--- rank {rank} stderr ---\n" + f.read()[-3000:])
    return "".join(texts)


def metric_rows(dump) -> list[dict]:
    """Every line of ``<dump>/metrics.jsonl``."""
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def losses(dump) -> dict[int, float]:
    """Training loss per logged step."""
    key = "loss_metrics/global_avg_loss"
    return {r["step"]: r[key] for r in metric_rows(dump) if key in r}
