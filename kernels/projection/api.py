"""``split_norm_rope``: checked entry point of the fused projection's norm + RoPE."""

from __future__ import annotations

import os

import torch

from kernels.checks import grad_required, is_finite_number


def split_norm_rope(y: torch.Tensor, hq: int, hkv: int, weights, eps: float, table: torch.Tensor,
                    rope_rho: bool = True):
    """The attention's inputs from the fused projection, one launch (forward and backward each).

    y: (B, L, (2 Hq + 2 Hkv) D), per token the q, k, v and rho heads in that order (fp16/bf16/fp32,
    CUDA, or CPU under TRITON_INTERPRET=1); hq, hkv: ints >= 1. weights: (w_q, w_k, w_rho), each a (D,)
    float tensor on y's device, the RMSNorm weights; eps: their epsilon, a finite positive number.
    table: (>= L, 2D) float RoPE rows on y's device (cos in [:D], sin in [D:]) of
    positions 0, 1, ...; token t of a row sits at position t. RoPE turns the pair (i, i + D/2) by one
    angle, so each half of the cos (and of the sin) columns repeats the other, as TorchTitan lays
    them out: the first halves are read. rope_rho: a bool, rotate rho as q and k.
    Bad arguments raise a ValueError naming them, before any launch.
    Returns q, rho (B, L, Hq, D) and k, v (B, L, Hkv, D), contiguous, in y's dtype; differentiable in
    y and the weights, not in the table (a table that requires grad while autograd records is
    refused). ``naive.split_norm_rope`` is the PyTorch reference.
    """
    from kernels.projection import ops

    _check(y, hq, hkv, weights, eps, table, rope_rho)
    angles = rope_angles(table, y.shape[1], y.dtype)
    return ops.split_norm_rope_op(y, hq, hkv, *weights, float(eps), angles, bool(rope_rho))


def rope_angles(table: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, D) cos | sin of the D/2 rotation angles of positions 0..n-1, in ``dtype`` (the rounding the
    model gives its RoPE rows), from (>= n, 2D) RoPE rows in rotate-half form (cos in [:D], sin in
    [D:], each half of them repeating the other, as TorchTitan lays them out): the kernels' table."""
    d = table.shape[-1] // 2
    return torch.cat([table[:n, : d // 2], table[:n, d: d + d // 2]], -1).to(dtype)


def _check(y, hq, hkv, weights, eps, table, rope_rho=True) -> int:
    """Raise ValueError naming the argument unless the types, shapes, dtypes and devices fit; returns D."""
    for name, x in (("y", y), ("table", table)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"split_norm_rope: {name} must be a torch.Tensor, got {type(x).__name__}")
    if y.dim() != 3 or y.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"split_norm_rope: y must be a (B, L, W) fp16/bf16/fp32 tensor, got {tuple(y.shape)} "
                         f"{y.dtype}")
    half = table.shape[-1] // 4 if table.dim() == 2 and table.shape[-1] % 4 == 0 else 0
    if half < 1 or half & (half - 1):
        raise ValueError(f"split_norm_rope: table must be (positions, 2 * head_dim) with head_dim twice a power of "
                         f"two, got {tuple(table.shape)}")
    d = table.shape[-1] // 2
    if any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in (hq, hkv)):
        raise ValueError(f"split_norm_rope: hq={hq!r} and hkv={hkv!r} must be ints >= 1")
    if y.shape[-1] != (2 * hq + 2 * hkv) * d:
        raise ValueError(f"split_norm_rope: y's width {y.shape[-1]} is not (2 * hq + 2 * hkv) * head_dim = "
                         f"(2 * {hq} + 2 * {hkv}) * {d}")
    if not table.is_floating_point():
        raise ValueError(f"split_norm_rope: table must hold floats (cos and sin), got {table.dtype}")
    if table.shape[0] < y.shape[1]:
        raise ValueError(f"split_norm_rope: table has {table.shape[0]} positions, the sequence {y.shape[1]}")
    if (not isinstance(weights, (list, tuple)) or len(weights) != 3
            or any(not isinstance(w, torch.Tensor) or tuple(w.shape) != (d,) or not w.is_floating_point()
                   for w in weights)):
        got = ([(tuple(w.shape), w.dtype) if isinstance(w, torch.Tensor) else type(w).__name__ for w in weights]
               if isinstance(weights, (list, tuple)) else type(weights).__name__)
        raise ValueError(f"split_norm_rope: weights must be three ({d},) float tensors, got {got}")
    if not is_finite_number(eps) or not eps > 0:
        raise ValueError(f"split_norm_rope: eps={eps!r} must be a finite positive number")
    if not isinstance(rope_rho, bool):
        raise ValueError(f"split_norm_rope: rope_rho={rope_rho!r} must be a bool")
    if grad_required({"table": table}):  # the backward gives y and the weights theirs: table's would be lost
        raise ValueError("split_norm_rope: table requires grad, but the kernels' backward has no gradient for the "
                         "RoPE table; pass table.detach(), or kernels.projection.naive.split_norm_rope, which is "
                         "differentiable in it")
    for name, t in (("weights[0]", weights[0]), ("weights[1]", weights[1]), ("weights[2]", weights[2]),
                    ("table", table)):
        if t.device != y.device:
            raise ValueError(f"split_norm_rope: {name} is on {t.device}, y on {y.device}; all must be on one device")
    if not y.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"split_norm_rope: needs CUDA tensors (y is on {y.device}) or TRITON_INTERPRET=1; "
                         "kernels.projection.naive.split_norm_rope runs on any device")
    return d
