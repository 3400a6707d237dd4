"""Shared fixtures for the optimizer tests: matrices with a prescribed spectrum."""

import math

import torch


def spectrum_matrix(m, n, sigmas, seed, dtype=torch.float64):
    """Return (W, U, s, V) with W = U diag(s) V^T, U (m, r), V (n, r) orthonormal, fp64."""
    g = torch.Generator().manual_seed(seed)
    s = torch.as_tensor(sigmas, dtype=torch.float64)
    r = s.numel()
    U, _ = torch.linalg.qr(torch.randn(m, r, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, r, generator=g, dtype=torch.float64))
    return ((U * s) @ V.T).to(dtype), U, s, V


def logspaced(m, n, kappa):
    return torch.logspace(0, -math.log10(kappa), min(m, n), dtype=torch.float64)


def polar_svd(W):
    """fp64 reference polar factor U V^T."""
    U, _, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    return U @ Vh


def rel_err(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()
