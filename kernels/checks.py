"""Argument checks shared by the kernels' public functions."""

from __future__ import annotations

import math
import numbers

import torch


def is_finite_number(x) -> bool:
    """True for a finite real Python number (a bool is not one).

    Under torch.compile a module's float attribute can arrive as a symbolic float (dynamo makes it
    dynamic after recompiling a block's code with other values), which ``math.isfinite`` cannot
    trace: the eager call checks the value, a traced call passes it on.
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return False
    return torch.compiler.is_compiling() or math.isfinite(x)
