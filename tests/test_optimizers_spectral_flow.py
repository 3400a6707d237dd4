"""S_p decay dynamics: pure-decay flow vs closed form; linear teacher optimum (SPEC.md 3)."""

import math

import pytest
import torch

from optimizers import band_projectors, spectral_power
from tests._optim_helpers import spectrum_matrix

# full rank (10 modes for 16 x 10): explicit p=0 steps make exact-zero modes oscillate
SIGMA0 = torch.tensor([2.0, 1.7, 1.5, 1.2, 1.0, 0.8, 0.7, 0.5, 0.42, 0.35], dtype=torch.float64)


def closed_form(s0, p, lam, t):
    """sigma(t) of d sigma / dt = -lam sigma^p (paper, section 3)."""
    if p == 0:
        return (s0 - lam * t).clamp_min(0)
    if p == 1:
        return s0 * math.exp(-lam * t)
    return (s0 ** (1 - p) + (p - 1) * lam * t) ** (-1 / (p - 1))


@pytest.mark.parametrize("p", [0, 1, 2, 4])
def test_pure_decay_flow_follows_closed_form(p):
    W, U, s, V = spectrum_matrix(16, 10, SIGMA0, 11)
    lam, h, steps = 1.0, 1e-3, 300
    for _ in range(steps):
        W = W - h * lam * spectral_power(W, p)
    t = h * steps
    core = U.T @ W @ V
    sig = torch.diagonal(core)
    # singular vectors unchanged: W stays diagonal in the initial singular bases
    off = core - torch.diag(sig)
    assert off.norm() / sig.norm() < 1e-6
    assert (W - U @ core @ V.T).norm() / W.norm() < 1e-6
    # explicit Euler vs the flow: O(h) error
    torch.testing.assert_close(sig, closed_form(SIGMA0, p, lam, t), rtol=2e-3, atol=1e-4)
    if p == 1:
        torch.testing.assert_close(sig / sig[0], SIGMA0 / SIGMA0[0], rtol=1e-10, atol=0)
    if p == 2:  # p > 1 flattens the normalised spectrum
        assert (sig / sig[0] > SIGMA0 / SIGMA0[0] + 1e-3)[1:].all()


TEACHER = torch.tensor([4, 2, 1, 0.4, 0.15, 0.05], dtype=torch.float64)
SPEC_OPTIMUM = {
    0: [3.8, 1.8, 0.8, 0.2, 0.0, 0.0],
    1: (TEACHER / 1.2).tolist(),
    2: [2.6235, 1.5311, 0.8541, 0.3723, 0.1458, 0.0495],
    4: [1.8175, 1.3452, 0.8800, 0.3951, 0.1499, 0.0500],
}


def solve_scalar(a, lam, p):
    """Root of s + lam s^p = a by bisection (fp64), the independent reference."""
    lo, hi = 0.0, a
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid + lam * mid**p < a else (lo, mid)
    return lo


@pytest.mark.parametrize("p", [0, 1, 2, 4])
def test_linear_teacher_converges_to_analytic_spectrum(p):
    A, U, a, V = spectrum_matrix(12, 8, TEACHER, 3)
    lam = 0.2
    h = 0.5 if p < 4 else 0.2  # below 2 / (1 + 4 lam s^3) at s = 1.8
    W = torch.zeros_like(A)
    for _ in range(400):
        if p == 0:  # proximal step: soft-threshold the gradient step at h*lam, no SVD
            Y = W - h * (W - A)
            P_top, _ = band_projectors(Y, tau=h * lam, steps=40)
            W = (Y - h * lam * spectral_power(Y, 0)) @ P_top
        else:
            W = W - h * ((W - A) + lam * spectral_power(W, p))
    sig = torch.linalg.svdvals(W)[:6]
    torch.testing.assert_close(sig, torch.tensor(SPEC_OPTIMUM[p], dtype=torch.float64), atol=6e-5, rtol=0)
    if p > 0:
        ref = torch.tensor([solve_scalar(x, lam, p) for x in TEACHER.tolist()], dtype=torch.float64)
        torch.testing.assert_close(sig, ref, atol=1e-7, rtol=0)
    # aligned with the teacher's singular vectors
    torch.testing.assert_close(U.T @ W @ V, torch.diag(sig), atol=1e-6, rtol=0)
