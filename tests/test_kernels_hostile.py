"""Hostile arguments to the kernels' public functions: each is refused by name before any work, or,
where it is valid, computes what the fp64 formula gives.

CPU (the ``gpu`` tests need CUDA, one of them two devices). The Triton kernels run under
TRITON_INTERPRET=1 in one child process (``tests._interpret.run_interpreted``): a strided
cache_seqlens, caches whose offsets pass 2^31 elements, and q, r, out and Affine LA inputs whose
head offsets do, against fp64; an ``out`` expanded over the heads; launches over more than 65535
(batch x heads) and the symmetric product's batch split into launches, their grids recorded; the
64-bit offset variants forced on small inputs, bit for bit against the 32-bit ones. In this process:
the launch grids at such sizes, the device guard every launcher enters, and which calls take the
64-bit offsets (tensors on the meta device: no memory).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from kernels import (AffineState, DecodePlan, affine_mesanet, exact_lla, exact_lla_cost, parallax_attention,
                     parallax_decode, rolling_cache_write)
from kernels import launcher
from kernels.gram import naive as gram_naive
from tests._interpret import rel_err, run_interpreted

HUGE = 10 ** 400  # a Python int beyond the float range: math.isfinite raises OverflowError on it
MANY = 65537  # batch x heads past CUDA's limit on a grid's second and third dims (65535)


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
    (lambda: parallax_decode(*_decode_inputs(), scale=HUGE), r"parallax_decode: scale=10+ must be a finite number"),
    (lambda: DecodePlan(1, 4, 2, 16, 9, torch.float32, "cpu", scale=HUGE),
     r"DecodePlan: scale=10+ must be a finite number"),
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


@pytest.mark.parametrize("name", ["k_cache", "v_cache"])
def test_rolling_cache_write_refuses_an_expanded_cache(name):
    """A cache expanded over its slots (stride 0) took every write into all of its slots at once."""
    caches = {"k_cache": torch.zeros(2, 4, 2, 8), "v_cache": torch.zeros(2, 4, 2, 8)}
    caches[name] = torch.zeros(2, 1, 2, 8).expand(2, 4, 2, 8)
    with pytest.raises(ValueError, match=rf"rolling_cache_write: {name} has elements at one address \(strides "
                                         r"\(16, 0, 8, 1\) for shape \(2, 4, 2, 8\)"):
        rolling_cache_write(caches["k_cache"], caches["v_cache"], torch.ones(2, 1, 2, 8), torch.ones(2, 1, 2, 8),
                            torch.zeros(2, dtype=torch.int64))
    assert not any(c.any() for c in caches.values())


def test_rolling_cache_write_refuses_start_on_another_device():
    """A start elsewhere than the caches failed in the copy to their device (meta: NotImplementedError)."""
    with pytest.raises(ValueError, match="rolling_cache_write: start is on meta, the caches on cpu"):
        rolling_cache_write(torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8), torch.ones(2, 1, 2, 8),
                            torch.ones(2, 1, 2, 8), torch.zeros(2, dtype=torch.int64, device="meta"))


def test_triton_attention_refuses_float64_by_name():
    """The fused kernels take 16-bit or fp32 tiles (the documented dtypes): fp64 inputs went into them
    all the same, a Triton CompilationError deep in the forward on an H200 (under the interpreter they
    even ran, through numpy)."""
    q = torch.zeros(1, 4, 2, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"parallax_attention: backend='triton' needs q, r, k, v of a dtype in "
                                         r"\(torch.float16, torch.bfloat16, torch.float32\), got torch.float64"):
        parallax_attention(q, q, q, q, backend="triton")


def test_attention_auto_takes_the_reference_for_float64_on_cuda():
    """"auto" sent causal fp64 CUDA inputs to the fused kernels (which fail to compile for them); they
    take the reference now."""
    from kernels.parallax.attention import _resolve_backend

    class CudaInput:  # what the dispatch reads of q: its device kind and dtype
        is_cuda = True

        def __init__(self, dtype):
            self.dtype = dtype

    assert [_resolve_backend("auto", CudaInput(dtype), True) for dtype in (torch.bfloat16, torch.float64)] == [
        "triton", "reference"]


# ---------------------------------------------------------------- autograd through forward-only kernels
def test_decode_reference_gradients_match_fp64_with_junk_past_the_lengths():
    """parallax_decode is differentiable through its reference: output and gradients against the fp64
    formula's autograd. Slots past a sequence's length hold NaN keys and inf values: the forward
    masked them, but the backward multiplied the keys by zero score gradients (dq = sum ds * k: 0 * NaN),
    so q's gradient was NaN."""
    from tests.test_parallax_decode import explicit_decode

    q, r, k, v = (x.double() for x in _decode_inputs(batch=3, length=11, seed=14))
    lens = torch.tensor([11, 4, 7], dtype=torch.int32)
    junk_k, junk_v = k.clone(), v.clone()
    for b, n in enumerate(lens.tolist()):
        junk_k[b, n:], junk_v[b, n:] = float("nan"), float("inf")
    got = _with_grads(lambda *x: parallax_decode(*x, cache_seqlens=lens), q, r, junk_k, junk_v)
    want = _with_grads(lambda *x: explicit_decode(*x, lens), q, r, k, v)
    assert got[0].grad_fn is not None
    assert all(rel_err(a, b) < 1e-6 for a, b in zip(got, want)), [rel_err(a, b) for a, b in zip(got, want)]


def test_decode_auto_takes_the_reference_when_an_input_requires_grad(monkeypatch):
    """The triton kernel has no backward: "auto" (triton on CUDA) plans the reference for a call that
    autograd records with an input requiring grad, and keeps "auto" otherwise."""
    from kernels.parallax import decode

    planned, cached_plan = [], decode._cached_plan

    def plan(*args):  # the backend asked for, last; a reference plan runs (the CPU has no kernel)
        planned.append(args[-1])
        return cached_plan(*args[:-1], "reference")

    monkeypatch.setattr(decode, "_cached_plan", plan)
    q, r, k, v = _decode_inputs()
    parallax_decode(q, r, k, v)
    parallax_decode(q, r, k.requires_grad_(), v)
    with torch.no_grad():
        parallax_decode(q, r, k, v)
    assert planned == ["auto", "reference", "auto"]


@pytest.mark.parametrize("name", ["q", "r", "k_cache", "v_cache"])
def test_triton_decode_refuses_inputs_that_require_grad(monkeypatch, name):
    """parallax_decode(backend="triton") and a triton DecodePlan returned an output without grad_fn
    for inputs that require grad: the gradients silently stopped there."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a triton plan on the CPU: built, refused before its launch
    tensors = dict(zip(("q", "r", "k_cache", "v_cache"), _decode_inputs()))
    tensors[name].requires_grad_()
    plan = DecodePlan.like(tensors["q"], tensors["k_cache"], backend="triton")
    for who, call in (("parallax_decode", lambda: parallax_decode(**tensors, backend="triton")),
                      ("DecodePlan", lambda: plan(*tensors.values()))):
        with pytest.raises(ValueError, match=rf"{who}: {name} requires grad, but this path has no backward .*"
                                             r"the reference backend is differentiable"):
            call()


def test_triton_decode_without_grad_mode_is_not_refused():
    """Under torch.no_grad the same call passes the check (and, on the CPU, stops at the device)."""
    q, r, k, v = _decode_inputs()
    with torch.no_grad(), pytest.raises(RuntimeError, match="triton decode needs CUDA tensors"):
        parallax_decode(q.requires_grad_(), r, k, v, backend="triton")


@pytest.mark.parametrize("name", ["P", "Y", "scale"])
def test_symmetric_product_kernel_refuses_inputs_that_require_grad(name):
    """The Triton symmetric product has no backward; its output carried no gradient to P, Y or scale."""
    from kernels.gram.fused import symmetric_product

    args = {"P": torch.ones(2, 3, 4), "Y": torch.ones(2, 3, 3), "scale": torch.ones(2)}
    args[name].requires_grad_()
    with pytest.raises(ValueError, match=rf"symmetric_product: {name} requires grad, .*"
                                         r"kernels.gram.naive.symmetric_product is differentiable"):
        symmetric_product(**args)
    with torch.no_grad(), pytest.raises(ValueError, match="the Triton kernel needs CUDA tensors"):
        symmetric_product(**args)


def test_split_norm_rope_refuses_a_table_that_requires_grad():
    """The kernels' backward gives y and the weights their gradients: a learned RoPE table got none."""
    from kernels import split_norm_rope

    y, weights, table = torch.zeros(1, 3, 6 * 8), [torch.ones(8)] * 3, torch.zeros(3, 16, requires_grad=True)
    with pytest.raises(ValueError, match="split_norm_rope: table requires grad, but the kernels' backward has no "
                                         "gradient for the RoPE table"):
        split_norm_rope(y, 2, 1, weights, 1e-6, table)
    with torch.no_grad(), pytest.raises(ValueError, match="split_norm_rope: needs CUDA tensors"):
        split_norm_rope(y, 2, 1, weights, 1e-6, table)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_decode_gradients_through_auto_match_fp64():
    """On CUDA "auto" would take the forward-only kernel: with inputs that require grad it takes the
    reference, whose output and gradients match the fp64 formula's."""
    from tests.test_parallax_decode import explicit_decode

    q, r, k, v = (x.cuda() for x in _decode_inputs(batch=2, length=40, hq=4, hkv=2, dim=64, seed=15))
    got = _with_grads(parallax_decode, q, r, k, v)
    want = _with_grads(explicit_decode, q, r, k, v)
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(got, want))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_polar_express_differentiates_through_torch_gemms():
    """polar_express on a CUDA bf16 matrix that requires grad forms A and H with torch's GEMMs (the
    symmetric-product kernel has no backward), so its gradient is the kernel=False one."""
    from optimizers import polar_express

    G = torch.randn(48, 80, generator=torch.Generator().manual_seed(16)).cuda().bfloat16()
    grads = [_with_grads(lambda x, kernel=kernel: polar_express(x, kernel=kernel), G) for kernel in (True, False)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))


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


# ---------------------------------------------------------------- launch grids past 65535
def _within_cuda_limits(grid):
    return 1 <= len(grid) <= 3 and all(1 <= n <= most for n, most in zip(grid, launcher.MAX_GRID))


def _attention_grids():
    from kernels.parallax.fused import tile_grid

    return [tile_grid(MANY * 16, 16, 8)], MANY * 8  # B 65537 x L 16, 8 heads, 16-token tiles


def _decode_grids():
    from kernels.parallax.decode_fused import launch_grids

    return launch_grids(MANY * 8, 64, 4, 256, 32), MANY * 8 * 64 + MANY * 32 * 8


def _affine_grids():
    from kernels.family.affine_la_fused import scan_grid

    return [scan_grid(MANY, 4, 128, 64)], MANY * 4 * 2


def _gram_grids():
    from kernels.gram.fused import _tiles, launch_grids

    launches = launch_grids(200, 3 * MANY, 64)
    starts = [rows.start for rows, _ in launches]
    assert starts == sorted(starts) and all(rows.stop - rows.start == grid[1] for rows, grid in launches)
    return [grid for _, grid in launches], _tiles(200, 64) * 3 * MANY


@pytest.mark.parametrize("grids", [_attention_grids, _decode_grids, _affine_grids, _gram_grids])
def test_launch_grids_past_65535_batch_heads_fit_cuda(grids):
    """Each launcher's grids at batch x heads > 65535: every dim within CUDA's limits, and one program
    per unit of work in all (the decode kernel had its groups, the Affine LA scans and the symmetric
    product their batch entries on the second dim, which stops at 65535)."""
    grids, programs = grids()
    assert all(_within_cuda_limits(grid) for grid in grids), grids
    assert sum(math.prod(grid) for grid in grids) == programs


@pytest.mark.parametrize("splits", [None, 4])
def test_decode_plan_past_65535_groups_fits_cuda(monkeypatch, splits):
    """A plan's own grids (split kernel and merge) at 65537 (batch x kv head) groups."""
    from kernels.parallax.decode_fused import TritonDecodePlan

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a CPU plan: built, never launched
    plan = TritonDecodePlan(MANY, 1, 1, 16, 64, torch.float32, "cpu", scale=0.25, block_n=16, num_splits=splits)
    assert plan.num_splits == (splits or 1)
    assert _within_cuda_limits(plan._grid) and math.prod(plan._grid) == MANY * plan.num_splits
    assert _within_cuda_limits(plan._merge_grid) and math.prod(plan._merge_grid) == MANY * 16 // plan.merge_block_d


# ---------------------------------------------------------------- the device a launch runs on
def test_launches_switch_to_a_cuda_device_that_is_not_the_current_one(monkeypatch):
    """Triton launches on the current device's stream: inputs on cuda:1 while cuda:0 is current are
    launched under torch.cuda.device(cuda:1); the current device and the CPU enter nothing (and the
    CPU never asks CUDA for its current device)."""
    entered = []

    class Switch:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", Switch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for device in ("cuda:1", "cuda:0", "cuda"):
        with launcher.on_device(torch.device(device)):
            pass
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("the CPU asked for a CUDA device"))
    with launcher.on_device(torch.device("cpu")):
        pass
    assert entered == [torch.device("cuda:1")]


class _Guarded(Exception):
    """Raised by a stand-in for ``launcher.on_device``: a launcher asked for it, with this device."""


def _attention_call(backward):
    from kernels.parallax import fused

    q, r, k, v = (torch.randn(1, 4, 2, 16) for _ in range(4))
    if not backward:
        return lambda: fused.forward(q, r, k, v, 0.25)
    stats = torch.zeros(2, 4)
    return lambda: fused.backward(q, q, r, k, v, q, q, stats, stats, 0.25)


def _decode_call():
    from kernels.parallax.decode_fused import TritonDecodePlan

    q, r, k, v = _decode_inputs()
    return lambda: TritonDecodePlan(2, 4, 2, 16, 9, torch.float32, "cpu", scale=0.25)(q, r, k, v)


def _affine_call(backward):
    from kernels.family import affine_la_fused

    r, k, v = _family_inputs()
    r, k, v = (torch.cat([x, x], -1) for x in (r, k, v))  # head dim 16
    if not backward:
        return lambda: affine_la_fused.forward(r, k, v, True)
    return lambda: affine_la_fused.backward(r, r, k, v, torch.zeros(1, 4, 5), True)


def _projection_call(backward):
    from kernels.projection import fused

    y, weights, angles = torch.randn(1, 3, 6 * 16), [torch.ones(16)] * 3, torch.zeros(3, 16)
    if not backward:
        return lambda: fused.forward(y, 2, 1, weights, 1e-6, angles, True)
    grads = [torch.zeros(1, 3, heads, 16) for heads in (2, 1, 1, 2)]
    return lambda: fused.backward(grads, y, 2, 1, weights, 1e-6, angles, True)


def _gram_call():
    from kernels.gram.fused import symmetric_product

    return lambda: symmetric_product(torch.ones(2, 8, 4))


@pytest.mark.parametrize("call", [
    lambda: _attention_call(False), lambda: _attention_call(True), _decode_call, lambda: _affine_call(False),
    lambda: _affine_call(True), lambda: _projection_call(False), lambda: _projection_call(True), _gram_call,
], ids=["attention_fwd", "attention_bwd", "decode_plan", "affine_fwd", "affine_bwd", "projection_fwd",
        "projection_bwd", "symmetric_product"])
def test_every_launcher_launches_on_its_inputs_device(monkeypatch, call):
    """Every function that launches Triton kernels asks ``launcher.on_device`` for its inputs' device
    before the first launch (here a stand-in that stops it there, so nothing launches on the CPU)."""
    def guard(device):
        raise _Guarded(device)

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the decode plan's device check
    monkeypatch.setattr("kernels.gram.fused.INTERPRET", True)  # the symmetric product's
    monkeypatch.setattr(launcher, "on_device", guard)
    with pytest.raises(_Guarded) as raised:
        call()()
    assert raised.value.args == (torch.device("cpu"),)


# ---------------------------------------------------------------- 64-bit offsets: which calls take them
def _meta_view(shape, strides, dtype=torch.float16):
    """A view of ``shape`` and ``strides`` into a meta buffer just large enough: sizes of any reach,
    no memory."""
    size = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    return torch.empty(size, dtype=dtype, device="meta").as_strided(shape, strides)


def _heads_apart(apart=None, tokens=1, heads=3, dim=16):
    """(1, tokens, heads, dim), each head's tokens contiguous, the heads ``apart`` elements apart (by
    default tokens * dim: no gaps)."""
    return _meta_view((1, tokens, heads, dim), (tokens * heads * dim, dim, apart or tokens * dim, 1))


def test_wide_offsets_from_2_to_the_31_elements():
    assert not launcher.wide_offsets(2 ** 31 - 1, 7)
    assert launcher.wide_offsets(7, 2 ** 31)


WIDE_HEADS, NARROW_HEADS = 2 ** 30, 2 ** 29  # times 3 heads: past 2^31 elements, and not


@pytest.mark.parametrize("name, apart, want", [
    ("none", None, (False, False)), ("q", WIDE_HEADS, (True, False)), ("q", NARROW_HEADS, (False, False)),
    ("r", WIDE_HEADS, (True, False)), ("out", WIDE_HEADS, (True, True)), ("out", NARROW_HEADS, (False, False)),
    ("k_cache", WIDE_HEADS, (True, False)),
])
def test_decode_takes_64_bit_offsets_where_heads_reach_2_to_the_31(monkeypatch, name, apart, want):
    """WIDE of the split and the merge kernel a plan call launches with, for q, r, out or a cache whose
    3 heads lie ``apart`` elements apart: q's, r's and out's head offsets were 32-bit whatever their
    reach (out's in both kernels)."""
    from kernels.parallax.decode_fused import TritonDecodePlan

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a plan on the meta device: never launched
    hkv = 3 if name == "k_cache" else 1
    plan = TritonDecodePlan(1, 3, hkv, 16, 64, torch.float16, "meta", scale=0.25, block_n=16, num_splits=2)
    launched = []
    monkeypatch.setattr(plan, "_launch", lambda kernel, grid, args, meta, key: launched.append(meta["WIDE"]))
    tensors = {key: _heads_apart() for key in ("q", "r", "out")}
    tensors.update(k_cache=_heads_apart(None, 64, hkv), v_cache=_heads_apart(None, 64, hkv))
    if apart is not None:
        tensors[name] = _heads_apart(apart, 64 if name == "k_cache" else 1, 3)
    plan(tensors["q"], tensors["r"], tensors["k_cache"], tensors["v_cache"], None, tensors["out"])
    assert tuple(launched) == want


@pytest.mark.parametrize("apart, copied", [(WIDE_HEADS, True), (NARROW_HEADS, False)])
def test_attention_reads_inputs_whose_heads_reach_2_to_the_31_from_a_copy(apart, copied):
    """The attention kernels' head offsets are 32-bit: an input whose 3 heads lie 2^30 elements apart
    is read from a contiguous copy (heads D apart), one whose heads stay below 2^31 in place."""
    from kernels.parallax.fused import _tokens

    x = _heads_apart(apart, 8)
    y, _, head_stride = _tokens(x)
    assert (y is not x) == copied and head_stride == (16 if copied else apart)


@pytest.mark.parametrize("name, apart, want", [
    ("none", None, False), ("r", WIDE_HEADS, True), ("r", NARROW_HEADS, False), ("kv", WIDE_HEADS, True),
])
def test_affine_la_takes_64_bit_offsets_where_heads_reach_2_to_the_31(monkeypatch, name, apart, want):
    """WIDE of the Affine LA forward scan for r or k, v whose 3 heads lie ``apart`` elements apart
    (their head offsets were 32-bit whatever their reach)."""
    from kernels.family import affine_la_fused

    launched = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append(meta["WIDE"])

    monkeypatch.setattr(affine_la_fused, "_scan_fwd_kernel", Kernel())
    r, k = _heads_apart(None, 8), _heads_apart(None, 8)
    if name == "r":
        r = _heads_apart(apart, 8)
    elif name == "kv":
        k = _heads_apart(apart, 8)
    affine_la_fused.forward(r, k, k, True)
    assert launched == [want]


# ---------------------------------------------------------------- kernels, interpreted
def _interpret_jobs():
    """Child process (TRITON_INTERPRET=1): one job."""
    return [lambda: {"strided_seqlens": _strided_seqlens_case(), "wide": _wide_offsets_case(),
                     "expanded_out": _expanded_out_error("triton"), "large_grid": _large_grid_case(),
                     "gram_launches": _gram_launches_case(), "forced_wide": _forced_wide_case(),
                     "wide_heads": _wide_heads_case()}]


@contextlib.contextmanager
def _recorded_grids():
    """Within, the interpreter records every launch grid (padded to three dims), and runs only the
    first and last four programs of a grid dim longer than CUDA's 65535 (it runs a grid's programs one
    after another, about 10 ms each). Yields the list of grids."""
    from triton.runtime import interpreter

    builder, grids = interpreter.interpreter_builder, []
    set_grid_dim = builder.set_grid_dim

    def record(*grid):
        grids.append(grid)
        set_grid_dim(*grid)

    def ends_of_long(*args):  # the grid loops' range
        full = range(*args)
        return [*full[:4], *full[-4:]] if len(args) == 1 and len(full) > launcher.MAX_GRID[1] else full

    builder.set_grid_dim, interpreter.range = record, ends_of_long
    try:
        yield grids
    finally:
        builder.set_grid_dim = set_grid_dim
        del interpreter.range


def _large_grid_case():
    """65537 (batch x heads): the decode kernel with one split, with two and the merge kernel, and the
    Affine LA forward. Their grids, and the relative errors against fp64 of the rows computed by the
    programs at both ends of the grids (batch entries 0, 1, 65535, 65536)."""
    from kernels.family import affine_la_fused
    from kernels.parallax.decode_fused import parallax_decode_triton
    from tests import _family_reference as ref
    from tests.test_parallax_decode import explicit_decode

    rows = [0, 1, MANY - 2, MANY - 1]
    q, r, k, v = _decode_inputs(batch=MANY, length=17, hq=1, hkv=1, dim=16, seed=4)
    want = explicit_decode(q[rows], r[rows], k[rows], v[rows])
    g = torch.Generator().manual_seed(5)
    r2, k2, v2 = (torch.randn(MANY, 3, 1, 16, generator=g) / 4 for _ in range(3))
    errors = []
    with _recorded_grids() as grids:
        for splits in (1, 2):  # 17 positions in blocks of 16: two splits
            errors.append(rel_err(parallax_decode_triton(q, r, k, v, None, 0.25, block_n=16,
                                                         num_splits=splits)[rows], want))
        out, _ = affine_la_fused.forward(r2, k2, v2, True)
    errors.append(rel_err(out[rows], ref.affine_linear_attention_dense(r2[rows].double(), k2[rows].double(),
                                                                       v2[rows].double())))
    return {"grids": grids, "errors": errors}


def _gram_launches_case():
    """The symmetric product of 5 matrices with the grid's second dim capped at 2 (``launcher.MAX_GRID``
    patched): its grids, and the relative error of the result (Y, scale) against fp64."""
    from kernels.gram.fused import symmetric_product

    g = torch.Generator().manual_seed(6)
    P, Y = torch.randn(5, 24, 40, generator=g), torch.randn(5, 24, 24, generator=g)
    Y, scale, limits = Y + Y.mT, torch.rand(5, generator=g) + 0.5, launcher.MAX_GRID
    launcher.MAX_GRID = (limits[0], 2, 2)
    try:
        with _recorded_grids() as grids:
            got = symmetric_product(P, 0.7, Y, -0.3, 0.2, scale)
    finally:
        launcher.MAX_GRID = limits
    p = P.double()
    want = scale.double()[:, None, None] * (0.7 * p @ p.mT - 0.3 * Y.double() + 0.2 * torch.eye(24).double())
    return {"grids": grids, "error": rel_err(got, want)}


def _forced_wide_case():
    """The decode kernel (one split; two with the merge kernel; two with the fused merge) and the Affine
    LA forward and backward on small inputs, with 32-bit offsets and with the 64-bit variants forced
    (``launcher.wide_offsets`` answering True): per output, whether the bits agree; and how often the
    forced answer was asked for."""
    from kernels.family import affine_la_fused
    from kernels.parallax.decode_fused import parallax_decode_triton

    q, r, k, v = _decode_inputs(batch=2, length=40, hq=4, hkv=2, dim=16, seed=7)
    g = torch.Generator().manual_seed(8)
    fr, fk, fv, fdo = (torch.randn(2, 20, heads, 32, generator=g) / 4 for heads in (4, 2, 2, 4))

    def outputs():
        res = {f"decode_{splits}_{fused}": (parallax_decode_triton(q, r, k, v, None, 0.25, block_n=16,
                                                                    num_splits=splits, fused_merge=fused),)
               for splits, fused in ((1, False), (2, False), (2, True))}
        o, tbar = affine_la_fused.forward(fr, fk, fv, True)
        res["affine_fwd"], res["affine_bwd"] = (o, tbar), affine_la_fused.backward(fdo, fr, fk, fv, tbar, True)
        return res

    narrow, asked, wide_offsets = outputs(), [], launcher.wide_offsets
    launcher.wide_offsets = lambda *extents: asked.append(extents) or True
    try:
        wide = outputs()
    finally:
        launcher.wide_offsets = wide_offsets
    return {"same": {name: all(map(torch.equal, narrow[name], wide[name])) for name in narrow}, "asked": len(asked)}


def _wide_heads_case(device="cpu", dtype=torch.float16, dim=16):
    """q, r and out of the decode kernel, then r of the Affine LA forward, then q and r of the
    attention forward, as views whose 3 heads lie 2^30 elements apart in one 4 GiB 16-bit buffer (of
    which only the rows read are touched): head 2 starts 2^31 elements in, past 32-bit offsets.
    Relative errors against fp64 (decode with one split, two and the merge kernel, two and the fused
    merge; Affine LA; attention); None where the allocation fails."""
    from kernels.family import affine_la_fused
    from kernels.parallax import fused
    from kernels.parallax.decode_fused import TritonDecodePlan
    from tests import _family_reference as ref
    from tests.test_parallax_decode import explicit_causal, explicit_decode

    try:
        buffer = torch.empty(2 * WIDE_HEADS + 10 * dim, dtype=dtype, device=device)
    except RuntimeError:  # no 4 GiB of address space here
        return None

    def heads(offset, tokens=1):
        return buffer.as_strided((1, tokens, 3, dim), (tokens * dim, dim, WIDE_HEADS, 1), offset)

    q0, r0, k, v = (x.to(device, dtype) for x in _decode_inputs(batch=1, length=40, hq=3, hkv=1, dim=dim, seed=9))
    q, r, out = heads(0), heads(dim), heads(2 * dim)
    q.copy_(q0)
    r.copy_(r0)
    want, errors = explicit_decode(q0, r0, k, v), []
    for splits, fused_merge in ((1, False), (2, False), (2, True)):
        plan = TritonDecodePlan(1, 3, 1, dim, 40, dtype, device, scale=dim ** -0.5, block_n=16, num_splits=splits,
                                fused_merge=fused_merge)
        errors.append(rel_err(plan(q, r, k, v, None, out), want))
    g = torch.Generator().manual_seed(10)
    r0, k, v = (torch.randn(1, 5, n, dim, generator=g).to(device, dtype) for n in (3, 1, 1))
    r = heads(0, 5)
    r.copy_(r0)
    o, _ = affine_la_fused.forward(r, k, v, True)
    errors.append(rel_err(o, ref.affine_linear_attention_dense(r0.double(), k.double(), v.double())))
    q0, r0, k, v = (torch.randn(1, 5, 3, dim, generator=g).to(device, dtype) for _ in range(4))
    q, r = heads(0, 5), heads(5 * dim, 5)  # one layout: read in place, were the heads not too far apart
    q.copy_(q0)
    r.copy_(r0)
    errors.append(rel_err(fused.forward(q, r, k, v, dim ** -0.5)[0], explicit_causal(q0, r0, k, v)))
    return errors


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


def test_launches_past_65535_batch_heads_fit_cuda_and_match_fp64(interpreted):
    """The decode kernel (one split; two and the merge kernel) and the Affine LA forward over 65537
    (batch x heads): the grids the interpreter ran fit CUDA (the decode kernel's had the 65537 groups
    in its second dim), and the programs at both ends of them compute their rows."""
    res = interpreted["large_grid"]
    assert len(res["grids"]) == 4 and all(_within_cuda_limits(grid) for grid in res["grids"]), res["grids"]
    assert all(err < 1e-5 for err in res["errors"]), res["errors"]


def test_symmetric_product_takes_a_launch_per_run_of_batch_entries(interpreted):
    """5 matrices with at most 2 per launch: three launches of their batch entries' views (P, Y, the
    scale factors and the output alike), the result as fp64 gives it."""
    res = interpreted["gram_launches"]
    assert res["grids"] == [(1, 2, 1), (1, 2, 1), (1, 1, 1)]
    assert res["error"] < 1e-5


def test_forced_64_bit_offsets_give_the_32_bit_bits(interpreted):
    """Every launch asked for its variant (three decode calls, split and merge each; four Affine LA
    scans), and the 64-bit variants' outputs equal the 32-bit ones bit for bit."""
    res = interpreted["forced_wide"]
    assert res["asked"] == 10 and all(res["same"].values()), res


def test_head_offsets_past_2_to_the_31_elements(interpreted):
    """Before 64-bit head offsets (and the attention's copy), head 2 of q (of the Affine LA's r) was
    read 2^31 elements below where it lies."""
    if interpreted["wide_heads"] is None:
        pytest.skip("a 4 GiB CPU allocation failed")
    assert all(err < 5e-3 for err in interpreted["wide_heads"]), interpreted["wide_heads"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_head_offsets_past_2_to_the_31_elements():
    errors = _wide_heads_case("cuda", torch.bfloat16, dim=64)
    assert errors is not None and all(err < 1e-2 for err in errors), errors


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_launches_past_65535_batch_heads():
    """The decode kernel (one split; two and the merge), the Affine LA forward and backward and the
    symmetric product over 65537 (batch x heads, or matrices), fp32, against fp64: each launch failed
    before (a grid's second dim past 65535)."""
    from kernels import affine_linear_attention
    from kernels.gram.fused import symmetric_product
    from kernels.parallax.decode import parallax_decode_reference
    from kernels.parallax.decode_fused import parallax_decode_triton

    q, r, k, v = (x.cuda() for x in _decode_inputs(batch=MANY, length=40, hq=2, hkv=1, dim=64, seed=11))
    want = parallax_decode_reference(*(x.double() for x in (q, r, k, v)), None, 0.125)
    errors = [rel_err(parallax_decode_triton(q, r, k, v, None, 0.125, block_n=16, num_splits=splits), want)
              for splits in (1, 2)]
    g = torch.Generator().manual_seed(12)
    leaves = [(torch.randn(MANY, 6, 1, 16, generator=g) / 4).cuda().requires_grad_() for _ in range(3)]
    grads = []
    for backend, dtype in (("triton", torch.float32), ("reference", torch.float64)):
        o = affine_linear_attention(*(x.to(dtype) for x in leaves), backend=backend)
        grads.append([o, *torch.autograd.grad(o.square().sum(), leaves)])
    errors += [rel_err(a, b) for a, b in zip(*grads)]
    P = torch.randn(MANY, 8, 16, generator=g).cuda()
    errors.append(rel_err(symmetric_product(P), P.double() @ P.double().mT))
    assert all(err < 1e-5 for err in errors), errors


def _with_grads(fn, *inputs):
    """fn's outputs on leaves copied from ``inputs``, then the leaves' gradients of their squares' sum."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    return (*outs, *torch.autograd.grad(sum(o.float().square().sum() for o in outs), leaves))


def _on_device(device):
    """What every launching entry point gives for fixed inputs made on ``device``, with the gradients
    where there is a backward."""
    from kernels import affine_linear_attention, split_norm_rope
    from kernels.gram.fused import symmetric_product

    g = torch.Generator().manual_seed(13)
    q, r, k, v = (torch.randn(2, 40, heads, 64, generator=g).to(device) for heads in (4, 4, 2, 2))
    y, table = torch.randn(2, 40, 12 * 64, generator=g).to(device), torch.randn(40, 128, generator=g).to(device)
    weights = [(1 + torch.rand(64, generator=g)).to(device) for _ in range(3)]
    table = torch.cat([table[:, :32]] * 2 + [table[:, 64:96]] * 2, -1)  # cos, sin halves repeated
    attention = lambda *x: parallax_attention(*x, backend="triton")  # noqa: E731
    return {
        "attention": _with_grads(attention, q, r, k, v),
        "attention_bf16": _with_grads(attention, *(x.bfloat16() for x in (q, r, k, v))),  # Hopper kernels
        "affine": _with_grads(lambda *x: affine_linear_attention(*x, backend="triton"), r, k, v),
        "decode": DecodePlan.like(q[:, :1], k, backend="triton")(q[:, :1], r[:, :1], k, v),
        "projection": _with_grads(lambda y, *w: split_norm_rope(y, 4, 2, w, 1e-6, table), y, *weights),
        "symmetric_product": symmetric_product(torch.randn(3, 48, 80, generator=g).to(device)),
    }


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_gpu_inputs_on_a_device_that_is_not_the_current_one():
    """With cuda:0 current, inputs on cuda:1 give the bits they give with cuda:1 current (the kernels
    were launched on cuda:0's stream, reading cuda:1's memory)."""
    with torch.cuda.device(1):
        want = _on_device("cuda:1")
    with torch.cuda.device(0):
        got = _on_device("cuda:1")
    torch.cuda.synchronize(1)
    for name in want:
        pairs = zip(*((x[name],) if torch.is_tensor(x[name]) else x[name] for x in (want, got)))
        assert all(torch.equal(a, b) for a, b in pairs), name
