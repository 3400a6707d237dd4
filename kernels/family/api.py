"""Public entry points of the uniform-weight family (SPEC 1b): validation and dispatch.

All take the (batch, seq, heads, head_dim) layout, are causal, support GQA (query head h reads
kv head h // (Hq // Hkv)) and return (B, L, Hq, D) in the queries' dtype. The PyTorch paths
compute in fp32 (fp64 for fp64 inputs) and are differentiable through autograd.
"""

from __future__ import annotations

import os

import torch

from kernels.family import chunked
from kernels.family.common import (check_choice, check_lam, check_positive, check_tensors, grouped, grouped_lam,
                                   ungrouped, work_dtype)

BACKENDS = ("auto", "reference", "triton")
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_flag(fn, name, value):
    if not isinstance(value, bool):
        raise ValueError(f"{fn}: {name}={value!r} must be a bool")


def value_averaging(v, *, q_heads=None):
    """Value Averaging (zero probe): o_i = vbar_i = (1/i) sum_{j<=i} v_j.

    v: (B, L, Hkv, D) float tensor. q_heads: number of query heads Hq (a multiple of Hkv) to
    broadcast the output to, as the attention slot expects; default Hkv.
    Returns (B, L, q_heads, D) in v's dtype.
    """
    fn = "value_averaging"
    check_tensors(fn, {}, {"v": v})
    hkv = v.shape[2]
    q_heads = hkv if q_heads is None else q_heads
    if isinstance(q_heads, bool) or not isinstance(q_heads, int) or q_heads < 1 or q_heads % hkv:
        raise ValueError(f"{fn}: q_heads={q_heads!r} must be a positive multiple of the kv heads ({hkv})")
    vg = grouped(v, hkv, work_dtype(v.dtype))
    out = chunked.value_averaging_chunked(vg).expand(-1, -1, q_heads // hkv, -1, -1)
    return ungrouped(out, v.dtype)


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
    Hq % Hkv == 0; fp16/bf16/fp32/fp64.
    intercept: False drops vbar and kbar (raw moments): o_i = -(1/i) sum_{j<=i} (r_i . k_j) v_j, the
    standard causal linear attention of probe -r normalised by the token count.
    backend: "reference" (chunked PyTorch, any device), "triton" (fused kernels, CUDA or
    TRITON_INTERPRET=1; fp16/bf16/fp32, D in 16/32/64/128), "auto" (triton on CUDA when supported).
    chunk: chunk length of the reference path.
    Returns (B, L, Hq, D) in r's dtype; differentiable w.r.t. r, k, v.
    """
    fn = "affine_linear_attention"
    check_tensors(fn, {"r": r}, {"k": k, "v": v})
    _check_flag(fn, "intercept", intercept)
    chunk = int(check_positive(fn, "chunk", chunk))
    if _resolve_backend(fn, backend, r) == "triton":
        from kernels.family.ops import affine_linear_attention_triton

        return affine_linear_attention_triton(r, k, v, intercept=intercept)
    work, hkv = work_dtype(r.dtype), k.shape[2]
    rg, kg, vg = (grouped(x, hkv, work) for x in (r, k, v))
    return ungrouped(chunked.affine_linear_attention_chunked(rg, kg, vg, intercept=intercept, chunk=chunk), r.dtype)


def affine_mesanet(q, k, v, *, lam, intercept=True, chunk=chunked.DEFAULT_CHUNK):
    """Affine MesaNet (solved probe, uniform-weight exact LLA):
    o_i = vbar_i + Sigma_KV(i) (Sigma_KK(i) + lam I)^-1 (q_i - kbar_i).

    q: (B, L, Hq, D); k, v: (B, L, Hkv, D), Hq % Hkv == 0; fp16/bf16/fp32/fp64.
    lam: ridge lambda > 0, a number or a (Hq,) tensor (e.g. softplus(param) + floor; not checked
    for positivity, to avoid a host sync).
    intercept: False gives MesaNet's form (S_vk(i)/i) (S_kk(i)/i + lam I)^-1 q_i.
    chunk: tokens whose D x D systems are built and factored at once (Cholesky, one per token).
    Returns (B, L, Hq, D) in q's dtype; differentiable w.r.t. q, k, v and a tensor lam.
    Cost per token and head: O(D^3 / 3) for the factorisation plus O(D^2) for the moments; autograd
    keeps one D x D factor per token and query head group.
    """
    fn = "affine_mesanet"
    check_tensors(fn, {"q": q}, {"k": k, "v": v})
    _check_flag(fn, "intercept", intercept)
    lam = check_lam(fn, lam, q.shape[2], q.device)
    chunk = int(check_positive(fn, "chunk", chunk))
    work, hkv = work_dtype(q.dtype), k.shape[2]
    qg, kg, vg = (grouped(x, hkv, work) for x in (q, k, v))
    out = chunked.affine_mesanet_chunked(qg, kg, vg, lam=grouped_lam(lam, hkv, work), intercept=intercept,
                                         chunk=chunk)
    return ungrouped(out, q.dtype)
