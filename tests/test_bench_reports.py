"""The results pages of scripts.bench.optimizers and scripts.bench.decode (table and --host-cost) on
fabricated timings: the ratios they derive, the table rows, and the header with the reproducing
command; the decode host-cost timing on a fake clock and the decode sweep's configs."""

import itertools
import json

import pytest
import torch

from scripts.bench import decode, optimizers
from scripts.bench.results import describe


def _optimizer_result(fwd_bwd_s: dict, errors: dict | None = None) -> dict:
    result = {"meta": describe("Optimizer step benchmark", "fabricated", "python -m scripts.bench.optimizers"),
              "flavor": "debug", "n_params": 1234, "fwd_bwd_batch": "4 x 32 as 1 micro-batches of 4 x 32",
              "opt_step_s": {"adamw": 0.002, "muon_polar_express_batched": 0.010}, "fwd_bwd_s": fwd_bwd_s}
    return {**result, "fwd_bwd_error": errors} if errors else result


def test_optimizer_ratios_use_the_parallax_forward_backward_when_it_ran(tmp_path):
    optimizers.write(_optimizer_result({"softmax": 0.1, "parallax": 0.2}), str(tmp_path / "opt"))
    saved = json.loads((tmp_path / "opt.json").read_text())
    muon = saved["ratios"]["muon_polar_express_batched"]
    assert muon["vs_adamw"] == pytest.approx(5.0) and muon["vs_fwd_bwd"] == pytest.approx(0.05)
    assert saved["fwd_bwd_model"].startswith("ParallaxQwen3Model (Parallax")
    text = (tmp_path / "opt.md").read_text()
    assert text.startswith("# Optimizer step benchmark\n") and "`python -m scripts.bench.optimizers`" in text
    assert "| muon_polar_express_batched | 10.0 | 5.000 | 0.050 |" in text
    assert "Parameter set: Parallax debug (1,234 parameters, fp32)." in text


def test_optimizer_ratios_fall_back_to_softmax_and_report_the_failure(tmp_path):
    result = _optimizer_result({"softmax": 0.1}, {"parallax": "OutOfMemoryError: no"})
    optimizers.write(result, str(tmp_path / "opt"))
    text = (tmp_path / "opt.md").read_text()
    assert "| adamw | 2.0 | 1.000 | 0.020 |" in text and "fwd+bwd (parallax) failed: OutOfMemoryError: no" in text
    saved = json.loads((tmp_path / "opt.json").read_text())
    assert saved["fwd_bwd_model"].endswith("(TorchTitan Qwen3 attention, SDPA)")


def test_decode_table_marks_contenders_that_did_not_run():
    us = {"cudnn-gqa": 20.0, "cudnn-packed": 25.0, "ours": 22.0}
    row = {"D": 128, "B": 1, "L": 4096, "us": us, "ratio": {n: t / 20.0 for n, t in us.items()},
           "tbps": {"ours": 2 * 4096 * 8 * 128 * 2 / 22.0 / 1e6}}
    text = decode.markdown([row], 4.25)
    assert text.startswith("Device-to-device copy ceiling 4.25 TB/s (read + write).\n")
    assert "| 128 | 1 | 4096 | 20.0 | 25.0 | - | - | - | - | - | 22.0 | 0.76 | 1.10 | - | - | - |" in text
    us["ours-no-pdl"] = 24.0
    row["ratio"]["ours-no-pdl"] = 1.2
    text = decode.markdown([row], 4.25)
    assert "| 128 | 1 | 4096 | 20.0 | 25.0 | - | - | - | - | 24.0 | 22.0 | 0.76 | 1.10 | 1.20 | - | - |" in text
    assert "| ours-no-pdl us | ours us | ours TB/s | ours / cuDNN | no PDL / cuDNN |" in text


def test_host_cost_takes_the_median_of_interleaved_rounds_per_call():
    """host_us_per_call on a fake clock: one untimed call each, then per round every function in
    turn, each block of `calls` calls after a sync; the median per-call time over the rounds."""
    from scripts.bench.decode_host import host_us_per_call

    per_call_s = {"a": [1e-6, 5e-6, 2e-6], "b": [10e-6, 30e-6, 20e-6]}  # per round
    now, events, made = [0.0], [], {"a": 0, "b": 0}

    def fn(name):
        def call():
            events.append(name)
            made[name] += 1
            timed = made[name] - 2  # the first call is the untimed warm-up
            if timed >= 0:
                now[0] += per_call_s[name][timed // 4]
        return call

    times = host_us_per_call({"a": fn("a"), "b": fn("b")}, calls=4, rounds=3,
                             sync=lambda: events.append("|"), clock=lambda: now[0])
    assert "".join(events) == "ab" + "|aaaa|bbbb" * 3 + "|"
    assert times["a"]["rounds_us"] == pytest.approx([1.0, 5.0, 2.0])
    assert times["a"]["median_us"] == pytest.approx(2.0) and times["a"]["min_us"] == pytest.approx(1.0)
    assert times["b"]["median_us"] == pytest.approx(20.0)


def test_host_cost_page_rows_and_goal(tmp_path):
    from scripts.bench import decode_host

    def t(us):
        return {"median_us": us, "min_us": us, "rounds_us": [us]}

    times = dict(zip(decode_host.CALLS, map(t, [17.8, 20.2, 24.7, 23.3, 61.4, 2.4])))
    text = decode_host.markdown(times)
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    assert [line.rsplit("|", 2)[-2].strip() for line in lines] == ["17.8", "20.2", "24.7", "23.3", "61.4", "2.4"]
    assert lines[0].startswith("| `plan(q, r, k, v, lens, out=out)` |") and lines[-1].startswith("| `graph.replay()` |")
    assert text.rstrip().endswith("at most 30 us per call; met.")
    times["parallax_decode(q, r, k, v, cache_seqlens=lens, check_seqlens=False)"] = t(31.0)
    assert decode_host.markdown(times).rstrip().endswith("not met.")


def test_kernel_times_group_the_cuda_events_per_call():
    from types import SimpleNamespace

    from scripts.bench import decode_kernels

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(name=name, device_type=kind, device_time=us) for name, kind, us in [
        ("_decode_split_kernel", cuda, 6.0), ("_decode_split_kernel", cuda, 8.0), ("_merge_kernel", cuda, 3.0),
        ("_merge_kernel", cuda, 1.0), ("Memset (Device)", cuda, 0.5), ("_merge_kernel", cpu, 99.0)]]
    assert decode_kernels.kernel_us(events, calls=2) == {"split kernel": 7.0, "merge kernel": 2.0, "other": 0.25}


def test_kernel_times_page_has_a_column_per_kernel_and_the_sum():
    from scripts.bench import decode_kernels

    rows = [{"D": 128, "B": 1, "L": 4096, "splits": 32, "pdl": False, "us": {"split kernel": 6.3, "merge kernel": 1.6}},
            {"D": 128, "B": 32, "L": 4096, "splits": 1, "pdl": False, "us": {"split kernel": 121.0}}]
    lines = decode_kernels.markdown(rows).splitlines()
    assert lines[0] == "| D | B | L | splits | PDL | split kernel us | merge kernel us | sum us |"
    assert lines[2] == "| 128 | 1 | 4096 | 32 | off | 6.30 | 1.60 | 7.90 |"
    assert lines[3] == "| 128 | 32 | 4096 | 1 | off | 121.00 | 0.00 | 121.00 |"


def test_decode_sweep_times_the_kernels_pick_first_and_every_other_config_once():
    """At batch 128 (1024 groups) the kernel runs the many-groups config: the sweep's default is that
    one, and the latency config joins the alternatives; at batch 1 the latency config is the default."""
    from kernels.parallax import tuning
    from scripts.bench.decode_tuning import sweep_configs

    cpu = torch.device("cpu")  # pick_config assumes the H200's SM count off-GPU
    for dim in tuning.DECODE_SWEEP:
        default, alts = sweep_configs(dim, 1, cpu)
        assert default == tuning.DECODE_CONFIGS[dim] and default not in alts
        assert set(alts) == set(tuning.DECODE_SWEEP[dim]) - {default} and len(alts) == len(set(alts))
        many, alts = sweep_configs(dim, 128, cpu)
        assert many == tuning.DECODE_MANY_GROUPS_CONFIGS[dim] and many not in alts
        assert tuning.DECODE_CONFIGS[dim] in alts


def test_decode_sweep_trials_time_the_default_launch_first_and_each_alternative_once(monkeypatch):
    """The heuristic's launch as a plan makes it comes first; the fused merge, PDL off and the other
    head dims per merge program are tried at the heuristic's launch; no trial twice."""
    from kernels.parallax import decode_fused, tuning
    from scripts.bench.decode_tuning import sweep_configs, sweep_trials

    cpu = torch.device("cpu")
    real = decode_fused.resident_slots
    monkeypatch.setattr(decode_fused, "resident_slots", lambda device, *args: real(cpu, *args))
    for dim, length in itertools.product(tuning.DECODE_SWEEP, (16384, 4096)):
        default, alts = sweep_configs(dim, 1, cpu)
        trials, heur = sweep_trials(dim, 1, length, default, alts)
        assert trials[0] == (default, heur, {}) and heur > 1
        launches = {(c, decode_fused.split_chunk(length, splits, c[0])[1], repr(o)) for c, splits, o in trials}
        assert len(launches) == len(trials)  # 33 and 48 splits make 32 at L=4096, block 64: timed once
        assert all(1 <= splits <= decode_fused.MAX_SPLITS for _, splits, _ in trials)
        options = [opts for config, splits, opts in trials if opts]
        assert all(config == default and splits == heur for config, splits, opts in trials if opts)
        blocks = [opts["merge_block_d"] for opts in options if "merge_block_d" in opts]
        assert {"fused_merge": True} in options and {"pdl": False} in options
        assert sorted(blocks) == sorted({16, 64, dim} - {min(dim, tuning.DECODE_MERGE_BLOCK_D)})


@pytest.mark.parametrize("argv, message", [(["--sweep-shapes", "32by16384"], "expected BATCHxLENGTH"),
                                           (["--shapes", "128x8"], "expected DIMxBATCHxLENGTH"),
                                           (["--shapes", "96x8x4096"], "expected DIM in (128, 64)"),
                                           (["--shapes", "128x0x4096"], "BATCH >= 1"),
                                           (["--calls", "0"], "'0': expected an int >= 1"),
                                           (["--inputs", "warm"], "invalid choice: 'warm'")])
def test_decode_command_line_refuses_bad_shapes(argv, message, capsys):
    with pytest.raises(SystemExit):
        decode.parser().parse_args(argv)
    assert message in capsys.readouterr().err


def test_decode_command_line_reads_the_graph_replay_mode():
    args = decode.parser().parse_args(["--calls", "10", "--inputs", "same", "--shapes", "128x8x4096", "64x1x16384"])
    assert (args.calls, args.inputs, args.shapes) == (10, "same", [(128, 8, 4096), (64, 1, 16384)])
    default = decode.parser().parse_args([])
    assert (default.calls, default.inputs, default.shapes) == (24, "rotate", None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernel_times_see_both_kernels_of_a_split_step():
    from kernels.parallax import decode_fused
    from scripts.bench import decode_kernels

    rows = decode_kernels.run([(64, 1, 4096)], calls=5)
    assert [row["pdl"] for row in rows] == [False, True][:2 if decode_fused.pdl_supported(torch.device("cuda")) else 1]
    for row in rows:
        assert row["splits"] > 1 and row["us"]["split kernel"] > 0 and row["us"]["merge kernel"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_host_cost_mode_writes_every_call_and_the_replay_is_the_cheapest(tmp_path):
    """--host-cost on the GPU, few rounds: a row for each call; replaying a captured call costs the
    host less than any eager call, and the checked API (it syncs) more than a plan call."""
    from scripts.bench import decode_host

    times = decode_host.host_us_per_call(decode_host.decode_calls(**decode_host.SHAPE), calls=50, rounds=3)
    assert list(times) == list(decode_host.CALLS)
    eager = [times[name]["median_us"] for name in decode_host.CALLS if name != "graph.replay()"]
    assert times["graph.replay()"]["median_us"] < min(eager)
    checked, plan = "parallax_decode(q, r, k, v, cache_seqlens=lens)", "plan(q, r, k, v, lens, out=out)"
    assert times[checked]["median_us"] > times[plan]["median_us"]
    text = decode_host.markdown(times)
    assert text.count("| `") == len(decode_host.CALLS)


def test_optimizer_profile_records_the_orthogonalisation(tmp_path):
    """--profile's step on a small model: the trace holds the Polar Express matmuls (aten::bmm) and
    the summary page the trace's launching ops."""
    from parallax_titan.model import ParallaxQwen3Model
    from tests.test_mixers_family import family_args

    torch.manual_seed(0)
    model = ParallaxQwen3Model(family_args("parallax"))
    with torch.no_grad():
        model.init_weights()
    optimizers.bench_optimizer(model, "muon_polar_express", 1, 1, str(tmp_path), "python -m x --profile d")
    trace = json.loads((tmp_path / "muon_polar_express_trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::bmm" in names and "aten::baddbmm" in names
    page = (tmp_path / "muon_polar_express.md").read_text()
    assert page.startswith("# Where one optimizer step's time goes") and "`python -m x --profile d`" in page


def test_optimizer_profile_folder_that_is_a_file_is_refused_first(tmp_path, capsys):
    path = tmp_path / "taken"
    path.write_text("")
    with pytest.raises(SystemExit):
        optimizers.main(["--only", "adamw", "--no-fwd-bwd", "--profile", str(path), "--out", str(tmp_path / "o")])
    assert f"--profile '{path}' is a file" in capsys.readouterr().err
    assert not (tmp_path / "o.md").exists()
