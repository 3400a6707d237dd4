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
