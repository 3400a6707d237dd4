"""Timing of the fused Affine Linear Attention against fla's chunked linear attention (GPU).

``time_affine_la`` is meant to be called from a benchmark script; it returns numbers and prints
nothing. fla (``fla-core``) is optional: without it only our kernel is timed.
"""

from __future__ import annotations

import statistics

import torch


def _time_ms(fn, warmup: int, reps: int) -> float:
    """Median wall time of fn() in ms over reps CUDA-event-timed calls after warmup calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _fwd_bwd(op, inputs, do, backward):
    def run():
        out = op(*inputs)
        if backward:
            torch.autograd.grad(out, inputs, do)
    return run


def time_affine_la(batch=4, seq_len=4096, q_heads=16, kv_heads=16, head_dim=128, *, dtype=torch.bfloat16,
                   backward=True, warmup=3, reps=10, seed=0) -> dict:
    """Median ms of one Affine LA call (forward, plus backward when ``backward``) at the given
    size, beside fla's ``chunk_linear_attn`` (normalize=False, scale=1, the same r, k, v with kv heads
    repeated to the query heads: fla has no GQA) when fla is installed.

    Returns {"shape": (B, L, Hq, Hkv, D), "dtype", "backward", "affine_la_ms", "fla_linear_attn_ms"
    (None without fla), "ratio" (ours / fla, or None)}. Needs CUDA.
    """
    from kernels.family.api import affine_linear_attention

    if not torch.cuda.is_available():
        raise RuntimeError("time_affine_la: needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape_q = (batch, seq_len, q_heads, head_dim)
    shape_kv = (batch, seq_len, kv_heads, head_dim)
    r = (torch.randn(shape_q, generator=gen, device="cuda") / head_dim ** 0.5).to(dtype).requires_grad_()
    k, v = (torch.randn(shape_kv, generator=gen, device="cuda").to(dtype).requires_grad_() for _ in range(2))
    do = torch.randn(shape_q, generator=gen, device="cuda").to(dtype)
    ours = _time_ms(_fwd_bwd(lambda *x: affine_linear_attention(*x, backend="triton"), (r, k, v), do, backward),
                    warmup, reps)
    theirs = None
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except ImportError:
        chunk_linear_attn = None
    if chunk_linear_attn is not None:
        group = q_heads // kv_heads
        kr, vr = (x.detach().repeat_interleave(group, 2).requires_grad_() for x in (k, v))

        def fla_op(q, k, v):
            return chunk_linear_attn(q, k, v, scale=1.0, normalize=False)[0]

        theirs = _time_ms(_fwd_bwd(fla_op, (r, kr, vr), do, backward), warmup, reps)
    return {"shape": (batch, seq_len, q_heads, kv_heads, head_dim), "dtype": str(dtype), "backward": backward,
            "affine_la_ms": ours, "fla_linear_attn_ms": theirs, "ratio": None if theirs is None else ours / theirs}
