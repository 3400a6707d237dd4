"""Spectral-power map S_p(W) = U diag(sigma^p) V^T without an SVD, and msign.

Identities (SPEC.md section 3), with ``Q_W = polar(W)``:
    m >= n: G = W^T W,  S_2k = Q_W G^k,  S_2k+1 = W G^k
    m <  n: G = W W^T,  S_2k = G^k Q_W,  S_2k+1 = G^k W
"""

from __future__ import annotations

import torch

from kernels.checks import is_finite_number

from .orthogonalize import check_float_matrix, orthogonalize

__all__ = ["spectral_power", "matrix_power", "msign", "band_projectors", "banded_spectral_power", "BANDS",
           "MAX_TRAINING_POWER", "TRAINING_POWERS"]

BANDS = ("none", "top", "bottom", "top_only", "bottom_only")
# The largest S_p power an optimizer takes: sigma^p overflows fp32 once sigma > 3.4e38^(1/p) (2.4 at
# p = 100, 258 at p = 16), which made the first step non-finite; the papers use p = 0 to 4.
MAX_TRAINING_POWER = 16
TRAINING_POWERS = f"an int from 0 to {MAX_TRAINING_POWER} (sigma^p overflows fp32 above it)"  # for messages


def matrix_power(G: torch.Tensor, k: int) -> torch.Tensor:
    """``G^k`` for a batch of square matrices ``(..., n, n)`` by repeated squaring, k >= 1."""
    if k < 1:
        raise ValueError(f"matrix_power: k must be >= 1; got {k!r}")
    result, base = None, G
    while k:
        if k & 1:
            result = base if result is None else result @ base
        k >>= 1
        if k:
            base = base @ base
    return result


def spectral_power(W: torch.Tensor, p: int, polar_steps: int = 8,
                   dtype: torch.dtype | None = None, polar: torch.Tensor | None = None) -> torch.Tensor:
    """S_p(W) for integer p >= 0 on ``(..., m, n)`` matrices.

    Args:
        W: real float tensor ``(..., m, n)``.
        p: power; 1 returns ``W`` itself, 0 the polar factor.
        polar_steps: Polar Express steps for even p.
        dtype: computation dtype (default: W's dtype promoted to at least fp32, since
            the Gram powers amplify bf16 error).
        polar: optional precomputed polar factor of W (reused by band selection), W's shape.
    Returns:
        Tensor of W's shape and dtype.
    """
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise ValueError(f"spectral_power: p must be an int >= 0; got {p!r}")
    check_float_matrix("spectral_power", "W", W)
    if polar is not None and (not isinstance(polar, torch.Tensor) or polar.shape != W.shape):
        got = tuple(polar.shape) if isinstance(polar, torch.Tensor) else type(polar).__name__
        raise ValueError(f"spectral_power: polar must be None or a tensor of W's shape {tuple(W.shape)}; got {got}")
    if p == 1:
        return W
    dtype = dtype or torch.promote_types(W.dtype, torch.float32)
    X = W.to(dtype)
    k, odd = divmod(p, 2)
    if odd:
        base = X
    elif polar is not None:
        base = polar.to(dtype)
    else:
        base = orthogonalize(X, "polar_express", polar_steps, dtype)
    if k == 0:
        return base.to(W.dtype)
    tall = X.shape[-2] >= X.shape[-1]
    Gk = matrix_power(X.mT @ X if tall else X @ X.mT, k)
    out = base @ Gk if tall else Gk @ base
    return out.to(W.dtype)


def msign(A: torch.Tensor, steps: int = 20, eps: float = 1e-7) -> torch.Tensor:
    """Matrix sign of symmetric ``A`` ``(..., n, n)``: eigenvalues -> their sign.

    ``Z0 = A / (||A||_F + eps)``, then ``steps`` times (an int >= 0)
    ``C = Z^2; Z <- Z (3I - 16/5 C + 6/5 C^2)``; eps: a finite number > 0 (it keeps a zero A at zero).
    Computed in fp32 at least; returns A's dtype.
    """
    check_float_matrix("msign", "A", A)
    if A.shape[-1] != A.shape[-2]:
        raise ValueError(f"msign: A must be square (..., n, n); got {tuple(A.shape)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"msign: steps={steps!r}; expected an int >= 0")
    if not is_finite_number(eps) or eps <= 0:
        raise ValueError(f"msign: eps={eps!r}; expected a finite number > 0")
    dtype = torch.promote_types(A.dtype, torch.float32)
    Z = A.to(dtype)
    Z = Z / (torch.linalg.matrix_norm(Z, keepdim=True) + eps)
    for _ in range(steps):
        C = Z @ Z
        Z = 3.0 * Z - 3.2 * (Z @ C) + 1.2 * (Z @ (C @ C))
    return Z.to(A.dtype)


def band_projectors(W: torch.Tensor, tau: float, steps: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Projectors onto singular modes of W above / below ``tau``.

    For ``m >= n`` they act on the right (``n x n``, from ``W^T W``), otherwise on
    the left (``m x m``, from ``W W^T``); tau: a finite number > 0 (a singular value), steps: msign's.
    Returns ``(P_top, P_bot)``.
    """
    check_float_matrix("band_projectors", "W", W)
    if not is_finite_number(tau) or tau <= 0:  # -tau selected the same band as tau; NaN gave NaN projectors
        raise ValueError(f"band_projectors: tau={tau!r}; expected a finite number > 0")
    X = W.to(torch.promote_types(W.dtype, torch.float32))
    tall = X.shape[-2] >= X.shape[-1]
    G = X.mT @ X if tall else X @ X.mT
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    J = msign(G - (tau * tau) * eye, steps)
    return (eye + J) / 2, (eye - J) / 2


def banded_spectral_power(W: torch.Tensor, p: int, band: str, tau: float, msign_steps: int = 20,
                          polar_steps: int = 8) -> torch.Tensor:
    """Band-selective decay direction (fp32, W's dtype out).

    ``top``: S_p W P_top + W P_bot; ``bottom``: W P_top + S_p P_bot;
    ``top_only``: S_p P_top; ``bottom_only``: S_p P_bot; ``none``: S_p(W).
    Projectors multiply on the right for m >= n, on the left otherwise.
    """
    if band not in BANDS:
        raise ValueError(f"banded_spectral_power: band={band!r}; expected one of {BANDS}")
    S = spectral_power(W, p, polar_steps)
    if band == "none":
        return S
    X, S = W.float(), S.float()
    P_top, P_bot = band_projectors(X, tau, msign_steps)
    tall = X.shape[-2] >= X.shape[-1]

    def apply(M, P):
        return M @ P if tall else P @ M

    out = {
        "top": lambda: apply(S, P_top) + apply(X, P_bot),
        "bottom": lambda: apply(X, P_top) + apply(S, P_bot),
        "top_only": lambda: apply(S, P_top),
        "bottom_only": lambda: apply(S, P_bot),
    }[band]()
    return out.to(W.dtype)
