"""Fused Triton Parallax attention against the fp64 naive reference.

CPU: the kernels run under TRITON_INTERPRET=1 in ONE subprocess (the variable must be set
before triton is first imported, which another test module may already have done in this
process); the child saves inputs, outputs and gradients, and this process checks them against
parallax_attention_naive in fp64. GPU tests (marked ``gpu``) run the real kernels at real shapes.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.parallax.naive import parallax_attention_naive

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
VARIANTS = [n + "_head_major" for n in HEAD_MAJOR_CASES] + [n + "_rows" for n in ROWS_CASES]


def make_case(shape_b, n, hq, hkv, d, dtype, rho_scale, seed):
    gen = torch.Generator().manual_seed(seed)
    q, r = (torch.randn(shape_b, n, hq, d, generator=gen) for _ in range(2))
    k, v = (torch.randn(shape_b, n, hkv, d, generator=gen) for _ in range(2))
    do = torch.randn(shape_b, n, hq, d, generator=gen)
    r = r * rho_scale / math.sqrt(d)
    return [x.to(getattr(torch, dtype)) for x in (q, r, k, v, do)]


def cu_from_lengths(lengths):
    return None if lengths is None else torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _interpret_main(out_path):
    """Child process (TRITON_INTERPRET=1): run every case through the fused kernels and the custom op."""
    from kernels import parallax_attention
    from kernels.parallax import fused

    results = {}
    for seed, (name, (b, n, hq, hkv, d, dtype, rho_scale, lengths, cfg)) in enumerate(INTERPRET_CASES.items()):
        q, r, k, v, do = make_case(b, n, hq, hkv, d, dtype, rho_scale, seed)
        cu, scale = cu_from_lengths(lengths), 1.0 / math.sqrt(d)
        o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, config=cfg)
        grads = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, dq_config=cfg, dkdv_config=cfg)
        results[name] = {"inputs": (q, r, k, v, do), "out": o, "grads": grads}
        if name in HEAD_MAJOR_CASES:
            hm = {**(cfg or fused.INTERPRET_CONFIG), "GLOBAL_ORDER": False}
            o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, config=hm)
            grads = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, dq_config=hm, dkdv_config=hm)
            results[name + "_head_major"] = {"inputs": (q, r, k, v, do), "out": o, "grads": grads}
        if name in ROWS_CASES:
            o, vbar, tbar, lse = fused.forward(q, r, k, v, scale, cu, config=cfg)
            rows = {**(cfg or fused.INTERPRET_CONFIG), "ROWS": True}
            grads = fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu, dq_config=cfg, dkdv_config=rows)
            results[name + "_rows"] = {"inputs": (q, r, k, v, do), "out": o, "grads": grads}
    results["custom_op"] = _custom_op_case(parallax_attention, compiled=False)
    results["compiled"] = _custom_op_case(parallax_attention, compiled=True)
    results["opcheck"] = _opcheck()
    torch.save(results, out_path)


def _opcheck():
    """torch.library.opcheck on both custom ops (schema, fake tensors, autograd registration)."""
    from kernels.parallax import fused, ops

    q, r, k, v, do = make_case(1, 9, 2, 1, 16, "float32", 1.0, seed=7)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    errors = []
    for cu_arg in (None, cu):
        fwd_args = ([x.requires_grad_() for x in (q, r, k, v)] + [0.25, cu_arg])
        saved = fused.forward(q.detach(), r.detach(), k.detach(), v.detach(), 0.25, cu_arg)
        bwd_args = (do, q.detach(), r.detach(), k.detach(), v.detach(), *saved, 0.25, cu_arg)
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


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    out_path = tmp_path_factory.mktemp("interp") / "results.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    code = f"import tests.test_parallax_fused as m; m._interpret_main({str(out_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out_path)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1.0)).item()  # floor: exact-zero grads at L=1


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


@pytest.mark.parametrize("name", ["custom_op", "compiled"])
def test_interpreted_custom_op_with_expanded_grad(interpreted, name):
    res = interpreted[name]
    check(res, None, TOL["float32"], upstream=res["upstream"])


def test_interpreted_custom_ops_pass_opcheck(interpreted):
    assert interpreted["opcheck"] == []


# ----------------------------------------------------------------------------- GPU (real kernels)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cuda_inputs(b, n, hq, hkv, d, dtype, seed, rho_scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, r, do = (torch.randn(b, n, hq, d, generator=gen, device="cuda") for _ in range(3))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device="cuda") for _ in range(2))
    r = r * rho_scale / math.sqrt(d)
    return [x.to(dtype) for x in (q, r, k, v)], do.to(dtype)


def _run(backend, inputs, do, cu=None, dtype=None):
    leaves = [x.detach().to(dtype or x.dtype).requires_grad_() for x in inputs]
    from kernels import parallax_attention

    out = parallax_attention(*leaves, backend=backend, cu_seqlens=cu)
    out.backward(do.to(out.dtype))
    return out.detach(), [x.grad for x in leaves]


def _compare(got, ref, tol):
    errs = [rel_err(got[0], ref[0])] + [rel_err(g, r) for g, r in zip(got[1], ref[1])]
    assert all(e < tol for e in errs), errs


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape, dtype", [((2, 1000, 16, 8, 128), torch.bfloat16), ((1, 777, 8, 2, 64), torch.bfloat16),
                                          ((3, 129, 4, 4, 64), torch.float16)])
def test_gpu_matches_fp64_naive(shape, dtype):
    inputs, do = _cuda_inputs(*shape, dtype, seed=1)
    got = _run("triton", inputs, do)
    ref = _run("reference", inputs, do, dtype=torch.float64)  # chunked fp64 == naive fp64 (CPU tests)
    _compare(got, ref, 1e-2 if dtype == torch.float16 else 2e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", [(1, 16384, 16, 8, 128), (4, 4096, 16, 8, 64)])
def test_gpu_long_sequences_match_reference(shape):
    inputs, do = _cuda_inputs(*shape, torch.bfloat16, seed=2)
    got = _run("triton", inputs, do)
    ref = _run("reference", inputs, do, dtype=torch.float32)
    _compare(got, ref, 2e-2)


@pytest.mark.gpu
@gpu
def test_gpu_varlen_and_large_rho():
    inputs, do = _cuda_inputs(1, 3000, 8, 4, 128, torch.bfloat16, seed=3, rho_scale=8.0)
    cu = torch.tensor([0, 1, 700, 701, 2048, 2999, 3000], dtype=torch.int32, device="cuda")
    got = _run("triton", inputs, do, cu=cu)
    ref = _run("reference", inputs, do, cu=cu, dtype=torch.float64)
    _compare(got, ref, 3e-2)


@pytest.mark.gpu
@gpu
def test_gpu_compiled_block_matches_eager():
    """Inductor-compiled block with the op inside; .sum() gives an expanded upstream gradient."""
    from kernels import parallax_attention

    inputs, _ = _cuda_inputs(2, 1024, 8, 4, 128, torch.bfloat16, seed=4)
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


def _launch(config):
    """A triton.Config as the explicit launch kwargs fused.forward/backward take."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


_FP64 = {}  # d -> (inputs, upstream gradient, fp64 reference output and gradients), shared by the config tests


def _config_case(d):
    if d not in _FP64:
        inputs, do = _cuda_inputs(2, 1000, 8, 4, d, torch.bfloat16, seed=5)
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
    from kernels.parallax import fused

    return max(len(c) for c in (fused.FWD_CONFIGS, fused.DQ_CONFIGS, fused.DKDV_CONFIGS))


def _sweep_column_configs():
    from scripts.bench.attention import sweep_configs

    # one program order: orders change which program runs which tile, not a tile's arithmetic
    return [_launch(c) for c in sweep_configs()["_DKDV_TUNED"][1] if c.kwargs["GLOBAL_ORDER"]]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("index", range(_shipped_list_length()))
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_shipped_configs_match_fp64(index, d):
    """Every config of the shipped lists (tile shapes, both program orders, both column-pass
    orientations) at a ragged length, against fp64: config ``index`` of each list (cycling)."""
    from kernels.parallax import fused

    fwd, dq, dkdv = (_launch(c[index % len(c)]) for c in (fused.FWD_CONFIGS, fused.DQ_CONFIGS, fused.DKDV_CONFIGS))
    _check_configs(d, fwd, dq, dkdv)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("config", _sweep_column_configs(), ids=str)
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_sweep_column_configs_match_fp64(config, d):
    """The sweep's column-pass candidates (they join DKDV_CONFIGS when they win a sweep), against fp64;
    a config that does not fit the GPU's shared memory is skipped, as the autotuner skips it."""
    from triton.runtime.errors import OutOfResources

    try:
        _check_configs(d, dkdv=config)
    except OutOfResources as exc:
        pytest.skip(str(exc))


def test_small_problems_skip_autotuning(monkeypatch):
    """Below SMALL_WORK the first listed config runs without tuning (MAD-size models compile one
    config per kernel instead of all of them); training-size work goes to the autotuner."""
    from kernels.parallax import fused

    monkeypatch.setattr(fused, "INTERPRET", False)
    mad = 128 * 128 * 128 * 8 * 16  # batch 128 x seq 128 tokens, 128 keys, 8 heads of 16
    kernel, launch = fused._pick(fused._bwd_dkdv_kernel, fused._DKDV_TUNED, None, mad)
    first = fused.DKDV_CONFIGS[0]
    assert kernel is fused._bwd_dkdv_kernel
    assert launch == {**first.kwargs, "num_warps": first.num_warps, "num_stages": first.num_stages}
    train = 4 * 4096 * 4096 * 16 * 128
    assert fused._pick(fused._bwd_dkdv_kernel, fused._DKDV_TUNED, None, train) == (fused._DKDV_TUNED, {})
    explicit = {"BM": 16, "BN": 16, "num_warps": 4, "num_stages": 1}
    assert fused._pick(fused._fwd_kernel, fused._FWD_TUNED, explicit, mad)[1] == {"GLOBAL_ORDER": True, **explicit}
