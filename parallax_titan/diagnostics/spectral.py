"""Spectral metrics of a matrix and linear CKA (SPEC section 3).

For singular values sigma_1 >= ... >= sigma_R >= 0 (R = the number of singular values, zero modes
included), with H(q) = -sum q log q and 0 log 0 = 0:

    stable rank                 sum sigma^2 / sigma_1^2
    eRank                       exp H(sigma / sum sigma)
    output-energy eRank         exp H(sigma^2 / sum sigma^2)
    top-k energy                sum_{i<=k} sigma_i^2 / sum sigma^2
    normalised spectral entropy H(sigma / sum sigma) / log R

All are NaN for a zero matrix (e.g. W_R initialised to zero for up-training). Functions take
singular values with any leading batch dims, (..., R), sorted descending, and return (...).
"""

from __future__ import annotations

import math

import torch

METRICS = ("stable_rank", "erank", "energy_erank", "top_k_energy", "spectral_entropy")


def singular_values(matrix: torch.Tensor) -> torch.Tensor:
    """(..., m, n) -> (..., min(m, n)) singular values in float64, descending."""
    if matrix.ndim < 2:
        raise ValueError(f"matrix has shape {tuple(matrix.shape)}; expected (..., m, n)")
    return torch.linalg.svdvals(matrix.detach().to(torch.float64))


def product_singular_values(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Singular values of a @ b^T without forming it, float64, descending.

    a: (..., m, D), b: (..., n, D) with D <= m, n (a bilinear circuit of rank <= D, e.g.
    W_QK = W_Q^T W_K per head). Reduced QR a = Qa Ra, b = Qb Rb gives a b^T = Qa (Ra Rb^T) Qb^T,
    so the D singular values of the small Ra Rb^T are those of a b^T (the rest are zero).
    """
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
        raise ValueError(f"a {tuple(a.shape)}, b {tuple(b.shape)}: expected (..., m, D) and (..., n, D)")
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    inner = a.shape[-1]
    if a.shape[-2] < inner or b.shape[-2] < inner:
        return torch.linalg.svdvals(a @ b.transpose(-1, -2))
    ra, rb = torch.linalg.qr(a, mode="r")[1], torch.linalg.qr(b, mode="r")[1]
    return torch.linalg.svdvals(ra @ rb.transpose(-1, -2))


def _entropy(weights: torch.Tensor) -> torch.Tensor:
    prob = weights / weights.sum(-1, keepdim=True)
    return -torch.special.xlogy(prob, prob).sum(-1)


def stable_rank(s: torch.Tensor) -> torch.Tensor:
    """||W||_F^2 / ||W||_2^2 from singular values (..., R)."""
    return s.square().sum(-1) / s[..., 0].square()


def effective_rank(s: torch.Tensor) -> torch.Tensor:
    """eRank = exp H(sigma / sum sigma) (Roy & Vetterli)."""
    return torch.exp(_entropy(s))


def energy_effective_rank(s: torch.Tensor) -> torch.Tensor:
    """Output-energy eRank = exp H(sigma^2 / sum sigma^2)."""
    return torch.exp(_entropy(s.square()))


def top_k_energy(s: torch.Tensor, k: int) -> torch.Tensor:
    """Fraction of sum sigma^2 in the k largest modes (all of it when k >= R)."""
    if k < 1:
        raise ValueError(f"top_k = {k}; expected >= 1")
    energy = s.square()
    return energy[..., :k].sum(-1) / energy.sum(-1)


def normalized_spectral_entropy(s: torch.Tensor) -> torch.Tensor:
    """H(sigma / sum sigma) / log R, in [0, 1]; needs R > 1."""
    if s.shape[-1] < 2:
        raise ValueError(f"singular values of length {s.shape[-1]}; the normalised entropy needs R > 1")
    return _entropy(s) / math.log(s.shape[-1])


def spectral_metrics(s: torch.Tensor, top_k: int = 8) -> dict[str, torch.Tensor]:
    """Every metric of :data:`METRICS` from singular values (..., R); each value has shape (...)."""
    return {
        "stable_rank": stable_rank(s),
        "erank": effective_rank(s),
        "energy_erank": energy_effective_rank(s),
        "top_k_energy": top_k_energy(s, top_k),
        "spectral_entropy": normalized_spectral_entropy(s),
    }


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear CKA of two representations of the same N inputs (Kornblith et al. 2019).

    x: (..., N, Dx), y: (..., N, Dy), centred over N here;
    CKA = ||x^T y||_F^2 / (||x^T x||_F ||y^T y||_F), in [0, 1]. float64.
    """
    if x.ndim < 2 or y.ndim < 2 or x.shape[-2] != y.shape[-2]:
        raise ValueError(f"x {tuple(x.shape)}, y {tuple(y.shape)}: expected (..., N, Dx) and (..., N, Dy)")
    x = x.detach().to(torch.float64)
    y = y.detach().to(torch.float64)
    x = x - x.mean(-2, keepdim=True)
    y = y - y.mean(-2, keepdim=True)
    cross = torch.linalg.matrix_norm(x.transpose(-1, -2) @ y).square()
    return cross / (torch.linalg.matrix_norm(x.transpose(-1, -2) @ x) * torch.linalg.matrix_norm(y.transpose(-1, -2) @ y))


def mean_pairwise_cka(outputs: torch.Tensor) -> float:
    """Mean linear CKA over the H(H-1)/2 pairs of heads; outputs (H, N, D), H >= 2."""
    n = outputs.shape[0]
    if outputs.ndim != 3 or n < 2:
        raise ValueError(f"outputs has shape {tuple(outputs.shape)}; expected (heads >= 2, N, D)")
    i, j = torch.triu_indices(n, n, offset=1)
    return float(linear_cka(outputs[i], outputs[j]).mean())
