"""``parallax_titan::split_norm_rope`` (and its backward) as opaque ``torch.library.custom_op``s,
so compiled TorchTitan blocks call the Triton kernels as black boxes (as the attention's ops)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.projection import fused


@torch.library.custom_op("parallax_titan::split_norm_rope", mutates_args=())
def split_norm_rope_op(y: Tensor, hq: int, hkv: int, w_q: Tensor, w_k: Tensor, w_rho: Tensor, eps: float,
                       angles: Tensor, rope_rho: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns q, k, v, rho (B, L, H, D), contiguous, in y's dtype; angles: ``api.rope_angles``' (L, D)."""
    return fused.forward(y, hq, hkv, (w_q, w_k, w_rho), eps, angles, rope_rho)


@split_norm_rope_op.register_fake
def _forward_fake(y, hq, hkv, w_q, w_k, w_rho, eps, angles, rope_rho):
    b, n, _ = y.shape
    d = angles.shape[-1]
    return tuple(y.new_empty((b, n, heads, d)) for heads in (hq, hkv, hkv, hq))


@torch.library.custom_op("parallax_titan::split_norm_rope_bwd", mutates_args=())
def split_norm_rope_bwd(dq: Tensor, dk: Tensor, dv: Tensor, dr: Tensor, y: Tensor, hq: int, hkv: int, w_q: Tensor,
                        w_k: Tensor, w_rho: Tensor, eps: float, angles: Tensor,
                        rope_rho: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns dy (B, L, W) and the three norm weights' gradients."""
    return fused.backward((dq, dk, dv, dr), y, hq, hkv, (w_q, w_k, w_rho), eps, angles, rope_rho)


@split_norm_rope_bwd.register_fake
def _backward_fake(dq, dk, dv, dr, y, hq, hkv, w_q, w_k, w_rho, eps, angles, rope_rho):
    return y.new_empty(y.shape), torch.empty_like(w_q), torch.empty_like(w_k), torch.empty_like(w_rho)


def _setup_context(ctx, inputs, output):
    y, hq, hkv, w_q, w_k, w_rho, eps, angles, rope_rho = inputs
    ctx.save_for_backward(y, w_q, w_k, w_rho, angles)
    ctx.args = hq, hkv, eps, rope_rho


def _backward(ctx, dq, dk, dv, dr):
    y, w_q, w_k, w_rho, angles = ctx.saved_tensors
    hq, hkv, eps, rope_rho = ctx.args
    # autograd materialises the gradient of an unused output as zeros
    dy, dw_q, dw_k, dw_rho = split_norm_rope_bwd(dq, dk, dv, dr, y, hq, hkv, w_q, w_k, w_rho, eps, angles, rope_rho)
    return dy, None, None, dw_q, dw_k, dw_rho, None, None, None


split_norm_rope_op.register_autograd(_backward, setup_context=_setup_context)
