"""Public entry points of the uniform-weight family (SPEC 1b): validation and dispatch.

All take the (batch, seq, heads, head_dim) layout, are causal, support GQA (query head h reads
kv head h // (Hq // Hkv)) and return (B, L, Hq, D) in the queries' dtype. The PyTorch paths
compute in fp32 (fp64 for fp64 inputs) and are differentiable through autograd.
"""

from __future__ import annotations

import os

import torch

from kernels.family import chunked
from kernels.family.common import (check_choice, check_flag, check_lam, check_positive_int, check_q_heads, check_tensors,
                                    grouped_lam, work_dtype)
from kernels.layout import grouped, ungrouped

BACKENDS = ("auto", "reference", "triton")
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def value_averaging(v, *, q_heads=None):
    """Value Averaging (zero probe): o_i = vbar_i = (1/i) sum_{j<=i} v_j.

    v: (B, L, Hkv, D) float tensor, no dimension 0. q_heads: number of query heads Hq (a multiple of Hkv) to
    broadcast the output to, as the attention slot expects; default Hkv.
    Returns (B, L, q_heads, D) in v's dtype.
    """
    fn = "value_averaging"
    check_tensors(fn, {}, {"v": v})
    hkv = v.shape[2]
    q_heads = check_q_heads(fn, hkv if q_heads is None else q_heads, hkv)
    vg = grouped(v, hkv, work_dtype(v.dtype))
    out = chunked.value_averaging_chunked(vg).expand(-1, -1, q_heads // hkv, -1, -1)
    return ungrouped(out, v.dtype)


def _first_token_shift(k, v):
    """Detached first-token key and value (B, 1, Hkv, D) to subtract before the raw-moment sums.

    The intercept forms depend on k and v only through centred moments (and vbar), so
    k -> k - c_k (q -> q - c_k for Affine MesaNet) and v -> v - c_v (output + c_v) leave them
    unchanged; the streaming sums then cancel far less when keys or values share a large mean
    (in 16-bit tensor-core products the raw sums lose the covariance entirely). The first token
    keeps every position's output a function of its own past only. Detaching is exact: the
    output's derivative with respect to the shift is zero.
    """
    return k[:, :1].detach(), v[:, :1].detach()


def _per_query_head(x, q_heads):
    """(B, 1, Hkv, D) -> (B, 1, Hq, D), kv head h // G for query head h."""
    return x.repeat_interleave(q_heads // x.shape[2], dim=2)


def _resolve_backend(fn, backend, r):
    check_choice(fn, "backend", backend, BACKENDS)
    from kernels.family.affine_la_fused import HEAD_DIMS

    fused_ok = r.dtype in TRITON_DTYPES and r.shape[-1] in HEAD_DIMS
    if backend == "auto":
        return "triton" if (r.is_cuda and fused_ok) else "reference"
    if backend == "triton":
        if not fused_ok:
            raise ValueError(f"{fn}: backend='triton' needs dtype in {TRITON_DTYPES} and head_dim in {HEAD_DIMS}, "
                             f"got {r.dtype} and {r.shape[-1]}")
        if not r.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"{fn}: backend='triton' needs CUDA tensors (r is on {r.device}) or TRITON_INTERPRET=1")
    return backend


def affine_linear_attention(r, k, v, *, intercept=True, backend="auto", chunk=chunked.DEFAULT_CHUNK):
    """Affine Linear Attention (learned probe): o_i = vbar_i - Sigma_KV(i) r_i, uniform causal moments.

    r: (B, L, Hq, D) probes (the "query" of linear attention, not scaled); k, v: (B, L, Hkv, D),
    Hq % Hkv == 0, no dimension 0; fp16/bf16/fp32/fp64.
    intercept: a bool; False drops vbar and kbar (raw moments): o_i = -(1/i) sum_{j<=i} (r_i . k_j) v_j, the
    standard causal linear attention of probe -r normalised by the token count.
    backend: "reference" (chunked PyTorch, any device), "triton" (fused kernels, CUDA or
    TRITON_INTERPRET=1; fp16/bf16/fp32, D in 16/32/64/128), "auto" (triton on CUDA when supported).
    chunk: chunk length of the reference path, an int >= 1.
    Returns (B, L, Hq, D) in r's dtype; differentiable w.r.t. r, k, v.
    """
    fn = "affine_linear_attention"
    check_tensors(fn, {"r": r}, {"k": k, "v": v})
    check_flag(fn, "intercept", intercept)
    chunk = check_positive_int(fn, "chunk", chunk)
    backend = _resolve_backend(fn, backend, r)
    if intercept:
        c_k, c_v = _first_token_shift(k, v)
        k, v = k - c_k, v - c_v
    if backend == "triton":
        from kernels.family.ops import affine_linear_attention_triton

        out = affine_linear_attention_triton(r, k, v, intercept=intercept)
    else:
        work, hkv = work_dtype(r.dtype), k.shape[2]
        rg, kg, vg = (grouped(x, hkv, work) for x in (r, k, v))
        out = ungrouped(chunked.affine_linear_attention_chunked(rg, kg, vg, intercept=intercept, chunk=chunk),
                        r.dtype)
    return out + _per_query_head(c_v, r.shape[2]) if intercept else out


def affine_mesanet(q, k, v, *, lam, intercept=True, chunk=chunked.DEFAULT_CHUNK):
    """Affine MesaNet (solved probe, uniform-weight exact LLA):
    o_i = vbar_i + Sigma_KV(i) (Sigma_KK(i) + lam I)^-1 (q_i - kbar_i).

    q: (B, L, Hq, D); k, v: (B, L, Hkv, D), Hq % Hkv == 0, no dimension 0; fp16/bf16/fp32/fp64.
    lam: ridge lambda > 0, a number or a (Hq,) tensor (e.g. softplus(param) + floor; not checked
    for positivity, to avoid a host sync).
    intercept: a bool; False gives MesaNet's form (S_vk(i)/i) (S_kk(i)/i + lam I)^-1 q_i.
    chunk: tokens whose D x D systems are built and factored at once (Cholesky, one per token), an int >= 1.
    Returns (B, L, Hq, D) in q's dtype; differentiable w.r.t. q, k, v and a tensor lam.
    Cost per token and head: O(D^3 / 3) for the factorisation plus O(D^2) for the moments; autograd
    keeps one D x D factor per token and query head group.
    """
    fn = "affine_mesanet"
    check_tensors(fn, {"q": q}, {"k": k, "v": v})
    check_flag(fn, "intercept", intercept)
    lam = check_lam(fn, lam, q.shape[2], q.device)
    chunk = check_positive_int(fn, "chunk", chunk)
    if intercept:
        c_k, c_v = _first_token_shift(k, v)
        q, k, v = q - _per_query_head(c_k, q.shape[2]), k - c_k, v - c_v
    work, hkv = work_dtype(q.dtype), k.shape[2]
    qg, kg, vg = (grouped(x, hkv, work) for x in (q, k, v))
    out = ungrouped(chunked.affine_mesanet_chunked(qg, kg, vg, lam=grouped_lam(lam, hkv, work), intercept=intercept,
                                                   chunk=chunk), q.dtype)
    return out + _per_query_head(c_v, q.shape[2]) if intercept else out
