"""Optimizers' numeric pieces against independent fp64 references: SVD polar factors U V^T,
S_p(W) = U diag(sigma^p) V^T, eigh for msign, band projectors and SOAP's eigenbasis, and SPEC.md
section 3's closed forms (coefficients typed in here, not read from the code).

Tolerances: SPEC's eight Polar Express tuples (l = 1e-3) map every normalised singular value
x0 in [1e-3, 1] to within PE_EXACT_ERR of 1 in exact arithmetic (fp64 scalar composition on a
dense grid, ``test_spec_polar_express_bound``), so what remains is rounding. The iteration's slope
at 0 is prod a_i (PE_GAIN ~ 6.4e3; Newton-Schulz 3.4445^5 ~ 487): the null modes of a rounded
rank-deficient matrix (below an ulp of ||G||_F) leave with at most that gain times their size.
"""

import math

import pytest
import torch

from optimizers import (
    aurora_polar,
    band_projectors,
    msign,
    newton_schulz,
    normuon_normalize,
    polar_express,
    soap_directions,
    spectral_power,
    update_scale,
)
from optimizers.directions import MatrixSpec, matrix_terms
from optimizers.skip_step import SkipStep
from tests._optim_helpers import logspaced, polar_svd, rel_err, spectrum_matrix

# SPEC.md section 3, typed in: published Polar Express set; all but the last divided by 1.01^(1,3,5)
SPEC_PE = [(8.28721, -23.59589, 17.30039), (4.10706, -2.94785, 0.54484), (3.94869, -2.90890, 0.55182),
           (3.31842, -2.48849, 0.51005), (2.30065, -1.66890, 0.41881), (1.89130, -1.26800, 0.37680),
           (1.87500, -1.25000, 0.37500), (1.875, -1.25, 0.375)]
SPEC_PE = [(a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in SPEC_PE[:-1]] + [SPEC_PE[-1]]
SPEC_NS = (3.4445, -4.7750, 2.0315)
PE_GAIN = math.prod(a for a, _, _ in SPEC_PE)  # d x_8 / d x0 at 0
NS_GAIN = SPEC_NS[0] ** 5
PE_EXACT_ERR = 3e-15
EPS32, EPS64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps


def spec_pe_scalar(x, steps=8):
    for i in range(steps):
        a, b, c = SPEC_PE[min(i, 7)]
        x = a * x + b * x**3 + c * x**5
    return x


def spec_ns_scalar(x, steps=5):
    a, b, c = SPEC_NS
    for _ in range(steps):
        x = a * x + b * x**3 + c * x**5
    return x


def spec_msign_scalar(x, steps=20):
    """SPEC: Z <- Z (3I - 16/5 Z^2 + 6/5 Z^4), on one eigenvalue."""
    for _ in range(steps):
        x = x * (3 - 16 / 5 * x**2 + 6 / 5 * x**4)
    return x


def spectral(x):
    return torch.linalg.matrix_norm(x.double(), ord=2).max().item()


# ------------------------------------------------------------------------------- Polar Express / NS


def test_spec_polar_express_bound():
    """The tolerance used below (for SPEC's tuples and the shipped ones): on SPEC's design interval [l, 1] = [1e-3, 1] the 8-step scalar
    composition is within PE_EXACT_ERR of 1, never above 1 + 1e-15 on (0, 1] (the 1.01 safety), and
    the Newton-Schulz quintic only reaches the band [0.68, 1.14] (its known non-convergence)."""
    from optimizers.orthogonalize import POLAR_EXPRESS_COEFFS

    x = torch.logspace(-3, 0, 100_001, dtype=torch.float64)
    assert (spec_pe_scalar(x) - 1).abs().max() < PE_EXACT_ERR
    shipped = x
    for a, b, c in POLAR_EXPRESS_COEFFS:  # the code's tuples meet the same bound
        shipped = a * shipped + b * shipped**3 + c * shipped**5
    assert (shipped - 1).abs().max() < PE_EXACT_ERR
    assert spec_pe_scalar(torch.logspace(-9, 0, 100_001, dtype=torch.float64)).max() < 1 + 1e-15
    ns = spec_ns_scalar(torch.logspace(-2, 0, 100_001, dtype=torch.float64))
    assert 0.68 < ns.min() and ns.max() < 1.14
    assert 6.3e3 < PE_GAIN < 6.5e3


SHAPES = [(1, 7), (9, 1), (40, 24), (24, 40), (32, 32), (2, 24, 16)]


@pytest.mark.parametrize("kappa", [10, 100])
@pytest.mark.parametrize("shape", SHAPES)
def test_polar_express_is_the_svd_polar_factor_within_the_spec_bound(shape, kappa):
    """polar_express(G) vs U V^T from an fp64 SVD (vectors: g / ||g||). Every normalised singular
    value lies in [1e-3, 1] (asserted), so fp64 must be within PE_EXACT_ERR + rounding (1e-12) in
    spectral norm. fp32: the last tuple has slope 0 at 1, so earlier rounding is damped and what
    is left is the last GEMMs' rounding: spectral error below 1e-5 (~84 fp32 ulps)."""
    *batch, m, n = shape
    mats = [spectrum_matrix(m, n, logspaced(m, n, kappa), seed) for seed in range(batch[0] if batch else 1)]
    G = torch.stack([w for w, *_ in mats]).reshape(shape)
    for _, _, s, _ in mats:
        assert (s / (s.norm() * 1.01)).min() >= 1e-3
    ref = torch.stack([u @ v.T for _, u, _, v in mats]).reshape(shape)
    assert spectral(polar_express(G, dtype=torch.float64) - ref) < PE_EXACT_ERR + 1e-12
    out32 = polar_express(G.float())
    assert out32.dtype == torch.float32 and spectral(out32 - ref) < 1e-5
    if m == 1 or n == 1:  # polar factor of a vector: the unit vector
        torch.testing.assert_close(polar_express(G, dtype=torch.float64), G / G.norm(), rtol=0, atol=1e-14)


@pytest.mark.parametrize("shape", [(40, 24), (24, 40), (32, 32)])
@pytest.mark.parametrize("rank", [1, 5])
def test_rank_deficient_polar_factor_is_the_partial_isometry(shape, rank):
    """G = U_r diag(s) V_r^T of rank r: the odd polynomials keep null modes at zero, so Polar
    Express returns U_r V_r^T (the polar factor on the range, zero on the null space) and
    Newton-Schulz U_r diag(ns5(x0)) V_r^T. Rounding leaves null modes below an ulp of the
    normalised G (measured: ~0.1 eps), which the iteration amplifies at most by its gain: tolerance
    gain * eps, in fp64 and fp32."""
    m, n = shape
    G, U, s, V = spectrum_matrix(m, n, torch.logspace(0, -1, rank, dtype=torch.float64), 2)
    pe_ref = U @ V.T
    ns_ref = (U * spec_ns_scalar(s / (s.norm() + 1e-7))) @ V.T  # eps as in the code
    for dtype, eps in ((torch.float64, EPS64), (torch.float32, EPS32)):
        Gd = G.to(dtype)
        assert spectral(polar_express(Gd, dtype=dtype) - pe_ref) < PE_GAIN * eps
        assert spectral(newton_schulz(Gd, dtype=dtype) - ns_ref) < NS_GAIN * eps + 1e-14


@pytest.mark.parametrize("fn,ref_scalar", [(polar_express, spec_pe_scalar), (newton_schulz, spec_ns_scalar)])
def test_bf16_inputs_round_to_the_polar_factor_of_their_values(fn, ref_scalar):
    """A bf16 G (computed in fp32 on the CPU) comes back in bf16; the reference is the closed form
    on the bf16 values' own fp64 SVD. Output rounding to bf16 moves each entry by at most 2^-9
    relative, so the relative Frobenius error is below 2^-8."""
    G = spectrum_matrix(48, 20, logspaced(48, 20, 10), 4)[0].bfloat16()
    U, s, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    scale = 1.01 if fn is polar_express else 1.0
    ref = (U * ref_scalar(s / (s.norm() * scale + 1e-7))) @ Vh
    out = fn(G)
    assert out.dtype == torch.bfloat16 and out.shape == G.shape
    assert rel_err(out, ref) < 2**-8


# -------------------------------------------------------------------------------------------- S_p


def svd_sp(W, p):
    """fp64 S_p from the SVD, on the range only (sigma = 0 modes give 0, also for p = 0)."""
    U, s, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    keep = s > s.max(-1, keepdim=True).values * 1e-10
    return (U * torch.where(keep, s**p, 0 * s).unsqueeze(-2)) @ Vh


@pytest.mark.parametrize("shape", [(20, 12), (12, 20), (3, 16, 16), (2, 9, 14)])
@pytest.mark.parametrize("p", [0, 2, 3, 4, 7])
def test_spectral_power_batched_against_svd(shape, p):
    """Batches of matrices with different spectra (each its own SVD) in fp64: S_p within
    PE_EXACT_ERR * sigma_max^p + fp64 rounding (1e-11 relative) for even p (one Polar Express
    call), fp64 rounding for odd p (products only)."""
    *batch, m, n = shape
    count = batch[0] if batch else 1
    W = torch.stack([spectrum_matrix(m, n, logspaced(m, n, 5 + 10 * i), 10 + i)[0] for i in range(count)])
    W = W.reshape(shape)
    out = spectral_power(W, p)
    assert out.dtype == torch.float64 and out.shape == W.shape
    assert rel_err(out, svd_sp(W, p)) < 1e-11


@pytest.mark.parametrize("shape", [(20, 12), (12, 20)])
@pytest.mark.parametrize("p", [0, 2, 5])
def test_spectral_power_of_rank_deficient_and_bf16_matrices(shape, p):
    """Rank 4 of min(m, n) = 12: S_0 is the partial isometry U_r V_r^T (the nuclear norm's
    minimum-norm subgradient), S_p for p > 0 has zero null modes. fp64: rounding only (null modes
    amplified by PE_GAIN at most for even p). bf16 W: computed in fp32, returned in bf16; the
    reference is the SVD of the bf16 values, the error that of the bf16 output rounding (< 2^-8)."""
    m, n = shape
    W, U, s, V = spectrum_matrix(m, n, torch.tensor([3.0, 1.0, 0.5, 0.2]), 6)
    torch.testing.assert_close(spectral_power(W, p), (U * s**p) @ V.T, rtol=0, atol=PE_GAIN * EPS64 * 3**p)
    full = spectrum_matrix(m, n, logspaced(m, n, 10) * 2, 7)[0].bfloat16()
    out = spectral_power(full, p)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, svd_sp(full, p)) < 2**-8


def test_spectral_power_with_a_given_polar_factor_is_the_gram_identity():
    """With polar(W) supplied (the SVD's U V^T), SPEC's identities are exact up to rounding:
    m >= n: S_2k = Q_W (W^T W)^k; m < n: S_2k = (W W^T)^k Q_W; checked against U diag(s^2k) V^T."""
    for m, n in [(14, 9), (9, 14)]:
        W, U, s, V = spectrum_matrix(m, n, torch.linspace(2, 0.1, 9), 8)
        for p in (0, 2, 4):
            out = spectral_power(W, p, polar=U @ V.T)
            torch.testing.assert_close(out, (U * s**p) @ V.T, rtol=0, atol=1e-13)


# ------------------------------------------------------------------------------ msign and the bands


def test_msign_against_eigh_closed_form():
    """msign(A) = E diag(f^20(lambda / (||A||_F + eps))) E^T with eigh of A in fp64 and SPEC's
    scalar step f: equal to fp64 rounding (1e-12). That closed form is within the scalar error of
    sign(A) (computed per eigenvalue here; 1.3e-5 for |lambda| / ||A||_F >= 0.05), and a zero matrix
    maps to zero. Batched, and in fp32/bf16 (returns A's dtype)."""
    gen = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(2, 7, 7, generator=gen, dtype=torch.float64))
    lam = torch.tensor([[2.0, 1.0, 0.6, -0.4, -0.9, 0.3, -1.5], [1.0, -1.0, 0.5, -0.25, 0.8, -3.0, 0.2]],
                       dtype=torch.float64)
    A = (Q * lam.unsqueeze(-2)) @ Q.mT
    evals, evecs = torch.linalg.eigh(A)
    x = evals / (torch.linalg.matrix_norm(A, keepdim=True).squeeze(-1) + 1e-7)
    closed = (evecs * spec_msign_scalar(x).unsqueeze(-2)) @ evecs.mT
    torch.testing.assert_close(msign(A), closed, rtol=0, atol=1e-12)
    sign = (evecs * evals.sign().unsqueeze(-2)) @ evecs.mT
    bound = (spec_msign_scalar(x) - x.sign()).abs().max().item()
    assert spectral(msign(A) - sign) <= bound + 1e-12 and bound < 2e-5
    assert msign(A.float()).dtype == torch.float32 and spectral(msign(A.float()) - sign) < bound + 1e-5
    assert msign(A.bfloat16()).dtype == torch.bfloat16
    assert torch.equal(msign(torch.zeros(3, 3)), torch.zeros(3, 3))


@pytest.mark.parametrize("shape", [(12, 8), (8, 12)])
def test_band_projectors_against_eigh_with_null_modes(shape):
    """W of rank 5 in min(m, n) = 8 with modes on both sides of tau = 0.6 (and 0.7 between tau and
    sqrt(tau), so a threshold of tau instead of tau^2 shows): the projectors act on the
    small side (n x n from W^T W for m >= n, m x m from W W^T otherwise) and equal
    E diag((1 +- f^20(x)) / 2) E^T, x the eigenvalues of G - tau^2 I over ||G - tau^2 I||_F (eigh of
    the small Gram side in fp64, null modes included: they fall in the bottom band). Checked to
    fp32 rounding (they are computed in fp32 from an fp32 W), and within the scalar error of the
    exact spectral projectors."""
    m, n = shape
    W, U, s, V = spectrum_matrix(m, n, torch.tensor([2.0, 1.5, 1.2, 0.7, 0.3]), 9)
    P_top, P_bot = band_projectors(W.float(), tau=0.6)
    side = V if m >= n else U
    G = W.T @ W if m >= n else W @ W.T
    B = G - 0.36 * torch.eye(G.shape[0], dtype=torch.float64)
    evals, evecs = torch.linalg.eigh(B)
    f = spec_msign_scalar(evals / (torch.linalg.matrix_norm(B) + 1e-7))
    top_closed = (evecs * ((1 + f) / 2)) @ evecs.T
    assert P_top.shape == (min(m, n),) * 2
    torch.testing.assert_close(P_top.double(), top_closed, rtol=0, atol=1e-5)
    torch.testing.assert_close(P_bot.double(), torch.eye(min(m, n), dtype=torch.float64) - top_closed, rtol=0,
                               atol=1e-5)
    exact_top = side[:, :4] @ side[:, :4].T
    assert spectral(P_top - exact_top) < (f.abs() - 1).abs().max().item() / 2 + 1e-5


# ------------------------------------------------------------------ update scale, head-wise, variants


@pytest.mark.parametrize("m,n", [(1024, 1024), (3072, 1024), (1024, 3072), (7, 3), (3, 7)])
def test_update_scale_is_the_spec_formula(m, n):
    """SPEC 3: Moonlight RMS matching 0.2 sqrt(max(m, n)); spectral sqrt(max(1, m / n)) with m the
    output rows; none 1."""
    assert update_scale("match_rms_adamw", m, n) == pytest.approx(0.2 * max(m, n) ** 0.5, rel=1e-15)
    assert update_scale("spectral", m, n) == pytest.approx(max(1.0, m / n) ** 0.5, rel=1e-15)
    assert update_scale("none", m, n) == 1.0
    assert update_scale("spectral", 3072, 1024) == pytest.approx(math.sqrt(3))


def test_headwise_directions_split_each_matrix_by_its_own_heads():
    """One head_dim bucket holding matrices of different head counts (Q 4 heads, K 2, R 4 of
    4 x 12; tall heads 8 x 6 too): each row block of head_dim rows is its own polar factor (fp64
    SVD, per head), never mixed with a neighbour's. The full-matrix V gets the polar factor of the
    whole matrix. fp32 on well-conditioned blocks: within the 1e-5 of the Polar Express test."""
    gen = torch.Generator().manual_seed(1)
    shapes = [(16, 12), (8, 12), (16, 12), (8, 12), (24, 6)]
    head_dims = [4, 4, 4, 0, 8]
    updates = [torch.randn(*s, generator=gen) for s in shapes]
    specs = [MatrixSpec(shape=s, update_coeff=-1.0, head_dim=h) for s, h in zip(shapes, head_dims)]
    directions, decay = matrix_terms(specs, updates, [None] * len(specs))
    assert decay == {}
    for i, (U, h) in enumerate(zip(updates, head_dims)):
        ref = torch.cat([polar_svd(b) for b in U.split(h)]) if h else polar_svd(U)
        assert directions[i].shape == U.shape
        assert spectral(directions[i] - ref) < 1e-5, i


def reference_aurora(G, iterations=2, beta=0.5, eps=1e-7):
    """fp64 Aurora (tall orientation, D_0 = 1 / row norms, K SVD polar calls)."""
    m, n = G.shape
    X = G.double() if m > n else G.double().T
    rows, cols = X.shape
    D = 1 / X.norm(dim=1, keepdim=True).clamp_min(eps)
    for k in range(iterations):
        O = polar_svd(D * X)
        if k + 1 < iterations:
            D = D * ((cols / rows) / (O**2).sum(1, keepdim=True).clamp_min(eps**2)) ** beta
    return O if m > n else O.T


def test_aurora_headwise_blocks_against_fp64_reference():
    """Aurora per head (4 x 12 wide heads, transposed in and out) and on a tall full matrix with
    rows over two decades, fp64 compute: each block its own leverage-uniform factor (SVD
    reference), to fp64 rounding of 8 Polar Express steps on well-conditioned inputs (1e-10)."""
    gen = torch.Generator().manual_seed(2)
    heads = torch.randn(16, 12, generator=gen, dtype=torch.float64) * torch.logspace(0, 1, 16, dtype=torch.float64)[:, None]
    spec = MatrixSpec(shape=(16, 12), update_coeff=-1.0, algo="aurora", head_dim=4, dtype="float32",
                      options=(("beta", 0.5), ("eps", 1e-7), ("iterations", 3)))
    got = matrix_terms([spec], [heads.float()], [None])[0][0]
    ref = torch.cat([reference_aurora(b, 3) for b in heads.float().split(4)])
    assert spectral(got - ref) < 1e-5
    tall = torch.randn(30, 8, generator=gen, dtype=torch.float64) * torch.logspace(0, 2, 30, dtype=torch.float64)[:, None]
    out = aurora_polar(tall, dtype=torch.float64, iterations=3)
    assert spectral(out - reference_aurora(tall, 3)) < 1e-10


def test_normuon_normalize_against_its_formula():
    """NorMuon with an existing second moment v: v <- b2 v + (1 - b2) mean_j O_ij^2,
    N = O / (sqrt(v) + eps), D = N ||O||_F / ||N||_F, written out in fp64; the state advances.
    A zero update gives zeros (not 0 / 0) and still advances v."""
    gen = torch.Generator().manual_seed(3)
    O = torch.randn(2, 6, 10, generator=gen, dtype=torch.float64)
    v0 = [torch.rand(6, 1, generator=gen, dtype=torch.float64) for _ in range(2)]
    states = [{"normuon_v": v.clone()} for v in v0]
    out = normuon_normalize(O, states, 0.9, 1e-8, SkipStep(None))
    for i in range(2):
        v = 0.9 * v0[i] + 0.1 * (O[i] ** 2).mean(1, keepdim=True)
        N = O[i] / (v.sqrt() + 1e-8)
        torch.testing.assert_close(out[i], N * O[i].norm() / N.norm(), rtol=1e-14, atol=0)
        torch.testing.assert_close(states[i]["normuon_v"], v, rtol=1e-14, atol=0)
    zero_states = [{}]
    out = normuon_normalize(torch.zeros(1, 4, 5), zero_states, 0.9, 1e-8, SkipStep(None))
    assert torch.equal(out, torch.zeros(1, 4, 5)) and torch.equal(zero_states[0]["normuon_v"], torch.zeros(4, 1))


@pytest.mark.parametrize("shape", [(10, 6), (6, 10)])
def test_soap_rectangular_eigenbasis_and_adam_in_it(shape):
    """SOAP on rectangular matrices. First call: L = (1 - b_s) G G^T, R = (1 - b_s) G^T G and the
    bases are their eigenvectors, eigenvalues descending: Q^T L Q is diagonal and descending, and the range columns match fp64 eigh up to sign (the null space's basis is
    arbitrary, so it is not compared). fp64 gradients (SOAP computes in G's dtype, fp32 at least):
    rounding tolerances 1e-10. Later calls, with the bases fixed (no refresh): Adam's
    bias-corrected step in the rotated frame, D = Q_L [M'/(1-b1^t) / (sqrt(V/(1-b2^t)) + eps)] Q_R^T,
    written out in fp64 with the same bases."""
    m, n = shape
    gen = torch.Generator().manual_seed(4)
    grads = [torch.randn(1, m, n, generator=gen, dtype=torch.float64) for _ in range(4)]
    states = [{}]
    opts = dict(beta1=0.9, beta2=0.95, shampoo_beta=0.8, eps=1e-8, refresh=False)
    first = soap_directions(grads[0], states, SkipStep(None), **opts)
    assert torch.equal(first, torch.zeros_like(first))
    st = states[0]
    g0 = grads[0][0].double()
    r = min(m, n)
    for key, S in (("soap_QL", 0.2 * g0 @ g0.T), ("soap_QR", 0.2 * g0.T @ g0)):
        Q = st[key]
        torch.testing.assert_close(Q.T @ Q, torch.eye(Q.shape[0], dtype=torch.float64), rtol=0, atol=1e-12)
        inner = Q.T @ S @ Q
        diag = inner.diagonal()
        assert (inner - torch.diag(diag)).abs().max() < 1e-12 * diag.max()
        assert (diag[:-1] >= diag[1:] - 1e-12 * diag.max()).all()
        ref = torch.linalg.eigh(S).eigenvectors.flip(-1)[:, :r]
        torch.testing.assert_close((Q[:, :r] * ref).sum(0).abs(), torch.ones(r, dtype=torch.float64), rtol=0,
                                   atol=1e-10)
    QL, QR = st["soap_QL"].clone(), st["soap_QR"].clone()
    M = V = torch.zeros(m, n, dtype=torch.float64)
    for t, G in enumerate(grads[1:], start=1):
        out = soap_directions(G, states, SkipStep(None), **opts)
        g = G[0].double()
        M = 0.9 * M + 0.1 * g
        V = 0.95 * V + 0.05 * (QL.T @ g @ QR) ** 2
        ref = QL @ ((QL.T @ M @ QR) / (1 - 0.9**t) / ((V / (1 - 0.95**t)).sqrt() + 1e-8)) @ QR.T
        torch.testing.assert_close(out[0], ref, rtol=0, atol=1e-10)
    assert float(st["soap_step"]) == 3


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_momentum_update_against_its_formula(nesterov, dtype):
    """SPEC 3 momentum, eager path: B <- mu B + G; U = G + mu B (Nesterov) or B, in fp64 from the
    same fp32 values over three steps. fp32: a few roundings of O(1) values (1e-6); bf16 U: one
    final rounding, at most 2^-8 relative per entry (plus the fp32 error)."""
    from optimizers.momentum import momentum_updates

    gen = torch.Generator().manual_seed(5)
    bufs = [torch.zeros(6, 4), torch.zeros(3, 5)]
    ref_b = [torch.zeros(6, 4, dtype=torch.float64), torch.zeros(3, 5, dtype=torch.float64)]
    for _ in range(3):
        grads = [torch.randn(b.shape, generator=gen) for b in bufs]
        out = momentum_updates(bufs, grads, 0.9, nesterov, dtype, SkipStep(None), compiled=False)
        for i, g in enumerate(grads):
            ref_b[i] = 0.9 * ref_b[i] + g.double()
            ref_u = g.double() + 0.9 * ref_b[i] if nesterov else ref_b[i]
            torch.testing.assert_close(bufs[i].double(), ref_b[i], rtol=1e-6, atol=1e-6)
            assert out[i].dtype == dtype
            tol = 2**-8 if dtype == torch.bfloat16 else 1e-6
            torch.testing.assert_close(out[i].double(), ref_u, rtol=tol, atol=1e-6)
