"""kernels.gram.symmetric_product (alpha P P^T + beta Y + gamma I) and its use in Polar Express.

* The PyTorch reference (``naive``) against the fp64 closed form, on the CPU.
* The Triton kernel under TRITON_INTERPRET=1 in one child process (``_interpret_results``; the variable
  must be set before Triton is first imported): wide and transposed-view P, the Y / beta / gamma
  epilogue, odd sizes, batch 1 and 3, 2-D P, fp32 / bf16 / fp16 against fp64; every output exactly
  symmetric and equal over two runs; no entry of Y below the diagonal used; ``polar_express`` with the
  kernel against the torch path in fp32.
* Argument checks (no launch); ``import kernels`` and the CPU path of polar_express import no Triton;
  the benchmark's page on a fabricated result.
* ``gpu``: the 0.6B Muon shapes in bf16 against fp64, and ``polar_express`` against the SVD polar
  factor.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch

from kernels.gram import naive
from tests._interpret import REPO, rel_err, run_interpreted

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}  # fp16 rounds 8x finer than bf16


def symmetric(B, k, seed, dtype=torch.float32):
    """A random symmetric (B, k, k) matrix of norm about sqrt(k) (exactly symmetric in ``dtype``)."""
    M = torch.randn(B, k, k, generator=torch.Generator().manual_seed(seed)) / k**0.5
    return ((M + M.mT) / 2).to(dtype)


def make_case(B, k, K, dtype, seed, transposed=False, epilogue=False, flat=False):
    """Arguments (P, alpha, Y, beta, gamma) of one case. ``transposed``: P is ``X.mT`` of a
    contiguous (B, K, k) X; ``epilogue``: a symmetric Y with beta and gamma; ``flat``: 2-D P (B = 1)."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(B, K, k, generator=gen) if transposed else torch.randn(B, k, K, generator=gen)
    P = (X / max(K, 1) ** 0.5).to(dtype)
    P = P.mT if transposed else P
    Y, alpha, beta, gamma = None, 1.0, 0.0, 0.0
    if epilogue:
        Y, alpha, beta, gamma = symmetric(B, k, seed + 1, dtype), 0.7, -1.3, 2.5
    if flat:
        P, Y = P[0], None if Y is None else Y[0]
    return P, alpha, Y, beta, gamma


# name -> make_case arguments (B, k, K, dtype, seed, transposed, epilogue, flat); the interpreter's
# tiles are 32 x 32 with K-steps of 16, so k = 64, K = 32 is the unmasked path
INTERPRET_CASES = {
    "wide_fp32": (3, 100, 37, torch.float32, 0),
    "wide_aligned_fp32": (2, 64, 32, torch.float32, 1),
    "odd_33x130_fp32": (1, 33, 130, torch.float32, 2),
    "transposed_fp32": (3, 40, 70, torch.float32, 3, True),
    "epilogue_fp32": (2, 64, 64, torch.float32, 4, False, True),
    "epilogue_odd_fp32": (1, 100, 37, torch.float32, 5, False, True),
    "flat_fp32": (1, 100, 37, torch.float32, 6, False, True, True),
    "empty_K_fp32": (2, 20, 0, torch.float32, 7, False, True),
    "wide_bf16": (3, 100, 37, torch.bfloat16, 8),
    "transposed_bf16": (1, 33, 130, torch.bfloat16, 9, True),
    "epilogue_bf16": (2, 70, 70, torch.bfloat16, 10, False, True),
    "wide_fp16": (3, 100, 37, torch.float16, 11),
    "transposed_fp16": (1, 33, 130, torch.float16, 12, True),
    "epilogue_fp16": (1, 64, 48, torch.float16, 13, False, True),
}
POLAR_SHAPES = {"wide": (2, 24, 40), "tall": (2, 40, 24), "square": (1, 36, 36)}
# polar_express inputs of extreme scale (its normalisation folds into the kernel's ``scale``)
POLAR_EDGES = {"zero": 0.0, "tiny": 1e-12, "large": 1e6}
# name -> make_case arguments; each runs with one scale factor per matrix
SCALED_CASES = {
    "scaled_epilogue_fp32": (3, 100, 37, torch.float32, 20, False, True),
    "scaled_transposed_bf16": (2, 33, 130, torch.bfloat16, 21, True),
    "scaled_flat_fp32": (1, 40, 24, torch.float32, 22, False, True, True),
}


def scale_for(P):
    """One factor per matrix of P: (B,) for a 3-D P, () for a 2-D one."""
    return torch.linspace(0.5, 3.0, P.shape[0]) if P.ndim == 3 else torch.tensor(2.5)


def _nan_below_the_diagonal(Y):
    """Y with NaN in every entry strictly below the diagonal."""
    k = Y.shape[-1]
    return Y.masked_fill(torch.ones(k, k, dtype=torch.bool, device=Y.device).tril(-1), float("nan"))


def _interpret_jobs():
    """Child process (TRITON_INTERPRET=1), one job: every case twice, the unused lower triangle of Y,
    and polar_express with the kernel and with torch GEMMs (fp32)."""
    return [_interpret_results]


def _interpret_results():
    from kernels.gram import fused
    ortho = importlib.import_module("optimizers.orthogonalize")

    results = {"cases": {}}
    for name, spec in INTERPRET_CASES.items():
        args = make_case(*spec)
        results["cases"][name] = {"args": args, "runs": [fused.symmetric_product(*args) for _ in range(2)]}
    P, alpha, Y, beta, gamma = make_case(2, 100, 37, torch.float32, 20, epilogue=True)
    results["lower_triangle"] = [fused.symmetric_product(P, alpha, y, beta, gamma)
                                 for y in (Y, _nan_below_the_diagonal(Y))]
    results["scaled"] = {}
    for name, spec in SCALED_CASES.items():
        case = make_case(*spec)
        args = (*case, scale_for(case[0]))
        results["scaled"][name] = {"args": args, "out": fused.symmetric_product(*args)}

    def both_paths(G):
        """polar_express(G) by torch GEMMs and with A and H from the kernel (as on CUDA)."""
        torch_path = ortho.polar_express(G)
        original, ortho._gram_kernel = ortho._gram_kernel, lambda X: fused.symmetric_product
        try:
            return {"torch": torch_path, "kernel": ortho.polar_express(G)}
        finally:
            ortho._gram_kernel = original

    results["polar"] = {name: both_paths(torch.randn(*shape, generator=torch.Generator().manual_seed(30)))
                        for name, shape in POLAR_SHAPES.items()}
    edge = torch.randn(2, 24, 40, generator=torch.Generator().manual_seed(31))
    results["polar_edges"] = {name: both_paths(edge * size) for name, size in POLAR_EDGES.items()}
    from scripts.bench import gram

    results["bench_row"] = gram.bench_shape(2, 40, 24, 0, device="cpu", timer=lambda fn, rep_ms: fn() is not None)
    return results


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return run_interpreted("tests.test_gram_kernel", tmp_path_factory.mktemp("interp"))


def closed_form(P, alpha=1.0, Y=None, beta=0.0, gamma=0.0, scale=None):
    """scale_b (alpha P P^T + beta Y + gamma I) in fp64, entry by entry from the definition."""
    P = P.double()
    out = alpha * torch.einsum("...ik,...jk->...ij", P, P)
    if Y is not None:
        out = out + beta * Y.double()
    out = out + gamma * torch.eye(P.shape[-2], dtype=torch.float64, device=P.device)
    return out if scale is None else out * scale.double()[..., None, None]


# --- the reference ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("transposed,epilogue,flat", [(False, False, False), (True, False, False),
                                                      (False, True, False), (False, True, True)])
def test_reference_matches_the_closed_form(dtype, transposed, epilogue, flat):
    P, alpha, Y, beta, gamma = make_case(3, 20, 13, dtype, 0, transposed, epilogue, flat)
    out = naive.symmetric_product(P, alpha, Y, beta, gamma)
    assert out.dtype == dtype and out.is_contiguous() and out.shape == (*P.shape[:-1], P.shape[-2])
    want = closed_form(P, alpha, Y, beta, gamma)
    assert rel_err(out, want) < {torch.float64: 1e-14, torch.float32: 1e-7, torch.bfloat16: 4e-3}[dtype]
    assert torch.equal(out, out.mT)


def test_reference_polynomial_is_polar_express_h():
    """symmetric_product(A, c, A, b, a) = aI + bA + cA^2 for a symmetric A."""
    A = symmetric(2, 16, 0, torch.float64)
    a, b, c = 3.0, -2.0, 0.5
    want = a * torch.eye(16, dtype=torch.float64) + b * A + c * A @ A
    assert rel_err(naive.symmetric_product(A, c, A, b, a), want) < 1e-14


# --- the kernel under the interpreter ---------------------------------------------------------------

@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpreted_kernel_matches_fp64(interpreted, name):
    res = interpreted["cases"][name]
    P, alpha, Y, beta, gamma = res["args"]
    out = res["runs"][0]
    assert out.dtype == P.dtype and out.is_contiguous() and out.shape == (*P.shape[:-1], P.shape[-2])
    assert rel_err(out, closed_form(*res["args"]), floor=0.0) < TOL[P.dtype]


@pytest.mark.parametrize("name", list(INTERPRET_CASES))
def test_interpreted_kernel_is_exactly_symmetric_and_deterministic(interpreted, name):
    first, second = interpreted["cases"][name]["runs"]
    assert torch.equal(first, first.mT)
    assert torch.equal(first.view(torch.int16 if first.element_size() == 2 else torch.int32),
                       second.view(torch.int16 if second.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("name", list(SCALED_CASES))
def test_interpreted_kernel_scales_each_matrix(interpreted, name):
    """``scale``: one factor per matrix on the whole result, against fp64 and against the reference."""
    res = interpreted["scaled"][name]
    P, out = res["args"][0], res["out"]
    assert rel_err(out, closed_form(*res["args"]), floor=0.0) < TOL[P.dtype]
    assert rel_err(out, naive.symmetric_product(*res["args"]), floor=0.0) < TOL[P.dtype]
    assert torch.equal(out, out.mT)


@pytest.mark.parametrize("name", list(POLAR_EDGES))
def test_interpreted_polar_express_folds_its_normalisation_at_any_scale(interpreted, name):
    """With the kernel the first step takes the unnormalised X and folds 1 / (||X|| * 1.01 + eps) into A
    and H: zero stays zero, and tiny or large inputs give the torch path's result (fp32)."""
    res = interpreted["polar_edges"][name]
    assert torch.isfinite(res["kernel"]).all()
    if name == "zero":
        assert not res["kernel"].any()
    else:
        assert rel_err(res["kernel"], res["torch"], floor=0.0) < 1e-5


def test_interpreted_case_with_a_transposed_view_reads_it_in_place(interpreted):
    P = interpreted["cases"]["transposed_fp32"]["args"][0]
    assert not P.is_contiguous() and P.mT.is_contiguous()


def test_interpreted_kernel_uses_no_entry_of_y_below_the_diagonal(interpreted):
    """NaN in every entry of Y strictly below the diagonal leaves the result unchanged, bit for bit."""
    clean, poisoned = interpreted["lower_triangle"]
    assert torch.isfinite(clean).all() and torch.equal(clean, poisoned)


@pytest.mark.parametrize("name", list(POLAR_SHAPES))
def test_interpreted_polar_express_with_the_kernel_matches_the_torch_path(interpreted, name):
    """polar_express in fp32 with A and H from the kernel (as on CUDA in bf16) against bmm/baddbmm."""
    res = interpreted["polar"][name]
    assert res["kernel"].shape == POLAR_SHAPES[name] and torch.isfinite(res["kernel"]).all()
    assert rel_err(res["kernel"], res["torch"]) < 1e-5


def test_interpreted_bench_row_compares_the_kernel_with_torch(interpreted):
    """scripts.bench.gram's measurement of one bucket, on the CPU with a fake timer: the kernel's A and
    H are within bf16 rounding of torch's (the CPU polar_express takes the torch path on both sides)."""
    row = interpreted["bench_row"]
    assert row["shape"] == [2, 40, 24] and row["orientation"] == "tall"
    assert row["ms"]["gram"] == {"ours": True, "torch": True}
    assert row["rel_diff"]["gram"] < 1e-2 and row["rel_diff"]["poly"] < 1e-2 and row["rel_diff"]["polar"] == 0.0


# --- argument checks (no launch) ------------------------------------------------------------------

def _bad_inputs():
    P = torch.randn(2, 8, 5)
    Y = torch.randn(2, 8, 8)
    return [
        ({"P": [[1.0]]}, TypeError, "P must be a torch.Tensor"),
        ({"P": torch.randn(8)}, ValueError, r"P must have 2 or 3 dimensions.*\(8,\)"),
        ({"P": torch.randn(1, 2, 8, 5)}, ValueError, "P must have 2 or 3 dimensions"),
        ({"P": torch.ones(2, 8, 5, dtype=torch.int32)}, TypeError, "P's dtype.*torch.int32"),
        ({"P": P.double()}, TypeError, "P's dtype.*torch.float64"),
        ({"P": P, "alpha": float("nan")}, ValueError, "alpha must be a finite.*nan"),
        ({"P": P, "beta": float("inf")}, ValueError, "beta must be a finite.*inf"),
        ({"P": P, "gamma": "1"}, ValueError, "gamma must be a finite.*str"),
        ({"P": P, "alpha": torch.tensor(1.0)}, ValueError, "alpha must be a finite.*tensor"),
        ({"P": P, "Y": Y.tolist()}, TypeError, "Y must be None or a torch.Tensor"),
        ({"P": P, "Y": torch.randn(2, 8, 5)}, ValueError, r"Y must have shape \(2, 8, 8\).*\(2, 8, 5\)"),
        ({"P": P[0], "Y": Y}, ValueError, r"Y must have shape \(8, 8\)"),
        ({"P": P, "Y": Y.half()}, TypeError, "Y's dtype must be P's.*torch.float16"),
        ({"P": P, "Y": Y.to("meta")}, ValueError, "Y must be on P's device.*meta"),
        ({"P": P, "scale": [1.0, 2.0]}, TypeError, "scale must be None or a floating torch.Tensor.*list"),
        ({"P": P, "scale": torch.ones(2, dtype=torch.int64)}, TypeError, "scale must be None or a floating"),
        ({"P": P, "scale": torch.ones(3)}, ValueError, r"scale must have shape \(2,\).*\(3,\)"),
        ({"P": P[0], "scale": torch.ones(1)}, ValueError, r"scale must have shape \(\)"),
        ({"P": P, "scale": torch.ones(2, device="meta")}, ValueError, "scale must be on P's device.*meta"),
    ]


@pytest.mark.parametrize("kwargs,error,match", _bad_inputs())
def test_bad_arguments_are_named(kwargs, error, match):
    from kernels.gram import fused

    with pytest.raises(error, match=match):
        fused.symmetric_product(**kwargs)


def test_reference_takes_fp64_and_checks_the_rest():
    assert naive.symmetric_product(torch.randn(4, 3, dtype=torch.float64)).dtype == torch.float64
    with pytest.raises(ValueError, match="gamma"):
        naive.symmetric_product(torch.randn(4, 3), gamma=float("-inf"))


def test_cpu_tensors_need_cuda_or_the_interpreter():
    from kernels.gram import fused

    if fused.INTERPRET:
        pytest.skip("TRITON_INTERPRET=1 in this process: CPU tensors are accepted")
    with pytest.raises(ValueError, match="needs CUDA tensors.*cpu.*TRITON_INTERPRET=1"):
        fused.symmetric_product(torch.randn(2, 8, 5))


def test_polar_express_uses_the_kernel_only_for_half_precision_cuda_tensors():
    ortho = importlib.import_module("optimizers.orthogonalize")

    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        assert ortho._gram_kernel(torch.zeros(1, 2, 2, dtype=dtype)) is None


def test_importing_kernels_and_cpu_polar_express_do_not_import_triton():
    """``kernels`` exports symmetric_product lazily, and the CPU path of polar_express never asks for it."""
    code = ("import sys, torch, kernels, kernels.gram, kernels.gram.naive\n"
            "from optimizers import polar_express\n"
            "polar_express(torch.randn(2, 8, 12), steps=2, dtype=torch.bfloat16)\n"
            "assert 'triton' not in sys.modules\n"
            "assert kernels.symmetric_product.__module__ == 'kernels.gram.fused'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# --- the shipped launch configs compiled for Hopper (no GPU: triton's ptxas) -----------------------

# (k, K, contiguous dimension of P, with Y, with scale): the Gram step of a wide and of a tall 0.6B
# bucket (the tall one reads X.mT: unit row stride), and the polynomial step with its epilogue
SM90_CASES = [(1024, 2048, "cols", False, True), (1024, 3072, "rows", False, True), (1024, 1024, "cols", True, True)]


@pytest.mark.parametrize("k,K,unit,has_y,has_scale", SM90_CASES)
def test_shipped_configs_compile_for_hopper(k, K, unit, has_y, has_scale):
    """``launch_config``'s config at the 0.6B Muon shapes compiles for sm_90 as a launch specialises it
    (16-byte aligned pointers, sizes and strides, the unit strides constants): wgmma, shared memory
    within the H200's 227 KiB per block, and every global store and Y load 16 bytes wide (the one
    narrow load is the fp32 scale). A store mask
    that varied along a row made the stores scalar and the kernel about 1.7x slower on an H200
    (docs/bench/gram.md). Register spills depend on triton's version (that page lists them for the
    GPU machine's 3.6), so they are reported there, not asserted here."""
    from kernels.gram import fused
    from scripts.bench import kernel_resources as kr

    config = dict(fused.launch_config(k, K))
    warps, stages = config.pop("num_warps"), config.pop("num_stages")
    unit_stride = "sp_c" if unit == "cols" else "sp_r"
    consts = {**config, "HAS_Y": has_y, "HAS_SCALE": has_scale, "PRECISION": "tf32", "UPCAST": False,
              "EVEN_M": k % config["BM"] == 0, "EVEN_K": K % config["BK"] == 0, unit_stride: 1, "sy_c": 1}
    types = {"P": "*bf16", "Y": "*bf16", "OUT": "*bf16", "S": "*fp32", "k": "i32", "K": "i32", "alpha": "fp32",
             "beta": "fp32", "gamma": "fp32"}
    divisible = {"P", "Y", "S", "OUT", "k", "K", "sp_b", "sp_r", "sp_c", "sy_b", "sy_r"} - {unit_stride}
    res = kr.resources(fused._symmetric_product_kernel.fn, consts, warps, stages, types=types, divisible=divisible)
    assert res["wgmma"] > 0
    assert 0 < res["shared"] <= 232448
    ops = res["global_ops"]
    stores = [op for op in ops if op.startswith("STG")]
    assert stores and all(op.endswith(".128") for op in stores), ops
    assert not [op for op in ops if op.startswith("LDG") and "U16" in op], ops  # Y, one bf16 per load


# --- the benchmark's page ---------------------------------------------------------------------------

def test_bench_page_reports_times_ratios_and_totals(tmp_path):
    from scripts.bench import gram
    from scripts.bench.results import describe

    def row(shape, gram_ms, poly_ms, polar_ms):
        return {"shape": list(shape), "orientation": gram.orientation(*shape[1:]),
                "ms": {"gram": dict(zip(("ours", "torch"), gram_ms)), "poly": dict(zip(("ours", "torch"), poly_ms)),
                       "polar": dict(zip(("ours", "torch"), polar_ms))},
                "rel_diff": {"gram": 1e-3, "poly": 2e-3, "polar": 5e-3}}

    result = {"meta": describe("Symmetric-product kernel benchmark", "fabricated", "python -m scripts.bench.gram"),
              "rows": [row((56, 1024, 1024), (0.5, 1.0), (0.25, 1.0), (4.0, 5.0)),
                       row((84, 2048, 1024), (1.5, 2.0), (0.5, 1.0), (8.0, 10.0))]}
    text = gram.write(result, str(tmp_path / "gram"))
    assert text.startswith("# Symmetric-product kernel benchmark\n") and "`python -m scripts.bench.gram`" in text
    assert "| 56x1024x1024 | square | 0.500 | 1.000 | 0.50 | 0.250 | 1.000 | 0.25 | 4.000 | 5.000 | 0.80 |" in text
    assert "| 84x2048x1024 | tall |" in text
    assert "| all buckets |  | 2.000 | 3.000 | 0.67 | 0.750 | 2.000 | 0.38 | 12.000 | 15.000 | 0.80 |" in text
    saved = json.loads((tmp_path / "gram.json").read_text())
    assert saved["rows"][1]["ratio"]["gram"] == pytest.approx(0.75)
    assert saved["total_ms"]["polar"] == {"ours": 12.0, "torch": 15.0}
    assert saved["meta"]["command"] == "python -m scripts.bench.gram"


# --- GPU ------------------------------------------------------------------------------------------

# (B, m, n) of the 0.6B Muon buckets, batch 4; a tall X enters as X.mT
GPU_SHAPES = [(4, 1024, 1024), (4, 1024, 3072), (4, 3072, 1024), (4, 2048, 1024)]


def _gpu_operand(B, m, n, dtype=torch.bfloat16, seed=0):
    """P for X of (B, m, n) normalised as Polar Express does: X itself (wide) or X.mT (tall)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    X = torch.randn(B, m, n, device="cuda", generator=gen)
    X = (X / X.norm(dim=(-2, -1), keepdim=True)).to(dtype)
    return X.mT if m > n else X


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_gram_and_polynomial_match_fp64_at_muon_shapes(shape):
    """bf16 A = P P^T and H = aI + bA + cA^2 (Polar Express's first, most cancelling coefficients)
    against fp64 of the same bf16 inputs; both exactly symmetric and equal over two calls."""
    from kernels.gram import symmetric_product
    from optimizers.orthogonalize import POLAR_EXPRESS_COEFFS

    P = _gpu_operand(*shape)
    A = symmetric_product(P)
    assert A.dtype == torch.bfloat16 and A.shape == (shape[0], min(shape[1:]), min(shape[1:]))
    # relative to the result's own norm: with ||X||_F = 1 that is far below rel_err's default floor of 1
    assert rel_err(A, closed_form(P), floor=0.0) < TOL[torch.bfloat16]
    a, b, c = POLAR_EXPRESS_COEFFS[0]
    H = symmetric_product(A, alpha=c, Y=A, beta=b, gamma=a)
    assert rel_err(H, closed_form(A, c, A, b, a), floor=0.0) < TOL[torch.bfloat16]
    for out, again in ((A, symmetric_product(P)), (H, symmetric_product(A, alpha=c, Y=A, beta=b, gamma=a))):
        assert torch.equal(out, out.mT)
        assert torch.equal(out.view(torch.int16), again.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec", [(3, 100, 37, False, True), (1, 33, 130, True, False), (2, 300, 200, False, True),
                                  (1, 257, 129, True, True)])
def test_gpu_odd_sizes_and_dtypes_match_fp64(dtype, spec):
    from kernels.gram import symmetric_product

    B, k, K, transposed, epilogue = spec
    args = [x.cuda() if isinstance(x, torch.Tensor) else x
            for x in make_case(B, k, K, dtype, 0, transposed, epilogue)]
    out = symmetric_product(*args)
    assert rel_err(out, closed_form(*args), floor=0.0) < TOL[dtype]
    assert torch.equal(out, out.mT)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernel_uses_no_entry_of_y_below_the_diagonal():
    from kernels.gram import fused

    P, alpha, Y, beta, gamma = (x.cuda() if isinstance(x, torch.Tensor) else x
                                for x in make_case(2, 520, 100, torch.bfloat16, 3, epilogue=True))
    clean = fused.symmetric_product(P, alpha, Y, beta, gamma)
    poisoned = fused.symmetric_product(P, alpha, _nan_below_the_diagonal(Y), beta, gamma)
    assert torch.isfinite(clean).all() and torch.equal(clean, poisoned)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m,n", [(1024, 3072), (2048, 1024), (1024, 1024)])
@pytest.mark.parametrize("kappa", [10, 1e3])
def test_gpu_polar_express_with_the_kernel_agrees_with_svd(m, n, kappa):
    """bf16 polar_express on CUDA (A and H from the kernel) against each matrix's fp64 SVD polar
    factor: within 1.5x the torch path's error (or 2e-2), as test_optimizers_ortho's GPU tests; the
    same bits over two calls."""
    ortho = importlib.import_module("optimizers.orthogonalize")
    from tests._optim_helpers import logspaced, polar_svd, spectrum_matrix

    W = torch.stack([spectrum_matrix(m, n, logspaced(m, n, kappa), seed)[0] for seed in (1, 2)]).cuda()
    assert ortho._gram_kernel(W.bfloat16()) is not None
    out = ortho.polar_express(W.float())
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.equal(out, ortho.polar_express(W.float()))
    standard = ortho.polar_express(W.float(), kernel=False)
    for i in range(2):
        ref = polar_svd(W[i])
        err, err_std = rel_err(out[i], ref, floor=0.0), rel_err(standard[i], ref, floor=0.0)
        assert err < max(1.5 * err_std, 2e-2), (err, err_std)


def test_rows_beyond_32_bit_offsets_are_refused():
    """k x k outputs are addressed with int32 offsets: a P with more rows than MAX_K is refused
    before anything is allocated (a meta tensor: no memory)."""
    from kernels.gram import fused

    with pytest.raises(ValueError, match=r"46341 rows; at most 46340"):
        fused.symmetric_product(torch.empty(1, fused.MAX_K + 1, 8, device="meta"))


@pytest.mark.parametrize("algo", ["muon", "normuon", "aurora"])
@pytest.mark.parametrize("choice,asked", [("auto", True), ("torch", False)])
def test_ortho_kernel_choice_reaches_the_orthogonaliser(monkeypatch, algo, choice, asked):
    """``[optimizer] ortho_kernel``: "auto" asks for the symmetric-product kernel at every Polar
    Express call (it applies on CUDA in fp16/bf16), "torch" never asks; an unknown value is refused
    by key before any step."""
    from optimizers.muon import MuonAdamW

    ortho = importlib.import_module("optimizers.orthogonalize")
    calls = []
    monkeypatch.setattr(ortho, "_gram_kernel", lambda X: calls.append(X.shape) and None)
    W = torch.nn.Parameter(torch.randn(6, 10))
    W.grad = torch.randn(6, 10)
    MuonAdamW([{"params": [W], "algo": algo, "ortho_kernel": choice}], lr=0.01).step()
    assert bool(calls) == asked
    with pytest.raises(ValueError, match="ortho_kernel='triton'; expected one of"):
        MuonAdamW([{"params": [W], "algo": algo, "ortho_kernel": "triton"}], lr=0.01)
