"""Chunked parallel PyTorch forms of the uniform-weight family (SPEC 1b), the training path on
any device (autograd through PyTorch ops).

All functions take grouped tensors (see ``kernels.layout.grouped``): queries/probes (B, Hkv, G, L, D),
keys/values (B, Hkv, 1, L, D), in the accumulation dtype, and return (B, Hkv, G, L, D).
With n_i = i (1-based position), s_k, s_v the causal cumulative sums, S_vk(i) = sum_{j<=i} v_j k_j^T:

    vbar_i = s_v(i) / i,  kbar_i = s_k(i) / i,  Sigma_KV(i) x = S_vk(i) x / i - vbar_i (kbar_i . x)

The only quadratic piece is ``u_i = S_vk(i) x_i = sum_{j<=i} (x_i . k_j) v_j`` (unnormalised causal
linear attention), computed chunkwise: exclusive prefix states per chunk (D x D) plus a causal
C x C product inside each chunk, so memory is O(L D + (L / C) D^2) per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.family.common import positions, solve_spd
from kernels.family.scan import prefix_sum

DEFAULT_CHUNK = 64


def _chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """(..., L, D) -> (..., N, C, D), zero-padded at the end to a multiple of C."""
    pad = (-x.shape[-2]) % chunk
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(*x.shape[:-2], -1, chunk, x.shape[-1])


def causal_linear_attention(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = DEFAULT_CHUNK):
    """u_i = sum_{j <= i} (x_i . k_j) v_j for grouped x (B,Hkv,G,L,D), k, v (B,Hkv,1,L,D)."""
    n = x.shape[-2]
    xc, kc, vc = (_chunks(t, chunk) for t in (x, k, v))
    per_chunk = kc.transpose(-1, -2) @ vc  # (..., N, D, D): sum over the chunk of k_j v_j^T
    before = torch.cat([torch.zeros_like(per_chunk[..., :1, :, :]), prefix_sum(per_chunk[..., :-1, :, :], -3)], -3)
    intra = (xc @ kc.transpose(-1, -2)).tril() @ vc
    return (xc @ before + intra).flatten(-3, -2)[..., :n, :]


def uniform_moments(k: torch.Tensor, v: torch.Tensor):
    """Causal uniform averages kbar_i, vbar_i (B, Hkv, 1, L, D) and counts n_i (L, 1)."""
    n = positions(k.shape[-2], k.dtype, k.device)
    return prefix_sum(k, -2) / n, prefix_sum(v, -2) / n, n


def value_averaging_chunked(v: torch.Tensor) -> torch.Tensor:
    """o_i = vbar_i for grouped v (B, Hkv, 1, L, D)."""
    return prefix_sum(v, -2) / positions(v.shape[-2], v.dtype, v.device)


def affine_linear_attention_chunked(r, k, v, *, intercept: bool = True, chunk: int = DEFAULT_CHUNK):
    """o_i = vbar_i - Sigma_KV(i) r_i (intercept) or -S_vk(i) r_i / i (no intercept, vbar = kbar = 0)."""
    u = causal_linear_attention(r, k, v, chunk)
    n = positions(r.shape[-2], r.dtype, r.device)
    if not intercept:
        return -u / n
    kbar, vbar, n = uniform_moments(k, v)
    tbar = (r * kbar).sum(-1, keepdim=True)
    return (1.0 + tbar) * vbar - u / n


def _solve_ridge(q, k, lam, intercept: bool, chunk: int):
    """x_i = (Sigma_KK(i) + lam I)^-1 (q_i - kbar_i) (raw moments when intercept is False).

    Walks the sequence in chunks so that the per-token D x D matrices exist for one chunk at a
    time (the solve needs one per token; autograd keeps their Cholesky factors)."""
    d = k.shape[-1]
    eye = torch.eye(d, dtype=k.dtype, device=k.device)
    ridge = lam * eye if not isinstance(lam, torch.Tensor) else lam[..., None] * eye
    s_kk = torch.zeros(*k.shape[:-2], d, d, dtype=k.dtype, device=k.device)
    s_k = torch.zeros_like(k[..., :1, :])
    xs = []
    for c0 in range(0, k.shape[-2], chunk):
        kc, qc = k[..., c0:c0 + chunk, :], q[..., c0:c0 + chunk, :]
        n = positions(kc.shape[-2], k.dtype, k.device)[:, :, None] + c0  # (C, 1, 1)
        kk = prefix_sum(kc[..., :, None] * kc[..., None, :], -3) + s_kk[..., None, :, :]
        s_kk = kk[..., -1, :, :]
        a = kk / n
        b = qc
        if intercept:
            kbar = (prefix_sum(kc, -2) + s_k) / n[..., 0]
            s_k = s_k + kc.sum(-2, keepdim=True)
            a = a - kbar[..., :, None] * kbar[..., None, :]
            b = qc - kbar
        xs.append(solve_spd(a + ridge, b))
    return torch.cat(xs, -2)


def affine_mesanet_chunked(q, k, v, *, lam, intercept: bool = True, chunk: int = DEFAULT_CHUNK):
    """o_i = vbar_i + Sigma_KV(i) (Sigma_KK(i) + lam I)^-1 (q_i - kbar_i) (SPEC 1b), or without the
    intercept (S_vk(i)/i) (S_kk(i)/i + lam I)^-1 q_i. lam: float or grouped (Hkv, G, 1, 1) tensor."""
    x = _solve_ridge(q, k, lam, intercept, chunk)
    u = causal_linear_attention(x, k, v, chunk)
    n = positions(q.shape[-2], q.dtype, q.device)
    if not intercept:
        return u / n
    kbar, vbar, n = uniform_moments(k, v)
    return vbar * (1.0 - (kbar * x).sum(-1, keepdim=True)) + u / n
