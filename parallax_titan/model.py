"""Qwen3 with Parallax attention: the whole model in one file.

TorchTitan's Qwen3 supplies the block (RMSNorm pre-norm, SwiGLU MLP, q/k RMSNorm before RoPE,
GQA, tied embeddings at 0.6B). Parallax adds, per layer (SPEC.md section 2):

* ``wr``: the probe projection W_R, d_model -> Hq * D (one probe head per query head);
* ``r_norm``: per-head RMSNorm on rho with its own weight, applied before RoPE;
* RoPE on rho (``rho_rope``), with the same cos/sin as q;
* an optional sigmoid gate (``gate = "token" | "head"``) that scales rho after the norm;
* ``wr_init = "zeros"`` makes every layer exactly softmax attention (the up-training path).

With ``mixer = "softmax"`` the block is TorchTitan's own attention (SDPA), unchanged; the
flash-linear-attention baselines (``gated_deltanet``, ``kda``, ``mamba2``, ``mesa_net``) take the
attention slot through ``parallax_titan.mixers`` (docs/mixers.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
from torchtitan.models.qwen3.model.model import (
    Attention,
    Qwen3Model,
    TransformerBlock,
    reshape_for_broadcast,
    rotate_half,
)
from torchtitan.models.utils import get_moe_model_nparams_and_flops, trunc_normal_

import kernels
from parallax_titan.mixers import FLA_MIXERS, build_mixer

Mixer = Literal["softmax", "parallax", "gated_deltanet", "kda", "mamba2", "mesa_net"]
Gate = Literal["none", "token", "head"]
WrInit = Literal["normal", "zeros"]
Backend = Literal["auto", "reference", "triton"]

SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size")

# The end-of-document token of the Qwen3 tokenizer used for pretraining (<|endoftext|>).
QWEN3_ENDOFTEXT_ID = 151643


@dataclass
class ParallaxModelArgs(Qwen3ModelArgs):
    """Qwen3 arguments plus the Parallax switches (TOML section ``[parallax]`` overrides them)."""

    mixer: Mixer = "parallax"
    rho_rope: bool = True
    gate: Gate = "none"
    wr_init: WrInit = "normal"
    attn_backend: Backend = "auto"
    eos_id: int = QWEN3_ENDOFTEXT_ID

    def shape_overrides(self, model_section) -> dict[str, int]:
        """The ``[model]`` shape keys set (non-zero) in ``model_section``."""
        return {k: getattr(model_section, k) for k in SHAPE_KEYS if getattr(model_section, k, 0)}

    def update_from_config(self, job_config, **kwargs) -> None:
        super().update_from_config(job_config, **kwargs)
        for key, value in self.shape_overrides(job_config.model).items():
            setattr(self, key, value)
        section = getattr(job_config, "parallax", None)
        if section is None:
            return
        if self.mixer == "parallax":
            self.rho_rope = section.rho_rope
            self.gate = section.gate
            self.wr_init = section.wr_init
        self.attn_backend = section.attn_backend
        self.attn_mask_type = section.attn_mask_type
        # TorchTitan only builds document masks for "flex"/"varlen"; Parallax and fla read cu_seqlens.
        if self.mixer != "softmax" and self.attn_mask_type == "block_causal":
            self.attn_type = "varlen"

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        # Parallax runs four attention matmuls per head (q.k, rho.k, p.v, (p*t).v), softmax two;
        # the fla mixers' chunked recurrences are not counted (their MFU covers the weights only).
        matmuls = {"parallax": 4, "softmax": 2}.get(self.mixer, 0)
        return get_moe_model_nparams_and_flops(self, model, matmuls * self.head_dim, seq_len)


def apply_rope(x: torch.Tensor, rope_cache: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """Rotate ``x`` (batch, seq, heads, head_dim) with TorchTitan's Qwen3 RoPE cache."""
    cache = reshape_for_broadcast(rope_cache, x, positions)
    head_dim = x.shape[-1]
    cos = cache[..., :head_dim].to(dtype=x.dtype, device=x.device)
    sin = cache[..., head_dim:].to(dtype=x.dtype, device=x.device)
    return (x * cos + rotate_half(x) * sin).type_as(x)


@dataclass
class DocumentBoundaries:
    """Packed-document layout for block-causal Parallax attention.

    ``cu_seqlens`` (int32, (num_docs + 1,)) holds document starts in the flattened (batch * seq)
    token axis; every batch row boundary is also a document boundary.
    """

    cu_seqlens: torch.Tensor


def document_boundaries(tokens: torch.Tensor, eos_id: int) -> DocumentBoundaries:
    """Documents end after each ``eos_id`` token and at the end of every row.

    tokens: (batch, seq) int64. Returns cumulative starts over the flattened batch.
    """
    batch, seq = tokens.shape
    ends = tokens == eos_id
    ends[:, -1] = True
    end_positions = torch.nonzero(ends.flatten(), as_tuple=False).flatten() + 1
    zero = torch.zeros(1, dtype=end_positions.dtype, device=tokens.device)
    return DocumentBoundaries(torch.cat([zero, end_positions]).to(torch.int32))


class ParallaxAttention(Attention):
    """TorchTitan's Qwen3 attention with a learned probe rho per query head."""

    def __init__(self, model_args: ParallaxModelArgs):
        super().__init__(model_args)
        self.rho_rope = model_args.rho_rope
        self.gate_kind = model_args.gate
        self.wr_init = model_args.wr_init
        self.backend = model_args.attn_backend
        self.wr = nn.Linear(model_args.dim, model_args.n_heads * self.head_dim, bias=False)
        self.r_norm = nn.RMSNorm(self.head_dim, eps=model_args.norm_eps, elementwise_affine=True)
        gate_out = {"none": 0, "token": 1, "head": model_args.n_heads}[model_args.gate]
        self.gate = nn.Linear(model_args.dim, gate_out, bias=False) if gate_out else None

    def init_weights(self, init_std: float):
        super().init_weights(init_std)
        if self.wr_init == "zeros":
            nn.init.zeros_(self.wr.weight)
        else:
            trunc_normal_(self.wr.weight, mean=0.0, std=0.02)
        self.r_norm.reset_parameters()
        if self.gate is not None:
            trunc_normal_(self.gate.weight, mean=0.0, std=0.02)

    def project(self, x: torch.Tensor, rope_cache: torch.Tensor, positions: torch.Tensor | None):
        """x (batch, seq, dim) -> q, r (batch, seq, Hq, D) and k, v (batch, seq, Hkv, D), after RoPE."""
        bs, seqlen, _ = x.shape
        shape = (bs, seqlen, -1, self.head_dim)
        q = self.q_norm(self.wq(x).view(shape))
        k = self.k_norm(self.wk(x).view(shape))
        v = self.wv(x).view(shape)
        r = self.r_norm(self.wr(x).view(shape))
        if self.gate is not None:
            # The gate must act after the norm: before it, the norm would undo the scaling.
            r = r * torch.sigmoid(self.gate(x)).unsqueeze(-1)
        q, k = apply_rope(q, rope_cache, positions), apply_rope(k, rope_cache, positions)
        if self.rho_rope:
            r = apply_rope(r, rope_cache, positions)
        return q, r, k, v

    def forward(self, x, rope_cache, attention_masks=None, positions=None):
        bs, seqlen, _ = x.shape
        q, r, k, v = self.project(x, rope_cache, positions)
        if isinstance(attention_masks, DocumentBoundaries):
            packed = [t.reshape(1, bs * seqlen, *t.shape[2:]) for t in (q, r, k, v)]
            out = kernels.parallax_attention(
                *packed, scale=self.scaling, backend=self.backend, cu_seqlens=attention_masks.cu_seqlens
            )
        else:
            out = kernels.parallax_attention(q, r, k, v, scale=self.scaling, backend=self.backend)
        return self.wo(out.reshape(bs, seqlen, -1))


class ParallaxBlock(TransformerBlock):
    """A Qwen3 block whose attention is Parallax or an fla mixer, as ``model_args.mixer`` says."""

    def __init__(self, layer_id: int, model_args: ParallaxModelArgs):
        super().__init__(layer_id, model_args)
        if model_args.mixer == "parallax":
            self.attention = ParallaxAttention(model_args)
        elif model_args.mixer in FLA_MIXERS:
            self.attention = build_mixer(layer_id, model_args)


class ParallaxQwen3Model(Qwen3Model):
    """Qwen3 language model with Parallax (or softmax) attention blocks.

    forward(tokens (batch, seq) int64) -> logits (batch, seq, vocab) in the parameter dtype.
    """

    def __init__(self, model_args: ParallaxModelArgs):
        super().__init__(model_args)
        self.layers = nn.ModuleDict(
            {str(i): ParallaxBlock(i, model_args) for i in range(model_args.n_layers)}
        )

    def get_attention_masks(self, input_batch, tokenizer, extra_inputs=None):
        if self.model_args.mixer != "softmax":
            return document_boundaries(input_batch, tokenizer.eos_id)
        return super().get_attention_masks(input_batch, tokenizer, extra_inputs)
