"""Explicit O(L^2) Parallax attention (SPEC section 1), the independent test reference.

Everything is computed in the inputs' dtype (pass float64 for a reference) from the
equivalent-weights form ``o_i = sum_j w_ij v_j`` with ``w_ij = p_ij (1 - t_ij + tbar_i)``,
so autograd through this module gives reference gradients independent of the closed-form
backward used by the kernels. Memory is O(B * H * L^2): tests only.
"""

from __future__ import annotations

import math

import torch


def document_ids(cu_seqlens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Document index of each packed token.

    cu_seqlens: (num_docs + 1,) integer offsets, flash-attn varlen convention.
    Returns (seq_len,) int64 on cu_seqlens' device.
    """
    positions = torch.arange(seq_len, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens.to(torch.int64), positions, right=True) - 1


def attention_mask(seq_len: int, causal: bool, cu_seqlens: torch.Tensor | None,
                   device: torch.device) -> torch.Tensor:
    """Boolean (seq_len, seq_len) mask, True where query i may read key j."""
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    if causal:
        mask = torch.tril(mask)
    if cu_seqlens is not None:
        doc = document_ids(cu_seqlens.to(device), seq_len)
        mask = mask & (doc[:, None] == doc[None, :])
    return mask


def _heads_first(q, r, k, v):
    """(B, L, H, D) -> (B, Hq, L, D) with kv heads repeated over their query group."""
    group = q.shape[2] // k.shape[2]
    q, r, k, v = (x.transpose(1, 2) for x in (q, r, k, v))
    return q, r, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def parallax_weights(q, r, k, *, scale=None, causal=True, cu_seqlens=None):
    """Softmax probabilities, probe scores and Parallax weights.

    q, r: (B, L, Hq, D); k: (B, L, Hkv, D).
    Returns dict of (B, Hq, L, L) tensors ``p`` (softmax of scale * q.k), ``t`` (rho . k,
    zero where masked), ``w`` (p * (1 - t + tbar)) and (B, Hq, L) ``tbar``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qh, rh, kh, _ = _heads_first(q, r, k, k)
    mask = attention_mask(q.shape[1], causal, cu_seqlens, q.device)
    s1 = (scale * qh @ kh.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
    p = torch.softmax(s1, dim=-1)
    t = (rh @ kh.transpose(-1, -2)).masked_fill(~mask, 0.0)
    tbar = (p * t).sum(-1)
    w = p * (1.0 - t + tbar[..., None])
    return {"p": p, "t": t, "tbar": tbar, "w": w}


def parallax_attention_naive(q, r, k, v, *, scale=None, causal=True, cu_seqlens=None):
    """Parallax attention output o = w @ v, differentiable, O(L^2) memory.

    q, r: (B, L, Hq, D); k, v: (B, L, Hkv, D); any floating dtype (computed in it).
    Returns (B, L, Hq, D).
    """
    w = parallax_weights(q, r, k, scale=scale, causal=causal, cu_seqlens=cu_seqlens)["w"]
    _, _, _, vh = _heads_first(q, r, k, v)
    return (w @ vh).transpose(1, 2)
