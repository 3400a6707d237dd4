"""PyTorch reference of ``symmetric_product`` and the argument checks both implementations share.

``symmetric_product(P, alpha, Y, beta, gamma, scale) = scale_b (alpha P P^T + beta Y + gamma I)`` per batch
entry b (``scale`` None: 1), computed
in fp64 (fp32 inputs and narrower) and rounded once to P's dtype: the tests' reference and a form
that runs on any device. No Triton here.
"""

from __future__ import annotations

import torch

from kernels.checks import is_finite_number

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}"
    return f"{type(x).__name__} {x!r}"


def check_args(P, alpha, Y, beta, gamma, scale=None, name: str = "symmetric_product",
               dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    """Raise a TypeError / ValueError naming the first bad argument of ``name``.

    P: (B, k, K) or (k, K) floating tensor of one of ``dtypes``; Y: None or a tensor of shape
    (B, k, k) (or (k, k)), P's dtype and device; alpha, beta, gamma: finite real Python numbers;
    scale: None or a floating tensor of shape (B,) (or () for a 2-D P) on P's device.
    """
    if not isinstance(P, torch.Tensor):
        raise TypeError(f"{name}: P must be a torch.Tensor of shape (B, k, K) or (k, K); got {_describe(P)}")
    if P.ndim not in (2, 3):
        raise ValueError(f"{name}: P must have 2 or 3 dimensions, (k, K) or (B, k, K); got shape {tuple(P.shape)}")
    if P.dtype not in dtypes:
        raise TypeError(f"{name}: P's dtype must be one of {[str(d) for d in dtypes]}; got {P.dtype}")
    for arg, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not is_finite_number(value):
            raise ValueError(f"{name}: {arg} must be a finite real Python number; got {_describe(value)}")
    _check_scale(P, scale, name)
    if Y is None:
        return
    if not isinstance(Y, torch.Tensor):
        raise TypeError(f"{name}: Y must be None or a torch.Tensor; got {_describe(Y)}")
    want = (*P.shape[:-1], P.shape[-2])
    if tuple(Y.shape) != want:
        raise ValueError(f"{name}: Y must have shape {want} (P's batch and rows, square); "
                         f"got {tuple(Y.shape)} for P of shape {tuple(P.shape)}")
    if Y.dtype != P.dtype:
        raise TypeError(f"{name}: Y's dtype must be P's ({P.dtype}); got {Y.dtype}")
    if Y.device != P.device:
        raise ValueError(f"{name}: Y must be on P's device ({P.device}); got {Y.device}")


def _check_scale(P, scale, name: str) -> None:
    if scale is None:
        return
    if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
        raise TypeError(f"{name}: scale must be None or a floating torch.Tensor; got {_describe(scale)}")
    want = tuple(P.shape[:-2])
    if tuple(scale.shape) != want:
        raise ValueError(f"{name}: scale must have shape {want} (one factor per matrix of P); "
                         f"got {tuple(scale.shape)} for P of shape {tuple(P.shape)}")
    if scale.device != P.device:
        raise ValueError(f"{name}: scale must be on P's device ({P.device}); got {scale.device}")


def symmetric_product(P: torch.Tensor, alpha: float = 1.0, Y: torch.Tensor | None = None,
                      beta: float = 0.0, gamma: float = 0.0, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``scale_b * (alpha * P @ P^T + beta * Y + gamma * I)`` on any device, in fp64, rounded once.

    Args:
        P: (B, k, K) or (k, K) floating tensor (fp16, bf16, fp32 or fp64), any strides.
        alpha, beta, gamma: finite Python numbers.
        Y: None or a (B, k, k) (or (k, k)) tensor of P's dtype and device; its entries below the
            diagonal are not used (the result mirrors its upper triangle, as the kernel's).
        scale: None or a (B,) (or ()) floating tensor on P's device: one factor per matrix.
    Returns:
        Contiguous (B, k, k) (or (k, k)) tensor of P's dtype.
    """
    check_args(P, alpha, Y, beta, gamma, scale, dtypes=(*FLOAT_DTYPES, torch.float64))
    wide = P.double()
    out = alpha * (wide @ wide.mT)
    if Y is not None:
        out = out + beta * Y.double()
    out.diagonal(dim1=-2, dim2=-1).add_(gamma)
    if scale is not None:
        out = out * scale.double()[..., None, None]
    out = out.to(P.dtype)
    # the upper triangle mirrored, as the kernel stores it: exactly symmetric, Y's lower one unused
    return (out.triu() + out.triu(1).mT).contiguous()
