"""Parallax decode: one new query token against a KV cache.

Math (SPEC section 1), per query head h reading kv head h // (Hq / Hkv):

    p_j = softmax_j(scale * q . k_j),  t_j = r . k_j  (r not scaled)
    o   = (1 + tbar) vbar - sum_j p_j t_j v_j,  vbar = sum p_j v_j, tbar = sum p_j t_j

The query is the newest token, whose own k/v are already in the cache, so it
attends to every valid cache position (no causal mask inside the cache).

Sliding window (SPEC 1b, ``window=W``): the query reads the last W valid positions of
its cache row. Two cache layouts give the same result: a linear cache (position p in
slot p; decode reads slots [len - W, len)), or a rolling cache of exactly W slots
(position p in slot p % W, ``rolling_cache_write``), where every valid slot is in the
window. Keys carry RoPE from before they were cached, so the order of the slots does not
matter to the softmax: decode over a rolling cache is plain decode over its valid slots.

Backends: ``reference`` (pure PyTorch, any device, fp32 or fp64 accumulation,
chunked over L, differentiable through autograd), ``triton`` (fused split-KV kernel,
``decode_fused``, forward only), ``auto`` (triton on CUDA when the kernel supports the inputs
and no input needs a gradient, else reference).
"""

from __future__ import annotations

import functools
import math

import torch

from kernels.checks import check_scale, grad_required, refuse_grad
from kernels.parallax.attention import check_window

_BACKENDS = ("auto", "reference", "triton")
_REFERENCE_CHUNK = 4096
_GRADIENTS = "the reference backend is differentiable (parallax_decode with backend='reference' or 'auto')"


def parallax_decode(q, r, k_cache, v_cache, *, cache_seqlens=None, scale=None, backend="auto", window=None,
                    check_seqlens=True):
    """Parallax attention for one query token per sequence against a KV cache.

    Args:
        q, r: (batch, 1, Hq, D) query and probe rows, same dtype and device; batch, Hq, D >= 1.
        k_cache, v_cache: (batch, L, Hkv, D) caches, L >= 1, Hq % Hkv == 0 (GQA).
        cache_seqlens: optional int32 (batch,) number of valid cache positions
            per sequence, each in [1, L]; default all L.
        scale: softmax scale for q . k (r is never scaled), a finite number; default 1/sqrt(D).
        backend: "auto", "reference" or "triton". The triton kernel has no backward: while autograd
            records and an input requires grad, "auto" takes the reference (differentiable) and
            "triton" raises a ValueError naming those inputs.
        window: optional sliding window W (int in [1, 2^31 - 1]): each sequence reads only its last W
            valid positions, [len - W, len). A rolling cache of W slots
            (``rolling_cache_write``) needs no window argument: all its valid slots qualify.
        check_seqlens: a bool: check that cache_seqlens lies in [1, L] (ValueError otherwise). The
            check reads the values on the host: one sync per call, which waits for the queued
            GPU work (skipped while a CUDA graph is captured). Pass False when the values are
            known good (a model's position counter); the triton kernel clamps them to [0, L]
            either way, so it never reads outside the cache.

    Returns:
        (batch, 1, Hq, D) tensor in q's dtype; through the reference, differentiable w.r.t. q, r and
        the caches.

    The launch plan (configuration, split count, scratch) is cached per geometry; a
    ``DecodePlan`` built once also skips the validation here (the leanest path, CUDA graphs).
    """
    if backend not in _BACKENDS:
        raise ValueError(f"parallax_decode: backend must be one of {_BACKENDS}, got {backend!r}")
    check_window(window, who="parallax_decode")
    if not isinstance(check_seqlens, bool):
        raise ValueError(f"parallax_decode: check_seqlens={check_seqlens!r} must be a bool")
    seqlens = _check_inputs(q, r, k_cache, v_cache, cache_seqlens, check_seqlens)
    scale = check_scale("parallax_decode", scale, q.shape[-1])
    named = {"q": q, "r": r, "k_cache": k_cache, "v_cache": v_cache}
    if backend == "auto" and grad_required(named):
        backend = "reference"  # the triton kernel has no backward
    elif backend == "triton":
        refuse_grad("parallax_decode", named, _GRADIENTS)
    batch, _, hq, dim = q.shape
    plan = _cached_plan(batch, hq, k_cache.shape[2], dim, k_cache.shape[1], q.dtype, k_cache.dtype, q.device,
                        window, scale, backend)
    return plan.run(q, r, k_cache, v_cache, seqlens)


class DecodePlan:
    """``parallax_decode`` for one geometry with the per-call host work done once.

    Construction validates the geometry, picks the backend ("auto": triton on CUDA when the
    kernel supports dtype and head dim), the launch configuration and the split count, and
    allocates the split scratch. A call checks only that the tensors match the plan (shapes,
    dtypes, device: no value reads, no host sync), launches the split kernel (and, with several
    splits, the merge kernel) and allocates the output (or writes ``out``), so it can be captured
    in a CUDA graph (call it once before capturing: the first call compiles the kernels).

    Args:
        batch, hq, hkv, head_dim, cache_len: the geometry of q (batch, 1, hq, head_dim) and of
            the caches (batch, cache_len, hkv, head_dim).
        dtype: of q and r; cache_dtype: of the caches (default dtype): floating torch.dtypes; device.
        window, scale, backend: as ``parallax_decode``.

    cache_seqlens is trusted: int32 (batch,) with values in [1, cache_len] (wrong values give
    wrong results; the triton kernel clamps them to [0, cache_len], 0 gives zeros). One call
    at a time: calls share the scratch, so calls on several streams at once would race.
    A triton plan is forward only: a call while autograd records an input that requires grad
    raises a ValueError (a reference plan is differentiable).
    """

    def __init__(self, batch, hq, hkv, head_dim, cache_len, dtype, device, *, cache_dtype=None, window=None,
                 scale=None, backend="auto"):
        sizes = dict(batch=batch, hq=hq, hkv=hkv, head_dim=head_dim, cache_len=cache_len)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in sizes.values()) or hq % hkv:
            raise ValueError(f"DecodePlan: sizes must be ints >= 1 with hq % hkv == 0, got {sizes}")
        cache_dtype = cache_dtype or dtype
        if not all(isinstance(x, torch.dtype) and x.is_floating_point for x in (dtype, cache_dtype)):
            raise TypeError(f"DecodePlan: dtype and cache_dtype must be floating torch.dtypes, got {dtype!r}, "
                            f"{cache_dtype!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"DecodePlan: backend must be one of {_BACKENDS}, got {backend!r}")
        check_window(window, who="DecodePlan")
        from kernels.parallax import decode_fused

        self.device = _indexed(torch.device(device))
        self.dtype, self.cache_dtype, self.window = dtype, cache_dtype, window
        self.scale = check_scale("DecodePlan", scale, head_dim)
        self._q_shape, self._kv_shape = (batch, 1, hq, head_dim), (batch, cache_len, hkv, head_dim)
        fits = decode_fused.supports(dtype, head_dim) and cache_dtype == dtype
        if backend == "auto":
            backend = "triton" if self.device.type == "cuda" and fits else "reference"
        if backend == "triton" and not fits:
            raise TypeError(f"DecodePlan: backend='triton' needs q, r and the caches of one dtype in "
                            f"(bfloat16, float16, float32) and a power-of-2 head dim in [16, 256]; got dtype "
                            f"{dtype}, cache_dtype {cache_dtype}, head_dim {head_dim}")
        self.backend = backend
        self._triton = None
        self._out_strides = None  # the last strides of an ``out`` found valid
        if backend == "triton":
            self._triton = decode_fused.TritonDecodePlan(batch, hq, hkv, head_dim, cache_len, dtype, self.device,
                                                         scale=self.scale, window=window)

    @classmethod
    def like(cls, q, k_cache, **kwargs):
        """The plan for tensors shaped like q (batch, 1, Hq, D) and k_cache (batch, L, Hkv, D); kwargs
        as the constructor's (window, scale, backend)."""
        for name, x in (("q", q), ("k_cache", k_cache)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"DecodePlan.like: {name} must be a 4-D tensor, got {got}")
        batch, _, hq, dim = q.shape
        return cls(batch, hq, k_cache.shape[2], dim, k_cache.shape[1], q.dtype, q.device, cache_dtype=k_cache.dtype,
                   **kwargs)

    @property
    def num_splits(self):
        """Splits per (batch, kv head) of the triton launch (1 for the reference backend)."""
        return self._triton.num_splits if self._triton is not None else 1

    def __call__(self, q, r, k_cache, v_cache, cache_seqlens=None, *, out=None):
        """(batch, 1, Hq, D) in the plan's dtype, for tensors of the plan's geometry (ValueError
        naming the tensor otherwise); ``out``: optional tensor of q's shape, the plan's dtype and
        device, last dim contiguous and no two elements at one address (not an expanded view: the
        kernel would write several heads to one row), to write into."""
        tensors = [("q", q, self._q_shape, self.dtype), ("r", r, self._q_shape, self.dtype),
                   ("k_cache", k_cache, self._kv_shape, self.cache_dtype),
                   ("v_cache", v_cache, self._kv_shape, self.cache_dtype)]
        if out is not None:
            tensors.append(("out", out, self._q_shape, self.dtype))
        for name, x, shape, dtype in tensors:
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"DecodePlan: {name} must be a torch.Tensor, got {type(x).__name__}")
            if x.shape != shape or x.dtype != dtype or x.device != self.device:
                raise ValueError(f"DecodePlan: {name} is {x.dtype} {tuple(x.shape)} on {x.device}; the plan "
                                 f"expects {dtype} {shape} on {self.device}")
        if out is not None and out.stride() != self._out_strides:
            if out.stride(-1) != 1 or _overlapping(out):
                raise ValueError(f"DecodePlan: out must have its last dim contiguous (stride 1) and no two elements "
                                 f"at one address, got strides {out.stride()} for shape {tuple(out.shape)}")
            self._out_strides = out.stride()  # checked once per layout: a plan call's host time is the point
        if cache_seqlens is not None and (not isinstance(cache_seqlens, torch.Tensor)
                                          or cache_seqlens.shape != self._q_shape[:1] or cache_seqlens.device != self.device
                                          or cache_seqlens.dtype != torch.int32):
            got = (f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)} on {cache_seqlens.device}"
                   if isinstance(cache_seqlens, torch.Tensor) else type(cache_seqlens).__name__)
            raise ValueError(f"DecodePlan: cache_seqlens must be int32 of shape {self._q_shape[:1]} on {self.device}, "
                             f"got {got}")
        if self._triton is not None:
            refuse_grad("DecodePlan", {"q": q, "r": r, "k_cache": k_cache, "v_cache": v_cache}, _GRADIENTS)
        return self.run(q, r, k_cache, v_cache, cache_seqlens, out)

    def run(self, q, r, k_cache, v_cache, cache_seqlens=None, out=None):
        """``__call__`` without the checks: inputs already validated (``parallax_decode``)."""
        if self._triton is not None:
            return self._triton(q, r, k_cache, v_cache, cache_seqlens, out)
        o = parallax_decode_reference(q, r, k_cache, v_cache, cache_seqlens, self.scale, window=self.window)
        return o if out is None else out.copy_(o)


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index: a tensor made on "cuda" is on "cuda:<current>", which a bare "cuda"
    does not equal (a plan built for "cuda" refused every tensor)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _overlapping(x):
    """Whether two elements of x might share an address: its dims of size > 1, by increasing stride,
    must each step past all the offsets of the ones before (strides 0, or heads closer than D apart,
    do not). Every layout of slices, transposes and permutes of a buffer passes."""
    reach = 0  # the largest offset the dims so far reach
    for stride, size in sorted((st, n) for st, n in zip(x.stride(), x.shape) if n > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


@functools.lru_cache(maxsize=32)
def _cached_plan(batch, hq, hkv, dim, length, dtype, cache_dtype, device, window, scale, backend):
    return DecodePlan(batch, hq, hkv, dim, length, dtype, device, cache_dtype=cache_dtype, window=window,
                      scale=scale, backend=backend)


def rolling_cache_write(k_cache, v_cache, k, v, start):
    """Write new tokens into rolling (ring) KV caches of W = k_cache.shape[1] slots, in place.

    k_cache, v_cache: (batch, W, Hkv, D) floating, W >= 1, no two elements at one address (not an
    expanded view: a write to one slot would land in others). k, v: (batch, n, Hkv, D) floating, n >= 1,
    on the caches' device, the tokens at absolute positions start[b] + [0, n), RoPE already applied at
    those positions. start: int tensor (batch,) on the caches' device, values >= 0 (not checked: no host
    sync). The token at position p goes to slot p % W; of n > W new tokens only the last W are
    written (the rest would be overwritten). No host sync. ValueError / TypeError for bad arguments.
    Returns cache_seqlens, int32 (batch,) = min(start + n, W): the valid slots to pass to
    ``parallax_decode(..., cache_seqlens=...)``, which then attends to the last W positions.
    """
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"rolling_cache_write: {name} must be a torch.Tensor, got {type(x).__name__}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"rolling_cache_write: {name} must be a 4-D (batch, W, Hkv, D) floating tensor, got "
                             f"{x.dtype} {tuple(x.shape)}")
        if _overlapping(x):
            raise ValueError(f"rolling_cache_write: {name} has elements at one address (strides {x.stride()} for "
                             f"shape {tuple(x.shape)}: an expanded view?); a write to one slot would land in others")
    for name, x in (("k", k), ("v", v)):
        if not x.is_floating_point():  # an int or bool token would be cast into the cache as numbers
            raise ValueError(f"rolling_cache_write: {name} must be a floating tensor, got {x.dtype}")
    for name, x in (("v_cache", v_cache), ("k", k), ("v", v), ("start", start)):
        if isinstance(x, torch.Tensor) and x.device != k_cache.device:
            raise ValueError(f"rolling_cache_write: {name} is on {x.device}, the caches on {k_cache.device}")
    batch, width = k_cache.shape[:2]
    token_shape = (batch, *k_cache.shape[2:])  # (batch, Hkv, D)
    if k_cache.shape != v_cache.shape or k.shape != v.shape or (k.shape[0], *k.shape[2:]) != token_shape:
        raise ValueError(f"rolling_cache_write: k, v must be (batch={batch}, n, Hkv, D) like the caches' "
                         f"{tuple(k_cache.shape)}; got k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"v_cache {tuple(v_cache.shape)}")
    if (not isinstance(start, torch.Tensor) or start.shape != (batch,) or start.is_floating_point()
            or start.is_complex() or start.dtype == torch.bool):
        got = f"{start.dtype} tensor of shape {tuple(start.shape)}" if isinstance(start, torch.Tensor) else start
        raise ValueError(f"rolling_cache_write: start must be an int tensor of shape ({batch},), got {got}")
    n = k.shape[1]
    if n < 1 or width < 1:
        raise ValueError(f"rolling_cache_write: needs at least one token (k has n={n}) and at least one slot (the "
                         f"caches have W={width})")
    keep = min(n, width)  # distinct slots: the writes never collide, so the result is deterministic
    pos = start.to(torch.int64)[:, None] + (n - keep) + torch.arange(keep, device=k_cache.device)
    rows = torch.arange(batch, device=k_cache.device)[:, None].expand(batch, keep)
    k_cache[rows, pos % width] = k[:, n - keep:].to(k_cache.dtype)
    v_cache[rows, pos % width] = v[:, n - keep:].to(v_cache.dtype)
    return torch.clamp(pos[:, -1] + 1, max=width).to(torch.int32)


def parallax_decode_reference(q, r, k_cache, v_cache, cache_seqlens, scale, chunk=_REFERENCE_CHUNK, window=None):
    """Streaming PyTorch reference (fp32 accumulation, fp64 for fp64 inputs).

    Same shapes as ``parallax_decode``; ``cache_seqlens`` is an int tensor (batch,)
    or None, ``scale`` a float, ``window`` None or an int >= 1. Walks the cache in chunks of ``chunk`` positions
    with the online-softmax rescale shared by the four accumulators, so memory
    stays O(batch * Hq * (chunk + D)) whatever L is. Differentiable through autograd; slots outside
    a sequence's valid range reach neither the output nor any gradient, whatever they hold.
    """
    batch, _, hq, dim = q.shape
    length, hkv = k_cache.shape[1], k_cache.shape[2]
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = hq // hkv
    qg = q.reshape(batch, hkv, group, dim).to(acc_dtype) * scale
    rg = r.reshape(batch, hkv, group, dim).to(acc_dtype)
    if cache_seqlens is None:
        lens = torch.full((batch,), length, device=q.device)
    else:
        lens = cache_seqlens.to(q.device, torch.int64)
    lens = torch.clamp(lens, 0, length)  # as the kernel does with unchecked values
    first = torch.clamp(lens - (window or length), min=0)  # each sequence reads [first, len)
    m = torch.full((batch, hkv, group), -math.inf, dtype=acc_dtype, device=q.device)
    d1 = torch.zeros_like(m)
    d2 = torch.zeros_like(m)
    o1 = torch.zeros(batch, hkv, group, dim, dtype=acc_dtype, device=q.device)
    o2 = torch.zeros_like(o1)
    for lo in range(0, length, chunk):
        pos = torch.arange(lo, min(lo + chunk, length), device=q.device)
        valid = (pos[None, :] < lens[:, None]) & (pos[None, :] >= first[:, None])  # (batch, chunk)
        # slots outside may hold inf or NaN: 0 * inf in the sums, and in the backward dq = sum_c ds_c k_c
        # with ds_c = 0 there (the keys zeroed too, not only their scores)
        kc, vc = (x[:, lo : lo + chunk].to(acc_dtype).masked_fill(~valid[:, :, None, None], 0.0)
                  for x in (k_cache, v_cache))
        s1 = torch.einsum("bhgd,bchd->bhgc", qg, kc).masked_fill(~valid[:, None, None, :], -math.inf)
        t = torch.einsum("bhgd,bchd->bhgc", rg, kc)
        m_new = torch.maximum(m, s1.amax(dim=-1))
        # A chunk wholly past a short sequence leaves m at -inf; pivot on 0 then.
        pivot = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - pivot)
        p = torch.exp(s1 - pivot[..., None])
        d1 = d1 * alpha + p.sum(-1)
        d2 = d2 * alpha + (p * t).sum(-1)
        o1 = o1 * alpha[..., None] + torch.einsum("bhgc,bchd->bhgd", p, vc)
        o2 = o2 * alpha[..., None] + torch.einsum("bhgc,bchd->bhgd", p * t, vc)
        m = m_new
    # an empty sequence (length 0, unchecked) reads nothing: zeros, as the kernel writes, and no NaN
    # in any gradient (its d1, d2, o1, o2 are 0, so dividing by 1 gives 0)
    inv = 1.0 / torch.where(d1 > 0, d1, torch.ones_like(d1))
    out = (1.0 + d2 * inv)[..., None] * o1 * inv[..., None] - o2 * inv[..., None]
    return out.reshape(batch, 1, hq, dim).to(q.dtype)


def _check_inputs(q, r, k_cache, v_cache, cache_seqlens, check_values=True):
    """Validate shapes, dtypes, devices (and cache_seqlens' values when check_values); return
    cache_seqlens as int32 or None."""
    for name, x in (("q", q), ("r", r), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"parallax_decode: {name} must be a 4-D tensor, got {got}")
        if not x.is_floating_point():
            raise TypeError(f"parallax_decode: {name} must be a floating tensor, got dtype {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"parallax_decode: {name} is on {x.device}, expected q's device {q.device}")
    if q.shape[1] != 1:
        raise ValueError(f"parallax_decode: q must have shape (batch, 1, Hq, D) (one query token), "
                         f"got {tuple(q.shape)}")
    if r.shape != q.shape:
        raise ValueError(f"parallax_decode: r must have q's shape {tuple(q.shape)}, got {tuple(r.shape)}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"parallax_decode: v_cache must have k_cache's shape {tuple(k_cache.shape)}, "
                         f"got {tuple(v_cache.shape)}")
    batch, _, hq, dim = q.shape
    kb, length, hkv, kd = k_cache.shape
    if kb != batch or kd != dim:
        raise ValueError(
            f"parallax_decode: k_cache must have shape (batch={batch}, L, Hkv, D={dim}), got {tuple(k_cache.shape)}"
        )
    if batch < 1 or length < 1 or hq < 1 or hkv < 1 or dim < 1 or hq % hkv != 0:
        raise ValueError(f"parallax_decode: need batch >= 1, L >= 1, Hq >= 1, Hkv >= 1, D >= 1 and Hq % Hkv == 0, "
                         f"got batch={batch}, L={length}, Hq={hq}, Hkv={hkv}, D={dim}")
    if r.dtype != q.dtype or v_cache.dtype != k_cache.dtype:
        raise TypeError(
            f"parallax_decode: r must match q's dtype and v_cache k_cache's: got q {q.dtype}, r {r.dtype}, "
            f"k_cache {k_cache.dtype}, v_cache {v_cache.dtype}"
        )
    if cache_seqlens is None:
        return None
    return _check_seqlens(cache_seqlens, batch, length, q.device, check_values)


def _check_seqlens(cache_seqlens, batch, length, device, check_values):
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.shape != (batch,):
        got = tuple(cache_seqlens.shape) if isinstance(cache_seqlens, torch.Tensor) else cache_seqlens
        raise ValueError(f"parallax_decode: cache_seqlens must be a tensor of shape ({batch},), got {got}")
    if cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"parallax_decode: cache_seqlens must be int32 (or int64), got {cache_seqlens.dtype}")
    if cache_seqlens.device != device:
        raise ValueError(f"parallax_decode: cache_seqlens is on {cache_seqlens.device}, expected q's device {device}")
    # The value check needs a host sync (one copy of min and max), which a CUDA graph capture forbids.
    # It reads the values before the int32 cast, at which int64 lengths of 2^31 or more would wrap.
    if check_values and not (cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        lo, hi = torch.stack(torch.aminmax(cache_seqlens)).tolist()
        if lo < 1 or hi > length:
            raise ValueError(f"parallax_decode: cache_seqlens values must lie in [1, L={length}], "
                             f"got min {lo}, max {hi}")
    return cache_seqlens.to(dtype=torch.int32).contiguous()
