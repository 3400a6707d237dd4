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


def bits(t):
    """The bit pattern of a float tensor (so -0.0 differs from 0.0 and NaN payloads count)."""
    width = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
             torch.float16: torch.int16}[t.dtype]
    return t.detach().contiguous().view(width).clone()


def state_bits(opt):
    """Bit patterns of every parameter and every tensor of the optimizer state, in a fixed order."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            out.append(bits(p))
            state = opt.state.get(p, {})
            out.extend(bits(state[k]) for k in sorted(state) if torch.is_tensor(state[k]))
    return out


def same_bits(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))
