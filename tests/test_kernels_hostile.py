"""Hostile arguments to the kernels' public functions: each is refused by name before any work, or,
where it is valid, computes what the fp64 formula gives.

CPU (one test needs CUDA). The decode kernel runs under TRITON_INTERPRET=1 in one child process
(``tests._interpret.run_interpreted``): a strided cache_seqlens and caches whose offsets pass 2^31
elements, against fp64, and an ``out`` expanded over the heads.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import (AffineState, DecodePlan, affine_mesanet, exact_lla, exact_lla_cost, parallax_attention,
                     parallax_decode, rolling_cache_write)
from kernels.gram import naive as gram_naive
from tests._interpret import rel_err, run_interpreted

HUGE = 10 ** 400  # a Python int beyond the float range: math.isfinite raises OverflowError on it


def _decode_inputs(batch=2, length=9, hq=4, hkv=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 1, hq, dim, generator=g)
    r = torch.randn(batch, 1, hq, dim, generator=g) / math.sqrt(dim)
    k, v = (torch.randn(batch, length, hkv, dim, generator=g) for _ in range(2))
    return q, r, k, v


def _family_inputs():
    """q (1, 5, 4, 8) and k, v (1, 5, 2, 8)."""
    g = torch.Generator().manual_seed(1)
    return [torch.randn(1, 5, heads, 8, generator=g) for heads in (4, 2, 2)]


def _split_norm_rope_huge_eps():
    from kernels import split_norm_rope

    y = torch.zeros(1, 3, 6 * 8)
    split_norm_rope(y, 2, 1, [torch.ones(8)] * 3, HUGE, torch.zeros(3, 16))


# ---------------------------------------------------------------- numbers beyond the float range
@pytest.mark.parametrize("call, match", [
    (lambda: parallax_decode(*_decode_inputs(), scale=HUGE), "parallax_decode: scale must be a finite positive"),
    (lambda: DecodePlan(1, 4, 2, 16, 9, torch.float32, "cpu", scale=HUGE),
     "DecodePlan: scale must be a finite positive"),
    (lambda: parallax_attention(*(torch.zeros(1, 3, 2, 8),) * 4, scale=HUGE), "parallax_attention: scale="),
    (lambda: exact_lla(*_family_inputs(), lam=0.1, scale=HUGE), "exact_lla: scale="),
    (lambda: affine_mesanet(*_family_inputs(), lam=HUGE), "affine_mesanet: lam="),
    (lambda: AffineState.zeros(1, 2, 8, with_kk=True).update(*(torch.ones(1, 1, 2, 8),) * 2).affine_mesanet(
        torch.ones(1, 1, 4, 8), lam=-HUGE), "AffineState.affine_mesanet: lam="),
    (lambda: gram_naive.symmetric_product(torch.ones(3, 4), alpha=HUGE), "symmetric_product: alpha must be"),
    (_split_norm_rope_huge_eps, "split_norm_rope: eps="),
])
def test_ints_beyond_the_float_range_are_refused_by_name(call, match):
    """A number argument of 10**400 is not a finite float: a ValueError naming the argument, not
    math.isfinite's OverflowError from inside the check."""
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- decode API
@pytest.mark.parametrize("change, match", [
    (dict(q=torch.zeros(2, 4, 16)), r"parallax_decode: q must be a 4-D tensor, got \(2, 4, 16\)"),
    (dict(k_cache=torch.zeros(2, 9, 2, 16, dtype=torch.int32)), "parallax_decode: k_cache must be a floating tensor"),
    (dict(cache_seqlens=torch.tensor([1, 2, 3], dtype=torch.int32)), "parallax_decode: cache_seqlens must be a tensor"),
    (dict(cache_seqlens=torch.tensor([0, 2], dtype=torch.int32)), r"parallax_decode: cache_seqlens values must lie"),
    (dict(backend="fast"), "parallax_decode: backend must be one of"),
])
def test_decode_errors_name_the_function(change, match):
    """parallax_decode's refusals name it, as parallax_attention's do."""
    q, r, k, v = _decode_inputs()
    args = {**dict(q=q, r=r, k_cache=k, v_cache=v), **change}
    with pytest.raises((ValueError, TypeError), match=match):
        parallax_decode(**args)


@pytest.mark.parametrize("q, k, match", [
    (torch.zeros(2, 4, 16), torch.zeros(2, 9, 2, 16), r"DecodePlan.like: q must be a 4-D tensor, got \(2, 4, 16\)"),
    ([0.0], torch.zeros(2, 9, 2, 16), "DecodePlan.like: q must be a 4-D tensor, got list"),
    (torch.zeros(2, 1, 4, 16), None, "DecodePlan.like: k_cache must be a 4-D tensor, got NoneType"),
])
def test_decode_plan_like_names_a_tensor_of_the_wrong_rank(q, k, match):
    """Not an unpacking error or an AttributeError from reading the shape."""
    with pytest.raises(ValueError, match=match):
        DecodePlan.like(q, k)


def _expanded_out_error(backend):
    """The error of a plan call whose ``out`` is one row per sequence expanded over the heads ("" where
    none was raised), and whether ``out`` was left as it was."""
    q, r, k, v = _decode_inputs()
    out = torch.zeros(2, 1, 1, 16).expand(2, 1, 4, 16)
    try:
        DecodePlan.like(q, k, backend=backend)(q, r, k, v, out=out)
        return "", not out.any()
    except (ValueError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}", not out.any()


def test_plan_refuses_an_out_whose_elements_share_addresses():
    """The triton kernel wrote the heads of a sequence over each other into the one row of an expanded
    ``out`` (interpreted test below); the reference path failed in copy_ with a RuntimeError."""
    message, untouched = _expanded_out_error("reference")
    assert message.startswith("ValueError: DecodePlan: out must have its last dim contiguous (stride 1) and no two "
                              "elements at one address, got strides (16, 16, 0, 1)")
    assert untouched


def test_a_plan_for_cuda_takes_the_current_cuda_device(monkeypatch):
    """Tensors made on "cuda" are on "cuda:<current>", which torch.device("cuda") does not equal: a
    plan built for "cuda" refused every tensor. (No GPU here: the reference backend allocates nothing.)"""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    plan = DecodePlan(1, 2, 1, 16, 8, torch.float32, "cuda", backend="reference")
    assert plan.device == torch.device("cuda", 3)
    assert DecodePlan(1, 2, 1, 16, 8, torch.float32, "cuda:1", backend="reference").device == torch.device("cuda", 1)
    assert DecodePlan(1, 2, 1, 16, 8, torch.float32, "cpu").device == torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_rolling_cache_write_refuses_non_float_tokens(dtype):
    """int or bool k / v were cast into the float cache as numbers (True -> 1.0) without a word."""
    caches = [torch.zeros(2, 4, 2, 8) for _ in range(2)]
    token = torch.ones(2, 1, 2, 8, dtype=dtype)
    for k, v, name in ((token, torch.ones(2, 1, 2, 8), "k"), (torch.ones(2, 1, 2, 8), token, "v")):
        with pytest.raises(ValueError, match=f"rolling_cache_write: {name} must be a floating tensor, got {dtype}"):
            rolling_cache_write(*caches, k, v, torch.zeros(2, dtype=torch.int64))
    assert all(not c.any() for c in caches)  # refused before any write


# ---------------------------------------------------------------- family
@pytest.mark.parametrize("args, kwargs, match", [
    ((-2, 8, 3, 4), {}, "exact_lla_cost: batch=-2 must be an int >= 0"),
    ((2, -8, 3, 4), {}, "exact_lla_cost: seq_len=-8 must be an int >= 0"),
    ((2, 8, 2.5, 4), {}, "exact_lla_cost: q_heads=2.5 must be an int >= 0"),
    ((2, 8, 3, True), {}, "exact_lla_cost: head_dim=True must be an int >= 0"),
    ((2, 8, 3, 4, "cg"), dict(cg_steps=0), "exact_lla_cost: cg_steps=0 must be an int >= 1"),
    ((2, 8, 3, 4, "cg"), dict(cg_steps=-3), "exact_lla_cost: cg_steps=-3 must be an int >= 1"),
])
def test_exact_lla_cost_refuses_sizes_that_are_not_counts(args, kwargs, match):
    """A negative size gave a negative cost (under any max_cost), a float one a float cost."""
    with pytest.raises(ValueError, match=match):
        exact_lla_cost(*args, **kwargs)


def test_exact_lla_cost_of_counts():
    b, n, h, d = 2, 8, 3, 4
    assert exact_lla_cost(b, n, h, d) == b * h * n * (n * d * d + d ** 3)
    assert exact_lla_cost(b, n, h, d, "cg") == b * h * n * n * d * (d + 4)
    assert exact_lla_cost(0, n, h, d) == 0


@pytest.mark.parametrize("build", [
    lambda flag: AffineState.zeros(1, 2, 4, with_kk=flag),
    lambda flag: AffineState.from_sequence(torch.ones(1, 3, 2, 4), torch.ones(1, 3, 2, 4), with_kk=flag),
])
@pytest.mark.parametrize("flag", ["no", None, 1])
def test_affine_state_with_kk_must_be_a_bool(build, flag):
    """with_kk='no' built the s_kk sums and None skipped them: a bool is asked for, as elsewhere."""
    with pytest.raises(ValueError, match=f"with_kk={flag!r} must be a bool"):
        build(flag)


# ---------------------------------------------------------------- decode kernel, interpreted
def _interpret_jobs():
    """Child process (TRITON_INTERPRET=1): one job."""
    return [lambda: {"strided_seqlens": _strided_seqlens_case(), "wide": _wide_offsets_case(),
                     "expanded_out": _expanded_out_error("triton")}]


def _strided_seqlens_case():
    """A DecodePlan (triton) given every other element of a longer lengths tensor: the kernel read
    lengths at SEQLENS + b, i.e. the wrong rows' lengths. Relative error against fp64."""
    from tests.test_parallax_decode import explicit_decode

    q, r, k, v = _decode_inputs(batch=3, length=40, seed=2)
    lens = torch.tensor([40, 0, 5, 0, 17, 0], dtype=torch.int32)[::2]
    for b, n in enumerate(lens.tolist()):  # junk past each length must not leak in
        k[b, n:], v[b, n:] = float("nan"), float("inf")
    want = explicit_decode(q, r, k, v, lens)
    errors = []
    for backend in ("triton", "reference"):
        plan = DecodePlan.like(q, k, backend=backend)
        errors.append(rel_err(plan(q, r, k, v, lens), want))
    return errors


def _wide_offsets_case(device="cpu", dtype=torch.float16, dim=16):
    """Caches as views whose position stride is 2^27 elements (16-bit: one 4 GiB allocation, of which
    only the rows read are touched): position 16 lies 2^31 elements in, and a step of 16 positions
    is 2^31 elements, past the kernel's 32-bit offsets. Relative errors against fp64 with one split
    (the loop's step) and two (a split starting at position 16); None where the allocation fails."""
    from kernels.parallax.decode_fused import parallax_decode_triton
    from tests.test_parallax_decode import explicit_decode

    length, stride = 17, 2 ** 27
    try:
        buffer = torch.empty((length - 1) * stride + 2 * dim, dtype=dtype, device=device)
    except RuntimeError:  # no 4 GiB of address space here
        return None
    k, v = (buffer.as_strided((1, length, 1, dim), (length * stride, stride, dim, 1), offset)
            for offset in (0, dim))
    q, r, k0, v0 = _decode_inputs(batch=1, length=length, hq=2, hkv=1, dim=dim, seed=3)
    k.copy_(k0)
    v.copy_(v0)
    q, r = q.to(device, dtype), r.to(device, dtype)
    want = explicit_decode(q, r, k, v)
    return [rel_err(parallax_decode_triton(q, r, k, v, None, dim ** -0.5, block_n=16, num_splits=splits), want)
            for splits in (1, 2)]


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return run_interpreted("tests.test_kernels_hostile", tmp_path_factory.mktemp("hostile"))


def test_plan_reads_a_strided_cache_seqlens(interpreted):
    triton_err, reference_err = interpreted["strided_seqlens"]
    assert reference_err < 1e-5
    assert triton_err < 1e-5


def test_triton_plan_refuses_an_out_whose_elements_share_addresses(interpreted):
    message, untouched = interpreted["expanded_out"]
    assert message.startswith("ValueError: DecodePlan: out must have its last dim contiguous") and untouched


def test_decode_kernel_reaches_cache_offsets_past_2_to_the_31(interpreted):
    """Before 64-bit offsets the child crashed reading below the caches (the offsets wrapped)."""
    if interpreted["wide"] is None:
        pytest.skip("a 4 GiB CPU allocation failed")
    assert all(err < 5e-3 for err in interpreted["wide"]), interpreted["wide"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decode_kernel_reaches_cache_offsets_past_2_to_the_31():
    errors = _wide_offsets_case("cuda", torch.bfloat16, dim=64)
    assert errors is not None and all(err < 1e-2 for err in errors), errors
