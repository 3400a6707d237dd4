"""scripts.bench.attention's reports on fabricated timings: the training table (the agreement section
only when other Parallax kernels ran beside ours), the --window and --affine-la pages; the command
line's checks; and the --sweep lists being in force while a mode times."""

import json

import pytest
import torch

from scripts.bench.attention import parser, write

ROW = {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128, "method": "parallax_ours", "mode": "fwd_bwd",
       "ms": 5.072, "vs_cudnn_same_D": 2.48, "vs_cudnn_D128": 2.48}
SHAPE = {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128}
COMMAND = "python -m scripts.bench.attention --no-competitors"


def test_agreement_section_only_when_there_is_something_to_compare(tmp_path):
    alone, beside = str(tmp_path / "alone"), str(tmp_path / "beside")
    write([{"shape": SHAPE, "agreement_vs_ours": {}}], [ROW], {}, alone, COMMAND)
    write([{"shape": SHAPE, "agreement_vs_ours": {"fla_0.6.0": 3.1e-3}}], [ROW], {}, beside, COMMAND)
    text_alone, text_beside = open(alone + ".md").read(), open(beside + ".md").read()
    assert "| 4 | 4096 | 16/8 | 128 | parallax_ours | fwd_bwd | 5.072 | 2.48 | 2.48 |" in text_alone
    assert "Output agreement" not in text_alone
    assert "Output agreement" in text_beside and "fla_0.6.0 3.1e-03" in text_beside


def test_page_and_json_carry_the_command_that_reproduces_them(tmp_path):
    out = str(tmp_path / "attention_train")
    tuning = {"fwd": {"(4096,)": "BM: 128"}}
    text = write([{"shape": SHAPE, "agreement_vs_ours": {}}], [ROW], tuning, out, COMMAND)
    assert text.startswith("# Parallax attention training benchmark\n") and f"`{COMMAND}`" in text
    saved = json.loads(open(out + ".json").read())
    assert saved["meta"]["command"] == COMMAND and saved["ratios"] == [ROW] and saved["tuning"] == tuning


# Rows as kernels.parallax.benchmark.time_window_vs_causal returns them (fabricated timings).
WINDOW_ROWS = [
    {"window": None, "mode": "fwd", "ms": 4.0, "work_ratio": 1.0, "speedup": 1.0},
    {"window": None, "mode": "fwd_bwd", "ms": 16.0, "work_ratio": 1.0, "speedup": 1.0},
    {"window": 1024, "mode": "fwd_bwd", "ms": 2.5, "work_ratio": 8.258, "speedup": 6.4},
    {"window": 1024, "mode": "fwd", "ms": 0.5, "work_ratio": 8.258, "speedup": 8.0},
]


def test_window_page_lists_causal_first_per_mode_with_speedup_and_work_ratio(tmp_path):
    from scripts.bench import attention_variants as variants

    out = str(tmp_path / "attention_window")
    text = variants.write_window(WINDOW_ROWS, 16384, out, "python -m scripts.bench.attention --window 1024")
    assert text.startswith("# Parallax attention: sliding window vs full causal\n")
    assert "`python -m scripts.bench.attention --window 1024`" in text
    assert "Shape: B1, L=16384, Hq16/Hkv8, D128, bf16." in text
    body = [line for line in text.splitlines() if line.startswith("| fwd")]
    assert body == ["| fwd | causal | 4.00 | 1.0x | 1.0x |", "| fwd | 1024 | 0.50 | 8.0x | 8.3x |",
                    "| fwd_bwd | causal | 16.00 | 1.0x | 1.0x |", "| fwd_bwd | 1024 | 2.50 | 6.4x | 8.3x |"]
    saved = json.loads(open(out + ".json").read())
    assert saved["shape"]["seq_len"] == 16384 and saved["rows"] == WINDOW_ROWS


def test_affine_page_marks_a_missing_fla(tmp_path):
    from scripts.bench import attention_variants as variants

    rows = [{"shape": (4, 4096, 16, 16, 128), "dtype": "torch.bfloat16", "backward": False, "affine_la_ms": 1.25,
             "fla_linear_attn_ms": 1.0, "ratio": 1.25},
            {"shape": (4, 4096, 16, 16, 128), "dtype": "torch.bfloat16", "backward": True, "affine_la_ms": 3.5,
             "fla_linear_attn_ms": None, "ratio": None}]
    text = variants.write_affine(rows, str(tmp_path / "affine"), "python -m scripts.bench.attention --affine-la")
    assert "| 4 | 4096 | 16 | 16 | 128 | fwd | 1.250 | 1.000 | 1.25 |" in text
    assert "| 4 | 4096 | 16 | 16 | 128 | fwd_bwd | 3.500 | - | - |" in text
    assert "fla (fla-core) was not importable" in text


@pytest.mark.parametrize("argv, message", [
    (["--window", "0"], "window sizes >= 1"), (["--window", "1024,x"], "window sizes >= 1"),
    (["--affine-shape", "4,4096,16,16"], "B,L,Hq,Hkv,D"), (["--affine-shape", "4,4096,16,6,128"], "multiple of Hkv"),
    (["--window", "1024", "--affine-la"], "not allowed with"), (["--window-len", "0"], "an int >= 1"),
])
def test_bad_mode_arguments_are_refused_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--methods", "parallax_ours,fla_0.6.0", "--no-competitors"], "['fla_0.6.0'] would not run"),
    (["--window", "1024", "--methods", "softmax_cudnn"], "--window times its own shapes"),
    (["--affine-la", "--shapes", "0"], "--affine-la times its own shapes"),
])
def test_options_the_mode_would_ignore_are_refused(argv, message, capsys):
    """They were ignored without a word: the page lacked the competitor, or the mode timed its own shapes."""
    from scripts.bench import attention

    with pytest.raises(SystemExit) as info:
        attention.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_named_method_that_cannot_run_stops_before_any_timing(monkeypatch):
    """A competitor named in --methods but not importable was dropped: the page lacked its rows."""
    from scripts.bench import attention

    monkeypatch.setattr(attention, "methods", lambda competitors: {"parallax_ours": ("blhd", None)})
    monkeypatch.setattr(attention, "bench_shape", lambda *args: pytest.fail("timed before the methods were checked"))
    args = parser().parse_args(["--methods", "parallax_ours,fla_0.6.0"])
    with pytest.raises(SystemExit, match=r"--methods: \['fla_0.6.0'\] cannot run here"):
        attention.run(args)
    assert parser().parse_args(["--methods", "parallax_ours,parallax_ours"]).methods == ["parallax_ours"]


def test_a_run_stopped_midway_keeps_the_timings_it_took(tmp_path, monkeypatch):
    """The page is rewritten after each timing, marked partial until the run ends: a run stopped by a
    time limit (in a competitor's minutes-long autotune) kept nothing before."""
    from scripts.bench import attention

    timings = iter([0.5, 2.0, 1.0])

    def bench_one(fn, inputs, mode):
        ms = next(timings, None)
        if ms is None:
            raise KeyboardInterrupt  # the time limit, in the fourth timing
        return {"ms": ms}

    monkeypatch.setattr(attention, "methods", lambda competitors: {"softmax_cudnn": ("blhd", None),
                                                                    "parallax_ours": ("blhd", None)})
    monkeypatch.setattr(attention, "make_inputs", lambda *shape: None)
    monkeypatch.setattr(attention, "agreement", lambda *args: {})
    monkeypatch.setattr(attention, "to_layout", lambda tensors, layout, group: tensors)
    monkeypatch.setattr(attention, "bench_one", bench_one)
    out = str(tmp_path / "train")
    args = parser().parse_args(["--shapes", "0", "--out", out])
    with pytest.raises(KeyboardInterrupt):
        attention.run_mode(args, COMMAND)
    page, saved = open(out + ".md").read(), json.loads(open(out + ".json").read())
    assert attention.PARTIAL in page and saved["partial"] is True
    assert "| parallax_ours | fwd | 1.000 | 2.00 | 2.00 |" in page and "parallax_ours | fwd_bwd" not in page
    assert [(r["method"], r["mode"]) for r in saved["ratios"]] == [("softmax_cudnn", "fwd"), ("softmax_cudnn", "fwd_bwd"),
                                                                   ("parallax_ours", "fwd")]
    timings = iter([0.5, 2.0, 1.0, 4.0])
    page = attention.run_mode(args, COMMAND)
    assert attention.PARTIAL not in page and "| parallax_ours | fwd_bwd | 4.000 | 2.00 | 2.00 |" in page
    assert "partial" not in json.loads(open(out + ".json").read())


def test_modes_run_under_the_sweep_lists_only_with_sweep(tmp_path, monkeypatch):
    """--sweep puts every kernel on tuning.SWEEP for the mode's timings, and the shipped lists return
    afterwards; without it the timings see tuning.SHIPPED."""
    from kernels.parallax import tuning
    from scripts.bench import attention, attention_variants as variants

    seen = []

    def fake_window(seq_len, windows):
        seen.append({name: tuning.active(name) for name in tuning.KERNEL_NAMES})
        return WINDOW_ROWS

    monkeypatch.setattr(variants, "run_window", fake_window)
    for argv in (["--window", "1024", "--sweep"], ["--window", "1024"]):
        args = parser().parse_args([*argv, "--out", str(tmp_path / "w")])
        assert "| fwd | 1024 | 0.50 |" in attention.run_mode(args, "cmd")
    assert seen == [{name: tuning.SWEEP[name] for name in tuning.KERNEL_NAMES},
                    {name: tuning.SHIPPED[name] for name in tuning.KERNEL_NAMES}]
    assert all(tuning.active(name) == tuning.SHIPPED[name] for name in tuning.KERNEL_NAMES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_window_mode_is_faster_than_causal_where_the_band_is_small(tmp_path):
    """--window 1024 at the page's L=16384 (about 8x fewer query-key pairs than causal): each mode's
    window row is faster than causal, by no more than the work ratio (with slack), and the page lists
    both. At B1, L=4096 with W=256 the forward + backward took 0.94 ms against causal's 1.14 on an H200
    (1.2x; the forward alone 2.4x): at that size the costs that do not scale with the band dominate."""
    from scripts.bench import attention

    args = parser().parse_args(["--window", "1024", "--out", str(tmp_path / "w")])
    text = attention.run_mode(args, "python -m scripts.bench.attention --window 1024")
    rows = json.loads(open(str(tmp_path / "w") + ".json").read())["rows"]
    windowed = [r for r in rows if r["window"] == 1024]
    assert len(windowed) == 2 and all(1.5 < r["speedup"] < 1.5 * r["work_ratio"] for r in windowed), rows
    assert "| fwd | 1024 |" in text and "| fwd_bwd | 1024 |" in text
