"""Matrix orthogonalisers: Polar Express and the Muon Newton-Schulz quintic.

Both map a matrix (or a batch of same-shape matrices) ``G`` of shape
``(..., m, n)`` to an approximation of its polar factor ``U V^T`` (``G = U S V^T``).
Each step forms its polynomial on the small side, ``H = aI + bA + cA^2`` with ``A = X X^T`` for a
wide X and ``A = X^T X`` for a tall one, and applies it with one product (``H X`` or ``X H``): no
transposed copies in or out, and no copy of the iterate into a ``baddbmm`` output (on an H200 the
two were 7.3 ms of a 56 ms 0.6B Muon step, docs/bench/optimizers_muon_profile.md).
A and H are symmetric, so on CUDA in fp16/bf16 both come from ``kernels.gram``'s Triton
``symmetric_product``, which computes only the tiles on and above the diagonal (about half a GEMM's
FLOPs) and fuses H's ``bA + aI`` into its epilogue; the product with X stays a ``torch.bmm``. On the
CPU, in fp32/fp64, or where Triton does not import, all three are torch GEMMs.
``gram=True`` iterates on that Gram matrix instead (``_iterate_gram``: fewer FLOPs on rectangular
matrices, since the iterate is formed only at restarts). It is off by
default: its update ``A <- H A H`` keeps the sign of every eigenvalue, so when rounding makes a
(near-)zero eigenvalue of a rank-deficient gradient's Gram matrix negative, the polynomials grow it
without bound. In bf16 on an H200 this turned the first Muon steps of MAD models into NaN
weights; the standard iteration maps every singular value into [0, ~1.2] and cannot.
"""

from __future__ import annotations

import functools
import math

import torch

from kernels.checks import grad_required

__all__ = [
    "FLOAT_DTYPES",
    "GRAM_SEGMENT",
    "POLAR_EXPRESS_COEFFS",
    "NEWTON_SCHULZ_COEFFS",
    "polar_express",
    "newton_schulz",
    "default_compute_dtype",
    "orthogonalize",
    "ORTHOGONALIZERS",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The real floating dtypes of the matrices (and parameters) the optimizers take."""

_SAFETY = 1.01
_NORM_EPS = 1e-7

# Published Polar Express set (lower bound l = 1e-3, 8 steps), SPEC.md section 3.
_PE_RAW = (
    (8.28721, -23.59589, 17.30039),
    (4.10706, -2.94785, 0.54484),
    (3.94869, -2.90890, 0.55182),
    (3.31842, -2.48849, 0.51005),
    (2.30065, -1.66890, 0.41881),
    (1.89130, -1.26800, 0.37680),
    (1.87500, -1.25000, 0.37500),
    (1.875, -1.25, 0.375),
)
# Every tuple but the last is shrunk by the safety factor so that singular values
# pushed slightly above 1 by rounding stay inside the polynomials' basin.
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = tuple(
    (a / _SAFETY, b / _SAFETY**3, c / _SAFETY**5) for a, b, c in _PE_RAW[:-1]
) + (_PE_RAW[-1],)

NEWTON_SCHULZ_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)


def default_compute_dtype(t: torch.Tensor) -> torch.dtype:
    """bf16 on CUDA (tensor cores), fp32 elsewhere (CPU bf16 matmul is slow)."""
    return torch.bfloat16 if t.is_cuda else torch.float32


def check_float_matrix(name: str, arg: str, x) -> None:
    """Raise a ValueError naming ``name`` and ``arg`` unless x is a real floating tensor (..., m, n):
    an integer or complex one came back cast to its dtype (rounded to garbage, or its imaginary
    part dropped) without a word."""
    if not isinstance(x, torch.Tensor) or x.ndim < 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: {arg} must be a tensor of shape (..., m, n); got {shape}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: {arg} has dtype {x.dtype}; expected one of {[str(d) for d in FLOAT_DTYPES]}")


def _check_matrix(G: torch.Tensor, steps: int, dtype, gram, kernel, name: str) -> None:
    check_float_matrix(name, "G", G)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"{name}: steps must be an int >= 0; got {steps!r}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: dtype={dtype!r}; expected None or one of {[str(d) for d in FLOAT_DTYPES]}")
    for arg, value in (("gram", gram), ("kernel", kernel)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}: {arg}={value!r}; expected a bool")


def _dense(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a contiguous tensor of ``dtype``, in one copy at most (``.to`` alone keeps strides)."""
    return x.to(dtype, memory_format=torch.contiguous_format).contiguous()


# Per 3-step segment the Gram iteration costs 4 m^2 n + 18 m^3 FLOPs against 3 (4 m^2 n + 2 m^3)
# for the standard steps (m <= n), so it saves work only when n exceeds about 1.5 m.
# Steps between restarts of the Gram iteration: recomputing A = X X^T from the current iterate
# drops the error A <- H A H has accumulated. In half precision a rounding-negative eigenvalue
# still grows within one segment (the module docstring), hence ``gram`` is off by default.
GRAM_SEGMENT = 3


def _frobenius(X: torch.Tensor) -> torch.Tensor:
    """Per-matrix Frobenius norm ``(batch, 1, 1)``, accumulated in fp32 or wider (no wide copy)."""
    wide = torch.promote_types(X.dtype, torch.float32)
    return torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True, dtype=wide)


@functools.cache
def _import_symmetric_product():
    """kernels.gram's Triton ``symmetric_product``, or None where Triton does not import."""
    try:
        from kernels.gram.fused import symmetric_product
    except ImportError:
        return None
    return symmetric_product


def _gram_kernel(X):
    """The Triton ``symmetric_product`` for a CUDA fp16/bf16 X, else None (also while autograd
    records an X that requires grad: the kernel has no backward, torch's GEMMs do)."""
    if not (X.is_cuda and X.dtype in (torch.float16, torch.bfloat16)) or grad_required({"G": X}):
        return None
    return _import_symmetric_product()


def _norm_divisor(X, safety):
    """||X||_F * safety + eps per matrix of a (batch, m, n) X, ``(batch, 1, 1)`` in fp32 or wider (the
    eps keeps a zero matrix at zero)."""
    return _frobenius(X) * safety + _NORM_EPS


def _normalised(X, safety):
    """X divided by ``_norm_divisor`` per matrix, in X's dtype."""
    return X / _norm_divisor(X, safety).to(X.dtype)


def _inverse_norm(X, safety):
    """1 / ``_norm_divisor`` per matrix: (batch,) in fp32 or wider."""
    return _norm_divisor(X, safety).reciprocal().reshape(-1)


def _polynomial(X, a, b, c, tall, symmetric_product=None, scale=None):
    """``H = aI + bA + cA^2`` with ``A = X^T X`` (tall X) or ``X X^T``, both (batch, k, k).

    With ``symmetric_product`` (``kernels.gram``'s signature) two calls that each compute only the
    upper-triangle tiles: A from X or its transposed view (read in place), then H = c A A^T + b A + a I
    (A is symmetric). ``scale`` (batch,), kernel only: the same for X * scale, returned as H * scale
    (A = scale^2 X X^T, both factors applied in fp32 before rounding), so that ``H X`` is the step
    from the scaled X without a pass that scales X. Without the kernel, torch: A by ``bmm``,
    ``bA + cA^2`` as one ``baddbmm`` (its input copy is k x k) and ``a`` added to the diagonal."""
    if symmetric_product is not None:
        A = symmetric_product(X.mT if tall else X, scale=None if scale is None else scale * scale)
        return symmetric_product(A, alpha=c, Y=A, beta=b, gamma=a, scale=scale)
    A = torch.bmm(X.mT, X) if tall else torch.bmm(X, X.mT)
    H = torch.baddbmm(A, A, A, beta=b, alpha=c)
    H.diagonal(dim1=-2, dim2=-1).add_(a)
    return H


def _iterate_polar(X, coeffs, steps, safety, kernel=True):
    """Run ``X <- p(X X^T) X`` with ``p(A) = aI + bA + cA^2`` from a contiguous ``(batch, m, n)`` X
    divided by ``||X||_F * safety + eps`` per matrix (the division is done here).

    p(X X^T) X = X p(X^T X), so a tall X (m > n) takes ``A = X^T X`` and ``X <- X H``: the small side
    either way, from a transposed view (read in place). Per step A and H (``_polynomial``: the Triton
    symmetric kernel on CUDA in fp16/bf16, ``_gram_kernel``; torch GEMMs otherwise), then the product
    with X as ``torch.bmm``, which writes a fresh output instead of copying X into it. With the kernel
    the normalisation is folded into the first step's A and H (their ``scale``): the division was a
    broadcasting elementwise pass over every X (1.4 ms of a 0.6B Muon step on an H200). ``kernel``
    False: torch GEMMs everywhere.
    """
    tall = X.shape[-2] > X.shape[-1]
    kernel = _gram_kernel(X) if kernel else None
    scale = _inverse_norm(X, safety) if kernel is not None and steps else None
    if scale is None:
        X = _normalised(X, safety)
    for i in range(steps):
        a, b, c = coeffs(i)
        H = _polynomial(X, a, b, c, tall, kernel, scale if i == 0 else None)
        X = torch.bmm(X, H) if tall else torch.bmm(H, X)
    return X


def _iterate_gram(X, coeffs, steps):
    """The same iteration on the small Gram side, for a contiguous ``(batch, m, n)`` X of either
    orientation (Dao AI Lab's Gram Newton-Schulz, https://tridao.me/blog/2026/gram-newton-schulz/).

    With ``X_k`` the wide iterate (X^T for a tall X), ``A_k = X_k X_k^T`` (k x k, k = min(m, n)) and
    ``H_k = a I + b A_k + c A_k^2``: ``X_{k+1} = H_k X_k``, so ``X_K = Q X_s`` with ``Q = H_{K-1}..H_s``
    and ``A_{k+1} = H_k A_k H_k`` (H_k commutes with A_k). Every ``GRAM_SEGMENT`` steps the iterate is
    formed and A recomputed from it (the restart). A tall X is used as is (``X^T X``, ``X Q^T``).
    """
    tall = X.shape[-2] > X.shape[-1]
    gram = (lambda Y: torch.bmm(Y.mT, Y)) if tall else (lambda Y: torch.bmm(Y, Y.mT))
    apply = (lambda Q, Y: torch.bmm(Y, Q.mT)) if tall else (lambda Q, Y: torch.bmm(Q, Y))
    Q = None
    for i in range(steps):
        if i % GRAM_SEGMENT == 0:
            if Q is not None:  # restart: the iterate itself, then its Gram matrix
                X, Q = apply(Q, X), None
            A = gram(X)
        a, b, c = coeffs(i)
        H = torch.baddbmm(A, A, A, beta=b, alpha=c)
        H.diagonal(dim1=-2, dim2=-1).add_(a)
        Q = H if Q is None else torch.bmm(H, Q)
        if i + 1 < steps and (i + 1) % GRAM_SEGMENT:
            A = torch.bmm(torch.bmm(H, A), H)
    return X if Q is None else apply(Q, X)


def _iterate(G, coeffs, steps, dtype, safety, gram, kernel):
    """The polynomial iteration in ``dtype`` (default: ``default_compute_dtype``) on G normalised
    by ``||G||_F * safety + eps`` (the eps keeps a zero matrix at zero), as a Gram iteration when
    ``gram``, with the symmetric-product kernel where it applies when ``kernel``; returns G's shape
    and dtype, contiguous."""
    dtype = dtype or default_compute_dtype(G)
    X = _dense(G, dtype)
    X = X.reshape(math.prod(G.shape[:-2]), *G.shape[-2:])  # not -1: a matrix of no entries is ambiguous
    if gram:
        X = _iterate_gram(_normalised(X, safety), coeffs, steps)
    else:
        X = _iterate_polar(X, coeffs, steps, safety, kernel)
    return _dense(X.reshape(G.shape), G.dtype)


def polar_express(G: torch.Tensor, steps: int = 8, dtype: torch.dtype | None = None,
                  gram: bool = False, kernel: bool = True) -> torch.Tensor:
    """Polar Express approximation of the polar factor of ``G``.

    Args:
        G: ``(..., m, n)`` float tensor; a batch is orthogonalised matrix by matrix.
        steps: number of polynomial steps; steps beyond 8 reuse the last tuple.
        dtype: computation dtype (default bf16 on CUDA, fp32 otherwise).
        gram: iterate on the Gram side (``_iterate_gram``; see the module docstring for why it is
            off by default).
        kernel: form A and H with ``kernels.gram``'s Triton kernel on CUDA in fp16/bf16 (False:
            torch GEMMs everywhere; the Gram-side iteration always uses torch's).
    Returns:
        Tensor of ``G``'s shape and dtype; zero matrices map to zeros.
    """
    _check_matrix(G, steps, dtype, gram, kernel, "polar_express")
    last = len(POLAR_EXPRESS_COEFFS) - 1
    return _iterate(G, lambda i: POLAR_EXPRESS_COEFFS[min(i, last)], steps, dtype, _SAFETY, gram, kernel)


def newton_schulz(G: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None,
                  gram: bool = False, kernel: bool = True) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration (3.4445, -4.7750, 2.0315).

    Args:
        G: ``(..., m, n)`` float tensor.
        steps: iteration count (5 in Muon).
        dtype: computation dtype (default bf16 on CUDA, fp32 otherwise).
        gram, kernel: as in ``polar_express``.
    Returns:
        Tensor of ``G``'s shape and dtype with singular values near [0.7, 1.2].
    """
    _check_matrix(G, steps, dtype, gram, kernel, "newton_schulz")
    return _iterate(G, lambda i: NEWTON_SCHULZ_COEFFS, steps, dtype, 1.0, gram, kernel)


ORTHOGONALIZERS = {"polar_express": (polar_express, 8), "newton_schulz": (newton_schulz, 5)}


def orthogonalize(G: torch.Tensor, method: str = "polar_express", steps: int = 0,
                  dtype: torch.dtype | None = None, gram: bool = False, kernel: bool = True) -> torch.Tensor:
    """Dispatch to an orthogonaliser by name; ``steps=0`` picks its default count."""
    if method not in ORTHOGONALIZERS:
        raise ValueError(f"orthogonalize: method={method!r}; expected one of {sorted(ORTHOGONALIZERS)}")
    fn, default_steps = ORTHOGONALIZERS[method]
    return fn(G, steps=steps or default_steps, dtype=dtype, gram=gram, kernel=kernel)
