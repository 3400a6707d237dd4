"""Input checks and head-layout helpers shared by the family mixers.

Layout everywhere is (batch, seq, heads, head_dim). GQA: query head h reads kv head
h // (Hq // Hkv). Internally the PyTorch forms work on grouped tensors
(B, Hkv, G, L, D) so that one kv head's statistics serve its G query heads by broadcasting.
"""

from __future__ import annotations

import torch

from kernels.checks import is_finite_number

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _shapes(named: dict) -> str:
    # built only for an error message: under torch.compile with dynamic shapes, str.join over a
    # generator of symbolic sizes cannot be traced, and a valid call needs no message
    return ", ".join(f"{n}={tuple(x.shape)}" for n, x in named.items())


def check_tensors(fn: str, query_like: dict, kv_like: dict) -> None:
    """Validate 4-D (B, L, H, D) tensors: same dtype/device, no empty dimension, shapes, GQA divisibility.

    query_like: name -> (B, L, Hq, D) tensor (all the same shape; may be empty);
    kv_like: name -> (B, L, Hkv, D) tensor (all the same shape, at least one).
    Raises TypeError / ValueError naming the argument, its value and what was expected.
    """
    named = {**query_like, **kv_like}
    first = next(iter(kv_like.values()))
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{fn}: {name} must be 4-D (batch, seq, heads, head_dim), has shape {tuple(x.shape)}")
        if 0 in x.shape:
            raise ValueError(f"{fn}: {name} has an empty dimension, shape {tuple(x.shape)}; batch, seq, heads and "
                             "head_dim must be >= 1")
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{fn}: {name}.dtype={x.dtype}, expected one of {FLOAT_DTYPES}")
        if x.dtype != first.dtype or x.device != first.device:
            raise ValueError(f"{fn}: {name} is {x.dtype} on {x.device} but the others are {first.dtype} on "
                             f"{first.device}; all inputs must match")
    for group in (query_like, kv_like):
        ref = next(iter(group.values()), None)
        for name, x in group.items():
            if x.shape != ref.shape:
                raise ValueError(f"{fn}: {name} must have the shape of {next(iter(group))} ({_shapes(named)})")
    if query_like:
        q = next(iter(query_like.values()))
        if q.shape[:2] != first.shape[:2] or q.shape[3] != first.shape[3]:
            raise ValueError(f"{fn}: batch, seq and head_dim must agree ({_shapes(named)})")
        if first.shape[2] == 0 or q.shape[2] % first.shape[2] != 0:
            raise ValueError(f"{fn}: query heads ({q.shape[2]}) must be a multiple of kv heads "
                             f"({first.shape[2]}) ({_shapes(named)})")


def check_positive(fn: str, name: str, value) -> float:
    """A finite positive Python number, returned as float."""
    if not is_finite_number(value) or value <= 0:
        raise ValueError(f"{fn}: {name}={value!r} must be a finite positive number")
    return float(value)


def check_positive_int(fn: str, name: str, value) -> int:
    """An int >= 1 (not a bool, not a float such as 2.5, which would be truncated), returned as int."""
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 1:
        raise ValueError(f"{fn}: {name}={value!r} must be an int >= 1")
    return value


def check_flag(fn: str, name: str, value) -> None:
    """A bool (None or 0 would silently select the False branch)."""
    if not isinstance(value, bool):
        raise ValueError(f"{fn}: {name}={value!r} must be a bool")


def check_q_heads(fn: str, q_heads, kv_heads: int) -> int:
    """The number of query heads: an int >= 1, a multiple of ``kv_heads``."""
    if isinstance(q_heads, bool) or not isinstance(q_heads, int) or q_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"{fn}: q_heads={q_heads!r} must be a positive multiple of the kv heads ({kv_heads})")
    return q_heads


def check_lam(fn: str, lam, q_heads: int, device: torch.device):
    """Ridge lambda: a finite positive number, or a tensor of shape (Hq,) (positive by construction,
    e.g. softplus(param) + floor; its values are not read here, to avoid a host sync)."""
    if isinstance(lam, torch.Tensor):
        if lam.shape != (q_heads,) or not lam.is_floating_point() or lam.device != device:
            raise ValueError(f"{fn}: lam tensor must be floating point of shape ({q_heads},) on {device}, got "
                             f"{lam.dtype} of shape {tuple(lam.shape)} on {lam.device}")
        return lam
    return check_positive(fn, "lam", lam)


def check_choice(fn: str, name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{fn}: {name}={value!r}, expected one of {choices}")


def grouped_lam(lam, hkv: int, dtype: torch.dtype):
    """lam as a float, or a (Hq,) tensor reshaped to (Hkv, G, 1, 1) to broadcast over (B, Hkv, G, L, D)."""
    if isinstance(lam, torch.Tensor):
        return lam.to(dtype).reshape(hkv, -1, 1, 1)
    return lam


def positions(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(n, 1) tensor 1, 2, ..., n: the count i of tokens a causal uniform average at position i covers."""
    return torch.arange(1, n + 1, dtype=dtype, device=device)[:, None]


def solve_spd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x = a^-1 b for symmetric positive definite a (..., D, D) and b (..., D), by Cholesky.

    No call here synchronises with the device. ``cholesky_ex`` rather than ``linalg.cholesky``, which
    reads its error flag on the host; two triangular solves rather than ``torch.cholesky_solve``,
    whose batched CUDA path (MAGMA) synchronised once per call and ran one triangular-solve kernel
    per right-hand side (on an H200 a third of an Affine MesaNet MAD step). Every system here is a
    covariance plus a ridge lambda >= its floor, so positive definite; a non-finite input gives a
    non-finite x, which the trainer's non-finite check catches, instead of an exception.
    Returns (..., D) in a's dtype; differentiable.
    """
    factor = torch.linalg.cholesky_ex(a).L
    y = torch.linalg.solve_triangular(factor, b[..., None], upper=False)
    return torch.linalg.solve_triangular(factor.mT, y, upper=True)[..., 0]
