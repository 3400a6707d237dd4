"""Update directions of the Muon family beyond Muon: NorMuon, Aurora and SOAP.

Each function maps a batch of same-shape full matrices (and, for NorMuon and SOAP, the per-matrix
state kept by the matrix's owner rank) to the direction ``D`` of the update
``W <- W + update_coeff * D``; ``directions.matrix_terms`` calls them on the owner.

NorMuon (Li et al., "NorMuon: Making Muon more efficient and scalable", arXiv 2510.05491),
per matrix with O = ortho(U) (U: Muon's momentum update), rows i = output neurons:

    v_i <- beta2 v_i + (1 - beta2) mean_j O_ij^2
    D = N * ||O||_F / ||N||_F,   N_ij = O_ij / (sqrt(v_i) + eps)

With ``update_scale = "match_rms_adamw"`` this is the paper's step 0.2 lr sqrt(mn) N / ||N||_F
(||O||_F = sqrt(min(m, n)) for a full-rank O).

Aurora (Tilde Research, "Aurora: A Leverage-Aware Optimizer for Rectangular Matrices",
https://blog.tilderesearch.com/blog/aurora, and tilde-research/aurora-release): for a tall
(m > n) matrix G (wide ones are transposed in and out) a diagonal row preconditioner
D_0 = diag(1 / ||G_i||) and, for k = 1..K,

    O_k = polar(D_{k-1} G),   D_k = D_{k-1} (n / m / ||O_k,i||^2)^beta

return O_K: an orthonormal-column factor whose row leverages ||O_i||^2 approach n / m. Square
matrices get polar(G), Muon's direction.

SOAP (Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", arXiv 2409.11321,
Algorithms 3 and 4): per matrix with gradient G,

    L <- b_s L + (1 - b_s) G G^T,   R <- b_s R + (1 - b_s) G^T G
    first call: Q_L, Q_R = eigenvectors of L, R (eigenvalues descending); no update
    later calls: M <- b1 M + (1 - b1) G,          M' = Q_L^T M Q_R,  G' = Q_L^T G Q_R
                 V <- b2 V + (1 - b2) G'^2,       t <- t + 1
                 D = Q_L [ (M' / (1 - b1^t)) / (sqrt(V / (1 - b2^t)) + eps) ] Q_R^T
                 every f-th call: sort Q's columns by diag(Q^T L Q) descending (V's rows
                 and columns with them), then Q_L <- qr(L Q_L).Q, Q_R <- qr(R Q_R).Q

Every state write goes through ``SkipStep`` so that a skipped step leaves the state as it was.
"""

from __future__ import annotations

import torch

from .orthogonalize import default_compute_dtype, orthogonalize
from .skip_step import SkipStep

__all__ = ["normuon_normalize", "aurora_polar", "soap_directions", "SOAP_STATE", "NORMUON_STATE"]

NORMUON_STATE = "normuon_v"
SOAP_STATE = ("soap_L", "soap_R", "soap_QL", "soap_QR", "soap_exp_avg", "soap_exp_avg_sq", "soap_step")


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def normuon_normalize(O: torch.Tensor, states: list[dict], beta2: float, eps: float,
                      skip: SkipStep) -> torch.Tensor:
    """NorMuon's per-row normalisation of orthogonalised updates (see module docstring).

    Args:
        O: ``(k, m, n)`` orthogonalised updates of k matrices of one shape.
        states: the k matrices' owner state dicts; ``normuon_v`` ``(m, 1)`` (fp32 or wider) is
            created as zeros and advanced unless the step is skipped.
        beta2, eps: second-moment decay and the denominator's guard.
        skip: the step's ``SkipStep``.
    Returns:
        ``(k, m, n)`` directions in O's dtype widened to fp32 at least.
    """
    X = O.to(_wide(O.dtype))
    for state in states:
        if NORMUON_STATE not in state:
            state[NORMUON_STATE] = torch.zeros(X.shape[-2], 1, dtype=X.dtype, device=X.device)
    vs = [state[NORMUON_STATE] for state in states]
    v = beta2 * torch.stack(vs) + (1 - beta2) * X.square().mean(-1, keepdim=True)
    skip.select_(vs, list(v.unbind(0)))
    N = X / (v.sqrt() + eps)
    # a zero update (zero gradient, lr 0) stays zero instead of 0 / 0
    ratio = X.norm(dim=(-2, -1), keepdim=True) / N.norm(dim=(-2, -1), keepdim=True).clamp_min(
        torch.finfo(X.dtype).tiny)
    return N * ratio


def aurora_polar(G: torch.Tensor, method: str = "polar_express", steps: int = 0,
                 dtype: torch.dtype | None = None, iterations: int = 2, beta: float = 0.5,
                 eps: float = 1e-7, gram: bool = False, kernel: bool = True) -> torch.Tensor:
    """Aurora's leverage-uniform polar factor (see module docstring).

    Args:
        G: ``(..., m, n)`` float tensor; square matrices return ``orthogonalize(G)``.
        method, steps, dtype, gram, kernel: the orthogonaliser and its options (as ``orthogonalize``).
        iterations: K, the number of polar calls; beta: the damping exponent in (0, 1];
        eps: floor of the row norms (and of the squared leverages, as eps^2).
    Returns:
        Tensor of G's shape and dtype.
    """
    m, n = G.shape[-2:]
    if m == n:
        return orthogonalize(G, method, steps, dtype, gram, kernel)
    tall = m > n
    # the values the orthogonaliser would see (it casts to its compute dtype first), widened for
    # the row statistics: a bf16 copy of G gives the same result as the fp32 original
    X = (G if tall else G.mT).to(dtype or default_compute_dtype(G)).to(_wide(G.dtype))
    rows, cols = X.shape[-2:]
    D = 1.0 / X.norm(dim=-1, keepdim=True).clamp_min(eps)
    for k in range(iterations):
        O = orthogonalize(D * X, method, steps, dtype, gram, kernel)
        if k + 1 < iterations:
            leverage = O.square().sum(-1, keepdim=True).clamp_min(eps * eps)
            D = D * ((cols / rows) / leverage) ** beta
    return (O if tall else O.mT).to(G.dtype, memory_format=torch.contiguous_format).contiguous()


def _soap_init_state(state: dict, m: int, n: int, dtype: torch.dtype, device) -> None:
    eye = lambda k: torch.eye(k, dtype=dtype, device=device)  # noqa: E731
    state.update({"soap_L": torch.zeros(m, m, dtype=dtype, device=device),
                  "soap_R": torch.zeros(n, n, dtype=dtype, device=device),
                  "soap_QL": eye(m), "soap_QR": eye(n),
                  "soap_exp_avg": torch.zeros(m, n, dtype=dtype, device=device),
                  "soap_exp_avg_sq": torch.zeros(m, n, dtype=dtype, device=device),
                  "soap_step": torch.zeros((), dtype=dtype, device=device)})


def _descending_eigenvectors(S: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of symmetric ``(k, d, d)`` S as columns, largest eigenvalue first."""
    return torch.linalg.eigh(S).eigenvectors.flip(-1)


def _refresh_basis(P: torch.Tensor, Q: torch.Tensor, V: torch.Tensor, dim: int):
    """One power-iteration + QR step towards P's eigenbasis, columns sorted by Q^T P Q's diagonal
    (descending), V's ``dim`` permuted with them. Returns (Q, V)."""
    estimate = (Q * (P @ Q)).sum(-2)  # diag(Q^T P Q)
    order = estimate.argsort(dim=-1, descending=True)
    Q = Q.gather(-1, order.unsqueeze(-2).expand_as(Q))
    V = V.gather(dim, order.unsqueeze(-1 if dim == -2 else -2).expand_as(V))
    return torch.linalg.qr(P @ Q).Q, V


def soap_directions(G: torch.Tensor, states: list[dict], skip: SkipStep, beta1: float, beta2: float,
                    shampoo_beta: float, eps: float, refresh: bool) -> torch.Tensor:
    """SOAP directions of k same-shape matrices (see module docstring).

    Args:
        G: ``(k, m, n)`` gradients.
        states: the k matrices' owner state dicts (keys ``SOAP_STATE``; created on the first
            call, which only sets the bases and returns zeros).
        skip: the step's ``SkipStep``; every state tensor is selected through it.
        beta1, beta2: Adam's moment decays in the eigenbasis; shampoo_beta: decay of L and R;
        eps: Adam's denominator guard; refresh: whether this call refreshes the bases.
    Returns:
        ``(k, m, n)`` directions, fp32 or wider.
    """
    G = G.to(_wide(G.dtype))
    k, m, n = G.shape
    fresh = [i for i, s in enumerate(states) if "soap_L" not in s]
    if fresh and len(fresh) < k:  # matrices that joined late: one call per kind
        out: list = [None] * k
        for part in (fresh, [i for i in range(k) if i not in fresh]):
            rows = soap_directions(torch.stack([G[i] for i in part]), [states[i] for i in part], skip, beta1,
                                   beta2, shampoo_beta, eps, refresh)
            for i, row in zip(part, rows.unbind(0)):
                out[i] = row
        return torch.stack(out)  # stacking, not indexed writes: a host index list would synchronise
    for i in fresh:
        _soap_init_state(states[i], m, n, G.dtype, G.device)
    old = {key: torch.stack([s[key] for s in states]) for key in SOAP_STATE}
    new = dict(old)
    new["soap_L"] = skip.pick(old["soap_L"], shampoo_beta * old["soap_L"] + (1 - shampoo_beta) * G @ G.mT)
    new["soap_R"] = skip.pick(old["soap_R"], shampoo_beta * old["soap_R"] + (1 - shampoo_beta) * G.mT @ G)
    if fresh:  # L and R are finite here (picked), so eigh never sees a skipped step's NaN
        new["soap_QL"] = skip.pick(old["soap_QL"], _descending_eigenvectors(new["soap_L"]))
        new["soap_QR"] = skip.pick(old["soap_QR"], _descending_eigenvectors(new["soap_R"]))
        direction = torch.zeros_like(G)
    else:
        QL, QR = old["soap_QL"], old["soap_QR"]
        M = beta1 * old["soap_exp_avg"] + (1 - beta1) * G
        V = beta2 * old["soap_exp_avg_sq"] + (1 - beta2) * (QL.mT @ G @ QR).square()
        t = (old["soap_step"] + 1).view(k, 1, 1)
        rotated = (QL.mT @ M @ QR) / (1 - beta1**t) / ((V / (1 - beta2**t)).sqrt() + eps)
        direction = QL @ rotated @ QR.mT
        if refresh:
            QL, V = _refresh_basis(new["soap_L"], QL, V, dim=-2)
            QR, V = _refresh_basis(new["soap_R"], QR, V, dim=-1)
        for key, value in (("soap_exp_avg", M), ("soap_exp_avg_sq", V), ("soap_step", t.view(k)),
                           ("soap_QL", QL), ("soap_QR", QR)):
            new[key] = skip.pick(old[key], value)
    for key in SOAP_STATE:
        if new[key] is not old[key]:
            torch._foreach_copy_([s[key] for s in states], list(new[key].unbind(0)))
    return direction
