"""Launching: ``python train.py`` as one process, and the launcher's SIGTERM and shutdown timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from parallax_titan import launch
from parallax_titan.checksums import content_problems, read_manifest
from parallax_titan.launch import SHUTDOWN_TIMEOUT_ENV, SHUTDOWN_TIMEOUT_S, child_pids
from tests._train_runs import REPO, TEST_CONFIG, losses, metric_rows, run_single

ARGS = ["--training.dataset", "default_corpus", "--checkpoint.interval", "100"]


def test_train_py_runs_as_one_process_without_tensorboard(tmp_path):
    """No torchrun variables (``configs/demo_cpu.toml``'s header runs ``python train.py``) and
    ``--metrics.no-enable_tensorboard``: trains, logs metrics.jsonl, writes no TensorBoard folder."""
    result = run_single(tmp_path, *ARGS, "--training.steps", "2", "--metrics.no-enable_tensorboard")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(losses(tmp_path)) == [1, 2]
    assert not (tmp_path / "tb").exists()


def test_child_pids_lists_direct_children_only():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in child_pids(os.getpid())
        assert child_pids(child.pid) == []
    finally:
        child.kill()
        child.wait()


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def test_sigterm_to_the_launcher_saves_and_exits_0_without_a_traceback(tmp_path):
    cmd = [sys.executable, "-m", "parallax_titan.launch", "--standalone", "--nproc_per_node=1", "train.py",
           "--job.config_file", TEST_CONFIG, "--job.dump_folder", str(tmp_path), *ARGS, "--training.steps", "1000"]
    env = {k: v for k, v in os.environ.items() if k != SHUTDOWN_TIMEOUT_ENV}
    launcher = subprocess.Popen(cmd, cwd=REPO, env={**env, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metric_rows(tmp_path)) >= 2):
        time.sleep(0.5)
    (torchrun,) = child_pids(launcher.pid)
    assert _environ(torchrun)[SHUTDOWN_TIMEOUT_ENV] == str(SHUTDOWN_TIMEOUT_S)
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output[-3000:]
    assert "Traceback" not in output and "(SIGTERM); checkpoint saved" in output
    step = max(losses(tmp_path))
    assert 1 <= step < 1000
    path = str(tmp_path / "checkpoint" / f"step-{step}")
    assert content_problems(path, read_manifest(path)) == []


@pytest.mark.parametrize("value", ["abc", "12.5", "-1", "15m", ""])
def test_bad_shutdown_timeout_is_refused_before_torchrun_starts(monkeypatch, capsys, value):
    """torchrun failed on a non-integer with a traceback on every node, and took a negative timeout
    as none: the workers were killed at once, without their checkpoint."""
    monkeypatch.setenv(SHUTDOWN_TIMEOUT_ENV, value)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun started"))
    assert launch.main(["--standalone", "--nproc_per_node=1", "train.py"]) == 2
    err = capsys.readouterr().err
    assert f"{SHUTDOWN_TIMEOUT_ENV}: {value!r} is not a whole number of seconds" in err


@pytest.fixture
def no_torchrun(monkeypatch):
    """``launch.main`` must return before it starts torchrun (and before it installs signal handlers)."""
    monkeypatch.delenv(SHUTDOWN_TIMEOUT_ENV, raising=False)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun started"))


TRAIN_PY = os.path.join(REPO, "train.py")


@pytest.mark.parametrize("value", ["0", "-1", "abc", "2.5", ""])
def test_bad_nproc_per_node_is_refused_before_torchrun_starts(no_torchrun, capsys, value):
    """torchrun failed on these with a traceback on every node; on 0 or less, with a bare AssertionError."""
    assert launch.main(["--standalone", f"--nproc_per_node={value}", TRAIN_PY]) == 2
    err = capsys.readouterr().err
    assert f"parallax_titan.launch: error: --nproc_per_node: {value!r} " in err
    assert "expected a whole number >= 1, or auto, cpu, gpu or xpu" in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_nproc_per_node_gpu_without_cuda_is_refused(no_torchrun, capsys):
    assert launch.main(["--standalone", "--nproc-per-node=gpu", TRAIN_PY]) == 2
    assert "--nproc_per_node: 'gpu' (Cuda is not available.)" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "abc", "2:1", "1:2:3"])
def test_bad_nnodes_is_refused_before_torchrun_starts(no_torchrun, capsys, value):
    assert launch.main([f"--nnodes={value}", "--nproc_per_node=1", TRAIN_PY]) == 2
    err = capsys.readouterr().err
    assert f"parallax_titan.launch: error: --nnodes: {value!r} " in err and "expected N or MIN:MAX" in err


def test_missing_training_script_is_refused_before_torchrun_starts(no_torchrun, capsys, tmp_path):
    """torchrun started every worker on it, each failed, then torchrun raised ChildFailedError."""
    script = str(tmp_path / "trian.py")
    assert launch.main(["--standalone", "--nproc_per_node=2", script, "--job.config_file", "x.toml"]) == 2
    assert f"parallax_titan.launch: error: {script!r} does not exist; expected the training script" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("argv", [["--nproc_per_node=2", TRAIN_PY], ["--nproc-per-node=cpu", "train.py"],
                                  ["--nproc_per_node=auto", "--nnodes=1:2", TRAIN_PY],
                                  ["-m", "no_such_file_but_a_module"], ["--no-python", "echo"]])
def test_good_arguments_start_torchrun(monkeypatch, argv):
    """Only a script that torchrun runs as a file is looked for (not ``-m`` modules or ``--no-python``
    commands); the arguments go to torchrun unchanged."""
    monkeypatch.chdir(REPO)
    started = []

    class FakeTorchrun:
        pid = os.getpid()

        def __init__(self, cmd, env):
            started.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", FakeTorchrun)
    monkeypatch.setattr(launch.signal, "signal", lambda *a: None)  # keep pytest's own handlers
    assert launch.main(["--standalone", *argv]) == 0
    assert started == [[sys.executable, "-m", "torch.distributed.run", "--standalone", *argv]]
