"""A non-finite gradient is reported with its step and parameter and handled by policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

from tests._train_runs import run_single

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tmp_path, policy: str, *driver: str):
    env = {**os.environ, "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29531", "PYTHONPATH": REPO}
    cmd = [sys.executable, "tests/_nonfinite_driver.py", *driver, "--job.config_file", "configs/test_cpu_2rank.toml",
           "--training.dataset", "default_corpus", "--training.steps", "4", "--checkpoint.interval", "100",
           "--job.dump_folder", str(tmp_path), "--reliability.nonfinite", policy]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_skip_policy_skips_the_update_and_continues(tmp_path):
    out, log = run(tmp_path, "skip")
    assert out == {"stopped": None, "unchanged_at_2": True, "changed_at_3": True, "last_step": 4,
                   "nonfinite_steps": 1, "finite_params": True}
    assert "non-finite loss or gradient at step 2" in log and "layers.1.feed_forward.w2.weight" in log


def test_stop_policy_saves_and_stops(tmp_path):
    out, log = run(tmp_path, "stop")
    assert out["last_step"] == 2 and out["unchanged_at_2"] and out["finite_params"]
    assert out["stopped"] == ("non-finite loss or gradient at step 2 (reliability.nonfinite = 'stop'); "
                              "checkpoint step-2 saved")
    assert os.path.isfile(tmp_path / "checkpoint" / "step-2" / ".metadata")


def test_stop_policy_exits_non_zero_naming_the_step(tmp_path):
    """Through train.py: an lr of 1e30 makes step 2's gradients non-finite; exit code 3, the step
    named, and no "Training completed". No weight decay: at that lr it would flip the weights' signs,
    which the optimizer refuses when it is built."""
    result = run_single(tmp_path, "--training.dataset", "default_corpus", "--training.steps", "4",
                        "--reliability.nonfinite", "stop", "--optimizer.lr", "1e30", "--optimizer.weight_decay", "0")
    assert result.returncode == 3, result.stderr[-3000:]
    assert result.stderr.rstrip().endswith("error: non-finite loss or gradient at step 2 (reliability.nonfinite = "
                                           "'stop'); checkpoint step-2 saved")
    assert "Training completed" not in result.stdout + result.stderr


class _StoppingTrainer:
    """What ``ParallaxTrainer.should_continue_training`` reads of a trainer that was told to stop."""

    def __init__(self, enable: bool, reason: str, nonfinite: str | None = None):
        # a step this run already saved: save_checkpoint_now only waits for a background save of it
        self.waits = []
        self.checkpointer = types.SimpleNamespace(enable=enable, saved_steps={2},
                                                  _async_wait=lambda: self.waits.append(self.step))
        self.step, self._stop_reason, self._nonfinite_stop = 2, reason, nonfinite
        self.job_config = types.SimpleNamespace(checkpoint=types.SimpleNamespace(load_step=-1))


@pytest.mark.parametrize("enable", [True, False])
def test_a_stop_says_whether_a_checkpoint_was_written(enable, monkeypatch):
    """With checkpoint.enable = false, SIGTERM (save_on_sigterm is on by default) and nonfinite =
    "stop" said "checkpoint step-N saved" and "rerun to resume", and nothing had been written."""
    from parallax_titan import trainer

    lines = []
    monkeypatch.setattr(trainer.logger, "info", lines.append)
    sigterm = _StoppingTrainer(enable, "SIGTERM")
    assert trainer.ParallaxTrainer.should_continue_training(sigterm) is False
    assert sigterm.waits == ([2] if enable else [])
    nonfinite = _StoppingTrainer(enable, "non-finite", "non-finite loss or gradient at step 2")
    with pytest.raises(trainer.NonFiniteStop) as info:
        trainer.ParallaxTrainer.should_continue_training(nonfinite)
    prefix = "non-finite loss or gradient at step 2 (reliability.nonfinite = 'stop'); "
    if enable:
        assert lines == ["Stopping after step 2 (SIGTERM); checkpoint saved, rerun to resume"]
        assert str(info.value) == prefix + "checkpoint step-2 saved"
    else:
        none = "no checkpoint written because checkpoint.enable = false (a rerun starts over)"
        assert lines == [f"Stopping after step 2 (SIGTERM); {none}"]
        assert str(info.value) == prefix + none


def test_nan_max_norm_set_in_code_never_applies_an_update(tmp_path):
    """training.max_norm = NaN (past validation) makes every clipped gradient NaN: each step is
    skipped, so every parameter keeps its initial value bit for bit."""
    out, log = run(tmp_path, "skip", "--max-norm-nan")
    assert out == {"unchanged": True, "finite_params": True, "last_step": 4, "nonfinite_steps": 4}
    assert "non-finite loss or gradient at step 4" in log


def test_off_policy_lets_nan_through(tmp_path):
    out, _ = run(tmp_path, "off")
    assert not out["finite_params"]


def test_step_flags_agree_and_read_once():
    from parallax_titan.step_flags import StepFlags

    flags = StepFlags()  # one process: no collective
    with pytest.raises(RuntimeError, match="no flags were agreed on"):
        flags.read()
    agreed = flags.agree(torch.tensor([0.0, 2.0]))
    assert agreed.dtype == torch.bool and agreed.tolist() == [False, True]
    assert flags.read().tolist() == [False, True]
    with pytest.raises(RuntimeError):
        flags.read()  # read once
    flags.agree(torch.tensor(0.0))
    flags.agree(torch.tensor(1.0))  # the latest agreement is the one read
    assert bool(flags.read())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_flags_wait_for_the_flags_not_for_later_work():
    from parallax_titan.step_flags import StepFlags

    bad = torch.zeros((), device="cuda")
    bad += 1
    reader = StepFlags()
    reader.agree(torch.stack([bad, torch.zeros((), device="cuda")]))
    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(20):  # queued after agree: read() must not wait for it
        a = a @ a / 100
    assert reader.read().tolist() == [True, False]
    assert not torch.cuda.current_stream().query()  # the matmuls are still running
    torch.cuda.synchronize()
