"""torch.library custom ops around the Affine Linear Attention Triton kernels.

Opaque ``custom_op``s with ``register_fake`` and ``register_autograd`` (as kernels/parallax/ops.py,
for the reason FACTS.md records: compiled blocks call them as black boxes and the backward op
makes the upstream gradient contiguous itself).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.family import affine_la_fused


@torch.library.custom_op("parallax_titan::affine_la_fwd", mutates_args=())
def affine_la_fwd(r: Tensor, k: Tensor, v: Tensor, intercept: bool) -> tuple[Tensor, Tensor]:
    """Returns o (B, L, Hq, D) in r's dtype and tbar (B, Hq, L) fp32."""
    return affine_la_fused.forward(r, k, v, intercept)


@affine_la_fwd.register_fake
def _affine_la_fwd_fake(r, k, v, intercept):
    affine_la_fused.check_head_dim(r.shape[-1])
    b, n, h, _ = r.shape
    return (torch.empty(r.shape, dtype=r.dtype, device=r.device),
            torch.empty(b, h, n, dtype=torch.float32, device=r.device))


@torch.library.custom_op("parallax_titan::affine_la_bwd", mutates_args=())
def affine_la_bwd(do: Tensor, r: Tensor, k: Tensor, v: Tensor, tbar: Tensor,
                  intercept: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Returns dr (B, L, Hq, D) and dk, dv (B, L, Hkv, D)."""
    return affine_la_fused.backward(do, r, k, v, tbar, intercept)


@affine_la_bwd.register_fake
def _affine_la_bwd_fake(do, r, k, v, tbar, intercept):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (r, k, v))


def _setup_context(ctx, inputs, output):
    r, k, v, intercept = inputs
    _, tbar = output
    ctx.mark_non_differentiable(tbar)
    ctx.save_for_backward(r, k, v, tbar)
    ctx.intercept = intercept


def _backward(ctx, do, _dtbar):
    r, k, v, tbar = ctx.saved_tensors
    dr, dk, dv = affine_la_bwd(do, r, k, v, tbar, ctx.intercept)
    return dr, dk, dv, None


affine_la_fwd.register_autograd(_backward, setup_context=_setup_context)


def affine_linear_attention_triton(r, k, v, *, intercept=True):
    """Fused causal Affine Linear Attention (validated inputs, see kernels.affine_linear_attention).

    r: (B, L, Hq, D); k, v: (B, L, Hkv, D); fp16/bf16/fp32 CUDA tensors (or TRITON_INTERPRET=1),
    D in affine_la_fused.HEAD_DIMS. Returns (B, L, Hq, D) in r's dtype.
    """
    return affine_la_fwd(r, k, v, intercept)[0]
