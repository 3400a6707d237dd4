"""torch.library custom ops around the fused Triton kernels.

Registered as opaque ``custom_op``s (not ``triton_op``) with ``register_fake`` and
``register_autograd``: compiled TorchTitan blocks then call them as black boxes. FACTS.md:
a triton_op gave silently wrong gradients under torch.compile when the upstream gradient
was expanded (stride 0); the backward op here makes dO contiguous itself.
Fake and real outputs are both freshly allocated contiguous tensors (same strides).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from kernels.parallax import fused


@torch.library.custom_op("parallax_titan::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, r: Tensor, k: Tensor, v: Tensor, scale: float, cu_seqlens: Optional[Tensor],
                  window: Optional[int], hopper_kernels: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns o, vbar (B, L, Hq, D) in q's dtype and tbar, lse (Hq, B * L) fp32. ``hopper_kernels``:
    the forward and the backward (``attention_bwd``) may run ``kernels/parallax/hopper.py``'s kernels."""
    return fused.forward(q, r, k, v, scale, cu_seqlens, window, hopper=hopper_kernels)


@attention_fwd.register_fake
def _attention_fwd_fake(q, r, k, v, scale, cu_seqlens, window, hopper_kernels):
    fused.check_head_dim(q.shape[-1])
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    stats = fused.stats_buffer(q)
    return o, torch.empty_like(o), stats, torch.empty_like(stats)


@torch.library.custom_op("parallax_titan::attention_bwd", mutates_args=())
def attention_bwd(do: Tensor, q: Tensor, r: Tensor, k: Tensor, v: Tensor, o: Tensor, vbar: Tensor,
                  tbar: Tensor, lse: Tensor, scale: float, cu_seqlens: Optional[Tensor],
                  window: Optional[int], hopper: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns dq, dr (B, L, Hq, D) and dk, dv (B, L, Hkv, D); ``hopper``: as ``fused.backward``'s."""
    return fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu_seqlens, window, hopper=hopper)


@attention_bwd.register_fake
def _attention_bwd_fake(do, q, r, k, v, o, vbar, tbar, lse, scale, cu_seqlens, window, hopper):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, r, k, v))


def _setup_context(ctx, inputs, output):
    q, r, k, v, scale, cu_seqlens, window, hopper_kernels = inputs
    o, vbar, tbar, lse = output
    ctx.mark_non_differentiable(vbar, tbar, lse)
    ctx.save_for_backward(q, r, k, v, o, vbar, tbar, lse, cu_seqlens)
    ctx.scale, ctx.window, ctx.hopper_kernels = scale, window, hopper_kernels


def _backward(ctx, do, _dvbar, _dtbar, _dlse):
    q, r, k, v, o, vbar, tbar, lse, cu_seqlens = ctx.saved_tensors
    dq, dr, dk, dv = attention_bwd(do, q, r, k, v, o, vbar, tbar, lse, ctx.scale, cu_seqlens, ctx.window,
                                   ctx.hopper_kernels)
    return dq, dr, dk, dv, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def parallax_attention_triton(q, r, k, v, *, scale, cu_seqlens=None, window=None, hopper_kernels=True):
    """Fused causal Parallax attention (validated inputs, see kernels.parallax_attention).

    q, r: (B, L, Hq, D); k, v: (B, L, Hkv, D); fp16/bf16/fp32 CUDA tensors; window None or int >= 1;
    hopper_kernels: the forward and backward may take ``kernels/parallax/hopper.py``'s kernels.
    Returns (B, L, Hq, D).
    """
    return attention_fwd(q, r, k, v, scale, cu_seqlens, window, hopper_kernels)[0]
