"""The Slurm launcher: its commands (dry run), the run-state helper, and a 2-rank CPU run through
the launcher's own node command stopped by SIGUSR1 (as Slurm sends it ahead of the time limit) or a
SIGTERM to the launcher: it saves, exits 0, asks to be requeued, and the next start finishes the run
with one continuous metrics.jsonl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from parallax_titan.launch import child_pids
from scripts.launch.state import main as state_main
from scripts.launch.state import trim_metrics
from tests._train_runs import REPO, TEST_CONFIG, losses

SBATCH = os.path.join(REPO, "scripts", "launch", "slurm.sbatch")


def launcher_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **extra}


def test_dry_run_prints_the_cluster_commands():
    env = launcher_env(DRY_RUN="1", SLURM_JOB_ID="77", SLURM_NNODES="4", HEAD_NODE="node01",
                       CONFIG="configs/paper/1.7B/parallax_muon_wsd.toml", DUMP="/shared/runs/x")
    result = subprocess.run(["bash", SBATCH, "--training.steps", "10"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    srun = next(line for line in out.splitlines() if line.startswith("srun "))
    for part in ("--ntasks-per-node=1", "-m parallax_titan.launch", "--nnodes=4", "--nproc-per-node=8",
                 "--rdzv-backend=c10d", "--rdzv-endpoint=node01:29500", "--rdzv-id=77",
                 "train.py --job.config_file configs/paper/1.7B/parallax_muon_wsd.toml --job.dump_folder "
                 "/shared/runs/x --training.steps 10", "USR1"):
        assert part in srun, (part, srun)
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in open(SBATCH).read()  # 900 s for parallax_titan.launch's torchrun
    assert "scontrol requeue 77" in out
    assert "scripts.launch.state" in result.stderr and " prepare" in result.stderr
    header = open(SBATCH).read()
    assert "#SBATCH --signal=USR1@600" in header and "#SBATCH --requeue" in header


@pytest.mark.parametrize("name, value", [("MAX_REQUEUES", "abc"), ("NPROC", "0"), ("PORT", "70000"),
                                         ("SHUTDOWN_TIMEOUT", "15m")])
def test_bad_numbers_are_refused_before_anything_runs(name, value):
    """They reached torchrun on every node (or, MAX_REQUEUES, the test after training, where bash's
    "integer expression expected" counted as under the limit: the job requeued without one)."""
    env = launcher_env(DRY_RUN="1", SLURM_JOB_ID="77", CONFIG=TEST_CONFIG, DUMP="/shared/runs/x", **{name: value})
    result = subprocess.run(["bash", SBATCH], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{name}: '{value}'" in result.stderr and "expected a whole number" in result.stderr
    assert result.stdout == "" and "scripts.launch.state" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--job.config_file", "no_such.toml"], "job.config_file: 'no_such.toml' does not exist"),
    (["--job.config_file", TEST_CONFIG, "--checkpoint.load_step", "5"], "step 5: "),
])
def test_state_reports_a_bad_config_in_one_line(tmp_path, capsys, args, message):
    """A traceback: the first thing the job printed, on every start."""
    argv = [*args, "--job.dump_folder", str(tmp_path), "prepare"]
    assert state_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_metrics_trimmed_to_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "lo')
    assert trim_metrics(str(path), 3) == 2
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert trim_metrics(str(path), 3) == 0
    with open(path, "a") as f:  # valid JSON that is no row (it stopped the trim with an AttributeError)
        f.write("[4]\n7\n")
    assert trim_metrics(str(path), 3) == 2
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def start_local(dump, steps: int) -> subprocess.Popen:
    env = launcher_env(LOCAL="1", NPROC="2", CONFIG=TEST_CONFIG, DUMP=str(dump))
    args = ["--training.dataset", "default_corpus", "--training.steps", str(steps), "--checkpoint.interval", "1000",
            "--training.local_batch_size", "2"]
    return subprocess.Popen(["bash", SBATCH, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["usr1_to_the_step", "term_to_the_launcher"])
def test_signal_saves_exits_zero_requeues_and_resumes(tmp_path, how):
    proc = start_local(tmp_path, steps=1000)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(losses(tmp_path)) >= 2):
        time.sleep(0.5)
    (launcher,) = child_pids(proc.pid)  # python -m parallax_titan.launch
    (torchrun,) = child_pids(launcher)
    workers = child_pids(torchrun)
    assert len(workers) == 2, workers
    if how == "usr1_to_the_step":  # Slurm's --signal reaches every process of the job step
        for pid in (launcher, torchrun, *workers):
            os.kill(pid, signal.SIGUSR1)
    else:  # a preemption's SIGTERM to the node command
        os.kill(launcher, signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-4000:]
    step = max(losses(tmp_path))
    assert 2 <= step < 1000 and output.count("checkpoint saved, rerun to resume") == 2, output[-4000:]
    assert os.path.isfile(tmp_path / "checkpoint" / f"step-{step}" / ".metadata")
    assert "requeuing" in output

    rerun = start_local(tmp_path, steps=step + 2)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0 and "training finished" in output, output[-4000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()
             if "loss_metrics/global_avg_loss" in line]
    assert steps == list(range(1, step + 3))
