"""MAD models: ``ParallaxQwen3Model`` with two blocks [RMSNorm, mixer, RMSNorm, SwiGLU] at width 128.

Mixers: ``attention`` (TorchTitan's softmax SDPA), ``parallax`` (Parallax attention through
``kernels.parallax_attention``), ``parallax_norope`` (Parallax without RoPE on rho). The model
is the language model's own code (``parallax_titan.spec.variant_args``), only smaller.
Compression wraps the same trunk in MAD's auto-encoder: the last position's hidden state plus
sin-cos position embeddings feeds a two-layer GELU decoder and the model's own norm and head.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from parallax_titan.model import ParallaxModelArgs, ParallaxQwen3Model
from parallax_titan.spec import variant_args

MIXERS = {"attention": ("transformer", {}), "parallax": ("parallax", {}),
          "parallax_norope": ("parallax", {"rho_rope": False}),
          # flash-linear-attention baselines (optional install, CUDA only: docs/mixers.md)
          "gated_deltanet": ("gated_deltanet", {}), "kda": ("kda", {}),
          "mamba2": ("mamba2", {}), "mesa_net": ("mesa_net", {})}


def mad_model_args(mixer: str, vocab_size: int, seq_len: int, dim: int = 128, n_heads: int = 8,
                   hidden_dim: int = 352, backend: str = "auto") -> ParallaxModelArgs:
    """Arguments of the two-block MAD model (untied head, no GQA, head_dim = dim / n_heads)."""
    if mixer not in MIXERS:
        raise ValueError(f"mixer={mixer!r}; expected one of {sorted(MIXERS)}")
    if dim % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide dim={dim}")
    base = ParallaxModelArgs(vocab_size=vocab_size, dim=dim, n_layers=2, n_heads=n_heads, n_kv_heads=n_heads,
                             head_dim=dim // n_heads, hidden_dim=hidden_dim, max_seq_len=seq_len,
                             enable_weight_tying=False, attn_backend=backend)
    variant, extra = MIXERS[mixer]
    return dataclasses.replace(variant_args(variant, base), **extra)


def sincos_positions(length: int, dim: int) -> torch.Tensor:
    """(length, dim) fp32 fixed sin-cos position embeddings (first half sin, second half cos)."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(dim // 2, dtype=torch.float64) / (dim // 2))
    return torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=1).float()


class CompressionModel(nn.Module):
    """Encoder (the MAD trunk) -> last position -> MLP decoder over positions -> logits.

    forward(tokens (B, L) int64) -> logits (B, L, vocab) fp32.
    """

    def __init__(self, args: ParallaxModelArgs):
        super().__init__()
        self.lm = ParallaxQwen3Model(args)
        dim = args.dim
        self.decoder = nn.Sequential(nn.RMSNorm(dim), nn.Linear(dim, dim), nn.GELU(),
                                     nn.RMSNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.register_buffer("positions", sincos_positions(args.max_seq_len, dim), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.lm.tok_embeddings(tokens)
        for layer in self.lm.layers.values():
            h = layer(h, self.lm.rope_cache, None, None)
        x = h[:, -1:, :] + self.positions[: tokens.shape[1]]
        return self.lm.output(self.lm.norm(self.decoder(x)))


def build_model(task: str, mixer: str, vocab_size: int, seq_len: int, device="cpu", seed: int = 0,
                **model_kw) -> nn.Module:
    """An initialised MAD model on ``device``; ``model_kw``: dim, n_heads, hidden_dim, backend."""
    args = mad_model_args(mixer, vocab_size, seq_len, **model_kw)
    torch.manual_seed(seed)
    with torch.device(device):
        model = CompressionModel(args) if task == "compression" else ParallaxQwen3Model(args)
    lm = model.lm if task == "compression" else model
    with torch.no_grad():
        lm.init_weights(buffer_device=torch.device(device))
    return model
