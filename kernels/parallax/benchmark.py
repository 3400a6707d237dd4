"""GPU timings of the public attention API, for benchmark scripts and GPU tests.

    from kernels.parallax.benchmark import time_window_vs_causal
    rows = time_window_vs_causal(seq_len=16384, windows=(512, 1024, 4096))
"""

from __future__ import annotations

import math

import torch


def band_pairs(seq_len: int, window: int | None) -> int:
    """(query, key) pairs of one causal sequence under a window of W (keys i - W < j <= i)."""
    if window is None or window >= seq_len:
        return seq_len * (seq_len + 1) // 2
    return seq_len * window - window * (window - 1) // 2


def time_window_vs_causal(seq_len=16384, windows=(1024, 4096), batch=1, hq=16, hkv=8, head_dim=128,
                          dtype=torch.bfloat16, warmup=25, rep=200, seed=0) -> list[dict]:
    """Time ``kernels.parallax_attention`` (triton backend) with full causal attention and each
    sliding window, forward (under no_grad) and forward + backward, on the current CUDA device.

    Inputs (batch, seq_len, hq | hkv, head_dim) in ``dtype``, rho scaled by 1/sqrt(head_dim).
    Times are triton.testing.do_bench medians in ms (autotuning happens in an untimed first call).
    Returns one dict per (window, mode): ``window`` (None for causal), ``mode`` ("fwd" or "fwd_bwd"),
    ``ms``, ``speedup`` (causal ms / this ms) and ``work_ratio`` (causal pairs / this window's
    pairs, the speedup that skipping every key tile outside the band would give at best).
    """
    import triton

    from kernels import parallax_attention

    if not torch.cuda.is_available():
        raise RuntimeError("time_window_vs_causal needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, r = (torch.randn(batch, seq_len, hq, head_dim, generator=gen, device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn(batch, seq_len, hkv, head_dim, generator=gen, device="cuda", dtype=dtype) for _ in range(2))
    r = r / math.sqrt(head_dim)
    leaves = [x.requires_grad_() for x in (q, r, k, v)]
    grad = torch.randn_like(q)
    rows = []
    for window in (None, *windows):
        def fwd():
            with torch.no_grad():
                parallax_attention(*leaves, backend="triton", window=window)

        def fwd_bwd():
            parallax_attention(*leaves, backend="triton", window=window).backward(grad)

        for mode, step in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
            step()  # autotune and compile outside the timing
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(step, warmup=warmup, rep=rep, grad_to_none=leaves, return_mode="median")
            rows.append({"window": window, "mode": mode, "ms": ms,
                         "work_ratio": band_pairs(seq_len, None) / band_pairs(seq_len, window)})
    causal = {row["mode"]: row["ms"] for row in rows if row["window"] is None}
    for row in rows:
        row["speedup"] = causal[row["mode"]] / row["ms"]
    return rows
