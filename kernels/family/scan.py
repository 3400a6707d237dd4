"""Causal prefix sums for the family's PyTorch forms, as an opaque custom op.

``torch.cumsum`` inside a compiled block lowers to an Inductor scan. On CUDA (torch 2.11) Inductor
splits short scans over few rows across programs, and its split-scan code generation fails on the
Affine MesaNet block (``InductorError: TypeError: list indices must be integers or slices, not
NoneType`` in ``get_block_shape``). As an opaque op the scan runs as ATen's ``cumsum`` kernel in
eager and compiled code alike, with the same summation order in both.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("parallax_titan::prefix_sum", mutates_args=())
def prefix_sum(x: Tensor, dim: int) -> Tensor:
    """Inclusive prefix sum of x along dim: out[..., i, ...] = sum_{j <= i} x[..., j, ...].

    x: any shape and floating dtype; returns a contiguous tensor of x's shape and dtype.
    Differentiable (the gradient is the reversed prefix sum of the upstream gradient).
    """
    return torch.cumsum(x.contiguous(), dim)


@prefix_sum.register_fake
def _prefix_sum_fake(x, dim):
    return x.new_empty(x.shape)


def _prefix_sum_setup(ctx, inputs, output):
    ctx.dim = inputs[1]


def _prefix_sum_backward(ctx, grad):
    return prefix_sum(grad.flip(ctx.dim), ctx.dim).flip(ctx.dim), None


prefix_sum.register_autograd(_prefix_sum_backward, setup_context=_prefix_sum_setup)
