"""Fused Triton Affine Linear Attention (kernels.affine_linear_attention, backend="triton").

CPU: the kernels run under TRITON_INTERPRET=1 in ONE subprocess (the variable must be set before
triton is first imported, which another test module may already have done in this process); the
child saves inputs, outputs and gradients, and this process checks them against the fp64
reference. GPU tests (``gpu``): realistic shapes in bf16/fp16/fp32 against fp64, fla's
``chunk_linear_attn`` and ``chunk_mesa_net`` with the intercept removed, and the timing helper.

Normalisation matched against fla (fla-core 0.6.0):
* linear attention: ``chunk_linear_attn(q, k, v, scale=1, normalize=False)`` returns
  sum_{j<=i} (q_i . k_j) v_j = S_vk(i) q_i; ours without intercept is -(1/i) S_vk(i) r_i, so
  fla(q) == i * ours(r = -q). (fla's normalize=True divides by q_i . sum_j k_j instead of i.)
* MesaNet: ``chunk_mesa_net`` keeps h_kk(i) = e^{g_i} h_kk(i-1) + beta_i k_i k_i^T (h_kv alike) and
  returns h_kv(i)^T (h_kk(i) + diag(lamb))^-1 q_i. With g_i = log((i-1)/i) (g_1 = 0) and
  beta_i = 1/i the states are the uniform averages S_kk(i)/i, S_vk(i)/i, which is exactly our
  intercept-free Affine MesaNet with lam = lamb (up to fla's finite CG iterations).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests import _family_reference as ref
from tests._interpret import rel_err, run_interpreted


# name -> (B, L, Hq, Hkv, D, dtype, intercept); the interpreter's chunk is 16 tokens
INTERPRET_CASES = {
    "len1": (1, 1, 2, 1, 16, "float32", True),
    "odd_gqa2_batch2": (2, 37, 4, 2, 32, "float32", True),
    "no_intercept_gqa2": (1, 40, 2, 1, 16, "float32", False),
    "d64_mha_ragged": (1, 23, 2, 2, 64, "float32", True),
    "aligned_gqa4": (1, 32, 4, 1, 16, "float32", True),
    "fp16": (1, 24, 2, 1, 16, "float16", True),
    "fp16_large_mean": (1, 100, 2, 1, 16, "float16", True),
    "fp16_long": (1, 128, 2, 1, 32, "float16", True),  # eight chunks: the state carries most of the sums
    "gqa3_batch2_no_intercept": (2, 19, 6, 2, 16, "float32", False),  # a group size that is not a power of 2
}  # no bf16 here: triton 3.9's interpreter computes bf16 tl.dot wrongly (bf16 runs in the GPU tests)
# keys and values shifted by this: sum_j k_j v_j^T passes fp16's largest value (65504) within L = 100
OFFSET = {"fp16_large_mean": 30.0}
TOL = {"float32": 2e-6, "float16": 2e-3}


def make_case(b, n, hq, hkv, d, dtype, seed, device="cpu"):
    gen = torch.Generator(device=device).manual_seed(seed)
    r = torch.randn(b, n, hq, d, generator=gen, device=device) / math.sqrt(d)
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device=device) for _ in range(2))
    do = torch.randn(b, n, hq, d, generator=gen, device=device)
    return [x.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype) for x in (r, k, v, do)]


def _run(r, k, v, do, intercept=True, backend="triton"):
    from kernels import affine_linear_attention

    leaves = [x.detach().clone().requires_grad_() for x in (r, k, v)]
    out = affine_linear_attention(*leaves, intercept=intercept, backend=backend)
    out.backward(do)
    return out.detach(), [x.grad for x in leaves]


def _interpret_jobs():
    """Child process (TRITON_INTERPRET=1): every case through the public API, plus the custom op
    under torch.compile with an expanded upstream gradient, plus opcheck; one job per case."""
    from functools import partial

    jobs = [partial(_case_results, seed, name, spec) for seed, (name, spec) in enumerate(INTERPRET_CASES.items())]
    return jobs + [lambda: {"compiled": _compiled_case()}, lambda: {"opcheck": _opcheck()}]


def _case_results(seed, name, spec):
    b, n, hq, hkv, d, dtype, intercept = spec
    r, k, v, do = make_case(b, n, hq, hkv, d, dtype, seed)
    k, v = k + OFFSET.get(name, 0.0), v + OFFSET.get(name, 0.0)
    out, grads = _run(r, k, v, do, intercept)
    return {name: {"inputs": (r, k, v, do), "out": out, "grads": grads}}


def _compiled_case():
    """Public API inside torch.compile (aot_eager); .sum() gives a stride-0 upstream gradient and r is a
    non-contiguous view."""
    from kernels import affine_linear_attention

    r, k, v, _ = make_case(1, 19, 4, 2, 16, "float32", seed=99)
    r = r.transpose(1, 2).contiguous().transpose(1, 2)
    leaves = [x.clone().requires_grad_() for x in (r, k, v)]
    block = torch.compile(lambda r, k, v: affine_linear_attention(r, k, v, backend="triton") * 1.5,
                          backend="aot_eager", fullgraph=True)
    block(*leaves).sum().backward()
    return {"inputs": tuple(x.detach() for x in leaves), "grads": tuple(x.grad / 1.5 for x in leaves)}


def _opcheck():
    from kernels.family import affine_la_fused, ops

    r, k, v, do = make_case(1, 9, 2, 1, 16, "float32", seed=7)
    errors = []
    for intercept in (True, False):
        _, tbar = affine_la_fused.forward(r, k, v, intercept)
        cases = ((ops.affine_la_fwd, ([x.clone().requires_grad_() for x in (r, k, v)] + [intercept])),
                 (ops.affine_la_bwd, (do, r, k, v, tbar, intercept)))
        for op, args in cases:
            try:
                torch.library.opcheck(op, args)
            except Exception as exc:  # reported to the parent, which fails the test
                errors.append(f"{op}: {exc!r}"[:2000])
    return errors


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return run_interpreted("tests.test_family_fused", tmp_path_factory.mktemp("interp"))


def reference(r, k, v, do, intercept=True):
    """fp64 dense output and gradients of (r, k, v)."""
    leaves = [x.double().requires_grad_() for x in (r, k, v)]
    out = ref.affine_linear_attention_dense(*leaves, intercept)
    out.backward(do.double())
    return out.detach(), [x.grad for x in leaves]


def errors_against_reference(result, intercept=True):
    out_ref, grads_ref = reference(*result["inputs"], intercept)
    errs = {"o": rel_err(result["out"], out_ref)}
    errs.update({f"d{n}": rel_err(g, w) for n, g, w in zip("rkv", result["grads"], grads_ref)})
    return errs


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpreted_kernels_match_fp64(interpreted, name):
    *_, dtype, intercept = INTERPRET_CASES[name]
    res = interpreted[name]
    errs = errors_against_reference(res, intercept)
    assert all(e < TOL[dtype] for e in errs.values()), errs
    for g, x in zip(res["grads"], res["inputs"]):
        assert g.dtype == x.dtype and g.shape == x.shape


@pytest.mark.parametrize("name", [n for n, case in INTERPRET_CASES.items() if case[5] == "float16"])
def test_interpreted_fp16_error_is_the_pytorch_forms(interpreted, name):
    """With 16-bit inputs the kernels' error against fp64 is that of the fp32 PyTorch form on the same
    inputs (the 16-bit shift by the first token and the output's rounding): the fp32 states and
    scores must not be rounded to 16 bits before their products. The interpreter's fp16 dots are
    GPU-faithful (exact products, fp32 sums). With single fp16 casts of those operands dr's error
    was 1.9 to 3.7 times the reference's in these cases (bf16 on an H200 at L = 2048: 6.6 times)."""
    res, intercept = interpreted[name], INTERPRET_CASES[name][6]
    errs = errors_against_reference(res, intercept)
    out, grads = _run(*res["inputs"], intercept=intercept, backend="reference")
    floor = errors_against_reference({"inputs": res["inputs"], "out": out, "grads": grads}, intercept)
    assert all(errs[n] < 1.1 * floor[n] for n in errs), (errs, "reference backend:", floor)


def test_interpreted_compiled_custom_op_with_expanded_grad(interpreted):
    res = interpreted["compiled"]
    r, k, v = res["inputs"]
    _, want = reference(r, k, v, torch.ones(r.shape, dtype=torch.float64))
    errs = [rel_err(g, w) for g, w in zip(res["grads"], want)]
    assert max(errs) < TOL["float32"], errs


def test_interpreted_custom_ops_pass_opcheck(interpreted):
    assert interpreted["opcheck"] == []


# ----------------------------------------------------------------------------- GPU (real kernels)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# (B, L, Hq, Hkv, D): model-like and MAD-like sizes, ragged lengths
GPU_SHAPES = [(2, 1000, 8, 4, 128), (1, 2048, 16, 8, 64), (3, 333, 4, 4, 32)]
# relative-norm error bounds against fp64 for output and gradients: fp32 uses IEEE dots; the 16-bit
# bounds are a few times the output rounding (bf16 2^-9, fp16 2^-12 relative)
# bf16: at (1, 2048, 16, 8, 64) on an H200 the PyTorch form's own output error is 0.019 (the bf16
# shift by the first token and the output rounding, which both backends share; its dr error 0.0038)
GPU_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_kernels_match_fp64(shape, dtype):
    r, k, v, do = make_case(*shape, dtype, seed=1, device="cuda")
    out, grads = _run(r, k, v, do)
    errs = errors_against_reference({"inputs": (r, k, v, do), "out": out, "grads": grads})
    floor = errors_against_reference(dict(zip(("out", "grads"), _run(r, k, v, do, backend="reference")),
                                          inputs=(r, k, v, do)))
    assert all(e < GPU_TOL[dtype] for e in errs.values()), (errs, "reference backend:", floor)


@pytest.mark.gpu
@cuda
def test_gpu_no_intercept_matches_fla_linear_attention():
    la = pytest.importorskip("fla.ops.linear_attn", reason="fla-core is not installed")
    b, n, h, d = 2, 500, 4, 64
    r, k, v, _ = make_case(b, n, h, h, d, torch.bfloat16, seed=2, device="cuda")
    from kernels import affine_linear_attention

    count = torch.arange(1, n + 1, device="cuda", dtype=torch.float32)[None, :, None, None]
    ours = affine_linear_attention(-r, k, v, intercept=False).float() * count
    theirs = la.chunk_linear_attn(r, k, v, scale=1.0, normalize=False)[0].float()
    exact = ref.affine_linear_attention_dense(*(x.double() for x in (-r, k, v)), False) * count
    assert rel_err(theirs, exact) < 2.5e-2  # fla itself is where we think it is
    assert rel_err(ours, theirs) < 2.5e-2, (rel_err(ours, exact), rel_err(theirs, exact))


@pytest.mark.gpu
@cuda
def test_gpu_no_intercept_matches_fla_mesa_net():
    mesa = pytest.importorskip("fla.ops.mesa_net", reason="fla-core is not installed")
    b, n, h, d, lam = 2, 300, 4, 64, 1.0
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(b, n, h, d, generator=gen, device="cuda") for _ in range(3))
    q, k = (torch.nn.functional.normalize(x, dim=-1) for x in (q, k))  # fla's recommended l2-normalised keys
    i = torch.arange(1, n + 1, device="cuda", dtype=torch.float32)
    g = torch.log((i - 1).clamp_min(1) / i).expand(b, h, n).transpose(1, 2).contiguous()  # g_1 = log 1 = 0
    beta = (1 / i).expand(b, h, n).transpose(1, 2).contiguous()
    lamb = torch.full((h, d), lam, device="cuda")
    from kernels import affine_mesanet

    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    theirs = mesa.chunk_mesa_net(qb, kb, vb, g, beta, lamb, max_CG_iteration=30)[0].float()
    ours = affine_mesanet(*(x.float() for x in (qb, kb, vb)), lam=lam, intercept=False)
    exact = affine_mesanet(*(x.double() for x in (qb, kb, vb)), lam=lam, intercept=False)
    assert rel_err(ours, exact) < 1e-4, rel_err(ours, exact)
    assert rel_err(theirs, exact) < 2.5e-2, rel_err(theirs, exact)


@pytest.mark.gpu
@cuda
def test_gpu_timing_helper_reports_both_kernels():
    from kernels.family.bench import time_affine_la

    result = time_affine_la(batch=1, seq_len=4096, q_heads=4, kv_heads=2, head_dim=128, reps=3)
    assert result["shape"] == (1, 4096, 4, 2, 128) and result["affine_la_ms"] > 0
    try:
        import fla.ops.linear_attn  # noqa: F401
    except ImportError:
        assert result["fla_linear_attn_ms"] is None
    else:
        assert result["fla_linear_attn_ms"] > 0 and result["ratio"] > 0
    print(result)
