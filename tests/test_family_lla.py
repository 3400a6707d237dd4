"""Exact LLA (kernels.exact_lla) against fp64 references written from SPEC section 1.

The references (tests/_family_reference.py) loop over positions with dense matrices and
torch.linalg.solve; their autograd gives the reference gradients.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels import affine_mesanet, exact_lla, exact_lla_cost, parallax_attention, value_averaging
from tests import _family_reference as ref

F64 = torch.float64
# name -> (B, L, Hq, Hkv, D, block)
SHAPES = {
    "mha": (1, 7, 2, 2, 4, 64),
    "gqa2_odd_blocks": (2, 11, 4, 2, 6, 4),
    "gqa3_block1": (1, 6, 3, 1, 5, 1),
}


def make(b, n, hq, hkv, d, seed=0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, hq, d, generator=gen, dtype=F64)
    k, v = (torch.randn(b, n, hkv, d, generator=gen, dtype=F64) for _ in range(2))
    do = torch.randn(b, n, hq, d, generator=gen, dtype=F64)
    return [x.to(dtype) for x in (q, k, v, do)]


def grads(fn, q, k, v, do):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(do)
    return out.detach(), [x.grad for x in leaves]


def test_parent_form_equals_local_linear_regression_form():
    """SPEC 1: vbar - (1 + eta) Sigma_KV rho* == vbar + Sigma_KV (Sigma_KK + lam I)^-1 (q - kbar)."""
    q, k, v, _ = make(2, 9, 4, 2, 5, seed=1)
    for lam in (0.05, 1.0, 20.0):
        parent = ref.lla_parent(q, k, v, lam)
        torch.testing.assert_close(parent, ref.local_linear_regression(q, k, v, lam), rtol=1e-11, atol=1e-11)
        assert (parent - ref.softmax_attention(q, k, v)).abs().max() > 1e-3  # the correction is really there


@pytest.mark.parametrize("solver", ["cholesky", "cg"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_forward_and_gradients_match_fp64_reference(name, solver):
    b, n, hq, hkv, d, block = SHAPES[name]
    q, k, v, do = make(b, n, hq, hkv, d, seed=2)
    lam = 0.7
    out, got = grads(lambda *x: exact_lla(*x, lam=lam, solver=solver, block=block), q, k, v, do)
    out_ref, want = grads(lambda *x: ref.lla_parent(*x, lam), q, k, v, do)
    tol = 1e-10 if solver == "cholesky" else 1e-7  # D CG steps in fp64: converged to roundoff
    torch.testing.assert_close(out, out_ref, rtol=tol, atol=tol)
    for name_, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=f"d{name_}")


@pytest.mark.parametrize("solver", ["cholesky", "cg"])
def test_gradcheck_with_learned_lambda(solver):
    q, k, v, _ = make(1, 5, 2, 1, 3, seed=3)
    lam = torch.tensor([0.4, 1.3], dtype=F64)
    inputs = [x.requires_grad_() for x in (q, k, v, lam)]
    assert torch.autograd.gradcheck(lambda q, k, v, lam: exact_lla(q, k, v, lam=lam, solver=solver, block=2),
                                    inputs)
    torch.testing.assert_close(exact_lla(q, k, v, lam=lam, solver=solver), ref.lla_parent(q, k, v, lam),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("solver", ["cholesky", "cg"])
def test_large_lambda_gives_softmax_attention(solver):
    q, k, v, _ = make(2, 10, 4, 2, 6, seed=4)
    soft = ref.softmax_attention(q, k, v)
    far = (exact_lla(q, k, v, lam=1.0, solver=solver) - soft).abs().max()
    near = (exact_lla(q, k, v, lam=1e9, solver=solver) - soft).abs().max()
    assert far > 1e-2 and near < 1e-7, (far, near)


@pytest.mark.parametrize("solver", ["cholesky", "cg"])
def test_zero_probe_gives_softmax_attention(solver):
    """mu_i = kbar_i - q_i = 0 makes rho* = 0: with scale 0 (uniform p) and q_i the running key mean,
    LLA is exactly softmax (= uniform) attention; a perturbed q brings the correction back."""
    _, k, v, _ = make(1, 9, 2, 2, 4, seed=5)
    q = k.cumsum(1) / torch.arange(1, 10, dtype=F64)[None, :, None, None]
    uniform = ref.softmax_attention(q, k, v, scale=0.0)
    torch.testing.assert_close(uniform, value_averaging(v), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(exact_lla(q, k, v, lam=0.3, scale=0.0, solver=solver), uniform, rtol=1e-10, atol=1e-10)
    moved = exact_lla(q + 0.5, k, v, lam=0.3, scale=0.0, solver=solver)
    assert (moved - uniform).abs().max() > 1e-2


def test_uniform_weights_give_affine_mesanet():
    """SPEC 1b: Affine MesaNet is exact LLA with p_ij = 1/i (scale 0)."""
    q, k, v, _ = make(2, 12, 4, 2, 5, seed=6)
    torch.testing.assert_close(exact_lla(q, k, v, lam=0.2, scale=0.0), affine_mesanet(q, k, v, lam=0.2),
                               rtol=1e-10, atol=1e-10)


def test_parallax_with_solved_probe_is_exact_lla():
    """SPEC 1: Parallax with probe (1 + eta) rho* reproduces exact LLA (its t uses k, and
    sum_j p_ij (t_ij - tbar_i) v_j only sees the centred k)."""
    q, k, v, _ = make(1, 8, 4, 2, 4, seed=7)
    probe = ref.lla_probe(q, k, v, 0.5)
    torch.testing.assert_close(parallax_attention(q, probe, k, v, backend="reference"), exact_lla(q, k, v, lam=0.5),
                               rtol=1e-10, atol=1e-10)


def test_cg_matches_cholesky_in_fp32_and_converges_with_steps():
    q, k, v, _ = make(2, 33, 4, 2, 16, seed=8, dtype=torch.float32)
    q, k, v = q / 2, k / 2, v
    direct = exact_lla(q, k, v, lam=1.0)
    exact = ref.local_linear_regression(q.double()[:1, :12], k.double()[:1, :12], v.double()[:1, :12], 1.0)
    torch.testing.assert_close(direct[:1, :12].double(), exact, rtol=1e-5, atol=1e-5)
    errors = [(exact_lla(q, k, v, lam=1.0, solver="cg", cg_steps=t) - direct).abs().max().item() for t in (1, 4, 16)]
    assert errors[2] < 2e-5 and errors[0] > 10 * errors[1] > 100 * errors[2], errors


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3), (torch.float32, 1e-5)])
def test_low_precision_inputs_compute_in_fp32(dtype, tol):
    q, k, v, _ = make(1, 16, 2, 1, 8, seed=9)
    lowp = [x.to(dtype) for x in (q, k, v)]
    out = exact_lla(*lowp, lam=0.5)
    assert out.dtype == dtype
    want = ref.lla_parent(*(x.double() for x in lowp), 0.5)
    assert ((out.double() - want).norm() / want.norm()).item() < tol


def test_cost_formula_and_guard():
    assert exact_lla_cost(2, 8, 3, 4, "cholesky") == 2 * 3 * 8 * (8 * 16 + 64)
    assert exact_lla_cost(2, 8, 3, 4, "cg", cg_steps=5) == 2 * 3 * 64 * 4 * 9
    assert exact_lla_cost(2, 8, 3, 4, "cg") == 2 * 3 * 64 * 4 * 8  # T defaults to D
    q = torch.zeros(4, 4096, 16, 128)
    k = torch.zeros(4, 4096, 8, 128)
    with pytest.raises(ValueError, match=r"B\*Hq\*L\*\(L\*D\^2 \+ D\^3\).*B=4, L=4096, Hq=16, D=128.*max_cost"):
        exact_lla(q, k, k, lam=1.0)
    with pytest.raises(ValueError, match=r"B\*Hq\*L\^2\*D\*\(T \+ 4\).*T=8"):
        exact_lla(q, k, k, lam=1.0, solver="cg", cg_steps=8)
    small = make(1, 6, 2, 1, 4, seed=10)[:3]
    with pytest.raises(ValueError, match="max_cost=100"):
        exact_lla(*small, lam=1.0, max_cost=100)
    assert exact_lla(*small, lam=1.0, max_cost=None).shape == (1, 6, 2, 4)


@pytest.mark.parametrize("kwargs, match", [
    ({"lam": 0.0}, r"lam=0.0 must be a finite positive number"),
    ({"lam": float("nan")}, r"lam=nan"),
    ({"lam": torch.ones(3)}, r"lam tensor must be floating point of shape \(2,\)"),
    ({"lam": 1.0, "solver": "lu"}, r"solver='lu', expected one of \('cholesky', 'cg'\)"),
    ({"lam": 1.0, "cg_steps": 3}, r"cg_steps=3 is only meaningful with solver='cg'"),
    ({"lam": 1.0, "solver": "cg", "cg_steps": 0}, r"cg_steps=0 must be a positive int"),
    ({"lam": 1.0, "scale": float("inf")}, r"scale=inf must be a finite number"),
    ({"lam": 1.0, "block": 0}, r"block=0 must be an int >= 1"),
    ({"lam": 1.0, "block": 0.5}, r"block=0.5 must be an int >= 1"),
    ({"lam": 1.0, "block": 2.7}, r"block=2.7 must be an int >= 1"),
    ({"lam": 1.0, "max_cost": "1e9"}, r"max_cost='1e9' must be None or a positive number"),
    ({"lam": 1.0, "max_cost": float("nan")}, r"max_cost=nan must be None or a positive number"),
    ({"lam": 1.0, "max_cost": -1}, r"max_cost=-1 must be None or a positive number"),
])
def test_bad_arguments_are_named(kwargs, match):
    q, k, v, _ = make(1, 4, 2, 1, 4)
    with pytest.raises(ValueError, match=match):
        exact_lla(q, k, v, **kwargs)


def test_bad_shapes_are_named():
    q, k, v, _ = make(1, 4, 3, 2, 4)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple of kv heads \(2\)"):
        exact_lla(q, k, v, lam=1.0)
    with pytest.raises(ValueError, match="v must have the shape of k"):
        exact_lla(q[:, :, :2], k, v[:, :3], lam=1.0)
    with pytest.raises(ValueError, match="v is torch.float32 on cpu but the others are torch.float64"):
        exact_lla(q[:, :, :2], k, v.float(), lam=1.0)
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        exact_lla([1.0], k, v, lam=1.0)
    with pytest.raises(ValueError, match=r"q must be 4-D .* has shape \(4, 3, 4\)"):
        exact_lla(q[0], k, v, lam=1.0)
    with pytest.raises(ValueError, match=r"q has an empty dimension, shape \(1, 0, 2, 4\); batch, seq, heads and "
                                         r"head_dim must be >= 1"):
        exact_lla(q[:, :0, :2], k[:, :0], v[:, :0], lam=1.0)
    with pytest.raises(ValueError, match=r"q has an empty dimension, shape \(1, 4, 2, 0\)"):
        exact_lla(q[:, :, :2, :0], k[..., :0], v[..., :0], lam=1.0)
    with pytest.raises(ValueError, match=r"exact_lla_cost: solver='lu', expected one of"):
        exact_lla_cost(1, 4, 2, 4, "lu")
    assert math.isfinite(exact_lla(q[:, :, :2], k, v, lam=1.0).sum().item())


def test_compiled_calls_trace_numbers_that_dynamo_made_dynamic():
    """dynamo turns a module's float attributes into symbolic floats, and sizes into symbolic ints,
    after recompiling the same code with other values; the argument checks must still trace (a
    check that formats its message on every call, or calls math.isfinite, does not), and every call
    must use its own values."""

    class Mixer(torch.nn.Module):
        def __init__(self, scale, lam):
            super().__init__()
            self.scale, self.lam = scale, lam

        def forward(self, q, k, v):
            return exact_lla(q, k, v, lam=self.lam, scale=self.scale)

    call = torch.compile(lambda module, *x: module(*x), fullgraph=True, backend="aot_eager")
    for i, (scale, lam) in enumerate([(0.1, 1.0), (0.2, 2.0), (0.3, 0.5), (0.4, 3.0)]):
        gen = torch.Generator().manual_seed(i)
        q, k, v = (torch.randn(1, 5 + i, 2, 4, generator=gen) for _ in range(3))
        torch.testing.assert_close(call(Mixer(scale, lam), q, k, v), exact_lla(q, k, v, lam=lam, scale=scale))
