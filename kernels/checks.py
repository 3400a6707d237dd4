"""Argument checks shared by the kernels' public functions."""

from __future__ import annotations

import math
import numbers

import torch


def is_finite_number(x) -> bool:
    """True for a finite real Python number (a bool is not one) that a float holds: an int beyond
    the float range (10**400) is not one, since the callers go on to ``float(x)``.

    Under torch.compile a module's float attribute can arrive as a symbolic float (dynamo makes it
    dynamic after recompiling a block's code with other values), which ``math.isfinite`` cannot
    trace: the eager call checks the value, a traced call passes it on.
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return False
    if torch.compiler.is_compiling():
        return True
    try:
        return math.isfinite(x)
    except OverflowError:  # math.isfinite converts to float first
        return False


def check_scale(who: str, scale, head_dim: int) -> float:
    """The logit scale as a float: None gives 1/sqrt(head_dim); else a finite real Python number (not a
    bool, str or tensor), any sign (0 gives uniform weights over the keys read); ValueError naming ``who``."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not is_finite_number(scale):
        raise ValueError(f"{who}: scale={scale!r} must be a finite number (the logits' scale; None for "
                         "1/sqrt(head_dim))")
    return float(scale)


def grad_required(tensors: dict) -> list[str]:
    """The names of ``tensors`` (name -> tensor or None) that require grad while autograd records
    ([] under ``torch.no_grad`` or inference mode). Host-only: flags, never tensor values."""
    if not torch.is_grad_enabled():
        return []
    return [name for name, x in tensors.items() if x is not None and x.requires_grad]


def refuse_grad(who: str, tensors: dict, instead: str) -> None:
    """Raise a ValueError naming the tensors of ``tensors`` that ``grad_required`` finds, for a path
    with no backward: its output would carry no ``grad_fn`` and the gradients would silently stop
    there. ``instead``: what gives gradients."""
    names = grad_required(tensors)
    if names:
        raise ValueError(f"{who}: {', '.join(names)} require{'s' if len(names) == 1 else ''} grad, but this path "
                         f"has no backward (its output would carry no gradient); {instead}, or call it under "
                         "torch.no_grad()")
