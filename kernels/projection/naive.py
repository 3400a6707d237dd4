"""The PyTorch reference of ``fused.split_norm_rope``: any device, any float dtype, autograd.

Same math as the model's unfused path (TorchTitan's Qwen3 ``q_norm``/``k_norm`` and RoPE, and the
probe's ``r_norm``): split the fused projection's rows into q, k, v, rho heads, RMS-normalise q, k
and rho per head with their weights, rotate q, k (and rho when ``rope_rho``) by the RoPE table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """RoPE of x (B, L, H, D) with ``table`` (L, 2D): cos in [:D], sin in [D:], cast to x's dtype
    (TorchTitan's Qwen3 form ``x cos + rotate_half(x) sin``)."""
    d = x.shape[-1]
    cos = table[:, None, :d].to(x.dtype)
    sin = table[:, None, d:].to(x.dtype)
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return (x * cos + half * sin).type_as(x)


def split_norm_rope(y, hq, hkv, weights, eps, table, rope_rho=True):
    """y (B, L, (2 Hq + 2 Hkv) D): per token the q, k, v and rho heads, in that order.
    weights: (w_q, w_k, w_rho), each (D,); eps: the norms' epsilon; table: (>= L, 2D) RoPE rows of
    positions 0, 1, ..., of which the first halves of cos and sin are read (in TorchTitan's rows the
    second halves repeat them). Returns q, rho (B, L, Hq, D) and k, v (B, L, Hkv, D) in y's dtype."""
    b, n, _ = y.shape
    d = table.shape[-1] // 2
    cos, sin = table[:n, : d // 2], table[:n, d: d + d // 2]
    table = torch.cat([cos, cos, sin, sin], dim=-1)
    q, k, v, r = y.split([hq * d, hkv * d, hkv * d, hq * d], dim=-1)
    q, k, v, r = (t.reshape(b, n, -1, d) for t in (q, k, v, r))
    q, k, r = (F.rms_norm(t, (d,), w, eps) for t, w in zip((q, k, r), weights))
    q, k = rotate(q, table), rotate(k, table)
    if rope_rho:
        r = rotate(r, table)
    return q, k, v, r
