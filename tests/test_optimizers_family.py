"""NorMuon, Aurora and SOAP groups of MuonAdamW against direct fp64 implementations of their
formulas (polar factors and eigenbases by SVD / eigh), and their published properties."""

import math

import pytest
import torch
import torch.nn as nn

from optimizers import MuonAdamW
from tests._optim_helpers import polar_svd


def run(algo, W0s, grads, **opts):
    """Parameters after stepping a MuonAdamW group of ``algo`` through ``grads`` (per step, one
    gradient per matrix); fp32 orthogonaliser."""
    params = [nn.Parameter(w.clone()) for w in W0s]
    opt = MuonAdamW([{"params": params, "algo": algo, **opts}], lr=opts.pop("lr", 0.02), ortho_dtype="float32")
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt


def gradients(shapes, steps, seed=0, rows=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        step = []
        for m, n in shapes:
            x = torch.randn(m, n, generator=g)
            if rows is not None:  # uneven row scales: a polar factor with uneven leverages
                x = x * rows(m)[:, None]
            step.append(x)
        out.append(step)
    return out


def momentum_updates(grads, mu=0.95):
    """Nesterov momentum updates U_t (fp64) of one matrix: B <- mu B + G, U = G + mu B."""
    B, out = 0, []
    for g in grads:
        B = mu * B + g.double()
        out.append(g.double() + mu * B)
    return out


def scale(kind, m, n):
    return {"match_rms_adamw": 0.2 * math.sqrt(max(m, n)), "spectral": math.sqrt(max(1, m / n)), "none": 1.0}[kind]


# ------------------------------------------------------------------------------------------- NorMuon


def reference_normuon(W0, grads, lr, wd, beta2, eps, kind, head_dim=0):
    W, v = W0.double().clone(), torch.zeros(W0.shape[0], 1, dtype=torch.float64)
    m, n = W.shape
    for U in momentum_updates(grads):
        O = torch.cat([polar_svd(b) for b in U.split(head_dim)]) if head_dim else polar_svd(U)
        v = beta2 * v + (1 - beta2) * (O**2).mean(dim=1, keepdim=True)
        N = O / (v.sqrt() + eps)
        D = N * O.norm() / N.norm()
        W = W - lr * wd * W - lr * scale(kind, m, n) * D
    return W


@pytest.mark.parametrize("shape,kind,head_dim", [((32, 16), "match_rms_adamw", 0), ((16, 40), "spectral", 0),
                                                 ((24, 16), "match_rms_adamw", 8)])
def test_normuon_matches_fp64_reference(shape, kind, head_dim):
    torch.manual_seed(0)
    W0 = torch.randn(shape) / 4
    grads = gradients([shape], 4)
    (got,), _ = run("normuon", [W0], grads, weight_decay=0.1, update_scale=kind, head_dim=head_dim,
                    normuon_beta2=0.9)
    ref = reference_normuon(W0, [g[0] for g in grads], 0.02, 0.1, 0.9, 1e-8, kind, head_dim)
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=3e-5)


@pytest.mark.parametrize("shape", [(32, 16), (16, 40)])
def test_normuon_rows_equal_and_update_norm_preserved(shape):
    """Published property: after the first step every output row of the update has the same norm
    (v was zero, so each row is divided by its own RMS; Muon's rows differ, the gradient's rows
    being scaled over a decade), and on every step the update's Frobenius norm is that of the
    orthogonalised update, sqrt(min(m, n)) (update_scale "none", lr 1)."""
    m, n = shape
    W0 = torch.zeros(shape)
    params = [nn.Parameter(W0.clone())]
    opt = MuonAdamW([{"params": params, "algo": "normuon", "update_scale": "none"}], lr=1.0, ortho_dtype="float32")
    for step, (g,) in enumerate(gradients([shape], 3, seed=4, rows=lambda k: torch.logspace(0, 1, k))):
        before = params[0].detach().clone()
        params[0].grad = g
        opt.step()
        D = (before - params[0].detach()).double()
        assert D.norm().item() == pytest.approx(math.sqrt(min(m, n)), rel=1e-4)
        if step == 0:
            row = D.norm(dim=1)
            torch.testing.assert_close(row, torch.full_like(row, math.sqrt(min(m, n) / m)), rtol=1e-5, atol=0)


# -------------------------------------------------------------------------------------------- Aurora


def reference_aurora(U, iterations, beta, eps):
    """Direct fp64 Aurora polar: tall orientation, D_0 = 1 / row norms, K polar calls by SVD."""
    m, n = U.shape
    if m == n:
        return polar_svd(U)
    X = U if m > n else U.T
    rows, cols = X.shape
    D = 1 / X.norm(dim=1, keepdim=True).clamp_min(eps)
    for k in range(iterations):
        O = polar_svd(D * X)
        if k + 1 < iterations:
            D = D * ((cols / rows) / (O**2).sum(dim=1, keepdim=True).clamp_min(eps**2)) ** beta
    return O if m > n else O.T


@pytest.mark.parametrize("shape,iterations,beta", [((48, 16), 2, 0.5), ((16, 40), 3, 0.5), ((32, 24), 2, 0.3),
                                                   ((20, 20), 2, 0.5)])
def test_aurora_matches_fp64_reference(shape, iterations, beta):
    m, n = shape
    torch.manual_seed(1)
    W0 = torch.randn(shape) / 4
    uneven = (lambda k: torch.logspace(0, 1, k)) if m != n else None  # square: Muon, well conditioned
    grads = gradients([shape], 3, seed=2, rows=uneven)
    (got,), _ = run("aurora", [W0], grads, weight_decay=0.1, update_scale="spectral", aurora_iterations=iterations,
                    aurora_beta=beta)
    W = W0.double()
    for U in momentum_updates([g[0] for g in grads]):
        W = W - 0.02 * 0.1 * W - 0.02 * scale("spectral", m, n) * reference_aurora(U, iterations, beta, 1e-7)
    torch.testing.assert_close(got.double(), W, rtol=0, atol=5e-5)


def test_aurora_equals_muon_on_square_matrices():
    W0s = [torch.randn(24, 24) / 4, torch.randn(16, 16) / 4]
    grads = gradients([(24, 24), (16, 16)], 3, seed=3)
    muon, _ = run("muon", W0s, grads, weight_decay=0.1)
    aurora, _ = run("aurora", W0s, grads, weight_decay=0.1, aurora_iterations=3)
    assert all(torch.equal(a, b) for a, b in zip(muon, aurora))


def direction(algo, G, **opts):
    """The first-step direction of ``algo`` for gradient G (lr 1, update_scale "none", W0 = 0)."""
    p = nn.Parameter(torch.zeros_like(G))
    opt = MuonAdamW([{"params": [p], "algo": algo, "update_scale": "none", **opts}], lr=1.0, ortho_dtype="float32")
    p.grad = G
    opt.step()
    return -p.detach().double()


@pytest.mark.parametrize("shape", [(48, 16), (16, 48)])
def test_aurora_leverage_uniform_and_orthonormal(shape):
    """Published property, on a gradient with rows scaled over 1.5 decades: Muon's update has row
    leverages ||O_i||^2 (of the tall orientation) spread over two orders of magnitude, Aurora's
    approach n / m as the iterations grow, and its singular values stay 1 (a polar factor)."""
    G = torch.randn(48, 16, generator=torch.Generator().manual_seed(5)) * torch.logspace(0, 1.5, 48)[:, None]
    G = G if shape == (48, 16) else G.T.contiguous()

    def leverage_spread(D):
        tall = D if D.shape[0] > D.shape[1] else D.T
        lev = tall.square().sum(1)
        assert lev.sum().item() == pytest.approx(16, rel=1e-4)  # n / m on average
        return (lev.max() / lev.min()).item()

    assert leverage_spread(direction("muon", G)) > 50
    spreads = [leverage_spread(direction("aurora", G, aurora_iterations=k)) for k in (2, 4, 12)]
    assert spreads[0] < 1.5 and spreads[1] < 1.1 and spreads[2] < 1.002
    sv = torch.linalg.svdvals(direction("aurora", G, aurora_iterations=4))
    torch.testing.assert_close(sv, torch.ones_like(sv), atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------- SOAP


def eigvecs_desc(S):
    return torch.linalg.eigh(S).eigenvectors.flip(-1)


def reference_soap(W0, grads, lr, b1, b2, bs, eps, freq, wd=0.0):
    """Direct fp64 SOAP of one matrix (Vyas et al. 2024, Algorithms 3 and 4)."""
    W = W0.double().clone()
    m, n = W.shape
    L, R = torch.zeros(m, m, dtype=torch.float64), torch.zeros(n, n, dtype=torch.float64)
    M, V, t = torch.zeros(m, n, dtype=torch.float64), torch.zeros(m, n, dtype=torch.float64), 0
    QL = QR = None
    for call, G in enumerate(grads, start=1):
        G = G.double()
        W = W - lr * wd * W
        L, R = bs * L + (1 - bs) * G @ G.T, bs * R + (1 - bs) * G.T @ G
        if QL is None:
            QL, QR = eigvecs_desc(L), eigvecs_desc(R)
            continue
        t += 1
        M = b1 * M + (1 - b1) * G
        V = b2 * V + (1 - b2) * (QL.T @ G @ QR) ** 2
        N = (QL.T @ M @ QR) / (1 - b1**t) / ((V / (1 - b2**t)).sqrt() + eps)
        W = W - lr * QL @ N @ QR.T
        if call % freq == 0:
            ol = torch.diagonal(QL.T @ L @ QL).argsort(descending=True)
            orr = torch.diagonal(QR.T @ R @ QR).argsort(descending=True)
            QL, QR, V = QL[:, ol], QR[:, orr], V[ol][:, orr]
            QL, QR = torch.linalg.qr(L @ QL).Q, torch.linalg.qr(R @ QR).Q
    return W


def test_soap_matches_fp64_reference():
    """Square matrices (rectangular ones have a degenerate null space after the first gradient,
    whose eigenbasis is arbitrary), two of one shape batched together; refresh every 3rd call."""
    shapes = [(12, 12), (12, 12), (16, 16)]
    torch.manual_seed(2)
    W0s = [torch.randn(s) / 4 for s in shapes]
    grads = gradients(shapes, 8, seed=6)
    opts = dict(soap_beta1=0.9, soap_beta2=0.95, soap_shampoo_beta=0.9, soap_eps=1e-8,
                soap_precondition_frequency=3)
    got, opt = run("soap", W0s, grads, weight_decay=0.1, lr=0.01, **opts)
    for i, W0 in enumerate(W0s):
        ref = reference_soap(W0, [g[i] for g in grads], 0.01, 0.9, 0.95, 0.9, 1e-8, 3, wd=0.1)
        torch.testing.assert_close(got[i].double(), ref, rtol=0, atol=2e-5)
    assert opt.param_groups[0]["soap_calls"] == 8


def test_soap_with_identity_basis_is_adam():
    """Published property: SOAP is Adam run in the eigenbasis; with the bases held at the identity
    it is Adam (rectangular matrices too). The first call only sets the bases."""
    shapes = [(12, 20), (20, 12)]
    W0s = [torch.randn(s, generator=torch.Generator().manual_seed(7)) for s in shapes]
    grads = gradients(shapes, 5, seed=8)
    params = [nn.Parameter(w.clone()) for w in W0s]
    opt = MuonAdamW([{"params": params, "algo": "soap", "soap_beta1": 0.9, "soap_beta2": 0.99,
                      "soap_precondition_frequency": 1000}], lr=0.01)
    for p, g in zip(params, grads[0]):
        p.grad = g.clone()
    opt.step()
    assert all(torch.equal(p, w) for p, w in zip(params, W0s))  # no update on the first call
    for p in params:
        for key in ("soap_QL", "soap_QR"):
            opt.state[p][key].copy_(torch.eye(opt.state[p][key].shape[0]))
    ref = [nn.Parameter(w.clone()) for w in W0s]
    adam = torch.optim.Adam(ref, lr=0.01, betas=(0.9, 0.99), eps=1e-8, foreach=False)
    for step in grads[1:]:
        for p, q, g in zip(params, ref, step):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step(), adam.step()
    for p, q, w in zip(params, ref, W0s):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
        assert (p - w).abs().max() > 1e-3


def test_family_options_are_validated():
    p = nn.Parameter(torch.zeros(4, 4))
    for opts, match in [({"algo": "soap", "head_dim": 2}, "head_dim=2; expected 0 for algo 'soap'"),
                        ({"algo": "normuon", "normuon_beta2": 1.0}, r"normuon_beta2=1.0; expected a float in \[0, 1\)"),
                        ({"algo": "aurora", "aurora_iterations": 0}, "aurora_iterations=0; expected an int >= 1"),
                        ({"algo": "aurora", "aurora_beta": 0.0}, r"aurora_beta=0.0; expected a float in \(0, 1\]"),
                        ({"algo": "soap", "soap_eps": 0.0}, "soap_eps=0.0; expected a finite float > 0"),
                        ({"algo": "lion"}, "algo='lion'; expected one of")]:
        with pytest.raises(ValueError, match=match):
            MuonAdamW([{"params": [p], **opts}])


def test_soap_matrix_joining_late_gets_its_own_first_call():
    """A matrix whose gradient appears a call later than its same-shape neighbour's is batched
    with it but starts as a fresh SOAP matrix (bases from its own first gradient, no update), and
    both match the direct fp64 implementation."""
    W0s = [torch.randn(12, 12, generator=torch.Generator().manual_seed(s)) / 4 for s in (11, 12)]
    grads = gradients([(12, 12), (12, 12)], 4, seed=13)
    params = [nn.Parameter(w.clone()) for w in W0s]
    opt = MuonAdamW([{"params": params, "algo": "soap", "soap_precondition_frequency": 1000}], lr=0.01)
    for call, step in enumerate(grads):
        params[0].grad = step[0].clone()
        params[1].grad = step[1].clone() if call > 0 else None
        opt.step()
    torch.testing.assert_close(params[0].detach().double(), reference_soap(
        W0s[0], [g[0] for g in grads], 0.01, 0.95, 0.95, 0.95, 1e-8, 1000), rtol=0, atol=2e-5)
    torch.testing.assert_close(params[1].detach().double(), reference_soap(
        W0s[1], [g[1] for g in grads[1:]], 0.01, 0.95, 0.95, 0.95, 1e-8, 1000), rtol=0, atol=2e-5)
