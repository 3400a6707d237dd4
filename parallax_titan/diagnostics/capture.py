"""Read q, rho, k, v of every attention layer during an ordinary forward, without changing it.

A forward pre-hook on each ``layers.<i>.attention`` module receives the block's inputs (normed
hidden states x, rope_cache, masks, positions), recomputes the projections under no_grad and
hands them to a callback; it returns nothing, so the forward itself is unchanged. Hooks exist
only inside :func:`attention_hooks`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torchtitan.models.qwen3.model.model import apply_rotary_emb

from parallax_titan.diagnostics.weights import attention_modules
from parallax_titan.model import ParallaxAttention


def project_qrkv(attention: torch.nn.Module, x: torch.Tensor, rope_cache: torch.Tensor,
                 positions: torch.Tensor | None):
    """q, r (B, L, Hq, D) and k, v (B, L, Hkv, D) exactly as the module's forward forms them
    (norms, gate, RoPE); r is None for TorchTitan's softmax attention."""
    if isinstance(attention, ParallaxAttention):
        return attention.project(x, rope_cache, positions)
    shape = (x.shape[0], x.shape[1], -1, attention.head_dim)
    q = attention.wq(x).view(shape)
    k = attention.wk(x).view(shape)
    v = attention.wv(x).view(shape)
    if attention.q_norm is not None:
        q = attention.q_norm(q)
    if attention.k_norm is not None:
        k = attention.k_norm(k)
    q, k = apply_rotary_emb(q, k, rope_cache, positions)
    return q, None, k, v


def gate_openings(attention: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """sigmoid(w_g . x) of a gated Parallax layer, (B, L, 1 or Hq); None without a gate."""
    gate = getattr(attention, "gate", None)
    if not isinstance(gate, torch.nn.Module):
        return None
    return torch.sigmoid(gate(x))


Callback = Callable[[int, torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor | None], None]


def _arguments(args: tuple, kwargs: dict):
    """(x, rope_cache, positions) from the attention module's call (x, rope_cache, masks, positions)."""
    names = ("x", "rope_cache", "attention_masks", "positions")
    bound = dict(zip(names, args)) | kwargs
    return bound["x"], bound["rope_cache"], bound.get("positions")


@contextmanager
def attention_hooks(model: torch.nn.Module, callback: Callback):
    """Within the block, every attention module's forward first calls
    ``callback(layer, module, x, rope_cache, positions)`` under no_grad."""

    def make_hook(layer: int):
        def hook(module, args, kwargs):
            x, rope_cache, positions = _arguments(args, kwargs)
            with torch.no_grad():
                callback(layer, module, x.detach(), rope_cache, positions)

        return hook

    handles = [module.register_forward_pre_hook(make_hook(index), with_kwargs=True)
               for index, _, module in attention_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
