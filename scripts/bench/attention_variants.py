"""The attention benchmark's other modes (``python -m scripts.bench.attention --window ...`` and
``--affine-la``): sliding-window Parallax attention against full causal attention, and the fused
Affine Linear Attention of ``kernels.family`` beside fla's chunked linear attention.

The timings come from the kernels' own timing functions (``kernels.parallax.benchmark
.time_window_vs_causal``, ``kernels.family.bench.time_affine_la``); this module chooses the shapes
and renders their rows as a results page.
"""

from __future__ import annotations

import argparse

import torch

from scripts.bench.results import describe, table, write_results

WINDOW_SHAPE = dict(batch=1, hq=16, hkv=8, head_dim=128)  # the sequence length comes from the command line
WINDOW_MEASURED = ("forward and forward+backward time of Parallax attention (kernels.parallax_attention, triton "
                   "backend) with full causal attention and with sliding windows W (keys i - W < j <= i), "
                   "B1, Hq16/Hkv8, D128, bf16; triton.testing.do_bench median (warmup 25 ms, rep 200 ms) after an "
                   "untimed call that autotunes; fwd under no_grad. Speedup = causal ms / window ms; work ratio = "
                   "causal (query, key) pairs / the band's pairs, the speedup if time followed the pairs exactly.")
AFFINE_MEASURED = ("forward and forward+backward time of the fused Affine Linear Attention "
                   "(kernels.affine_linear_attention, triton backend) beside fla's chunk_linear_attn (normalize=False, "
                   "scale 1, kv heads repeated to the query heads) when fla is installed, bf16; median of 10 "
                   "CUDA-event-timed calls after 3 warm-up calls (kernels.family.bench.time_affine_la).")


def window_list(text: str) -> list[int]:
    """``"1024,4096"`` as [1024, 4096]: window sizes, each an int >= 1 (argparse type of ``--window``)."""
    try:
        windows = [int(x) for x in text.split(",")]
    except ValueError:
        windows = []
    if not windows or min(windows) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected window sizes >= 1 separated by commas, e.g. 1024,4096")
    return windows


def sequence_length(text: str) -> int:
    """``"16384"`` as an int >= 1 (argparse type of ``--window-len``)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a sequence length, an int >= 1")
    return int(text)


def affine_shape(text: str) -> tuple[int, int, int, int, int]:
    """``"B,L,Hq,Hkv,D"`` (e.g. "4,4096,16,16,128") as five ints >= 1 (argparse type of ``--affine-shape``)."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 5 or min(shape) < 1 or shape[2] % shape[3]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected B,L,Hq,Hkv,D (ints >= 1, Hq a multiple of Hkv), "
                                         "e.g. 4,4096,16,16,128")
    return shape


def run_window(seq_len: int, windows: list[int]) -> list[dict]:
    """``time_window_vs_causal`` rows (window None = causal; mode, ms, speedup, work_ratio) at
    WINDOW_SHAPE and ``seq_len``, bf16, on the current CUDA device."""
    from kernels.parallax.benchmark import time_window_vs_causal

    return time_window_vs_causal(seq_len=seq_len, windows=tuple(windows), dtype=torch.bfloat16, **WINDOW_SHAPE)


def window_markdown(rows: list[dict], seq_len: int) -> str:
    """The body of the sliding-window page: the shape, then one table row per ``run_window`` row,
    causal first within each mode."""
    shape = WINDOW_SHAPE
    lines = [f"Shape: B{shape['batch']}, L={seq_len}, Hq{shape['hq']}/Hkv{shape['hkv']}, D{shape['head_dim']}, bf16.",
             ""]
    ordered = sorted(rows, key=lambda r: (r["mode"] != "fwd", r["window"] is not None, r["window"] or 0))
    cells = ((r["mode"], "causal" if r["window"] is None else r["window"], f"{r['ms']:.2f}",
              f"{r['speedup']:.1f}x", f"{r['work_ratio']:.1f}x") for r in ordered)
    lines += table(["mode", "window W", "ms", "speedup vs causal", "work ratio"], cells)
    return "\n".join(lines) + "\n"


def run_affine(shape: tuple[int, int, int, int, int]) -> list[dict]:
    """``time_affine_la`` results at ``shape`` (B, L, Hq, Hkv, D), bf16: forward only, then forward
    and backward."""
    from kernels.family.bench import time_affine_la

    batch, seq_len, hq, hkv, dim = shape
    return [time_affine_la(batch, seq_len, hq, hkv, dim, dtype=torch.bfloat16, backward=backward)
            for backward in (False, True)]


def affine_markdown(rows: list[dict]) -> str:
    """The body of the Affine LA page: one table row per ``run_affine`` result ("-" where fla did not run)."""
    def ms(x):
        return "-" if x is None else f"{x:.3f}"

    cells = ((*r["shape"], "fwd_bwd" if r["backward"] else "fwd", ms(r["affine_la_ms"]), ms(r["fla_linear_attn_ms"]),
              "-" if r["ratio"] is None else f"{r['ratio']:.2f}") for r in rows)
    lines = table(["B", "L", "Hq", "Hkv", "D", "mode", "affine LA ms", "fla linear attn ms", "ours / fla"], cells)
    if any(r["fla_linear_attn_ms"] is None for r in rows):
        lines += ["", "fla (fla-core) was not importable: only our kernel was timed."]
    return "\n".join(lines) + "\n"


def write_window(rows: list[dict], seq_len: int, out: str, command: str) -> str:
    """Write ``out``.md (header and ``window_markdown``) and ``out``.json (shape and rows); return the markdown."""
    meta = describe("Parallax attention: sliding window vs full causal", WINDOW_MEASURED, command)
    return write_results(out, meta, window_markdown(rows, seq_len),
                         {"shape": {**WINDOW_SHAPE, "seq_len": seq_len, "dtype": "bfloat16"}, "rows": rows})


def write_affine(rows: list[dict], out: str, command: str) -> str:
    """Write ``out``.md (header and ``affine_markdown``) and ``out``.json (the rows); return the markdown."""
    meta = describe("Affine Linear Attention (fused) beside fla's linear attention", AFFINE_MEASURED, command)
    return write_results(out, meta, affine_markdown(rows), {"rows": rows})
