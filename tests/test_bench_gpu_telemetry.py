"""scripts.bench.gpu_telemetry (nvidia-smi samples of SM clock and power), the summary's telemetry
columns, and scripts.bench.step_probe's command line and host-delay probe."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from scripts.bench import gpu_telemetry as telemetry
from scripts.bench.summarize_runs import markdown
from scripts.bench.train import parse_args
from scripts.bench.train_launch import PROBE_MODULE, train_command
from tests._train_runs import REPO, TEST_CONFIG

LIMIT = 700.0


def line(mhz, watts, reasons="0x0000000000000004", limit=LIMIT):
    return f"{mhz}, {watts}, {limit}, {reasons}\n"


def test_parse_line_reads_a_sample_and_refuses_what_nvidia_smi_could_not_fill():
    assert telemetry.parse_line(line(1680, 684.7)) == telemetry.Sample(1680.0, 684.7, LIMIT, 4)
    assert telemetry.parse_line("1680, [N/A], 700.00, 0x0000000000000004\n") is None
    assert telemetry.parse_line("1680, 684.7, 70") is None  # cut off while the sampler was stopped
    assert telemetry.parse_line("") is None
    assert telemetry.parse_line("1680, 684.7, 700, [Not Supported]") is None


def test_summary_counts_only_samples_under_load():
    lines = [line(345, 80, "0x0000000000000001"),  # idle before the run: excluded
             line(1600, 690), line(1700, 680), line(1980, 500, "0x0000000000000000"),
             line(1500, 600, "0x0000000000000024"),  # power cap and software thermal slowdown
             "garbage\n", line(1980, 650, limit=0)]  # no limit reported: excluded
    summary = telemetry.summarize(lines)
    assert summary["samples"] == 4
    assert summary["sm_mhz"] == pytest.approx(1650.0) and summary["power_w"] == pytest.approx(640.0)
    assert summary["limit_w"] == LIMIT
    assert summary["power_capped"] == pytest.approx(3 / 4) and summary["slowed"] == pytest.approx(1 / 4)


def test_summary_without_load_is_none():
    assert telemetry.summarize([line(345, 80, "0x1")]) is None
    assert telemetry.summarize([]) is None


def test_visible_gpu_indices():
    assert telemetry.visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "0, 3"}) == ["0", "3"]
    assert telemetry.visible_gpu_indices({"CUDA_VISIBLE_DEVICES": "GPU-5d2e"}) == []  # UUIDs: all GPUs
    assert telemetry.visible_gpu_indices({}) == []


def test_sampler_polls_the_visible_gpus_and_stops(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH prints its arguments' samples and would run forever: the sampler
    records them and stops it when the block ends."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\necho \"$*\" > \"$(dirname \"$0\")/args\"\n"
                    "while true; do echo '1700, 690.0, 700.00, 0x0000000000000004'; sleep 0.05; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "run.gpu.csv"
    with telemetry.Sampler(str(out), {"CUDA_VISIBLE_DEVICES": "1"}, interval_ms=50) as sampler:
        while out.stat().st_size == 0:
            pass
    assert sampler._proc.poll() is not None  # stopped
    summary = telemetry.summarize_file(str(out))
    assert summary["sm_mhz"] == 1700.0 and summary["power_capped"] == 1.0
    args = (fake.parent / "args").read_text().split()
    assert "-lms=50" in args and args[-2:] == ["-i", "1"] and f"--query-gpu={telemetry.QUERY}" in args


def test_sampler_without_nvidia_smi_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(telemetry.shutil, "which", lambda name: None)
    with telemetry.Sampler(str(tmp_path / "x.gpu.csv")):
        pass
    assert telemetry.summarize_file(str(tmp_path / "x.gpu.csv")) is None
    assert telemetry.summarize_file(str(tmp_path / "missing.gpu.csv")) is None


def test_sampler_refuses_a_bad_interval(tmp_path):
    with pytest.raises(ValueError, match="interval_ms = 0"):
        telemetry.Sampler(str(tmp_path / "x.csv"), interval_ms=0)


def _row(run, tokens, gpu):
    return {"run": run, "tokens_per_s": tokens, "mfu_pct": 50.0, "peak_mem_gib": 40.0, "loss": {1: 12.0, 20: 7.0},
            "gpu": gpu}


def test_summary_table_shows_clock_power_and_power_cap_share():
    gpu = {"samples": 9, "sm_mhz": 1680.0, "power_w": 684.7, "limit_w": 700.0, "power_capped": 0.95, "slowed": 0.0}
    table = markdown([_row("transformer", 86_000.0, gpu), _row("parallax", 65_000.0, None)], "transformer")
    header, _, first, second = table.splitlines()
    assert header.endswith("| SM MHz | power / limit W | at power cap % |")
    assert first.endswith("| 1680 | 685 / 700 | 95 |") and second.endswith("|  |  |  |")
    assert "SM MHz" not in markdown([_row("a", 1.0, None)], "a")  # no telemetry: the plain table


def test_probe_runs_train_py_under_step_probe():
    args = parse_args(["parallax", "--probe", "--cuda-profile-step 15 --trace-dir t", "--steps", "20"])
    cmd = train_command(args, "parallax", "parallax", 1)
    entry = cmd.index(PROBE_MODULE)
    assert cmd[entry - 1] == "-m"
    assert cmd[entry + 1:entry + 6] == ["--cuda-profile-step", "15", "--trace-dir", "t", "--"]
    assert cmd[entry + 6] == "--job.config_file" and "train.py" not in cmd


@pytest.mark.parametrize("probe, message", [
    ("--cuda-profile-step 0 --trace-dir t", "'0': expected an int >= 1"),
    ("--trace-dir t", "--trace-dir without --cuda-profile-step: no step is profiled"),
    ("--gpu-sleep-ms -1", "'-1': expected a finite number >= 0"),
    ("--host-delay-us nan", "'nan': expected a finite number >= 0"),
    ("--host-delay-us", "expected one argument"),
    ("--no-such-probe", "unrecognized arguments: --no-such-probe"),
])
def test_bad_probes_are_refused_before_any_run(probe, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(["parallax", "--probe", probe])
    assert message in capsys.readouterr().err


def test_profiled_step_past_the_last_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["parallax", "--steps", "20", "--probe", "--cuda-profile-step 21"])
    err = capsys.readouterr().err
    assert "--cuda-profile-step 21 is past the last step (--steps 20): no step would be profiled" in err
    parse_args(["parallax", "--steps", "20", "--probe", "--cuda-profile-step 20"])


def test_step_probe_refuses_a_profiled_step_past_training_steps():
    """Run directly (not through bench.train), the check comes when training starts."""
    from types import SimpleNamespace

    from scripts.bench import step_probe

    class Trainer:
        job_config = SimpleNamespace(training=SimpleNamespace(steps=10))

        def train(self):
            return "trained"

        def train_step(self, data_iterator):
            return None

    step_probe.profile_step(Trainer, 10, "/tmp/unused")
    assert Trainer().train() == "trained"
    step_probe.profile_step(Trainer, 11, "/tmp/unused")
    with pytest.raises(SystemExit, match="--cuda-profile-step 11 is past training.steps = 10"):
        Trainer().train()


def test_probe_is_refused_for_torchtitans_trainer(capsys):
    with pytest.raises(SystemExit):
        parse_args(["titan_qwen3", "transformer", "--probe", "--host-delay-us 5"])
    assert "--probe runs our train.py; titan_qwen3 is TorchTitan's trainer" in capsys.readouterr().err


def test_host_delay_spins_before_every_attention_call(monkeypatch):
    from kernels.parallax import fused
    from scripts.bench import step_probe

    calls = []
    monkeypatch.setattr(fused, "forward", lambda *a, **k: calls.append(("forward", a, k)) or "o")
    monkeypatch.setattr(fused, "backward", lambda *a, **k: calls.append(("backward", a, k)) or "d")
    monkeypatch.setattr(step_probe, "_spin", lambda seconds: calls.append(("spin", seconds)))
    step_probe.delay_attention_calls(150.0)
    assert fused.forward(1, 2, hopper=True) == "o" and fused.backward(3) == "d"
    assert calls == [("spin", pytest.approx(150e-6)), ("forward", (1, 2), {"hopper": True}),
                     ("spin", pytest.approx(150e-6)), ("backward", (3,), {})]


def test_step_probe_needs_the_separator_and_a_gpu_for_gpu_probes(monkeypatch):
    from scripts.bench import step_probe

    with pytest.raises(SystemExit, match="expected PROBES -- TRAIN_ARGS"):
        step_probe.main(["--host-delay-us", "5"])
    monkeypatch.setattr(step_probe.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="need a CUDA GPU"):
        step_probe.main(["--gpu-sleep-ms", "5", "--", "--job.config_file", "x.toml"])


@pytest.mark.slow
def test_probe_run_trains_through_step_probe_on_cpu(tmp_path):
    """--probe on the tiny CPU config: torchrun runs train.py's cli under step_probe to the end; the
    run's GPU samples file exists (empty without nvidia-smi) and the summary has no telemetry."""
    cmd = [sys.executable, "-m", "scripts.bench.train", "parallax", "--probe", "--host-delay-us 1",
           "--config", TEST_CONFIG, "--flavor", "debug", "--steps", "2", "--local-batch", "2", "--out", str(tmp_path),
           "--extra", "--training.dataset default_corpus"]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = (tmp_path / "parallax.log").read_text()
    probes = "{'cuda_profile_step': None, 'trace_dir': None, 'gpu_sleep_ms': 0.0, 'host_delay_us': 1.0}"
    assert f"[step_probe] {probes}" in log
    assert "Training finished" in log and (tmp_path / "parallax.gpu.csv").is_file()
    rows = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert [r["run"] for r in rows] == ["parallax"] and rows[0]["gpu"] is None
