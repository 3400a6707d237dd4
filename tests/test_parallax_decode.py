"""Parallax decode (one query vs a KV cache) against independent fp64 formulas.

The fp64 references here use the explicit weights of SPEC section 1,
w_j = p_j (1 - t_j + tbar), not the streaming accumulators the code uses.
The Triton kernel runs under TRITON_INTERPRET=1 in a subprocess (the variable
must be set before triton is imported); GPU tests run it at real shapes.
"""

import itertools
import math
import os

import pytest
import torch
import torch.nn.functional as F

from kernels import DecodePlan, parallax_decode, rolling_cache_write
from kernels.parallax.decode import parallax_decode_reference
from tests._attention_cases import banded_mask, masked_parallax_fp64
from tests._aten_ops import recorded_ops
from tests._interpret import run_interpreted


# ---------------------------------------------------------------- fp64 formulas
def explicit_decode(q, r, k, v, seqlens=None, scale=None):
    """fp64 decode with explicit weights. q, r (B, 1, Hq, D); k, v (B, L, Hkv, D)."""
    batch, _, hq, dim = q.shape
    hkv = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    out = torch.empty(batch, 1, hq, dim, dtype=torch.float64, device=q.device)
    for b in range(batch):
        n = k.shape[1] if seqlens is None else int(seqlens[b])
        kb = k[b, :n].double().repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # (Hq, n, D)
        vb = v[b, :n].double().repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        qb, rb = q[b, 0].double(), r[b, 0].double()  # (Hq, D)
        p = torch.softmax(scale * torch.einsum("hd,hnd->hn", qb, kb), dim=-1)
        t = torch.einsum("hd,hnd->hn", rb, kb)
        tbar = (p * t).sum(-1, keepdim=True)
        w = p * (1.0 - t + tbar)
        out[b, 0] = torch.einsum("hn,hnd->hd", w, vb)
    return out


def explicit_causal(q, r, k, v, scale=None):
    """fp64 full causal Parallax attention, (B, N, H, D) each (Hq == Hkv here)."""
    n, dim = q.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    qh, rh, kh, vh = (x.double().transpose(1, 2) for x in (q, r, k, v))
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    s = (scale * qh @ kh.transpose(-1, -2)).masked_fill(~causal, -math.inf)
    p = torch.softmax(s, dim=-1)
    t = rh @ kh.transpose(-1, -2)
    tbar = (p * t).sum(-1, keepdim=True)
    vbar = p @ vh
    # SPEC: o = vbar - sum_j p_ij (t_ij - tbar_i) v_j
    return (vbar - (p * (t - tbar)) @ vh).transpose(1, 2)


def windowed_decode(q, r, k, v, seqlens, window, scale=None):
    """fp64 decode reading the last ``window`` of each sequence's valid positions (SPEC 1b for the
    newest query i = len - 1: keys len - window <= j < len), by slicing the caches."""
    outs = []
    for b in range(q.shape[0]):
        n = k.shape[1] if seqlens is None else int(seqlens[b])
        lo = max(0, n - window)
        outs.append(explicit_decode(q[b:b + 1], r[b:b + 1], k[b:b + 1, lo:n], v[b:b + 1, lo:n], scale=scale))
    return torch.cat(outs)


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def make_inputs(batch, length, hq, hkv, dim, dtype=torch.float64, rho=0.5, device="cpu", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(batch, 1, hq, dim, generator=g)
    r = torch.randn(batch, 1, hq, dim, generator=g) * (rho / math.sqrt(dim))
    k = torch.randn(batch, length, hkv, dim, generator=g)
    v = torch.randn(batch, length, hkv, dim, generator=g)
    return [x.to(device=device, dtype=dtype) for x in (q, r, k, v)]


# ---------------------------------------------------------------- reference backend
SHAPES = [  # batch, L, Hq, Hkv, D, seqlens
    (1, 1, 2, 2, 64, None),
    (2, 37, 4, 4, 64, None),
    (2, 37, 4, 2, 128, [37, 5]),
    (3, 50, 8, 2, 64, [1, 50, 23]),
    (2, 9, 4, 1, 128, [9, 4]),
]


@pytest.mark.parametrize("batch,length,hq,hkv,dim,seqlens", SHAPES)
@pytest.mark.parametrize("chunk", [4096, 7])
def test_reference_matches_explicit_fp64(batch, length, hq, hkv, dim, seqlens, chunk):
    q, r, k, v = make_inputs(batch, length, hq, hkv, dim)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
    out = parallax_decode_reference(q, r, k, v, lens, dim**-0.5, chunk=chunk)
    assert rel_err(out, explicit_decode(q, r, k, v, lens)) < 1e-12


def test_reference_large_rho_and_custom_scale():
    q, r, k, v = make_inputs(2, 41, 8, 2, 64, rho=20.0)
    lens = torch.tensor([41, 17], dtype=torch.int32)
    ref = explicit_decode(q, r, k, v, lens, scale=0.3)
    w_range = _weight_range(q, r, k, lens, 0.3)
    assert w_range > 10.0  # the probe really moves the weights far from softmax
    out = parallax_decode(q, r, k, v, cache_seqlens=lens, scale=0.3, backend="reference")
    assert rel_err(out, ref) < 1e-12


@pytest.mark.parametrize("scale", [-0.7, 0.0])
def test_reference_takes_a_scale_of_any_sign(scale):
    """0 weighs the keys read uniformly, a negative scale favours the least similar: the same logits as
    training attention takes (parallax_attention accepts any finite scale), so decode does too."""
    q, r, k, v = make_inputs(2, 41, 8, 2, 64, rho=2.0)
    lens = torch.tensor([41, 17], dtype=torch.int32)
    out = parallax_decode(q, r, k, v, cache_seqlens=lens, scale=scale, backend="reference")
    assert rel_err(out, explicit_decode(q, r, k, v, lens, scale=scale)) < 1e-12
    assert rel_err(out, explicit_decode(q, r, k, v, lens, scale=0.3)) > 1e-2  # the scale was not ignored


def _weight_range(q, r, k, lens, scale):
    b, n = 1, int(lens[1])
    kb = k[b, :n, 0].double()
    p = torch.softmax(scale * kb @ q[b, 0, 0].double(), 0)
    t = kb @ r[b, 0, 0].double()
    w = p * (1 - t + (p * t).sum())
    return (w.max() - w.min()).item() / p.max().item()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-5)])
def test_reference_low_precision_inputs(dtype, tol):
    q, r, k, v = make_inputs(2, 33, 4, 2, 64, dtype=dtype)
    out = parallax_decode(q, r, k, v, backend="reference")
    assert out.dtype == dtype
    # Reference accumulates in fp32: compare with fp64 on the same rounded inputs,
    # allowing the output's own rounding to dtype.
    ref = explicit_decode(q, r, k, v)
    assert rel_err(out, ref) < max(tol, torch.finfo(dtype).eps)


def test_rho_zero_is_softmax_decode():
    q, r, k, v = make_inputs(3, 29, 8, 2, 64)
    r = torch.zeros_like(r)
    lens = torch.tensor([29, 3, 17], dtype=torch.int32)
    out = parallax_decode(q, r, k, v, cache_seqlens=lens, backend="reference")
    mask = (torch.arange(29)[None, :] < lens[:, None].long())[:, None, None, :]  # (B, 1, 1, L)
    sdpa = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(4, 1), v.transpose(1, 2).repeat_interleave(4, 1),
        attn_mask=mask,
    ).transpose(1, 2)
    assert rel_err(out, sdpa) < 1e-12


def test_decode_is_last_row_of_causal_attention():
    batch, n, heads, dim = 2, 23, 4, 64
    g = torch.Generator().manual_seed(3)
    q, r, k, v = (torch.randn(batch, n, heads, dim, generator=g, dtype=torch.float64) for _ in range(4))
    r = r * 0.4
    # Sequence 1 is only 11 tokens long: its cache tail is junk the decode must ignore.
    lens = torch.tensor([n, 11], dtype=torch.int32)
    full = explicit_causal(q, r, k, v)
    short = explicit_causal(q[1:, :11], r[1:, :11], k[1:, :11], v[1:, :11])
    want = torch.stack([full[0, n - 1], short[0, 10]])[:, None]
    qd = torch.stack([q[0, n - 1], q[1, 10]])[:, None]
    rd = torch.stack([r[0, n - 1], r[1, 10]])[:, None]
    k_junk, v_junk = k.clone(), v.clone()
    k_junk[1, 11:], v_junk[1, 11:] = 1e4, -1e4
    out = parallax_decode(qd, rd, k_junk, v_junk, cache_seqlens=lens, backend="reference")
    assert rel_err(out, want) < 1e-12


def test_auto_on_cpu_is_reference():
    q, r, k, v = make_inputs(2, 19, 4, 2, 64, dtype=torch.float32)
    out = parallax_decode(q, r, k, v)
    assert torch.equal(out, parallax_decode(q, r, k, v, backend="reference"))


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a.update(q=a["q"][:, :, :3], r=a["r"][:, :, :3]), "Hq % Hkv"),
        (lambda a: a.update(q=torch.cat([a["q"], a["q"]], 1), r=torch.cat([a["r"], a["r"]], 1)), "one query"),
        (lambda a: a.update(r=a["r"][..., :32]), "r must have q's shape"),
        (lambda a: a.update(v_cache=a["v_cache"][:, :5]), "v_cache must have"),
        (lambda a: a.update(k_cache=a["k_cache"][:1], v_cache=a["v_cache"][:1]), "k_cache must have shape"),
        (lambda a: a.update(cache_seqlens=torch.tensor([0, 3], dtype=torch.int32)), "cache_seqlens values"),
        (lambda a: a.update(cache_seqlens=torch.tensor([3, 20], dtype=torch.int32)), "cache_seqlens values"),
        (lambda a: a.update(cache_seqlens=torch.tensor([3], dtype=torch.int32)), "cache_seqlens must be"),
        (lambda a: a.update(cache_seqlens=torch.tensor([3.0, 2.0])), "cache_seqlens must be int32"),
        (lambda a: a.update(scale=float("nan")), "parallax_decode: scale=nan must be a finite number"),
        (lambda a: a.update(backend="cuda"), "backend must be"),
        (lambda a: a.update(r=a["r"].half()), "r must match"),
        (lambda a: a.update(**{n: a[n][:0] for n in ("q", "r", "k_cache", "v_cache")},
                            cache_seqlens=torch.zeros(0, dtype=torch.int32)), "need batch >= 1"),
        (lambda a: a.update(**{n: a[n][..., :0] for n in ("q", "r", "k_cache", "v_cache")}), "D >= 1"),
        # int64 lengths are range-checked before the int32 cast (2**32 + 4 would wrap to 4)
        (lambda a: a.update(cache_seqlens=torch.tensor([3, 2 ** 32 + 4])),
         r"cache_seqlens values must lie in \[1, L=19\], got min 3, max 4294967300"),
        (lambda a: a.update(check_seqlens=None), "check_seqlens=None must be a bool"),
        (lambda a: a.update(scale="0.3"), "scale='0.3' must be a finite number"),
        (lambda a: a.update(scale=True), "scale=True must be a finite number"),
        (lambda a: a.update(scale=torch.tensor([0.3, 0.2])), r"scale=tensor\(\[0.3000, 0.2000\]\) must be a finite"),
        (lambda a: a.update(window=2 ** 40), "parallax_decode: window=1099511627776 must be at most"),
    ],
)
def test_bad_input_raises(change, match):
    q, r, k, v = make_inputs(2, 19, 4, 2, 64, dtype=torch.float32)
    args = dict(q=q, r=r, k_cache=k, v_cache=v)
    change(args)
    with pytest.raises((ValueError, TypeError), match=match):
        parallax_decode(**args)


# ---------------------------------------------------------------- sliding window
@pytest.mark.parametrize("window", [1, 4, 11, 23, 40])
def test_window_decode_is_last_row_of_banded_attention(window):
    """Decode with a window over a linear cache equals the last row of fp64 banded causal attention
    (explicit mask), per sequence of a ragged batch; junk past each length is ignored."""
    batch, n, hq, hkv, dim = 2, 23, 4, 2, 32
    g = torch.Generator().manual_seed(window)
    q, r = (torch.randn(batch, n, hq, dim, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(batch, n, hkv, dim, generator=g, dtype=torch.float64) for _ in range(2))
    lens = [n, 14]
    want = []
    for b, m in enumerate(lens):
        mask = banded_mask(m, window)
        want.append(masked_parallax_fp64(*(x[b:b + 1, :m] for x in (q, r, k, v)), mask)[0, m - 1])
    k[1, 14:], v[1, 14:] = float("nan"), float("inf")
    qd = torch.stack([q[b, m - 1] for b, m in enumerate(lens)])[:, None]
    rd = torch.stack([r[b, m - 1] for b, m in enumerate(lens)])[:, None]
    out = parallax_decode(qd, rd, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32), window=window,
                          backend="reference")
    assert rel_err(out, torch.stack(want)[:, None]) < 1e-12


def test_rolling_cache_decode_streams_the_banded_rows():
    """A stream written into a rolling cache of W slots (prefill of more than W tokens, then one token
    per step) decodes each step's token as the last row of fp64 banded attention over the stream;
    the cache holds position p in slot p % W."""
    batch, n, hq, hkv, dim, window, prefill = 2, 19, 4, 2, 16, 5, 8
    g = torch.Generator().manual_seed(5)
    q, r = (torch.randn(batch, n, hq, dim, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(batch, n, hkv, dim, generator=g, dtype=torch.float64) for _ in range(2))
    banded = masked_parallax_fp64(q, r, k, v, banded_mask(n, window))
    k_cache, v_cache = (torch.full((batch, window, hkv, dim), float("nan"), dtype=torch.float64) for _ in range(2))
    lens = rolling_cache_write(k_cache, v_cache, k[:, :prefill], v[:, :prefill], torch.zeros(batch, dtype=torch.int64))
    assert lens.dtype == torch.int32 and lens.tolist() == [window] * batch
    for p in range(prefill, n):
        lens = rolling_cache_write(k_cache, v_cache, k[:, p:p + 1], v[:, p:p + 1], torch.full((batch,), p))
        out = parallax_decode(q[:, p:p + 1], r[:, p:p + 1], k_cache, v_cache, cache_seqlens=lens, backend="reference")
        assert rel_err(out, banded[:, p:p + 1]) < 1e-12, p
    for p in range(n - window, n):
        assert torch.equal(k_cache[:, p % window], k[:, p]) and torch.equal(v_cache[:, p % window], v[:, p])


def test_rolling_cache_before_it_fills():
    """Fewer tokens than slots: cache_seqlens counts them and decode reads only those."""
    q, r, k, v = make_inputs(3, 6, 4, 2, 16)
    k_cache, v_cache = (torch.full((3, 8, 2, 16), float("nan"), dtype=torch.float64) for _ in range(2))
    lens = rolling_cache_write(k_cache, v_cache, k, v, torch.zeros(3, dtype=torch.int32))
    assert lens.tolist() == [6, 6, 6]
    out = parallax_decode(q, r, k_cache, v_cache, cache_seqlens=lens, backend="reference")
    assert rel_err(out, explicit_decode(q, r, k, v)) < 1e-12


@pytest.mark.parametrize("change, match", [
    (dict(window=0), "parallax_decode: window=0 must be None or an int >= 1"),
    (dict(window=2.0), "parallax_decode: window=2.0 must be None or an int >= 1"),
])
def test_bad_window_raises(change, match):
    q, r, k, v = make_inputs(2, 19, 4, 2, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match=match):
        parallax_decode(q, r, k, v, **change)


def test_rolling_cache_write_rejects_bad_shapes():
    k_cache = torch.zeros(2, 4, 2, 16)
    with pytest.raises(ValueError, match=r"k, v must be \(batch=2, n, Hkv, D\)"):
        rolling_cache_write(k_cache, k_cache.clone(), torch.zeros(2, 1, 3, 16), torch.zeros(2, 1, 3, 16),
                            torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"start must be an int tensor of shape \(2,\)"):
        rolling_cache_write(k_cache, k_cache.clone(), torch.zeros(2, 1, 2, 16), torch.zeros(2, 1, 2, 16),
                            torch.zeros(2))


@pytest.mark.parametrize("change, match", [
    (dict(k=[0.0]), "rolling_cache_write: k must be a torch.Tensor, got list"),
    (dict(k_cache=torch.zeros(4, 2, 16), v_cache=torch.zeros(4, 2, 16)),
     r"k_cache must be a 4-D \(batch, W, Hkv, D\) floating tensor, got torch.float32 \(4, 2, 16\)"),
    (dict(k_cache=torch.zeros(2, 4, 2, 16, dtype=torch.int64), v_cache=torch.zeros(2, 4, 2, 16, dtype=torch.int64)),
     "k_cache must be a 4-D .* floating tensor, got torch.int64"),
    (dict(k=torch.zeros(2, 1, 2, 16, device="meta"), v=torch.zeros(2, 1, 2, 16, device="meta")),
     "k is on meta, the caches on cpu"),
    (dict(k=torch.zeros(2, 0, 2, 16), v=torch.zeros(2, 0, 2, 16)), "at least one token"),
    (dict(k_cache=torch.zeros(2, 0, 2, 16), v_cache=torch.zeros(2, 0, 2, 16)), "at least one slot"),
    (dict(start=torch.tensor([True, False])), r"start must be an int tensor of shape \(2,\), got torch.bool"),
])
def test_rolling_cache_write_rejects_bad_arguments(change, match):
    args = dict(k_cache=torch.zeros(2, 4, 2, 16), v_cache=torch.zeros(2, 4, 2, 16), k=torch.zeros(2, 1, 2, 16),
                v=torch.zeros(2, 1, 2, 16), start=torch.zeros(2, dtype=torch.int32))
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        rolling_cache_write(**args)


# ---------------------------------------------------------------- DecodePlan and the unchecked path
def test_plan_matches_decode_and_writes_out():
    q, r, k, v = make_inputs(3, 50, 8, 2, 64, dtype=torch.float32)
    lens = torch.tensor([50, 1, 23], dtype=torch.int32)
    plan = DecodePlan.like(q, k, window=30, scale=0.2)
    assert plan.backend == "reference" and plan.num_splits == 1  # CPU tensors
    want = parallax_decode(q, r, k, v, cache_seqlens=lens, window=30, scale=0.2)
    assert torch.equal(plan(q, r, k, v, lens), want)
    out = torch.empty_like(q)
    assert plan(q, r, k, v, lens, out=out) is out and torch.equal(out, want)
    assert rel_err(want, windowed_decode(q, r, k, v, lens, 30, scale=0.2)) < 1e-5


@pytest.mark.parametrize("change, match", [
    (dict(q=torch.zeros(3, 1, 8, 32)), r"DecodePlan: q is torch.float32 \(3, 1, 8, 32\) on cpu; the plan expects "
                                       r"torch.float32 \(3, 1, 8, 64\)"),
    (dict(r=torch.zeros(3, 1, 8, 64, dtype=torch.float64)), "DecodePlan: r is torch.float64"),
    (dict(k_cache=torch.zeros(3, 49, 2, 64)), r"DecodePlan: k_cache is torch.float32 \(3, 49, 2, 64\)"),
    (dict(v_cache=torch.zeros(3, 50, 2, 64, device="meta")), "DecodePlan: v_cache .* on meta"),
    (dict(cache_seqlens=torch.tensor([1, 2, 3])), r"cache_seqlens must be int32 of shape \(3,\) on cpu, got torch.int64"),
    (dict(cache_seqlens=torch.tensor([1, 2], dtype=torch.int32)), r"got torch.int32 \(2,\)"),
    (dict(q=[0.0]), "DecodePlan: q must be a torch.Tensor, got list"),
    (dict(cache_seqlens=[1, 2, 3]), r"cache_seqlens must be int32 of shape \(3,\) on cpu, got list"),
    # the triton path writes out through its strides: a wrong out would be written out of bounds
    (dict(out=torch.empty(3, 1, 8, 32)), r"DecodePlan: out is torch.float32 \(3, 1, 8, 32\) on cpu"),
    (dict(out=torch.empty(3, 1, 8, 64, dtype=torch.float16)), "DecodePlan: out is torch.float16"),
    (dict(out=torch.empty(3, 1, 64, 8).mT), r"out .* last dim contiguous"),
])
def test_plan_rejects_tensors_of_another_geometry(change, match):
    q, r, k, v = make_inputs(3, 50, 8, 2, 64, dtype=torch.float32)
    args = dict(q=q, r=r, k_cache=k, v_cache=v, cache_seqlens=torch.tensor([50, 1, 23], dtype=torch.int32))
    args.update(change)
    plan = DecodePlan(3, 8, 2, 64, 50, torch.float32, "cpu")
    with pytest.raises(ValueError, match=match):
        plan(**args)


@pytest.mark.parametrize("kwargs, match", [
    (dict(hq=6), r"sizes must be ints >= 1 with hq % hkv == 0, got \{'batch': 2, 'hq': 6, 'hkv': 4"),
    (dict(cache_len=0), "'cache_len': 0"),
    (dict(dtype=torch.int32), "dtype and cache_dtype must be floating"),
    (dict(backend="cuda"), "backend must be one of"),
    (dict(window=0), "DecodePlan: window=0 must be None or an int >= 1"),
    (dict(scale=float("inf")), "DecodePlan: scale=inf must be a finite number"),
    (dict(scale="0.2"), "DecodePlan: scale='0.2' must be a finite number"),
    (dict(batch=True), "'batch': True"),
    (dict(dtype="float32"), "DecodePlan: dtype and cache_dtype must be floating torch.dtypes, got 'float32'"),
    (dict(dtype=None), "DecodePlan: dtype and cache_dtype must be floating torch.dtypes, got None"),
])
def test_plan_rejects_bad_geometry(kwargs, match):
    args = dict(batch=2, hq=8, hkv=4, head_dim=64, cache_len=10, dtype=torch.float32, device="cpu")
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        DecodePlan(**args)


def test_unchecked_seqlens_skip_the_value_check():
    """check_seqlens=False reads no values: an out-of-range length passes and is clamped to L."""
    q, r, k, v = make_inputs(2, 19, 4, 2, 64, dtype=torch.float32)
    lens = torch.tensor([19, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cache_seqlens values must lie in \[1, L=19\], got min 19, max 20"):
        parallax_decode(q, r, k, v, cache_seqlens=lens)
    out = parallax_decode(q, r, k, v, cache_seqlens=lens, check_seqlens=False)
    assert rel_err(out, explicit_decode(q, r, k, v)) < 1e-5


def test_an_empty_sequence_unchecked_gives_zeros_and_finite_gradients_in_the_reference():
    """Length 0 with check_seqlens=False: the reference gives zeros for that sequence (as the kernel
    writes) and finite gradients to every input; the other sequence is the explicit decode's."""
    q, r, k, v = (x.double().requires_grad_() for x in make_inputs(2, 19, 4, 2, 32, dtype=torch.float32))
    lens = torch.tensor([0, 7], dtype=torch.int32)
    out = parallax_decode_reference(q, r, k, v, lens, 32**-0.5)
    assert not out[0].any()
    assert rel_err(out[1:], explicit_decode(q[1:], r[1:], k[1:], v[1:], lens[1:])) < 1e-12
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, r, k, v))
    assert not q.grad[0].any() and not r.grad[0].any()


def test_seqlens_on_another_device_rejected():
    q, r, k, v = make_inputs(2, 19, 4, 2, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="cache_seqlens is on meta, expected q's device cpu"):
        parallax_decode(q, r, k, v, cache_seqlens=torch.tensor([3, 4], dtype=torch.int32, device="meta"))


# ---------------------------------------------------------------- Triton, interpreted
# (batch, L, Hq, Hkv, D, seqlens, dtype, rho, knobs)
INTERP_CASES = [
    (1, 1, 2, 2, 16, None, "float32", 0.5, {}),
    (2, 37, 4, 2, 32, [37, 5], "float32", 0.5, dict(block_n=16, num_splits=3, fused_merge=True)),
    (2, 37, 4, 2, 32, [37, 5], "float32", 0.5, dict(block_n=16, num_splits=3)),
    # the separate merge over four slices of D per head, four heads per group
    (2, 37, 8, 2, 32, [37, 5], "float32", 0.5, dict(block_n=16, num_splits=5, merge_block_d=8)),
    (3, 45, 4, 1, 16, [1, 45, 20], "float32", 20.0, dict(block_n=16, num_splits=4)),
    (2, 33, 8, 2, 64, [33, 16], "float32", 0.5, dict(block_n=16)),
    (1, 64, 8, 8, 16, None, "float16", 0.5, dict(block_n=16, num_splits=2)),
    (2, 50, 16, 1, 32, [50, 9], "float16", 5.0, dict(block_n=32, num_splits=2)),
    # sliding window over a linear cache: positions before len - window hold junk too
    (2, 37, 4, 2, 32, [37, 5], "float32", 0.5, dict(block_n=16, num_splits=2, window=20)),
    (3, 45, 4, 1, 16, [1, 45, 20], "float32", 20.0, dict(block_n=16, num_splits=3, window=7)),
    (2, 33, 8, 2, 64, [33, 16], "float32", 0.5, dict(block_n=16, window=1)),
    (1, 64, 8, 8, 16, None, "float16", 0.5, dict(block_n=16, num_splits=2, window=40)),
]


def _interpret_jobs():
    """Child process (``tests._interpret.run_interpreted``, TRITON_INTERPRET=1), one job."""
    return [lambda: {"results": _interpreter_results()}]


def _interpreter_results():
    """INTERP_CASES and the cases below through the Triton kernel under the interpreter: per-case results."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from kernels.parallax.decode_fused import parallax_decode_triton

    results = []
    for i, (batch, length, hq, hkv, dim, seqlens, dtype, rho, knobs) in enumerate(INTERP_CASES):
        q, r, k, v = make_inputs(batch, length, hq, hkv, dim, dtype=getattr(torch, dtype), rho=rho, seed=i)
        lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
        window = knobs.get("window")
        ref = explicit_decode(q, r, k, v, lens) if window is None else windowed_decode(q, r, k, v, lens, window)
        for b, n in enumerate(seqlens or [length]):  # junk outside each sequence's window must not leak in
            k[b, n:], v[b, n:] = float("nan"), float("inf")
            k[b, :max(0, n - (window or n))], v[b, :max(0, n - (window or n))] = float("nan"), float("inf")
        out = parallax_decode_triton(q, r, k, v, lens, dim**-0.5, **knobs)
        results.append({"case": i, "err": rel_err(out, ref), "finite": bool(torch.isfinite(out).all())})
    results.append(_rolling_case())
    results.append(_plan_case())
    results.append(_bad_merge_block_case(parallax_decode_triton))
    results.append(_empty_sequence_case(parallax_decode_triton))
    q, r, k, v = make_inputs(2, 21, 4, 2, 32, dtype=torch.float32)
    api = parallax_decode(q, r, k, v, backend="triton")
    results.append({"case": "api", "err": rel_err(api, explicit_decode(q, r, k, v)),
                    "finite": bool(torch.isfinite(api).all())})
    for scale in SIGNED_SCALES:
        out = parallax_decode(q, r, k, v, scale=scale, backend="triton")
        results.append({"case": f"scale {scale}", "err": rel_err(out, explicit_decode(q, r, k, v, scale=scale)),
                        "finite": bool(torch.isfinite(out).all())})
    return results


SIGNED_SCALES = (-0.7, 0.0)


def _empty_sequence_case(parallax_decode_triton):
    """A sequence of length 0 passed unchecked: the kernel writes zeros for it, as the reference gives."""
    q, r, k, v = make_inputs(2, 21, 4, 2, 32, dtype=torch.float32)
    lens = torch.tensor([0, 9], dtype=torch.int32)
    out = parallax_decode_triton(q, r, k, v, lens, 32**-0.5, block_n=16, num_splits=2)
    ref = parallax_decode_reference(q, r, k, v, lens, 32**-0.5)
    return {"case": "empty", "err": rel_err(out, ref), "finite": bool(torch.isfinite(out).all()) and
            not out[0].any() and bool(out[1].any())}


def _plan_case():
    """A DecodePlan (split launch) against fp64, and the tensor work of its call beside the public
    API's: the API with check_seqlens=False runs exactly the plan's ops (its plan is cached: no
    scratch allocated, no host read), the checked API adds only the min/max read of cache_seqlens."""
    q, r, k, v = make_inputs(2, 300, 4, 2, 32, dtype=torch.float32, seed=4)
    lens = torch.tensor([300, 17], dtype=torch.int32)
    plan = DecodePlan.like(q, k, backend="triton", window=200)
    out = plan(q, r, k, v, lens)
    api = parallax_decode(q, r, k, v, cache_seqlens=lens, window=200, backend="triton")  # builds its plan
    plan_ops = recorded_ops(lambda: plan(q, r, k, v, lens))
    lean_ops = recorded_ops(lambda: parallax_decode(q, r, k, v, cache_seqlens=lens, window=200, backend="triton",
                                                    check_seqlens=False))
    checked_ops = recorded_ops(lambda: parallax_decode(q, r, k, v, cache_seqlens=lens, window=200,
                                                       backend="triton"))
    return {"case": "plan", "err": rel_err(out, windowed_decode(q, r, k, v, lens, 200)),
            "finite": bool(torch.isfinite(out).all()), "splits": plan.num_splits, "same_as_api": torch.equal(out, api),
            "plan_first_op": plan_ops[0], "lean_is_plan": lean_ops == plan_ops,
            "checked_extra": checked_ops[:len(checked_ops) - len(plan_ops)],
            "checked_rest_is_plan": checked_ops[len(checked_ops) - len(plan_ops):] == plan_ops}


BAD_MERGE_BLOCKS = [0, -8, 3, 48, 64, 16.0, True]  # at D = 32


def _bad_merge_block_case(parallax_decode_triton):
    """The error of each bad merge_block_d at D = 32 ("" where none was raised)."""
    q, r, k, v = make_inputs(1, 20, 4, 2, 32, dtype=torch.float32)
    messages = []
    for bad in BAD_MERGE_BLOCKS:
        try:
            parallax_decode_triton(q, r, k, v, None, 0.25, num_splits=2, merge_block_d=bad)
            messages.append("")
        except ValueError as exc:
            messages.append(str(exc))
    return {"case": "bad_merge_block_d", "messages": messages, "err": 0.0, "finite": True}


def _rolling_case():
    """The Triton kernel through the public API over a rolling cache of 6 slots holding the last 6 of
    13 tokens (each sequence at its own position), against fp64 decode of the linear stream's window."""
    q, r, k, v = make_inputs(2, 13, 4, 2, 32, dtype=torch.float32, seed=3)
    k_cache, v_cache = (torch.full((2, 6, 2, 32), float("nan")) for _ in range(2))
    lens = rolling_cache_write(k_cache, v_cache, k[:, :12], v[:, :12], torch.zeros(2, dtype=torch.int64))
    lens = rolling_cache_write(k_cache, v_cache, k[:, 12:], v[:, 12:], torch.full((2,), 12))
    out = parallax_decode(q, r, k_cache, v_cache, cache_seqlens=lens, backend="triton")
    ref = windowed_decode(q, r, k, v, None, 6)
    return {"case": "rolling", "err": rel_err(out, ref), "finite": bool(torch.isfinite(out).all())}


def test_triton_kernel_interpreted(tmp_path):
    results = run_interpreted("tests.test_parallax_decode", tmp_path)["results"]
    assert len(results) == len(INTERP_CASES) + 5 + len(SIGNED_SCALES)
    bad = next(res for res in results if res["case"] == "bad_merge_block_d")
    for value, message in zip(BAD_MERGE_BLOCKS, bad["messages"]):
        assert f"merge_block_d must be an int >= 1 that divides the head dim 32, got {value!r}" in message
    plan = next(res for res in results if res["case"] == "plan")
    assert plan["splits"] > 1 and plan["same_as_api"]
    assert plan["plan_first_op"] == "aten.empty_like.default"  # the output, then the interpreter's copies
    assert plan["lean_is_plan"] and plan["checked_rest_is_plan"]
    assert plan["checked_extra"] == ["aten.aminmax.default", "aten.stack.default"]
    for res in results:
        case = res["case"]
        tol = 1e-5 if isinstance(case, str) or INTERP_CASES[case][6] == "float32" else 5e-3
        assert res["finite"] and res["err"] < tol, res



# ---------------------------------------------------------------- GPU, real shapes
GPU_SHAPES = [  # batch, L, Hq, Hkv, D, ragged, rho, dtype
    (4, 4099, 16, 8, 128, True, 0.5, torch.bfloat16),
    (4, 4099, 16, 8, 64, True, 0.5, torch.bfloat16),
    (1, 16384, 16, 8, 128, False, 0.5, torch.bfloat16),
    (2, 3001, 16, 16, 128, True, 0.5, torch.float16),
    (2, 3001, 16, 4, 64, True, 0.5, torch.bfloat16),
    (3, 2048, 16, 8, 128, True, 20.0, torch.bfloat16),
    (64, 1024, 16, 8, 128, False, 0.5, torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch,length,hq,hkv,dim,ragged,rho,dtype", GPU_SHAPES)
def test_triton_gpu_matches_fp64(batch, length, hq, hkv, dim, ragged, rho, dtype):
    q, r, k, v = make_inputs(batch, length, hq, hkv, dim, dtype=dtype, rho=rho, device="cuda")
    lens = None
    if ragged:
        g = torch.Generator().manual_seed(1)
        lens = torch.randint(1, length + 1, (batch,), generator=g, dtype=torch.int32)
        lens[0] = length
        lens = lens.cuda()
    ref = explicit_decode(q, r, k, v, lens)
    from kernels.parallax.decode_fused import parallax_decode_triton

    outs = {}
    for fused in (False, True):
        outs[fused] = parallax_decode_triton(q, r, k, v, lens, dim**-0.5, fused_merge=fused)
        assert outs[fused].dtype == dtype and torch.isfinite(outs[fused]).all()
        assert rel_err(outs[fused], ref) < (2e-2 if rho > 5 else 1e-2)
    assert torch.equal(parallax_decode(q, r, k, v, cache_seqlens=lens), outs[False])  # the default merge


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("scale", SIGNED_SCALES)
@pytest.mark.parametrize("dim", [128, 64])
def test_triton_gpu_takes_a_scale_of_any_sign(scale, dim):
    """bf16 decode over 4099 ragged positions at scale 0 (uniform weights) and a negative scale, both
    merges, against fp64: the split-KV merge's running max and the base-2 scores hold for any sign."""
    q, r, k, v = make_inputs(4, 4099, 16, 8, dim, dtype=torch.bfloat16, rho=0.5, device="cuda", seed=5)
    lens = torch.tensor([4099, 17, 2048, 1], dtype=torch.int32, device="cuda")
    ref = explicit_decode(q, r, k, v, lens, scale=scale)
    from kernels.parallax.decode_fused import parallax_decode_triton

    for fused in (False, True):
        out = parallax_decode_triton(q, r, k, v, lens, scale, fused_merge=fused)
        assert torch.isfinite(out).all() and rel_err(out, ref) < 1e-2, (fused, rel_err(out, ref))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch, length, dim, window", [(4, 4099, 128, 1000), (1, 16384, 128, 4096),
                                                        (4, 4099, 64, 1), (2, 3001, 64, 3001)])
def test_triton_gpu_window_matches_fp64(batch, length, dim, window):
    """bf16 decode with a window over a linear cache (ragged lengths) against fp64 over each
    sequence's last ``window`` positions; positions outside hold NaN/inf junk."""
    q, r, k, v = make_inputs(batch, length, 16, 8, dim, dtype=torch.bfloat16, device="cuda")
    lens = torch.randint(1, length + 1, (batch,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    lens[0] = length
    ref = windowed_decode(q, r, k, v, lens, window)
    for b, n in enumerate(lens.tolist()):
        k[b, n:], v[b, n:] = float("nan"), float("inf")
        k[b, :max(0, n - window)], v[b, :max(0, n - window)] = float("nan"), float("inf")
    out = parallax_decode(q, r, k, v, cache_seqlens=lens.cuda(), window=window)
    assert torch.isfinite(out).all() and rel_err(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_gpu_rolling_cache_matches_fp64():
    """A rolling cache of 1024 slots holding the last 1024 of 5000 tokens (prefill, then 7 single
    tokens), batch 4 at different positions, against fp64 decode of the linear stream's window."""
    batch, n, window = 4, 5000, 1024
    q, r, k, v = make_inputs(batch, n, 16, 8, 128, dtype=torch.bfloat16, device="cuda", seed=4)
    k_cache, v_cache = (torch.full((batch, window, 8, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    starts = torch.tensor([0, 0, 3000, 4500], device="cuda")
    rolling_cache_write(k_cache, v_cache, k[:, :n - 7], v[:, :n - 7], starts)
    for p in range(n - 7, n):
        lens = rolling_cache_write(k_cache, v_cache, k[:, p:p + 1], v[:, p:p + 1], starts + p)
    out = parallax_decode(q, r, k_cache, v_cache, cache_seqlens=lens)
    assert lens.tolist() == [window] * batch
    # every sequence holds the last 1024 of tokens 0..n-1 (its start only shifts the slots)
    assert rel_err(out, windowed_decode(q, r, k, v, None, window)) < 1e-2


def _lean_inputs(batch=1, length=4096, dim=128):
    q, r, k, v = make_inputs(batch, length, 16, 8, dim, dtype=torch.bfloat16, device="cuda")
    return q, r, k, v, torch.full((batch,), length, dtype=torch.int32, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_lean_decode_paths_do_not_sync():
    """DecodePlan calls and parallax_decode with check_seqlens=False (or without cache_seqlens) run
    under sync debug mode "error"; the checked call syncs (so the mode does catch it)."""
    q, r, k, v, lens = _lean_inputs()
    plan = DecodePlan.like(q, k)
    want = plan(q, r, k, v, lens)
    parallax_decode(q, r, k, v, cache_seqlens=lens, check_seqlens=False)  # builds the cached plan
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [plan(q, r, k, v, lens), parallax_decode(q, r, k, v, cache_seqlens=lens, check_seqlens=False),
                parallax_decode(q, r, k, v)]
        with pytest.raises(RuntimeError, match="synchroniz"):
            parallax_decode(q, r, k, v, cache_seqlens=lens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.equal(out, want) for out in outs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_plan_repeat_calls_match_a_fresh_launch():
    """Repeat calls of a plan (launched without triton's argument binding) give the bits of a fresh
    plan's first launch, also for a q that is a view at an offset not 16-byte aligned (another
    compiled variant) and without cache_seqlens."""
    from kernels.parallax.decode_fused import parallax_decode_triton

    q, r, k, v, lens = _lean_inputs(batch=2)
    lens[1] = 1000
    plan = DecodePlan.like(q, k)
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")[1:].view(q.shape)  # 2-byte offset
    shifted.copy_(q)
    for args in ((q, r, k, v, lens), (shifted, r, k, v, lens), (q, r, k, v, None)):
        fresh = parallax_decode_triton(*args, 128 ** -0.5)
        assert all(torch.equal(plan(*args), fresh) for _ in range(3))
    assert rel_err(plan(q, r, k, v, lens), explicit_decode(q, r, k, v, lens.cpu())) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_plan_allocates_only_its_output():
    q, r, k, v, lens = _lean_inputs()
    plan = DecodePlan.like(q, k)
    out = plan(q, r, k, v, lens)
    assert plan.num_splits > 1  # the split path, with its scratch
    torch.cuda.synchronize()
    count = lambda: torch.cuda.memory_stats()["allocation.all.allocated"]  # noqa: E731
    before = count()
    for _ in range(10):
        plan(q, r, k, v, lens, out=out)
    middle = count()
    for _ in range(10):
        plan(q, r, k, v, lens)
    assert (middle - before, count() - middle) == (0, 10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_plan_replays_in_a_cuda_graph():
    """A captured plan call follows new queries and lengths written into its static inputs."""
    q, r, k, v, lens = _lean_inputs(batch=2)
    plan = DecodePlan.like(q, k, window=3000)
    plan(q, r, k, v, lens)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan(q, r, k, v, lens)
    for seed, new_lens in ((1, [4096, 17]), (2, [1, 3001])):
        q.copy_(make_inputs(2, 1, 16, 8, 128, dtype=torch.bfloat16, device="cuda", seed=seed)[0])
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        graph.replay()
        assert torch.equal(out, plan(q, r, k, v, lens))
        assert rel_err(out, windowed_decode(q, r, k, v, lens.cpu(), 3000)) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a CUDA device of compute capability 9.0 or newer")
@pytest.mark.parametrize("batch, length, fused_merge", [(1, 4096, False), (1, 16384, True), (4, 999, False),
                                                        (32, 4096, False)])
def test_gpu_pdl_decode_waits_for_the_kernel_before_it(batch, length, fused_merge):
    """Under graph replay each call's cache is written by the copy kernel launched just before it:
    with programmatic dependent launch a split kernel that read before its wait would see the
    previous call's cache. Every call matches the same plan launched without PDL, bit for bit,
    and the fp64 formula."""
    from kernels.parallax.decode_fused import TritonDecodePlan

    q, r, k, v, lens = _lean_inputs(batch=batch, length=length)
    caches = [make_inputs(batch, length, 16, 8, 128, dtype=torch.bfloat16, device="cuda", seed=s)[2:]
              for s in range(4)]
    kw = dict(scale=128 ** -0.5, fused_merge=fused_merge)
    plans = {pdl: TritonDecodePlan(batch, 16, 8, 128, length, q.dtype, q.device, pdl=pdl, **kw)
             for pdl in (True, False)}
    assert plans[True].pdl and (batch > 1 or plans[True].split)
    plans[True](q, r, k, v, lens)  # compiles outside the capture
    torch.cuda.synchronize()
    graph, outs = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        for kc, vc in caches:
            k.copy_(kc)
            v.copy_(vc)
            outs.append(plans[True](q, r, k, v, lens))
    graph.replay()
    torch.cuda.synchronize()
    for out, (kc, vc) in zip(outs, caches):
        assert torch.equal(out, plans[False](q, r, kc, vc, lens))
        assert rel_err(out, explicit_decode(q, r, kc, vc, lens.cpu())) < 1e-2


def host_us_per_call(fns, calls=200, repeats=9):
    """Microseconds of host time per call of each function in ``fns`` (name -> fn): calls enqueued
    back to back (the kernels queue, the host does not wait on them), the functions interleaved,
    the fastest of ``repeats`` rounds (what the code costs, without the noise of a shared host)."""
    import time

    rounds = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            rounds[name].append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return {name: min(times) for name, times in rounds.items()}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decode_host_cost():
    """Host time per eager call at B1 L4096 D128 (the issue's shape), printed, and compared within the
    run: a plan call costs less than the public API without the value check, which costs at most
    two thirds of the checked call (that one syncs)."""
    q, r, k, v, lens = _lean_inputs()
    plan = DecodePlan.like(q, k)
    out = torch.empty_like(q)
    times = host_us_per_call({
        "plan_out": lambda: plan(q, r, k, v, lens, out=out), "plan": lambda: plan(q, r, k, v, lens),
        "unchecked": lambda: parallax_decode(q, r, k, v, cache_seqlens=lens, check_seqlens=False),
        "checked": lambda: parallax_decode(q, r, k, v, cache_seqlens=lens)})
    print({name: round(us, 1) for name, us in times.items()})
    assert times["plan"] < times["unchecked"] < times["checked"] / 1.5, times


def test_pdl_is_hopper_only_and_for_split_plans(monkeypatch):
    """Programmatic dependent launch is on by default only where the device has it (CUDA, compute
    capability 9.0 or newer) and the plan splits (two launches per call); asking for it elsewhere,
    or with a non-bool, is refused at plan time."""
    from kernels.parallax import decode_fused

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a CPU plan: built, never launched
    assert decode_fused.pdl_supported("cpu") is False
    plan = lambda **kw: decode_fused.TritonDecodePlan(1, 16, 8, 128, 4096, torch.bfloat16, "cpu",  # noqa: E731
                                                      scale=0.1, **kw)
    assert plan().split and plan().pdl is False and plan(pdl=False).pdl is False
    assert plan()._meta["PDL"] is False and "launch_pdl" not in plan()._meta
    with pytest.raises(ValueError, match=r"pdl=True needs a CUDA device of compute capability 9\.0"):
        plan(pdl=True)
    with pytest.raises(TypeError, match="pdl must be None, True or False, got 'yes'"):
        plan(pdl="yes")
    monkeypatch.setattr(decode_fused, "pdl_supported", lambda device: True)  # as on an H200
    split, single = plan(), plan(num_splits=1)
    assert split.pdl and split._meta["launch_pdl"] and split._merge_meta["PDL"]
    assert not single.split and single.pdl is False and single._meta["PDL"] is False
    assert plan(num_splits=1, pdl=True).pdl is True


@pytest.mark.parametrize("name", ["_decode_split_kernel", "_merge_kernel"])
def test_pdl_kernels_wait_before_any_global_access(name):
    """Compiled for sm_90 with PDL, a decode kernel's grid-dependency wait comes before its first
    global load, store or atomic, and it releases its dependents; without PDL neither instruction
    is emitted (PTX order; the SASS is ACQBULK and PREEXIT)."""
    import re

    from kernels.parallax import decode_fused
    from scripts.bench import kernel_resources as kr

    kernel = getattr(decode_fused, name)
    types = {"SEQLENS": "*i32", "COUNTER": "*i32", "PO": "*fp32", "PM": "*fp32", "PD1": "*fp32", "PD2": "*fp32",
             "scale_log2": "fp32", "Q": "*bf16", "R": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16"}
    consts = dict(HKV=8, G=2, D=128, SP=32)
    if name == "_decode_split_kernel":
        consts.update(HP=8, BN=64, HAS_SEQLENS=True, SPLIT=True, FUSED_MERGE=True, IEEE=False)
    else:
        consts.update(DM=32)
    for pdl in (True, False):
        ptx = kr.compile_kernel(kernel, {**consts, "PDL": pdl}, 4, 3, types=types, divisible=set()).asm["ptx"]
        body = ptx[ptx.index(".entry"):]
        first_access = re.search(r"\b(ld|st|atom|red)\.global", body).start()
        wait = body.find("griddepcontrol.wait")
        assert (0 <= wait < first_access) == pdl
        assert ("griddepcontrol.launch_dependents" in body) == pdl


def test_launch_config_by_group_count():
    """Measured H200 choices (docs/kernels_decode.md): batch 1 and 32 keep the latency configs; batch
    128 (1024 groups at Hkv 8) takes 2 stages at D=128 and 8 warps at D=64."""
    from kernels.parallax.decode_fused import pick_config

    cpu = torch.device("cpu")  # the H200's 132 SMs are assumed off-GPU
    assert pick_config(8, 128, cpu) == (64, 4, 3) and pick_config(256, 128, cpu) == (64, 4, 3)
    assert pick_config(1024, 128, cpu) == (64, 4, 2) and pick_config(1024, 64, cpu) == (128, 8, 3)
    assert pick_config(1024, 32, cpu) == (32, 4, 2)  # no measured config for this head dim


def test_split_chunks_cover_the_span_in_whole_blocks_and_never_split_more_than_asked():
    """split_chunk over spans, requests and blocks: chunks are whole blocks, the splits cover the span
    with no empty split, never exceed the request, and a request that rounds shows it (48 -> 32)."""
    from kernels.parallax import decode_fused as dec

    for span, asked, block_n in itertools.product((1, 100, 4096, 4097, 16384, 50_000), (1, 2, 33, 48, 64), (32, 64)):
        chunk, splits = dec.split_chunk(span, asked, block_n)
        assert chunk % block_n == 0 and 1 <= splits <= asked
        assert chunk * (splits - 1) < span <= chunk * splits
    assert dec.split_chunk(4096, 48, 64) == (128, 32) and dec.split_chunk(4096, 32, 64) == (128, 32)
    assert dec.split_chunk(16384, 32, 64) == (512, 32)


@pytest.mark.parametrize("n_groups, length, block_n, slots", [
    (8, 4096, 64, 264), (8, 16384, 64, 264), (8, 32768, 128, 264), (8, 100, 64, 264),
    (128, 16384, 64, 264), (256, 16384, 64, 264), (1024, 4096, 64, 396), (3, 50_000, 32, 16),
])
def test_split_count_is_the_shortest_one_wave_split(n_groups, length, block_n, slots):
    """pick_num_splits against a brute force over every count: all programs in one wave, at least
    tuning.DECODE_MIN_CHUNK positions per split, and no other admissible count walks fewer blocks per split
    (or as few with fewer splits); one split once the groups alone fill a wave."""
    from kernels.parallax import decode_fused as dec
    from kernels.parallax import tuning

    splits = dec.pick_num_splits(n_groups, length, block_n, slots)
    blocks = lambda s: -(-(-(-length // s)) // block_n)  # noqa: E731
    admissible = [s for s in range(1, dec.MAX_SPLITS + 1)
                  if n_groups * s <= slots and (s == 1 or -(-length // s) >= tuning.DECODE_MIN_CHUNK)]
    best = min(admissible or [1], key=lambda s: (blocks(s), s))
    assert splits == best
    if n_groups * 2 > slots:
        assert splits == 1
    if (n_groups, length, block_n) == (8, 16384, 64):
        assert splits == 32 and blocks(32) == 8  # equal chunks of 512, not a ragged 29
