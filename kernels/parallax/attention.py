"""Public entry point for Parallax attention (training / prefill): validation and dispatch."""

from __future__ import annotations

import os

import torch

from kernels.checks import check_scale
from kernels.parallax import cu_seqlens as offsets
from kernels.parallax.chunked import parallax_attention_chunked

BACKENDS = ("auto", "reference", "triton")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_DTYPES = _FLOAT_DTYPES[:3]  # the fused kernels' dots take 16-bit or fp32 tiles


def _shape_error(q, r, k, v, why):
    shapes = ", ".join(f"{n}={tuple(x.shape)}" for n, x in zip("qrkv", (q, r, k, v)))
    return ValueError(f"parallax_attention: {why} (got {shapes}; layout is (batch, seq, heads, head_dim))")


def _check_tensors(q, r, k, v):
    for name, x in zip("qrkv", (q, r, k, v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"parallax_attention: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise _shape_error(q, r, k, v, f"{name} must be 4-D, has {x.dim()} dims")
        if x.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"parallax_attention: {name}.dtype={x.dtype}, expected one of {_FLOAT_DTYPES}")
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"parallax_attention: {name} is {x.dtype} on {x.device}, "
                             f"q is {q.dtype} on {q.device}; all four must match")
    if r.shape != q.shape:
        raise _shape_error(q, r, k, v, "r must have q's shape")
    if k.shape != v.shape:
        raise _shape_error(q, r, k, v, "k and v must have the same shape")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise _shape_error(q, r, k, v, "batch, seq and head_dim of q and k must match")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2] != 0:
        raise _shape_error(q, r, k, v, f"q heads ({q.shape[2]}) must be a multiple of kv heads ({k.shape[2]})")
    if q.shape[3] < 1:
        raise _shape_error(q, r, k, v, f"head_dim must be >= 1, got {q.shape[3]}")


MAX_WINDOW = 2 ** 31 - 1  # windows are int32 in the kernels and int64 tensor arithmetic in the references


def check_window(window, causal=True, who="parallax_attention"):
    """Raise unless window is None or an int in [1, MAX_WINDOW] (and, for attention, causal is True)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{who}: window={window!r} must be None or an int >= 1 (keys i - window < j <= i)")
    if window > MAX_WINDOW:
        raise ValueError(f"{who}: window={window} must be at most {MAX_WINDOW}; a window of at least the sequence "
                         "length is full causal attention (window=None)")
    if not causal:
        raise ValueError(f"{who}: window={window} needs causal=True (the band is i - window < j <= i)")


def _resolve_backend(backend, q, causal):
    if backend not in BACKENDS:
        raise ValueError(f"parallax_attention: backend={backend!r}, expected one of {BACKENDS}")
    if backend == "auto":
        return "triton" if (q.is_cuda and causal and q.dtype in _TRITON_DTYPES) else "reference"
    if backend == "triton":
        if not causal:
            raise ValueError("parallax_attention: backend='triton' supports causal=True only")
        if q.dtype not in _TRITON_DTYPES:
            raise ValueError(f"parallax_attention: backend='triton' needs q, r, k, v of a dtype in {_TRITON_DTYPES}, "
                             f"got {q.dtype} (backend='reference' takes it)")
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"parallax_attention: backend='triton' needs CUDA tensors (q is on {q.device}) "
                             "or TRITON_INTERPRET=1")
    return backend


def parallax_attention(q, r, k, v, *, scale=None, causal=True, backend="auto", cu_seqlens=None, window=None,
                       hopper_kernels=True):
    """Parallax attention o_i = vbar_i - sum_j p_ij (t_ij - tbar_i) v_j (SPEC section 1).

    q, r: (B, L, Hq, D) queries and probes (r is not scaled); k, v: (B, L, Hkv, D),
    Hq % Hkv == 0 (query head h reads kv head h // (Hq // Hkv)), D >= 1; fp16/bf16/fp32/fp64.
    scale: logit scale (a finite number, any sign), default 1/sqrt(D). causal: a bool, mask keys j > i.
    backend: "reference" (chunked PyTorch, CPU/GPU), "triton" (fused, CUDA, causal, fp16/bf16/fp32),
    "auto" (triton for causal fp16/bf16/fp32 CUDA inputs, else reference).
    cu_seqlens: optional (num_docs + 1,) int32 offsets of documents packed along seq
    (requires B == 1); attention stays within each document. Its values are checked on every call
    (0 first, non-decreasing, L last; ValueError naming them): eagerly one host sync per tensor
    (remembered until it is written in place), under CUDA-graph capture a device-side assertion
    (no sync); see kernels/parallax/cu_seqlens.py.
    window: optional sliding window W (int in [1, 2^31 - 1], causal only; SPEC 1b): query i reads keys
    i - W < j <= i (and, with cu_seqlens, only its own document's); W >= L is full causal attention.
    Both backends skip the key tiles outside the band, so the work is about L * W instead of L^2 / 2.
    hopper_kernels: the triton backend's forward and backward as ``kernels/parallax/hopper.py``'s kernels
    where they apply (``fused.hopper_unusable``); False keeps the Triton kernels.
    Returns (B, L, Hq, D) in q's dtype; differentiable w.r.t. q, r, k, v.
    """
    _check_tensors(q, r, k, v)
    scale = check_scale("parallax_attention", scale, q.shape[-1])
    if not isinstance(causal, bool):
        raise ValueError(f"parallax_attention: causal={causal!r} must be a bool")
    check_window(window, causal)
    if not isinstance(hopper_kernels, bool):
        raise ValueError(f"parallax_attention: hopper_kernels={hopper_kernels!r} must be a bool")
    backend = _resolve_backend(backend, q, causal)
    if cu_seqlens is not None:
        offsets.check_structure(cu_seqlens, q)
    if backend == "reference":
        if cu_seqlens is not None:
            offsets.check_values(cu_seqlens, q.shape[0] * q.shape[1])
        return parallax_attention_chunked(q, r, k, v, scale=scale, causal=causal, cu_seqlens=cu_seqlens,
                                          window=window)
    from kernels.parallax.ops import parallax_attention_triton

    # the fused path checks cu_seqlens' values inside its custom op (kernels.parallax.fused)
    return parallax_attention_triton(q, r, k, v, scale=scale, cu_seqlens=cu_seqlens, window=window,
                                     hopper_kernels=hopper_kernels)
