"""MAD models: ``ParallaxQwen3Model`` with two blocks [RMSNorm, mixer, RMSNorm, SwiGLU] at width 128.

Mixers (:data:`MIXERS`): ``attention`` (TorchTitan's softmax SDPA), ``parallax`` (Parallax attention
through ``kernels.parallax_attention``), ``parallax_norope`` (Parallax without RoPE on rho), the
Parallax family ``exact_lla``, ``value_averaging``, ``affine_la``, ``affine_mesanet``
(``kernels.family``, PyTorch forms on any device) and the flash-linear-attention baselines
``gated_deltanet``, ``kda``, ``mamba2``, ``mesa_net`` (CUDA only). The model is the language model's
own code (``parallax_titan.spec.variant_args``), only smaller.
Compression wraps the same trunk in MAD's auto-encoder: the last position's hidden state plus
sin-cos position embeddings feeds a two-layer GELU decoder and the model's own norm and head.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from parallax_titan.mixers import FLA_MIXERS
from parallax_titan.model import ParallaxAttention, ParallaxModelArgs, ParallaxQwen3Model
from parallax_titan.spec import variant_args

# MAD mixer name -> (variant, argument overrides)
MIXERS = {"attention": ("transformer", {}), "parallax": ("parallax", {}),
          "parallax_norope": ("parallax", {"rho_rope": False}),
          # the Parallax family (docs/models.md). Exact LLA's cost bound is for language-model
          # configs; MAD's grid is fixed, and its longest settings (batch 128 x 1024 tokens) lie just
          # above that bound
          "exact_lla": ("exact_lla", {"lla_max_cost": None}), "value_averaging": ("value_averaging", {}),
          "affine_la": ("affine_la", {}), "affine_mesanet": ("affine_mesanet", {}),
          # flash-linear-attention baselines (optional install, CUDA only: docs/mixers.md)
          "gated_deltanet": ("gated_deltanet", {}), "kda": ("kda", {}),
          "mamba2": ("mamba2", {}), "mesa_net": ("mesa_net", {})}


# The fused Triton Parallax kernel tiles head_dim with tl.dot, which needs at least 16 columns;
# fla's kernels need the same.
MIN_FUSED_HEAD_DIM = 16


class PaddedHeadParallax(ParallaxAttention):
    """Parallax attention whose heads (D < 16) are zero-padded to 16 for the fused CUDA kernel.

    Exact: the zero columns add nothing to q.k or rho.k (the logit scale stays 1/sqrt(D)) and give
    zero output columns, which are cut off; their gradients are dropped by the padding's backward.
    When the reference backend runs (on CPU with ``backend = "auto"``, or ``"reference"``), it
    computes as ParallaxAttention does.
    """

    def forward(self, x, rope_cache, attention_masks=None, positions=None):
        fused = self.backend == "triton" or (self.backend == "auto" and x.is_cuda)
        if not fused or self.head_dim >= MIN_FUSED_HEAD_DIM:
            return super().forward(x, rope_cache, attention_masks, positions)
        bs, seqlen, _ = x.shape
        pad = MIN_FUSED_HEAD_DIM - self.head_dim
        q, r, k, v = (F.pad(t, (0, pad)) for t in self.project(x, rope_cache, positions))
        out = kernels.parallax_attention(q, r, k, v, scale=self.scaling, backend=self.backend, window=self.window)
        return self.wo(out[..., : self.head_dim].reshape(bs, seqlen, -1))


def pad_narrow_heads(model: nn.Module) -> None:
    """Let every Parallax layer of ``model`` with heads narrower than 16 use the fused kernel
    (PaddedHeadParallax holds no state of its own, so the module keeps its weights)."""
    for module in model.modules():
        if type(module) is ParallaxAttention and module.head_dim < MIN_FUSED_HEAD_DIM:
            module.__class__ = PaddedHeadParallax


def mad_model_args(mixer: str, vocab_size: int, seq_len: int, dim: int = 128, n_heads: int = 16,
                   hidden_dim: int = 352, backend: str = "auto") -> ParallaxModelArgs:
    """Arguments of the two-block MAD model (untied head, no GQA, head_dim = dim / n_heads).

    Attention, Parallax and the family mixers use ``n_heads`` heads (mad-lab: 16 heads of 8 at width
    128); the fla mixers get heads of at least 16 (their kernels need them).
    """
    if mixer not in MIXERS:
        raise ValueError(f"mixer={mixer!r}; expected one of {sorted(MIXERS)}")
    if n_heads < 1 or dim % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide dim={dim}")
    variant, extra = MIXERS[mixer]
    if variant in FLA_MIXERS:
        n_heads = min(n_heads, max(1, dim // MIN_FUSED_HEAD_DIM))
    base = ParallaxModelArgs(vocab_size=vocab_size, dim=dim, n_layers=2, n_heads=n_heads, n_kv_heads=n_heads,
                             head_dim=dim // n_heads, hidden_dim=hidden_dim, max_seq_len=seq_len,
                             enable_weight_tying=False, attn_backend=backend)
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


def compile_blocks(model: nn.Module, backend: str = "inductor") -> None:
    """``torch.compile`` (fullgraph) each block of a MAD model in place, as the trainer compiles:
    whole blocks, or every child of a block but an fla mixer, whose Triton autograd functions cannot
    be traced (``parallax_titan.parallelize.compile_around_mixer``). Dynamo's caches are reset
    first: a worker process trains many models whose blocks share one code object, and with
    fullgraph the recompile limit would end a later run."""
    from parallax_titan.parallelize import compile_around_mixer

    torch._dynamo.reset()

    lm = model.lm if isinstance(model, CompressionModel) else model
    if lm.model_args.mixer in FLA_MIXERS:
        compile_around_mixer(lm, backend)
        return
    for name, block in list(lm.layers.items()):
        lm.layers[name] = torch.compile(block, backend=backend, fullgraph=True)


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
    pad_narrow_heads(model)
    return model
