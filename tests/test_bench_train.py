"""scripts.bench.train: command line, the train.py commands it runs, the scaling and resume reports
on fabricated metrics, and (slow) real --scaling 2 and --resume checks on CPU ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from scripts.bench.results import describe
from scripts.bench.summarize_runs import summarize
from scripts.bench.train import parse_args
from scripts.bench.train_launch import TIMEOUT_EXIT, run_logged, train_command
from scripts.bench.train_resume import resume_markdown, resume_report
from scripts.bench.train_scaling import scaling_report, write_scaling
from tests._train_runs import REPO, TEST_CONFIG


def test_defaults_and_options(monkeypatch):
    monkeypatch.setenv("OUT", "/tmp/bench_out")
    args = parse_args(["transformer", "parallax"])
    assert args.variants == ["transformer", "parallax"] and args.out == "/tmp/bench_out"
    assert (args.ngpu, args.steps, args.recipe, args.flavor, args.local_batch, args.run_timeout, args.scaling) == (
        1, 30, "muon_wsd", "0.6B", 4, 420, 0)
    args = parse_args(["parallax", "--ngpu", "8", "--steps", "300", "--recipe", "adamw_wsd", "--flavor", "1.7B",
                       "--local-batch", "2", "--extra", "--compile.no-enable --training.seq_len 2048",
                       "--name-prefix", "x_", "--run-timeout", "60", "--out", "/tmp/o"])
    cmd = train_command(args, "parallax", "x_parallax", args.ngpu)
    assert "--nproc_per_node=8" in cmd
    assert cmd[cmd.index("train.py") + 2] == "configs/paper/1.7B/parallax_adamw_wsd.toml"
    assert cmd[cmd.index("--training.local_batch_size") + 1] == "2"
    assert cmd[cmd.index("--job.dump_folder") + 1] == "/tmp/o/x_parallax"
    assert cmd[-3:] == ["--compile.no-enable", "--training.seq_len", "2048"]  # --extra comes last
    assert parse_args(["parallax", "--extra", "--compile.no-enable", "--steps", "5"]).extra == "--compile.no-enable"


@pytest.mark.parametrize("argv", [["parallax", "--scaling", "1"], ["transformer", "parallax", "--scaling", "2"],
                                  ["parallax", "--scaling", "2", "--ngpu", "2"], ["parallax", "--resume", "30"],
                                  ["transformer", "parallax", "--resume", "3"], ["parallax", "--resume", "-1"],
                                  ["parallax", "--resume", "3", "--scaling", "2"],
                                  ["parallax", "--multi-gpu-extra", "--compile.no-enable"],  # one GPU: no run
                                  ["parallax", "--ngpu", "2", "--resume", "3", "--multi-gpu-extra", "-x"]])
def test_bad_scaling_options_are_refused(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_out_holding_other_files_than_a_benchmarks_is_refused(tmp_path, capsys):
    """Each run's folder OUT/<run> is emptied before the run: with --out outputs, a training run's
    folder outputs/parallax (its checkpoints) was deleted."""
    users_run = tmp_path / "parallax" / "checkpoint"
    users_run.mkdir(parents=True)
    with pytest.raises(SystemExit) as info:
        parse_args(["parallax", "--out", str(tmp_path)])
    assert info.value.code == 2
    assert f"--out: {str(tmp_path)!r} holds 'parallax'" in capsys.readouterr().err
    assert users_run.is_dir()


def test_out_of_an_earlier_benchmark_is_accepted(tmp_path):
    for name in ("parallax", "transformer_resumed"):  # run folders, each with its log beside it
        (tmp_path / name).mkdir()
        (tmp_path / f"{name}.log").write_text("log")
    for name in ("parallax.gpu.csv", "transformer_resumed.rerun.log", "transformer_resumed.rerun.gpu.csv",
                 "summary.md", "summary.json", "resume.md", "resume.json", "scaling.md", "scaling.json"):
        (tmp_path / name).write_text("x")
    assert parse_args(["parallax", "--out", str(tmp_path)]).out == str(tmp_path)


@pytest.mark.parametrize("problem", ["baseline", "no_metrics"])
def test_summarize_runs_checks_its_runs_and_baseline(tmp_path, capsys, problem):
    """A --baseline that names none of the runs was a StopIteration traceback after every run was
    read; a folder without metrics.jsonl a FileNotFoundError."""
    from scripts.bench.summarize_runs import main as summarize_main

    run = fake_run(tmp_path / "a", [100.0], [5.0])
    runs = [run, str(tmp_path / "b")] if problem == "no_metrics" else [run]
    if problem == "no_metrics":
        (tmp_path / "b").mkdir()
    with pytest.raises(SystemExit) as info:
        summarize_main([*runs, "--baseline", "a" if problem == "no_metrics" else "x", "--out", str(tmp_path / "s")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert ("--baseline 'x' is none of the runs" if problem == "baseline" else "hold no metrics.jsonl") in err
    assert not (tmp_path / "s.md").exists()


def test_multi_gpu_extra_reaches_the_runs_on_several_gpus_only():
    """FSDP settings are refused by the config check of a one-GPU run (nothing is sharded there): the
    scaling check's 1-GPU runs get --extra only, its N-GPU run --multi-gpu-extra after it."""
    args = parse_args(["parallax", "--scaling", "2", "--extra", "--compile.no-enable", "--multi-gpu-extra",
                       "--parallelism.fsdp_reshard_after_forward never"])
    one, two = (train_command(args, "parallax", "p", nproc) for nproc in (1, 2))
    assert one[-1] == "--compile.no-enable" and "--parallelism.fsdp_reshard_after_forward" not in one
    assert two[-3:] == ["--compile.no-enable", "--parallelism.fsdp_reshard_after_forward", "never"]
    eight = parse_args(["parallax", "--ngpu", "8", "--multi-gpu-extra", "--compile.no-enable"])
    assert train_command(eight, "parallax", "p", eight.ngpu)[-1] == "--compile.no-enable"


def test_run_past_its_timeout_is_stopped(tmp_path):
    log = tmp_path / "run.log"
    cmd = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    assert run_logged(cmd, str(log), timeout=2) == TIMEOUT_EXIT
    assert "started" in log.read_text()


def test_stopping_the_benchmark_stops_its_run(tmp_path):
    """An outer `timeout` (SIGTERM) on bench_train must not leave its torchrun training on the GPU."""
    pid_file, log = tmp_path / "child.pid", tmp_path / "run.log"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = ("import sys; from scripts.bench.train_launch import run_logged; "
              f"run_logged([sys.executable, '-c', {child!r}], {str(log)!r}, timeout=120)")
    bench = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO)
    deadline = time.time() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline, "the run never started"
        time.sleep(0.1)
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=30) != 0
    run_pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(run_pid, 0)


def fake_run(folder, tokens_per_s: list[float], losses: list[float]) -> str:
    """A run folder whose metrics.jsonl logs these per-step throughputs and losses."""
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for step, (tps, loss) in enumerate(zip(tokens_per_s, losses), start=1):
            f.write(json.dumps({"step": step, "loss_metrics/global_avg_loss": loss, "throughput(tps)": tps,
                                "mfu(%)": tps / 2000, "memory/max_reserved(GiB)": 40.0}) + "\n")
            f.write(json.dumps({"step": step, "lr": 1e-3}) + "\n")
    return str(folder)


def test_rounds_run_the_variants_in_turn_and_give_each_rounds_ratios(tmp_path, monkeypatch):
    """--rounds 3: A B A B A B, runs named <variant>_r<k>; per round the ratio to that round's
    baseline, then their median and range; a round whose run logged no step gives no ratio and the
    exit status 1."""
    from scripts.bench import train

    speeds = {"transformer": [100.0, 90.0, 110.0], "parallax": [77.0, 72.0, 82.5]}
    calls = []

    def fake_bench_run(args, variant, name, nproc):
        calls.append(name)
        k = int(name.rsplit("_r", 1)[1])
        if (variant, k) == ("parallax", 3) and fail:
            return None
        return fake_run(os.path.join(args.out, name), [1.0, speeds[variant][k - 1], speeds[variant][k - 1]],
                        [9.0, 8.0, 7.0])

    monkeypatch.setattr(train, "bench_run", fake_bench_run)
    for fail in (False, True):
        calls.clear()
        out = tmp_path / f"out_{fail}"
        args = parse_args(["transformer", "parallax", "--rounds", "3", "--steps", "3", "--out", str(out)])
        os.makedirs(out)
        assert train.throughput(args) == (1 if fail else 0)
        assert calls == ["transformer_r1", "parallax_r1", "transformer_r2", "parallax_r2", "transformer_r3",
                         "parallax_r3"]
        saved = json.loads((out / "summary.json").read_text())
        spread = {r["variant"]: r for r in saved["round_ratios"]}
        want = [0.77, 0.8] if fail else [0.77, 0.8, 0.75]
        assert spread["parallax"]["ratios"] == pytest.approx(want)
        assert spread["parallax"]["median"] == pytest.approx(0.785 if fail else 0.77)
        assert spread["transformer"]["ratios"] == [1.0, 1.0, 1.0]
        text = (out / "summary.md").read_text()
        assert ("| parallax | 0.770, 0.800 | 0.785 | 0.770-0.800 |" if fail else
                "| parallax | 0.770, 0.800, 0.750 | 0.770 | 0.750-0.800 |") in text
        assert "3 rounds of the variants in turn" in text


@pytest.mark.parametrize("argv", [["parallax", "--rounds", "0"], ["parallax", "--rounds", "2", "--scaling", "2"],
                                  ["parallax", "--rounds", "2", "--resume", "3"]])
def test_bad_rounds_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "--rounds" in capsys.readouterr().err


def test_scaling_report_on_fabricated_metrics(tmp_path):
    one = fake_run(tmp_path / "p_1gpu_accum2", [10.0, 1000.0, 1000.0, 1000.0], [10.0, 8.0, 6.0, 5.0])
    two = fake_run(tmp_path / "p_2gpu", [5.0, 900.0, 950.0, 1000.0], [10.0, 8.0, 6.03, 5.0])
    plain = fake_run(tmp_path / "p_1gpu", [10.0, 1300.0, 1300.0, 1300.0], [10.0, 8.0, 6.0, 5.0])
    report = scaling_report(summarize(one, 2), summarize(two, 2), 2, summarize(plain, 2))
    assert report["per_gpu_efficiency"] == pytest.approx(0.975)  # steps 3-4 only: (950 + 1000) / 2000
    assert report["per_gpu_efficiency_same_work"] == pytest.approx(0.75)  # 975 / 1300
    assert report["max_abs_diff"] == pytest.approx(0.03) and report["max_rel_diff"] == pytest.approx(0.005)
    assert [r["step"] for r in report["losses"]] == [1, 2, 3, 4]
    meta = describe("Scaling", "fabricated metrics", "python -m scripts.bench.train p --scaling 2")
    text = write_scaling(report, meta, str(tmp_path / "scaling"))
    assert "**0.975** (meets the goal 0.90)" in text and "| 3 | 6.000000 | 6.030000 | 0.03 | 0.005 |" in text
    assert "(the same work per GPU, one optimizer step per micro-batch): **0.750**" in text
    assert "| p_1gpu |" in text and text.startswith("# Scaling\n")
    saved = json.loads((tmp_path / "scaling.json").read_text())
    assert saved["per_gpu_efficiency"] == pytest.approx(0.975) and saved["meta"] == meta


def test_resume_report_compares_the_steps_after_the_stop():
    straight = {1: 10.0, 2: 9.0, 3: 8.0, 4: 7.0}
    resumed = {1: 10.0, 2: 9.0, 3: 8.0, 4: 7.07}
    report = resume_report(straight, resumed, 2)
    assert [r["step"] for r in report["losses"]] == [3, 4] and report["identical"] == 1
    assert report["max_abs_diff"] == pytest.approx(0.07) and report["max_rel_diff"] == pytest.approx(0.01)
    assert "2 steps after the stop compared: 1 bit-identical" in resume_markdown(report)
    never_logged = resume_report(straight, {1: 10.0, 2: 9.0}, 2)
    assert never_logged["steps_compared"] == 0 and never_logged["max_abs_diff"] is None
    assert resume_markdown(never_logged) == "The rerun logged no step after the stop at step 2.\n"


def _bench_on_cpu(tmp_path, *args):
    """``python -m scripts.bench.train`` from the repository root on the tiny CPU config (debug flavor,
    4 steps, local batch 2) into tmp_path; fails the test unless it exits 0."""
    cmd = [sys.executable, "-m", "scripts.bench.train", *args, "--config", TEST_CONFIG, "--flavor", "debug",
           "--steps", "4", "--local-batch", "2", "--out", str(tmp_path)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_resume_check_is_exact_on_cpu(tmp_path):
    """--resume 2 on the tiny CPU config: stopped at step 2, rerun with the same command, every later
    loss bit-identical to the straight run's (fp32 on CPU), and a checkpoint at the stop."""
    _bench_on_cpu(tmp_path, "parallax", "--resume", "2", "--extra", "--training.dataset default_corpus")
    report = json.loads((tmp_path / "resume.json").read_text())
    assert report["steps_compared"] == 2 and report["identical"] == 2
    assert (tmp_path / "parallax_resumed" / "checkpoint" / "step-2" / ".metadata").is_file()
    assert "Training starts at step 3" in (tmp_path / "parallax_resumed.rerun.log").read_text()


@pytest.mark.slow
def test_scaling_check_runs_on_cpu_ranks(tmp_path):
    """--scaling 2 on the tiny CPU config: 1 rank with accumulation 2 and 2 gloo ranks agree; the FSDP
    setting of --multi-gpu-extra reaches the 2-rank run only (the 1-rank runs' config check refuses it)."""
    _bench_on_cpu(tmp_path, "parallax", "--scaling", "2", "--multi-gpu-extra",
                  "--parallelism.fsdp_reshard_after_forward never")
    report = json.loads((tmp_path / "scaling.json").read_text())
    assert [r["step"] for r in report["losses"]] == [1, 2, 3, 4]
    assert report["max_rel_diff"] < 1e-5 and report["per_gpu_efficiency"] > 0
    assert report["per_gpu_efficiency_same_work"] > 0 and (tmp_path / "parallax_1gpu.log").is_file()
    assert (tmp_path / "scaling.md").is_file() and (tmp_path / "parallax_2gpu.log").is_file()


def test_torchtitan_reference_is_launched_as_a_module():
    """``titan_qwen3``: ``torchrun -m scripts.bench.titan_reference`` on the Transformer's config."""
    args = parse_args(["titan_qwen3", "transformer", "--recipe", "adamw_wsd"])
    cmd = train_command(args, "titan_qwen3", "titan_qwen3", 1)
    entry = cmd.index("scripts.bench.titan_reference")
    assert cmd[entry - 1] == "-m" and cmd.index("torch.distributed.run") < entry
    assert cmd[entry + 1:entry + 3] == ["--job.config_file", "configs/paper/0.6B/transformer_adamw_wsd.toml"]
    assert "train.py" in train_command(args, "transformer", "transformer", 1)


@pytest.mark.slow
def test_torchtitan_reference_runs_beside_ours(tmp_path):
    """TorchTitan's own Trainer and Qwen3 and our Transformer on the tiny CPU config, summarised in one
    table whose page opens with the results header."""
    _bench_on_cpu(tmp_path, "titan_qwen3", "transformer",
                  "--extra", "--training.dataset default_corpus --metrics.log_freq 1")
    rows = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert [r["run"] for r in rows] == ["titan_qwen3", "transformer"]
    assert all(r["tokens_per_s"] > 0 and len(r["loss"]) == 4 for r in rows)
    page = (tmp_path / "summary.md").read_text()
    assert page.startswith("# Training throughput\n")
    assert "`python -m scripts.bench.train titan_qwen3 transformer --extra '--training.dataset" in page
    assert "Building titan_qwen3 debug" in (tmp_path / "titan_qwen3.log").read_text()  # TorchTitan's spec
    assert "Building transformer debug" in (tmp_path / "transformer.log").read_text()
