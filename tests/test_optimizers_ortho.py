"""Orthogonalisers, S_p and msign against fp64 SVD references and SPEC closed forms."""

import importlib

import pytest
import torch

from optimizers import newton_schulz, polar_express, spectral_power
from optimizers.orthogonalize import ORTHOGONALIZERS, POLAR_EXPRESS_COEFFS
from optimizers.spectral import band_projectors, banded_spectral_power, matrix_power, msign
from tests._optim_helpers import logspaced, polar_svd, rel_err, spectrum_matrix

SHAPES = [(64, 64), (128, 64), (64, 128)]
SEEDS = [42, 43, 44]
# SPEC.md section 3: paper's max relative Frobenius error of S_p in fp32.
PAPER_TABLE = {
    (10, 0): 2.8e-6, (10, 2): 2.9e-6, (10, 4): 2.9e-6,
    (1e3, 0): 6.7e-5, (1e3, 2): 3.0e-6, (1e3, 4): 3.0e-6,
    (1e6, 0): 0.55, (1e6, 2): 2.7e-6, (1e6, 4): 2.7e-6,
}


# SPEC.md section 3, typed in: the published set (l = 1e-3, 8 steps) before the safety division
SPEC_PE_TUPLES = [
    (8.28721, -23.59589, 17.30039), (4.10706, -2.94785, 0.54484),
    (3.94869, -2.90890, 0.55182), (3.31842, -2.48849, 0.51005),
    (2.30065, -1.66890, 0.41881), (1.89130, -1.26800, 0.37680),
    (1.87500, -1.25000, 0.37500), (1.875, -1.25, 0.375),
]


def test_polar_express_coefficients_are_the_published_set():
    """All eight tuples: a / 1.01, b / 1.01^3, c / 1.01^5 for the first seven, the last as printed."""
    assert len(POLAR_EXPRESS_COEFFS) == 8
    for i, ((a, b, c), got) in enumerate(zip(SPEC_PE_TUPLES, POLAR_EXPRESS_COEFFS)):
        want = (a, b, c) if i == 7 else (a / 1.01, b / 1.01**3, c / 1.01**5)
        assert got == pytest.approx(want, rel=1e-12, abs=0), i
    # the converged polynomials fix 1: p(1) = 1 for the last, slightly below for the shrunk one
    assert sum(POLAR_EXPRESS_COEFFS[-1]) == 1.0
    assert sum(POLAR_EXPRESS_COEFFS[-2]) < 1.0


@pytest.mark.parametrize("kappa,p", sorted(PAPER_TABLE))
def test_spectral_power_matches_paper_table(kappa, p):
    worst = 0.0
    for m, n in SHAPES:
        for seed in SEEDS:
            W, U, s, V = spectrum_matrix(m, n, logspaced(m, n, kappa), seed)
            ref = (U * s**p) @ V.T
            worst = max(worst, rel_err(spectral_power(W.float(), p), ref))
    # the paper quotes two significant digits; compare at that precision
    assert float(f"{worst:.2g}") <= PAPER_TABLE[(kappa, p)], worst


@pytest.mark.parametrize("m,n", SHAPES)
def test_polar_express_vs_svd(m, n):
    W, *_ = spectrum_matrix(m, n, logspaced(m, n, 10), 42)
    out = polar_express(W.float())
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert rel_err(out, polar_svd(W)) < 5e-6


def test_polar_express_batch_equals_loop_and_extra_steps_reuse_last():
    W = torch.randn(3, 32, 48, generator=torch.Generator().manual_seed(0))
    batched = polar_express(W, steps=10)
    for i in range(3):
        torch.testing.assert_close(batched[i], polar_express(W[i], steps=10), rtol=1e-5, atol=1e-6)
    # steps 9, 10 apply the last tuple again: the result equals two manual extra steps
    X = polar_express(W[0], steps=8)
    a, b, c = POLAR_EXPRESS_COEFFS[-1]
    for _ in range(2):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    torch.testing.assert_close(batched[0], X, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (9, 9)])
@pytest.mark.parametrize("method,steps", [("newton_schulz", 5), ("newton_schulz", 2), ("polar_express", 8),
                                          ("polar_express", 11)])
def test_iteration_is_the_scalar_polynomial_on_each_singular_value(method, steps, shape):
    """SPEC.md 3 in closed form: an odd matrix polynomial acts on each singular value alone, so with
    G = U diag(s) V^T the result is U diag(x_K) V^T, x_0 = s / (||s||_2 * safety + 1e-7) (safety 1.01
    for Polar Express, 1 for Newton-Schulz) and x <- a x + b x^3 + c x^5 with the SPEC tuples. This
    pins what the SVD comparisons cannot: the coefficients, the normalisation, the step count."""
    sigmas = torch.tensor([3.0, 1.0, 0.3, 0.05, 1e-3], dtype=torch.float64)
    W, U, s, V = spectrum_matrix(*shape, sigmas, 3)
    raw = [(3.4445, -4.7750, 2.0315)] * steps if method == "newton_schulz" else SPEC_PE_TUPLES
    safety = 1.0 if method == "newton_schulz" else 1.01
    x = s / (s.norm() * safety + 1e-7)
    for i in range(steps):
        a, b, c = raw[min(i, len(raw) - 1)]
        if method == "polar_express" and i < 7:  # SPEC: every tuple but the last divided by the safety
            a, b, c = a / 1.01, b / 1.01**3, c / 1.01**5
        x = a * x + b * x**3 + c * x**5
    out = ORTHOGONALIZERS[method][0](W, steps=steps, dtype=torch.float64)
    assert rel_err(out, (U * x) @ V.T) < 1e-11


def test_newton_schulz_singular_values_in_band():
    W, *_ = spectrum_matrix(96, 48, logspaced(96, 48, 100), 1)
    s = torch.linalg.svdvals(newton_schulz(W.float()).double())
    assert s.min() > 0.6 and s.max() < 1.25
    # tall input handled by orientation: same as transposing the wide result
    torch.testing.assert_close(newton_schulz(W.float()), newton_schulz(W.float().T).T)


@pytest.mark.parametrize("fn", [polar_express, newton_schulz])
def test_zero_matrix_gives_zeros(fn):
    out = fn(torch.zeros(2, 8, 16))
    assert torch.equal(out, torch.zeros(2, 8, 16))
    assert torch.equal(spectral_power(torch.zeros(8, 4), 0), torch.zeros(8, 4))


def test_bf16_compute_dtype_keeps_input_dtype():
    W, *_ = spectrum_matrix(64, 32, logspaced(64, 32, 10), 3)
    out = polar_express(W.float(), dtype=torch.bfloat16)
    assert out.dtype == torch.float32
    assert rel_err(out, polar_svd(W)) < 5e-2


def test_bad_input_messages():
    with pytest.raises(ValueError, match="steps"):
        polar_express(torch.ones(4, 4), steps=-1)
    with pytest.raises(ValueError, match="shape"):
        newton_schulz(torch.ones(4))
    with pytest.raises(ValueError, match="p must be an int >= 0; got -1"):
        spectral_power(torch.ones(4, 4), -1)


def test_spectral_power_p1_identity_and_odd_powers_exact():
    W, U, s, V = spectrum_matrix(20, 12, torch.linspace(2, 0.1, 12), 5)
    assert spectral_power(W, 1) is W
    for p in (3, 5, 7):
        torch.testing.assert_close(spectral_power(W, p), (U * s**p) @ V.T, rtol=1e-10, atol=1e-12)


def test_matrix_power_repeated_squaring():
    G = torch.randn(3, 5, 5, dtype=torch.float64) / 3
    for k in (1, 2, 5, 8, 13):
        torch.testing.assert_close(matrix_power(G, k), torch.linalg.matrix_power(G, k))


def test_msign_and_band_projectors():
    sig = torch.tensor([3.0, 2.0, 1.2, 0.8, 0.5, 0.1])
    for m, n in [(10, 6), (6, 10)]:
        W, U, s, V = spectrum_matrix(m, n, sig, 7)
        P_top, P_bot = band_projectors(W, tau=1.0)
        basis = V if m >= n else U
        top = basis[:, :3]
        torch.testing.assert_close(P_top, top @ top.T + 0 * P_top, atol=1e-5, rtol=0)
        torch.testing.assert_close(P_top + P_bot, torch.eye(P_top.shape[0], dtype=W.dtype))
        # top_only decay: sigma^p on modes above tau, zero below
        out = banded_spectral_power(W, 2, "top_only", 1.0)
        ref = (U * torch.where(s > 1.0, s**2, 0 * s)) @ V.T
        assert rel_err(out, ref) < 1e-5
        mixed = banded_spectral_power(W, 0, "bottom", 1.0)
        ref = (U * torch.where(s > 1.0, s, torch.ones_like(s))) @ V.T
        assert rel_err(mixed, ref) < 1e-5
    A = torch.diag(torch.tensor([2.0, -0.5, 0.3], dtype=torch.float64))
    # the fixed point 1 has slope -0.6: 20 steps converge to ~1e-5
    sign = torch.diag(torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(msign(A), sign, atol=5e-5, rtol=0)


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (3, 40, 24), (2, 24, 40)])
@pytest.mark.parametrize("method", ["polar_express", "newton_schulz"])
def test_result_is_contiguous_in_the_input_layout(shape, method):
    """Tall and batched inputs come back dense (the caller's elementwise ops then take fast paths)
    and equal the polar factor computed through an explicit transpose."""
    G = torch.randn(*shape, dtype=torch.float64)
    out = ORTHOGONALIZERS[method][0](G, dtype=torch.float64)
    assert out.is_contiguous() and out.shape == G.shape and out.dtype == G.dtype
    flipped = ORTHOGONALIZERS[method][0](G.mT.contiguous(), dtype=torch.float64).mT
    torch.testing.assert_close(out, flipped, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (2, 30, 20)])
@pytest.mark.parametrize("steps", [0, 1, 3, 4, 8, 10])
@pytest.mark.parametrize("fn", [polar_express, newton_schulz])
def test_gram_iteration_is_the_standard_iteration_in_fp64(fn, steps, shape):
    """Same polynomials, same result: the Gram-side iteration (restarts included) and the
    standard one agree to fp64 rounding."""
    G = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(steps))
    gram = fn(G, steps=steps, dtype=torch.float64, gram=True)
    standard = fn(G, steps=steps, dtype=torch.float64, gram=False)
    assert gram.shape == G.shape and gram.is_contiguous()
    torch.testing.assert_close(gram, standard, rtol=0, atol=1e-11)


@pytest.mark.parametrize("m,n", [(256, 768), (768, 256), (256, 512)])
@pytest.mark.parametrize("kappa", [10, 1e3])
def test_gram_bf16_agrees_with_svd_like_the_standard_path(m, n, kappa):
    """bf16 on full-rank rectangular matrices: the Gram side's error against the fp64 SVD polar
    factor stays that of the standard bf16 iteration (which was 8e-3 at kappa 10, 0.17 at kappa
    1e3, from the unconverged small modes)."""
    W, *_ = spectrum_matrix(m, n, logspaced(m, n, kappa), 1)
    ref = polar_svd(W)
    gram = polar_express(W.float(), dtype=torch.bfloat16, gram=True)
    standard = rel_err(polar_express(W.float(), dtype=torch.bfloat16, gram=False), ref)
    assert torch.isfinite(gram).all()
    assert rel_err(gram, ref) < max(1.5 * standard, 2e-2), (rel_err(gram, ref), standard)


@pytest.mark.parametrize("fn", [polar_express, newton_schulz])
def test_the_default_is_the_standard_iteration(fn):
    """The Gram side is opt-in (its bf16 iteration blew up on rank-deficient MAD gradients on an
    H200): by default every dtype and shape runs the standard iteration, bit for bit, and the
    optimizer's default mode is "off"."""
    for shape in [(40, 32), (64, 32), (32, 96)]:
        W = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        for dtype in (torch.bfloat16, torch.float32):
            assert torch.equal(fn(W, dtype=dtype), fn(W, dtype=dtype, gram=False))
    from optimizers.muon import MuonAdamW

    opt = MuonAdamW([{"params": [torch.nn.Parameter(torch.zeros(4, 8))], "algo": "muon"}], lr=0.1)
    assert opt.param_groups[0]["ortho_gram"] == "off"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m,n", [(1024, 3072), (2048, 1024), (1024, 1024)])
@pytest.mark.parametrize("kappa", [10, 1e3])
def test_gpu_gram_side_agrees_with_svd(m, n, kappa):
    """The 0.6B shapes, full rank, bf16, batched: the Gram side's error against each matrix's fp64
    SVD polar factor stays within 1.5x that of the standard bf16 iteration (or 2e-2)."""
    W = torch.stack([spectrum_matrix(m, n, logspaced(m, n, kappa), seed)[0] for seed in (1, 2)]).cuda()
    gram = polar_express(W.float(), gram=True)
    standard = polar_express(W.float())
    assert gram.dtype == torch.float32 and torch.isfinite(gram).all()
    for i in range(2):
        ref = polar_svd(W[i])
        err, err_std = rel_err(gram[i], ref), rel_err(standard[i], ref)
        assert err < max(1.5 * err_std, 2e-2), (err, err_std)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fn", [polar_express, newton_schulz])
@pytest.mark.parametrize("shape", [(352, 128), (128, 352), (3072, 1024)])
def test_gpu_default_path_is_bounded_on_rank_deficient_matrices(fn, shape):
    """Low-rank gradients (a MAD model's first steps) in bf16 on the GPU: every singular value of
    the default path's output stays below 1.3 (the Gram side's sign-keeping update blew such
    inputs up to NaN weights)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rank in (1, 3, 16):
        G = torch.randn(8, shape[0], rank, device="cuda", generator=gen) @ torch.randn(
            8, rank, shape[1], device="cuda", generator=gen)
        out = fn(G)
        assert torch.isfinite(out).all()
        assert torch.linalg.matrix_norm(out.double(), ord=2).max() < 1.3


def _noisy_square_products(monkeypatch, relative=3e-3):
    """Make every k x k product of the orthogonalisers carry a symmetric error of ``relative`` times
    its largest entry, as half-precision products with reduced-precision sums do on a GPU."""
    module = importlib.import_module("optimizers.orthogonalize")
    exact, gen = torch.bmm, torch.Generator().manual_seed(0)

    def bmm(a, b):
        out = exact(a, b)
        if out.shape[-1] != out.shape[-2]:
            return out
        noise = torch.randn(out.shape, generator=gen, dtype=out.dtype) * relative
        return out + (noise + noise.mT) / 2 * out.abs().amax(dim=(-2, -1), keepdim=True)

    monkeypatch.setattr(module.torch, "bmm", bmm)


@pytest.mark.parametrize("rank", [1, 3, 10])
def test_rank_deficient_matrices_under_rounding_noise(monkeypatch, rank):
    """The MAD runs' failure on a CPU: a rank-deficient gradient whose k x k products carry
    half-precision-sized errors. The default (standard) iteration keeps every singular value below
    1.3; the Gram side, whose sign-keeping update grows the negative eigenvalues the noise makes,
    does not (the reason it is opt-in)."""
    gen = torch.Generator().manual_seed(rank)
    G = torch.randn(352, rank, generator=gen) @ torch.randn(rank, 128, generator=gen)
    _noisy_square_products(monkeypatch)
    standard = polar_express(G)
    gram = polar_express(G, gram=True)
    assert torch.isfinite(standard).all() and torch.linalg.matrix_norm(standard, ord=2) < 1.3
    assert not (torch.isfinite(gram).all() and torch.linalg.matrix_norm(gram, ord=2) < 1.3)


def _textbook_polar_express(G, dtype):
    """Polar Express written as the papers do, on the wide orientation (a tall G transposed in and
    out), in ``dtype``: X <- aX + (bA + cA^2)X, A = X X^T, the aX term added in the GEMM's fp32
    epilogue. The reference the small-side form is held to."""
    from optimizers.orthogonalize import _NORM_EPS, _SAFETY

    tall = G.shape[-2] > G.shape[-1]
    X = (G.mT if tall else G).to(dtype).contiguous().unsqueeze(0)
    X = X / (torch.linalg.vector_norm(X.float(), dim=(-2, -1), keepdim=True) * _SAFETY + _NORM_EPS).to(dtype)
    for a, b, c in POLAR_EXPRESS_COEFFS:
        A = torch.bmm(X, X.mT)
        X = torch.baddbmm(X, torch.baddbmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return (X[0].mT if tall else X[0]).float()


@pytest.mark.parametrize("m,n", [(256, 768), (768, 256), (384, 384)])
@pytest.mark.parametrize("kappa", [10, 1e3])
def test_small_side_form_is_as_accurate_as_the_textbook_form_in_bf16(m, n, kappa):
    """The shipped step (H = aI + bA + cA^2 on the small side, a added to H's diagonal in bf16, X H
    for tall inputs) against the fp64 SVD polar factor: no further from it than the textbook form
    (aX + BX on the wide orientation) in the same dtype, on full-rank matrices of both
    orientations. In fp64 the two agree to rounding."""
    W, *_ = spectrum_matrix(m, n, logspaced(m, n, kappa), 3)
    ref = polar_svd(W)
    ours = rel_err(polar_express(W.float(), dtype=torch.bfloat16), ref)
    textbook = rel_err(_textbook_polar_express(W.float(), torch.bfloat16), ref)
    assert ours < 1.1 * textbook + 2e-3, (ours, textbook)
    torch.testing.assert_close(polar_express(W, dtype=torch.float64), _textbook_polar_express(W, torch.float64).double(),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("fn", [polar_express, newton_schulz])
@pytest.mark.parametrize("shape", [(352, 128), (128, 352)])
def test_bf16_default_path_is_bounded_on_rank_deficient_matrices(fn, shape):
    """Low-rank gradients in bf16 on the CPU, both orientations (the tall one iterates on X^T X):
    every singular value of the output stays below 1.3, as on the GPU."""
    gen = torch.Generator().manual_seed(0)
    for rank in (1, 3, 16):
        G = torch.randn(4, shape[0], rank, generator=gen) @ torch.randn(4, rank, shape[1], generator=gen)
        out = fn(G, dtype=torch.bfloat16)
        assert torch.isfinite(out).all()
        assert torch.linalg.matrix_norm(out.double(), ord=2).max() < 1.3
