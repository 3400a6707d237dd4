"""Fused Triton Parallax attention against the fp64 naive reference.

CPU: the kernels run under TRITON_INTERPRET=1 in two child processes at once (the variable must
be set before triton is first imported, which another test module may already have done in this
process); the children save inputs, outputs and gradients, and this process checks them against
parallax_attention_naive in fp64. GPU tests (marked ``gpu``) run the real kernels at real shapes.
"""

import contextlib
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.parallax.naive import parallax_attention_naive
from tests._aten_ops import recorded_ops
from tests._interpret import rel_err, run_interpreted
from tests._attention_cases import BAD_CU_NAMES, SEQ, bad_cu_seqlens, banded_reference, cu_from_lengths, cuda_inputs

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"num_warps": 4, "num_stages": 1}

# name -> (B, L, Hq, Hkv, D, dtype, rho_scale, doc lengths or None, kernel config or None)
INTERPRET_CASES = {
    "len1": (1, 1, 2, 1, 16, "float32", 1.0, None, None),
    "odd_gqa2_batch2": (2, 37, 4, 2, 32, "float32", 1.0, None, None),
    "gqa4_bm32_bn16": (1, 40, 4, 1, 16, "float32", 1.0, None, {"BM": 32, "BN": 16, **SMALL}),
    "gqa4_bm16_bn32": (1, 40, 4, 1, 16, "float32", 1.0, None, {"BM": 16, "BN": 32, **SMALL}),
    "d64_ragged": (1, 23, 2, 2, 64, "float32", 1.0, None, None),
    "large_rho": (1, 33, 2, 1, 16, "float32", 30.0, None, None),
    "varlen": (1, 40, 4, 2, 16, "float32", 1.0, [5, 1, 17, 17], None),
    "varlen_bm32_bn16": (1, 40, 4, 2, 16, "float32", 1.0, [5, 1, 17, 17], {"BM": 32, "BN": 16, **SMALL}),
    "varlen_bm16_bn32": (1, 40, 2, 1, 32, "float32", 1.0, [20, 3, 17], {"BM": 16, "BN": 32, **SMALL}),
    "fp16": (1, 24, 2, 1, 16, "float16", 1.0, None, None),
    # L a multiple of the tiles: the global heaviest-first program order across documents and heads
    "aligned_batch3": (3, 32, 4, 2, 16, "float32", 1.0, None, None),
    "aligned_bm32_bn16": (2, 64, 4, 1, 32, "float32", 1.0, None, {"BM": 32, "BN": 16, **SMALL}),
}  # no bf16 here: triton 3.9's interpreter computes bf16 tl.dot wrongly (bf16 runs in the GPU tests)
TOL = {"float32": 2e-5, "float16": 5e-3}
# the head-major program order (the default explicit config runs the global order) on some cases
HEAD_MAJOR_CASES = ("odd_gqa2_batch2", "varlen_bm32_bn16", "aligned_batch3", "aligned_bm32_bn16")
# the column pass with queries on the rows of its tiles (ROWS, most shipped configs) on some cases
ROWS_CASES = ("odd_gqa2_batch2", "varlen_bm16_bn32", "varlen_bm32_bn16", "fp16", "aligned_bm32_bn16")
# the row tiles read through TMA tensor descriptors (the TMA flag) on some cases, both column-pass orientations
TMA_CASES = ("odd_gqa2_batch2", "varlen_bm16_bn32", "fp16")
VARIANTS = [n + "_head_major" for n in HEAD_MAJOR_CASES] + [n + "_rows" for n in ROWS_CASES]
# sliding window: name -> (B, L, Hq, Hkv, D, doc lengths or None, window, kernel config or None), fp32;
# every case runs the forward, both backward passes and the column pass in both orientations
BM32 = {"BM": 32, "BN": 16, **SMALL}
BN32 = {"BM": 16, "BN": 32, **SMALL}
WINDOW_CASES = {
    "w1": (1, 37, 4, 2, 16, None, 1, None),
    "w7_gqa_odd": (2, 37, 4, 2, 16, None, 7, None),  # W not a multiple of the tiles
    "w16_bm32_bn16": (1, 45, 4, 1, 16, None, 16, BM32),
    "w9_bm16_bn32": (1, 45, 2, 1, 32, None, 9, BN32),
    "w40_bn32": (2, 37, 2, 2, 16, None, 40, BN32),  # W >= L: full causal
    "w6_varlen": (1, 40, 4, 2, 16, [5, 1, 17, 17], 6, None),
    "w20_varlen_bm32": (1, 40, 4, 2, 16, [5, 1, 17, 17], 20, BM32),
    "w3_varlen_bn32": (1, 40, 2, 1, 16, [20, 3, 17], 3, {**BN32, "GLOBAL_ORDER": False}),
}


def make_case(shape_b, n, hq, hkv, d, dtype, rho_scale, seed):
    gen = torch.Generator().manual_seed(seed)
    q, r = (torch.randn(shape_b, n, hq, d, generator=gen) for _ in range(2))
    k, v = (torch.randn(shape_b, n, hkv, d, generator=gen) for _ in range(2))
    do = torch.randn(shape_b, n, hq, d, generator=gen)
    r = r * rho_scale / math.sqrt(d)
    return [x.to(getattr(torch, dtype)) for x in (q, r, k, v, do)]


def _interpret_jobs():
    """Child processes (TRITON_INTERPRET=1): every case through the fused kernels and the custom op,
    one job (a callable returning a dict of results) per case."""
    from functools import partial

    from kernels import parallax_attention
    from kernels.parallax import fused, tuning

    jobs = [partial(_case_results, fused, tuning, seed, name, spec)
            for seed, (name, spec) in enumerate(INTERPRET_CASES.items())]
    jobs += [partial(_window_results, fused, tuning, seed, name, spec)
             for seed, (name, spec) in enumerate(WINDOW_CASES.items())]
    return jobs + [lambda: {"tma_fallback": _tma_fallback_case(fused)},
                   lambda: {"projection_slice": _projection_slice_case(fused, tuning)},
                   lambda: {"tma_thread": _tma_thread_case(fused)},
                   lambda: {"window_api": _window_api_case(parallax_attention)},
                   lambda: {"custom_op": _custom_op_case(parallax_attention, compiled=False)},
                   lambda: {"candidates": _candidates_case(parallax_attention, tuning)},
                   lambda: {"bad_cu": _bad_cu_case(parallax_attention)},
                   lambda: {"compiled": _custom_op_case(parallax_attention, compiled=True)},
                   lambda: {"opcheck": _opcheck()}]


def _case_results(fused, tuning, seed, name, spec):
    """One INTERPRET_CASES case under its config, and its head-major, ROWS and TMA variants where listed."""
    b, n, hq, hkv, d, dtype, rho_scale, lengths, cfg = spec
    q, r, k, v, do = make_case(b, n, hq, hkv, d, dtype, rho_scale, seed)
    cu, scale = cu_from_lengths(lengths), 1.0 / math.sqrt(d)
    o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, config=cfg)
    grads = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, dq_config=cfg, dkdv_config=cfg)
    results = {name: {"inputs": (q, r, k, v, do), "out": o, "grads": grads}}
    if name in HEAD_MAJOR_CASES:
        hm = {**(cfg or tuning.INTERPRET_CONFIG), "GLOBAL_ORDER": False}
        o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, config=hm)
        grads = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, dq_config=hm, dkdv_config=hm)
        results[name + "_head_major"] = {"inputs": (q, r, k, v, do), "out": o, "grads": grads}
    if name in ROWS_CASES:
        o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, config=cfg)
        rows = {**(cfg or tuning.INTERPRET_CONFIG), "ROWS": True}
        grads = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, dq_config=cfg, dkdv_config=rows)
        results[name + "_rows"] = {"inputs": (q, r, k, v, do), "out": o, "grads": grads}
    if name in TMA_CASES:
        results[name + "_tma"] = _tma_case(fused, tuning, (q, r, k, v, do), cu, scale, None, cfg)
    return results


def _window_results(fused, tuning, seed, name, spec):
    """One WINDOW_CASES case: both column-pass orientations, the full causal result beside it, TMA where listed."""
    b, n, hq, hkv, d, lengths, window, cfg = spec
    q, r, k, v, do = make_case(b, n, hq, hkv, d, "float32", 2.0, seed)
    cu, scale = cu_from_lengths(lengths), 1.0 / math.sqrt(d)
    o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, window, config=cfg)
    grads = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, window, dq_config=cfg, dkdv_config=cfg)
    rows = {**(cfg or tuning.INTERPRET_CONFIG), "ROWS": True}
    grads_rows = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, window, dq_config=cfg,
                                dkdv_config=rows)
    full = fused.forward(q, r, k, v, scale, cu, config=cfg)[0]
    results = {"window_" + name: {"inputs": (q, r, k, v, do), "out": o, "grads": grads,
                                  "grads_rows": grads_rows, "equals_full": torch.equal(o, full)}}
    if name in ("w7_gqa_odd", "w20_varlen_bm32"):
        results["window_" + name + "_tma"] = _tma_case(fused, tuning, (q, r, k, v, do), cu, scale, window, cfg)
    return results


def _all_passes(fused, inputs, scale, cu, window, config):
    """The forward and both column-pass orientations of the backward under one launch config:
    [o, vbar, tbar, lse, dq, dr, dk, dv (keys x queries), dq, dr, dk, dv (queries on rows)]."""
    q, r, k, v, do = inputs
    o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, window, config=config)
    cols = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, window, dq_config=config,
                          dkdv_config=config)
    rows = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, window, dq_config=config,
                          dkdv_config={**config, "ROWS": True})
    return [o, vbar, tbar, lse, *cols, *rows]


def _tma_case(fused, tuning, inputs, cu, scale, window, cfg):
    """Forward and both backward orientations with pointer loads and with TMA descriptors, same tiles."""
    q, _, k, _, _ = inputs
    runs = {tma: _all_passes(fused, inputs, scale, cu, window, {**(cfg or tuning.INTERPRET_CONFIG), "TMA": tma})
            for tma in (False, True)}
    return {"inputs": inputs, "out": runs[True][0], "grads": runs[True][4:8], "tma_ok": fused._tma_ok(
        q.shape[-1], [(q, q.stride(1)), (k, k.stride(1))]),
            "bitwise": [torch.equal(a, b) for a, b in zip(runs[False], runs[True])]}


def _projection_slice_case(fused, tuning):
    """v cut from a wider per-token tensor, as the model's fused q, k, v, rho projection gives it: read
    in place (no copy) with pointer loads and with TMA descriptors, both column-pass orientations, and
    bit for bit the results of a contiguous v."""
    q, r, k, v, do = make_case(2, 37, 4, 2, 16, "float32", 1.0, seed=21)
    fused_rows = torch.randn(2, 37, 4 * 16 + 2 * 16 + 2 * 16 + 4 * 16)  # q | k | v | rho per token
    fused_rows[..., 96:128] = v.flatten(2)
    v_slice = fused_rows[..., 96:128].unflatten(-1, (2, 16))
    runs = {(name, tma): _all_passes(fused, (q, r, k, v_in, do), 0.25, None, None,
                                     {**tuning.INTERPRET_CONFIG, "TMA": tma})
            for name, v_in in (("slice", v_slice), ("contiguous", v)) for tma in (False, True)}
    def default_configs():
        saved = fused.forward(q, r, k, v_slice, 0.25)
        fused.backward(do, q, r, k, v_slice, *saved, 0.25)

    ops = recorded_ops(default_configs)
    return {"inputs": (q, r, k, v, do), "out": runs["slice", True][0], "grads": runs["slice", True][4:8],
            "clones": ops.count("aten.clone.default"),  # what .contiguous() of a strided tensor runs
            "tma_ok": fused._tma_ok(16, [(v_slice, v_slice.stride(1))]),
            "bitwise": [torch.equal(a, b) for tma in (False, True)
                        for a, b in zip(runs["slice", tma], runs["contiguous", tma])]}


def _tma_fallback_case(fused):
    """K and V whose heads are not D apart (views into wider rows): no descriptor can read them, so a
    TMA config keeps pointer loads and gives the pointer-load results."""
    torch.manual_seed(0)
    q, r = (torch.randn(1, 37, 4, 16) for _ in range(2))
    k, v = (torch.randn(1, 37, 2, 32)[..., :16] for _ in range(2))
    config = {"BM": 16, "BN": 16, **SMALL}
    plain = fused.forward(q, r, k, v, 0.25, config=config)[0]
    tma = fused.forward(q, r, k, v, 0.25, config={**config, "TMA": True})[0]
    return {"tma_ok": fused._tma_ok(16, [(k, k.stride(1))]), "equal": torch.equal(plain, tma)}


def _tma_thread_case(fused):
    """A TMA backward on another thread than its forward, as autograd runs a CUDA backward: triton
    keeps its allocator in a context variable, so the launch there has to set it again (the
    interpreter does not call it, hence the direct look at the thread's allocator afterwards)."""
    import threading

    torch.manual_seed(1)
    q, r, k, v, do = (torch.randn(1, 20, 2, 16) for _ in range(5))
    config = {"BM": 16, "BN": 16, **SMALL, "TMA": True}
    saved = fused.forward(q, r, k, v, 0.25, config=config)
    box = {}

    def backward():
        try:
            box["grads"] = fused.backward(do, q, r, k, v, *saved, 0.25, dq_config=config, dkdv_config=config)
            from triton.runtime import _allocation

            box["scratch"] = str(_allocation._allocator.get()(64, 16, None).device)
        except Exception as exc:  # the result: the test reports it
            box["error"] = repr(exc)[:200]

    thread = threading.Thread(target=backward)
    thread.start()
    thread.join()
    here = fused.backward(do, q, r, k, v, *saved, 0.25, dq_config=config, dkdv_config=config)
    return {"error": box.get("error"), "scratch": box.get("scratch"),
            "equal": "grads" in box and all(torch.equal(a, b) for a, b in zip(box["grads"], here))}


def _opcheck():
    """torch.library.opcheck on both custom ops (schema, fake tensors, autograd registration)."""
    from kernels.parallax import fused, ops

    q, r, k, v, do = make_case(1, 9, 2, 1, 16, "float32", 1.0, seed=7)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    errors = []
    for cu_arg, window, hopper in ((None, None, True), (cu, None, False), (None, 3, False), (cu, 2, True)):
        fwd_args = ([x.requires_grad_() for x in (q, r, k, v)] + [0.25, cu_arg, window, hopper])
        saved = fused.forward(q.detach(), r.detach(), k.detach(), v.detach(), 0.25, cu_arg, window)
        bwd_args = (do, q.detach(), r.detach(), k.detach(), v.detach(), *saved, 0.25, cu_arg, window, hopper)
        for op, args in ((ops.attention_fwd, fwd_args), (ops.attention_bwd, bwd_args)):
            try:
                torch.library.opcheck(op, args)
            except Exception as exc:  # reported to the parent, which fails the test
                errors.append(f"{op}: {exc!r}"[:2000])
    return errors


def _custom_op_case(attn, compiled):
    """Public API through the custom op; loss .sum() gives an expanded (stride 0) upstream gradient.
    q is a non-contiguous view to exercise the stride handling."""
    q, r, k, v, _ = make_case(1, 19, 4, 2, 16, "float32", 1.0, seed=99)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, (B, H, L, D) memory order
    leaves = [x.clone().requires_grad_() for x in (q, r, k, v)]

    def block(q, r, k, v):
        return attn(q, r, k, v, backend="triton") * 1.5

    fn = torch.compile(block, backend="aot_eager", fullgraph=True) if compiled else block
    out = fn(*leaves)
    out.sum().backward()
    return {"inputs": tuple(x.detach() for x in leaves), "out": out.detach() / 1.5,
            "grads": tuple(x.grad * 1 for x in leaves), "upstream": 1.5}


def _window_api_case(attn):
    """The public API with a window, compiled (aot_eager, fullgraph) around the custom op."""
    q, r, k, v, do = make_case(1, 30, 4, 2, 16, "float32", 2.0, seed=17)
    cu = cu_from_lengths([12, 18])
    leaves = [x.clone().requires_grad_() for x in (q, r, k, v)]
    fn = torch.compile(lambda *x: attn(*x, backend="triton", cu_seqlens=cu, window=5), backend="aot_eager",
                       fullgraph=True)
    out = fn(*leaves)
    out.backward(do)
    return {"inputs": (q, r, k, v, do), "out": out.detach(), "grads": tuple(x.grad for x in leaves)}


def _candidates_case(attn, tuning):
    """The public API inside ``tuning.candidates``: one listed config per kernel runs (tiles of 32 x 16,
    which no other case of the custom op uses)."""
    q, r, k, v, do = make_case(1, 45, 4, 2, 16, "float32", 1.0, seed=11)
    tile = tuning.both_orders([(32, 16, 4, 1)])[1:]  # global order
    rows = tuning.both_orders([(16, 32, 4, 1)], ROWS=True)[:1]  # head-major, queries on the rows
    leaves = [x.clone().requires_grad_() for x in (q, r, k, v)]
    with tuning.candidates(fwd=tile, dq=tile, dkdv=rows):
        out = attn(*leaves, backend="triton")
        out.backward(do)
    # the listed config really is what launches: a tile that is not a power of two cannot compile
    try:
        with tuning.candidates(fwd=tuning.both_orders([(24, 16, 4, 1)])):
            attn(q, r, k, v, backend="triton")
        rejected = ""
    except Exception as exc:  # reported to the parent, which checks it
        rejected = repr(exc)
    return {"inputs": (q, r, k, v, do), "out": out.detach(), "grads": tuple(x.grad for x in leaves),
            "rejected": rejected}


def _bad_cu_case(attn):
    """The error message of the triton backend for each bad cu_seqlens case ("" if none), and after
    a valid tensor is written in place."""
    q, r, k, v, _ = make_case(1, SEQ, 2, 1, 16, "float32", 1.0, seed=13)
    messages = {}
    for name in BAD_CU_NAMES:
        cu, _ = bad_cu_seqlens(name)
        messages[name] = _error(lambda: attn(q, r, k, v, backend="triton", cu_seqlens=cu))
    cu = torch.tensor([0, 6, SEQ], dtype=torch.int32)
    messages["valid"] = _error(lambda: attn(q, r, k, v, backend="triton", cu_seqlens=cu))
    cu[1] = 20
    messages["written_in_place"] = _error(lambda: attn(q, r, k, v, backend="triton", cu_seqlens=cu))
    return messages


def _error(call):
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return ""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return run_interpreted("tests.test_parallax_fused", tmp_path_factory.mktemp("interp"), parts=2)


def reference(inputs, cu, upstream=None):
    """fp64 naive output and gradients of (q, r, k, v) for upstream gradient do (tensor) or constant."""
    q, r, k, v = (x.double().requires_grad_() for x in inputs[:4])
    out = parallax_attention_naive(q, r, k, v, cu_seqlens=cu)
    do = inputs[4].double() if upstream is None else torch.full_like(out, upstream)
    out.backward(do)
    return out.detach(), (q.grad, r.grad, k.grad, v.grad)


def check(result, cu, tol, upstream=None):
    out_ref, grads_ref = reference(result["inputs"], cu, upstream)
    errors = {"o": rel_err(result["out"], out_ref)}
    errors.update({f"d{n}": rel_err(g, gr) for n, g, gr in zip("qrkv", result["grads"], grads_ref)})
    assert all(e < tol for e in errors.values()), errors
    for name, g, x in zip("qrkv", result["grads"], result["inputs"]):
        assert g.dtype == x.dtype and g.shape == x.shape, name


@pytest.mark.parametrize("name", list(INTERPRET_CASES) + VARIANTS)
def test_interpreted_kernels_match_fp64(interpreted, name):
    _, _, _, _, _, dtype, _, lengths, _ = INTERPRET_CASES[name.removesuffix("_head_major").removesuffix("_rows")]
    res = interpreted[name]
    assert res["out"].dtype == getattr(torch, dtype)
    check(res, cu_from_lengths(lengths), TOL[dtype])


@pytest.mark.parametrize("name", TMA_CASES)
def test_interpreted_tma_descriptors_give_the_pointer_loads_bits(interpreted, name):
    """Rows read by TMA tensor descriptors (rows past T as zeros) give bit for bit the masked pointer
    loads' outputs, statistics and gradients (both column-pass orientations), and match fp64."""
    res = interpreted[name + "_tma"]
    assert res["tma_ok"] and all(res["bitwise"]), res["bitwise"]
    _, _, _, _, _, dtype, _, lengths, _ = INTERPRET_CASES[name]
    check(res, cu_from_lengths(lengths), TOL[dtype])


@pytest.mark.parametrize("name", ["w7_gqa_odd", "w20_varlen_bm32"])
def test_interpreted_tma_descriptors_with_a_window(interpreted, name):
    res = interpreted["window_" + name + "_tma"]
    assert res["tma_ok"] and all(res["bitwise"]), res["bitwise"]


def test_interpreted_tma_config_keeps_pointer_loads_where_descriptors_cannot_read(interpreted):
    assert interpreted["tma_fallback"] == {"tma_ok": False, "equal": True}
    assert interpreted["tma_thread"] == {"error": None, "scratch": "cpu", "equal": True}


def test_interpreted_v_sliced_from_the_fused_projection_is_read_in_place(interpreted):
    """The kernels take v's own strides: a v cut from the fused projection's rows is not copied, and
    gives the contiguous v's bits (pointer loads and TMA, both column-pass orientations) and fp64's values."""
    res = interpreted["projection_slice"]
    assert res["clones"] == 0 and res["tma_ok"]
    assert all(res["bitwise"]), res["bitwise"]
    check(res, None, TOL["float32"], upstream=None)


def test_tma_needs_heads_d_apart_and_16_byte_alignment():
    from kernels.parallax.fused import _tma_ok

    x = torch.zeros(2, 8, 4, 16, dtype=torch.bfloat16)
    assert _tma_ok(16, [(x, x.stride(1))])
    wide = torch.zeros(2, 8, 4, 32, dtype=torch.bfloat16)[..., :16]  # heads 32 apart
    assert not _tma_ok(16, [(wide, wide.stride(1))])
    flat = torch.zeros(1 + 2 * 8 * 4 * 16, dtype=torch.bfloat16)
    shifted = flat[1:].view(2, 8, 4, 16)  # base 2 bytes past an aligned address
    assert not _tma_ok(16, [(shifted, shifted.stride(1))])
    odd = torch.zeros(2, 8, 68, dtype=torch.bfloat16)[..., 4:].unflatten(-1, (4, 16))  # token stride 136 bytes
    assert not _tma_ok(16, [(odd, odd.stride(1))])
    assert not _tma_ok(16, [(x, x.stride(1)), (wide, wide.stride(1))])  # every source must qualify


def test_tma_is_asked_for_only_by_configs_with_the_flag():
    """A candidate list with a TMA config or an explicit TMA config asks for TMA (and triton's
    allocator); a list without one does not, and an explicit config decides over the candidates."""
    from kernels.parallax import tuning

    assert all(tuning.wants_tma(name) for name in tuning.KERNEL_NAMES)  # every shipped list has one
    with tuning.candidates(dq=tuning.SHIPPED["dq"][:2]):
        assert not tuning.wants_tma("dq")
    assert all(c.kwargs["TMA"] for name in tuning.KERNEL_NAMES for c in tuning.TMA_SWEEP[name])
    with tuning.candidates(**tuning.TMA_SWEEP):
        assert all(tuning.wants_tma(name) for name in tuning.KERNEL_NAMES)
        assert not tuning.wants_tma("fwd", {"BM": 16, "BN": 16})
    assert tuning.wants_tma("dq", {"BM": 16, "BN": 16, "TMA": True})
    assert not tuning.wants_tma("dq", tuning.SHIPPED["dq"][0])


def check_window(result, lengths, window, grads_key="grads"):
    out_ref, grads_ref = banded_reference(result["inputs"][:4], result["inputs"][4], window, lengths)
    errors = {"o": rel_err(result["out"], out_ref)}
    errors.update({f"d{n}": rel_err(g, gr) for n, g, gr in zip("qrkv", result[grads_key], grads_ref)})
    assert all(e < TOL["float32"] for e in errors.values()), errors


@pytest.mark.parametrize("name", list(WINDOW_CASES))
def test_interpreted_window_matches_fp64_banded(interpreted, name):
    _, n, _, _, _, lengths, window, _ = WINDOW_CASES[name]
    res = interpreted["window_" + name]
    check_window(res, lengths, window)
    check_window(res, lengths, window, grads_key="grads_rows")
    # W >= every document's length: the same kernels' full causal result, bit for bit
    assert res["equals_full"] == (window >= max(lengths or [n]))


def test_interpreted_window_through_the_public_api_compiled(interpreted):
    check_window(interpreted["window_api"], [12, 18], 5)


@pytest.mark.parametrize("name", ["custom_op", "compiled"])
def test_interpreted_custom_op_with_expanded_grad(interpreted, name):
    res = interpreted[name]
    check(res, None, TOL["float32"], upstream=res["upstream"])


def test_interpreted_public_api_under_tuning_candidates(interpreted):
    check(interpreted["candidates"], None, TOL["float32"])
    assert "power of 2" in interpreted["candidates"]["rejected"]


@pytest.mark.parametrize("name", BAD_CU_NAMES)
def test_interpreted_bad_cu_seqlens_raise_naming_the_values(interpreted, name):
    _, pattern = bad_cu_seqlens(name)
    assert re.search(pattern, interpreted["bad_cu"][name]), interpreted["bad_cu"][name]


def test_interpreted_cu_seqlens_checked_again_after_an_in_place_write(interpreted):
    messages = interpreted["bad_cu"]
    assert messages["valid"] == ""
    assert "cu_seqlens=[0, 20, 16] is invalid: cu_seqlens[1]=20 lies outside" in messages["written_in_place"]


def test_interpreted_custom_ops_pass_opcheck(interpreted):
    assert interpreted["opcheck"] == []


# ----------------------------------------------------------------------------- GPU (real kernels)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _run(backend, inputs, do, cu=None, dtype=None, window=None, scale=None):
    leaves = [x.detach().to(dtype or x.dtype).requires_grad_() for x in inputs]
    from kernels import parallax_attention

    out = parallax_attention(*leaves, backend=backend, cu_seqlens=cu, window=window, scale=scale)
    out.backward(do.to(out.dtype))
    return out.detach(), [x.grad for x in leaves]


def _errors(got, ref, floor=1.0):
    """``rel_err`` of (out, grads) against ref, each reference norm floored at ``floor``."""
    return [rel_err(g, r, floor) for g, r in [(got[0], ref[0])] + list(zip(got[1], ref[1]))]


def _compare(got, ref, tol, floor=1.0):
    errs = _errors(got, ref, floor)
    assert all(e < tol for e in errs), errs


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("scale", [-0.3, 0.0])
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_scale_of_any_sign_matches_fp64(scale, d):
    """parallax_attention takes any finite scale: the Hopper forward keeps its running max in units of
    the scaled scores only for scale > 0 and hands the others to the Triton forward, whose backward
    passes (and the Hopper ones) take any sign."""
    inputs, do = cuda_inputs(2, 1000, 16, 8, d, torch.bfloat16, seed=9)
    got = _run("triton", inputs, do, scale=scale)
    ref = _run("reference", inputs, do, dtype=torch.float64, scale=scale)
    _compare(got, ref, 2e-2)


@pytest.mark.gpu
@gpu
def test_gpu_v_sliced_from_the_projection_gives_the_contiguous_bits():
    """v read in place from the fused projection's rows (TMA descriptors over its strides) gives the
    output and gradients of a contiguous copy of it, bit for bit, under the shipped configs."""
    (q, r, k, v), do = cuda_inputs(2, 1000, 16, 8, 128, torch.bfloat16, seed=6)
    rows = torch.zeros(2, 1000, (16 + 8 + 8 + 16) * 128, device="cuda", dtype=torch.bfloat16)  # q | k | v | rho
    v_slice = rows[..., 24 * 128:32 * 128].unflatten(-1, (8, 128))
    v_slice.copy_(v)
    sliced, plain = _run("triton", [q, r, k, v_slice], do), _run("triton", [q, r, k, v], do)
    assert torch.equal(sliced[0], plain[0])
    assert all(torch.equal(a, b) for a, b in zip(sliced[1], plain[1]))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape, dtype", [((2, 1000, 16, 8, 128), torch.bfloat16), ((1, 777, 8, 2, 64), torch.bfloat16),
                                          ((3, 129, 4, 4, 64), torch.float16)])
def test_gpu_matches_fp64_naive(shape, dtype):
    inputs, do = cuda_inputs(*shape, dtype, seed=1)
    got = _run("triton", inputs, do)
    ref = _run("reference", inputs, do, dtype=torch.float64)  # chunked fp64 == naive fp64 (CPU tests)
    _compare(got, ref, 1e-2 if dtype == torch.float16 else 2e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", [(1, 16384, 16, 8, 128), (4, 4096, 16, 8, 64)])
def test_gpu_long_sequences_match_reference(shape):
    inputs, do = cuda_inputs(*shape, torch.bfloat16, seed=2)
    got = _run("triton", inputs, do)
    ref = _run("reference", inputs, do, dtype=torch.float32)
    _compare(got, ref, 2e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape, lengths", [((2, 1000, 16, 8, 128), None), ((1, 3000, 8, 2, 64), [1, 700, 2299])],
                         ids=str)
def test_gpu_tma_configs_match_fp64(shape, lengths):
    """Every TMA sweep config (``tuning.TMA_SWEEP``) on bf16 training shapes: forward and backward
    against fp64, as the pointer-load configs are."""
    from kernels.parallax import tuning

    inputs, do = cuda_inputs(*shape, torch.bfloat16, seed=12)
    cu = cu_from_lengths(lengths, "cuda")
    ref = _run("reference", inputs, do, cu=cu, dtype=torch.float64)
    lists = [tuning.TMA_SWEEP[name] for name in ("fwd", "dq", "dkdv")]
    for i in range(max(map(len, lists))):  # every config of every list at least once
        fwd, dq, dkdv = (configs[i % len(configs)] for configs in lists)
        with tuning.candidates(fwd=[fwd], dq=[dq], dkdv=[dkdv]):
            _compare(_run("triton", inputs, do, cu=cu), ref, 3e-2)


@pytest.mark.gpu
@gpu
def test_gpu_varlen_and_large_rho():
    inputs, do = cuda_inputs(1, 3000, 8, 4, 128, torch.bfloat16, seed=3, rho_scale=8.0)
    cu = torch.tensor([0, 1, 700, 701, 2048, 2999, 3000], dtype=torch.int32, device="cuda")
    got = _run("triton", inputs, do, cu=cu)
    ref = _run("reference", inputs, do, cu=cu, dtype=torch.float64)
    _compare(got, ref, 3e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape, window, lengths", [
    ((1, 4096, 16, 8, 128), 1000, None),
    ((1, 4096, 16, 8, 64), 777, None),
    ((2, 4096, 8, 4, 128), 64, None),  # one key tile of the shipped configs
    ((2, 4096, 8, 2, 64), 4096, None),  # W = L: full causal
    ((1, 4096, 8, 4, 128), 700, [1000, 1, 2500, 595]),
], ids=str)
def test_gpu_window_matches_fp64_banded(shape, window, lengths):
    """bf16 sliding-window attention at training shapes (autotuned configs), forward and backward,
    against fp64 over the explicit banded mask."""
    inputs, do = cuda_inputs(*shape, torch.bfloat16, seed=8, rho_scale=2.0)
    cu = cu_from_lengths(lengths, "cuda")
    got = _run("triton", inputs, do, cu=cu, window=window)
    ref = banded_reference(inputs, do, window, lengths)
    _compare(got, ref, 2e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("window", [1, 777, 4096])
def test_gpu_window_agrees_with_parallax_kernel(window):
    """Our ``window = W`` beside the authors' parallax-kernel 0.1.1 ``window_size_left = W`` (their row
    i reads keys i - W + 1 .. i, the same band) on one bf16 input, forward and backward, both against
    the fp64 banded reference, the output's norm the floor (dq and dk are exactly zero at W = 1):
    ours within bf16 error. Both kernels' errors are printed, for docs/bench/attention_window.md."""
    parallax = pytest.importorskip("parallax")
    import parallax.triton.parallax_train as theirs_module

    inputs, do = cuda_inputs(2, 4096, 16, 8, 128, torch.bfloat16, seed=11, rho_scale=2.0)
    ours = _run("triton", inputs, do, window=window)
    leaves = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in inputs]  # (B, H, L, D)
    with _one_config_each(theirs_module):
        out = parallax.parallax_func(*leaves, window_size_left=window)
        out.backward(do.transpose(1, 2).contiguous())
    theirs = (out.detach().transpose(1, 2), [x.grad.transpose(1, 2) for x in leaves])
    ref = banded_reference(inputs, do, window)
    floor = float(ref[0].norm())
    errors = {"ours": _errors(ours, ref, floor), "theirs": _errors(theirs, ref, floor)}
    print(f"window {window}: relative errors (o, dq, dr, dk, dv) vs fp64", errors)
    assert max(errors["ours"]) < 2e-2, errors


@contextlib.contextmanager
def _one_config_each(module):
    """Every triton autotuner in ``module`` restricted to one config, its smallest tiles with 4 warps
    and 2 stages where it lists one: the results do not depend on the tile, and parallax-kernel's
    sweeps (36 configs per kernel, re-run per window) take minutes per call."""
    from triton.runtime.autotuner import Autotuner

    def size(config):
        return tuple(v for k, v in sorted(config.kwargs.items()) if k.endswith("TILE_SIZE"))

    tuners = {name: obj for name, obj in vars(module).items() if isinstance(obj, Autotuner)}
    saved = {name: tuner.configs for name, tuner in tuners.items()}
    for tuner in tuners.values():
        small = min(size(c) for c in tuner.configs)
        picks = [c for c in tuner.configs if size(c) == small and (c.num_warps, c.num_stages) == (4, 2)]
        tuner.configs = picks[:1] or [min(tuner.configs, key=size)]
    try:
        yield
    finally:
        for name, configs in saved.items():
            tuners[name].configs = configs


@pytest.mark.gpu
@gpu
def test_gpu_window_skips_the_tiles_outside_the_band():
    """At L=16384 a window of 1024 keys does about an eighth of causal attention's work: forward and
    forward + backward must run at least 2.5x faster (skipped tiles, not masked ones)."""
    from kernels.parallax.benchmark import time_window_vs_causal

    rows = time_window_vs_causal(seq_len=16384, windows=(1024,), rep=100)
    for row in rows:
        print(row)
    assert all(row["speedup"] > 2.5 for row in rows if row["window"] == 1024), rows


@pytest.mark.gpu
@gpu
def test_gpu_cu_seqlens_checked_once_per_tensor():
    """The host check of cu_seqlens syncs on a tensor's first use only: forward and backward again
    with the same tensor run under sync debug mode "error"; a fresh tensor with the same values syncs."""
    inputs, do = cuda_inputs(1, 3000, 8, 4, 128, torch.bfloat16, seed=6)
    cu = torch.tensor([0, 1, 700, 2048, 3000], dtype=torch.int32, device="cuda")
    first = _run("triton", inputs, do, cu=cu)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = _run("triton", inputs, do, cu=cu)
        with pytest.raises(RuntimeError, match="synchroniz"):
            _run("triton", inputs, do, cu=cu.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _compare(again, first, 1e-6)


def _graph_capture_main():
    """Child process (CUDA): parallax_attention with cu_seqlens captured in a CUDA graph. Prints
    whether replays follow new valid offsets written into the captured buffer, then writes invalid
    offsets and replays: the device-side check must stop the process's CUDA work."""
    from kernels import parallax_attention

    (q, r, k, v), _ = cuda_inputs(1, 1000, 4, 2, 64, torch.bfloat16, seed=7)
    cu = torch.tensor([0, 300, 1000], dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad():
        with torch.cuda.stream(side):
            parallax_attention(q, r, k, v, cu_seqlens=cu)  # compiles outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = parallax_attention(q, r, k, v, cu_seqlens=cu)
        for offsets in ([0, 300, 1000], [0, 999, 1000]):
            cu.copy_(torch.tensor(offsets, dtype=torch.int32))
            graph.replay()
            eager = parallax_attention(q, r, k, v, cu_seqlens=torch.tensor(offsets, dtype=torch.int32, device="cuda"))
            print("REPLAY", offsets, torch.equal(out, eager), flush=True)
        cu.copy_(torch.tensor([0, 10, 6], dtype=torch.int32))
        graph.replay()
        try:
            torch.cuda.synchronize()
            print("INVALID OFFSETS RAN", flush=True)
        except RuntimeError as exc:
            print("DEVICE ASSERT", repr(exc)[:200], flush=True)


@pytest.mark.gpu
@gpu
def test_gpu_cu_seqlens_checked_on_device_under_graph_capture():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import tests.test_parallax_fused as m; m._graph_capture_main()"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout
    assert "REPLAY [0, 300, 1000] True" in out and "REPLAY [0, 999, 1000] True" in out, (out, proc.stderr[-3000:])
    assert "INVALID OFFSETS RAN" not in out
    assert "DEVICE ASSERT" in out or "device-side assert" in proc.stderr, (out, proc.stderr[-3000:])


@pytest.mark.gpu
@gpu
def test_gpu_compiled_block_matches_eager():
    """Inductor-compiled block with the op inside; .sum() gives an expanded upstream gradient."""
    from kernels import parallax_attention

    inputs, _ = cuda_inputs(2, 1024, 8, 4, 128, torch.bfloat16, seed=4)
    proj = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16) / 11

    def block(q, r, k, v):
        return parallax_attention(q @ proj, r, k, v) @ proj

    results = []
    for fn in (block, torch.compile(block, fullgraph=True)):
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        out = fn(*leaves)
        out.float().sum().backward()
        results.append((out.detach(), [x.grad for x in leaves]))
    _compare(results[1], results[0], 1e-2)
    ref = []  # and both agree with the fp32 reference
    leaves = [x.detach().float().requires_grad_() for x in inputs]
    out = parallax_attention(leaves[0] @ proj.float(), *leaves[1:], backend="reference") @ proj.float()
    out.sum().backward()
    ref = (out.detach(), [x.grad for x in leaves])
    _compare(results[1], ref, 2e-2)


_FP64 = {}  # d -> (inputs, upstream gradient, fp64 reference output and gradients), shared by the config tests


def _config_case(d):
    if d not in _FP64:
        inputs, do = cuda_inputs(2, 1000, 8, 4, d, torch.bfloat16, seed=5)
        _FP64[d] = inputs, do, _run("reference", inputs, do, dtype=torch.float64)
    return _FP64[d]


def _check_configs(d, fwd=None, dq=None, dkdv=None):
    from kernels.parallax import fused

    (q, r, k, v), do, ref = _config_case(d)
    scale = d ** -0.5
    saved = fused.forward(q, r, k, v, scale, config=fwd)
    grads = fused.backward(do, q, r, k, v, *saved, scale, dq_config=dq, dkdv_config=dkdv)
    _compare((saved[0], grads), ref, 2e-2)


def _shipped_list_length():
    from kernels.parallax import tuning

    return max(len(c) for c in tuning.SHIPPED.values())


def _sweep_column_configs():
    from kernels.parallax import tuning

    # one program order: orders change which program runs which tile, not a tile's arithmetic
    return [tuning.launch_kwargs(c) for c in tuning.SWEEP["dkdv"] if c.kwargs["GLOBAL_ORDER"]]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("index", range(_shipped_list_length()))
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_shipped_configs_match_fp64(index, d):
    """Every config of the shipped lists (tile shapes, both program orders, both column-pass
    orientations) at a ragged length, against fp64: config ``index`` of each list (cycling)."""
    from kernels.parallax import tuning

    fwd, dq, dkdv = (c[index % len(c)] for c in (tuning.SHIPPED[n] for n in ("fwd", "dq", "dkdv")))
    _check_configs(d, fwd, dq, dkdv)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("config", _sweep_column_configs(), ids=str)
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_sweep_column_configs_match_fp64(config, d):
    """The sweep's column-pass candidates (one joins tuning.SHIPPED when it wins a sweep), against fp64;
    a config that does not fit the GPU's shared memory is skipped, as the autotuner skips it."""
    from triton.runtime.errors import OutOfResources

    try:
        _check_configs(d, dkdv=config)
    except OutOfResources as exc:
        pytest.skip(str(exc))


def test_small_problems_skip_autotuning():
    """Below SMALL_WORK the first listed config runs without tuning (MAD-size models compile one
    config per kernel instead of all of them); training-size work goes to the autotuner."""
    from kernels.parallax import tuning

    mad = 128 * 128 * 128 * 8 * 16  # batch 128 x seq 128 tokens, 128 keys, 8 heads of 16
    first = tuning.SHIPPED["dkdv"][0]
    assert tuning.choose("dkdv", mad, interpret=False) == {**first.kwargs, "num_warps": first.num_warps,
                                                            "num_stages": first.num_stages}
    train = 4 * 4096 * 4096 * 16 * 128
    assert tuning.choose("dkdv", train, interpret=False) is None
    explicit = {"BM": 16, "BN": 16, "num_warps": 4, "num_stages": 1}
    assert tuning.choose("fwd", mad, explicit, interpret=False) == {"GLOBAL_ORDER": True, **explicit}
    assert tuning.choose("fwd", train, interpret=True) == {"GLOBAL_ORDER": True, **tuning.INTERPRET_CONFIG}


def test_candidates_override_and_restore():
    """Inside ``candidates`` a one-config list runs that config at every size (and under the
    interpreter); a longer list autotunes at training size; the shipped lists come back on exit."""
    from kernels.parallax import tuning

    train = 4 * 4096 * 4096 * 16 * 128
    one = tuning.SWEEP["dkdv"][-1]
    with tuning.candidates(dkdv=[one]):
        assert tuning.active("dkdv") == (one,) and tuning.active("fwd") == tuning.SHIPPED["fwd"]
        for interpret in (False, True):
            assert tuning.choose("dkdv", train, interpret=interpret) == {"GLOBAL_ORDER": True,
                                                                         **tuning.launch_kwargs(one)}
        with tuning.candidates(**tuning.SWEEP):
            assert tuning.active("dkdv") == tuning.SWEEP["dkdv"]
            assert tuning.choose("dkdv", train, interpret=False) is None
        assert tuning.active("dkdv") == (one,)
    assert tuning.active("dkdv") == tuning.SHIPPED["dkdv"]


def test_select_keeps_one_autotuner_per_candidate_list_and_autotuner_finds_the_active_one(monkeypatch):
    """Above SMALL_WORK ``select`` returns an autotuner over ``active(name)``, the same one on every call;
    a ``candidates`` block gets its own; ``autotuner(name)`` is the one of the list active now."""
    from kernels.parallax import fused, tuning

    if tuning.INTERPRET:
        pytest.skip("under TRITON_INTERPRET=1 every launch takes INTERPRET_CONFIG, no autotuner")
    monkeypatch.setattr(tuning, "_tuners", {})
    train = 4 * 4096 * 4096 * 16 * 128
    assert tuning.autotuner("fwd") is None
    tuner, launch = tuning.select("fwd", fused._fwd_kernel, train)
    assert launch == {} and tuning.autotuner("fwd") is tuner
    assert [str(c) for c in tuner.configs] == [str(c) for c in tuning.SHIPPED["fwd"]]
    assert tuning.select("fwd", fused._fwd_kernel, train)[0] is tuner
    assert tuning.autotuner("dq") is None
    with tuning.candidates(fwd=tuning.SWEEP["fwd"]):
        assert tuning.autotuner("fwd") is None
        swept, _ = tuning.select("fwd", fused._fwd_kernel, train)
        assert swept is not tuner and tuning.autotuner("fwd") is swept
    assert tuning.autotuner("fwd") is tuner
    assert tuning.tuner_key("fwd", tuning.SHIPPED["fwd"]) in tuning._tuners


@pytest.mark.parametrize("call, match", [
    (lambda t: t.candidates(bwd=t.SHIPPED["dq"]), "kernel name 'bwd'"),
    (lambda t: t.candidates(dq=[]), r"candidates\(dq=...\) must be a non-empty list"),
    (lambda t: t.candidates(dq=[{"BM": 16}]), "must be a non-empty list of triton.Config"),
    (lambda t: t.launch_kwargs((16, 16)), "config must be a triton.Config or a dict"),
])
def test_tuning_rejects_bad_input(call, match):
    from kernels.parallax import tuning

    with pytest.raises((ValueError, TypeError), match=match):
        with call(tuning):
            pass
