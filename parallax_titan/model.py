"""Qwen3 with Parallax attention: the whole model in one file.

:class:`ParallaxQwen3Model` is token embeddings -> ``n_layers`` :class:`Block` -> RMSNorm -> output
projection (tied to the embeddings at 0.6B). A block is pre-norm, ``h = x + mixer(norm(x))`` then
``h + SwiGLU(norm(h))``, and its sequence mixer is picked when it is built (:func:`sequence_mixer`,
from ``ParallaxModelArgs.mixer``):

* ``softmax``: TorchTitan's Qwen3 attention, unchanged (q/k RMSNorm before RoPE, GQA, SDPA);
* ``parallax``: :class:`ParallaxAttention`, which adds per layer (SPEC.md section 2)

  - ``wr``: the probe projection W_R, d_model -> Hq * D (one probe head per query head);
  - ``r_norm``: per-head RMSNorm on rho with its own weight, applied before RoPE;
  - RoPE on rho (``rho_rope``), with the same cos/sin as q;
  - an optional sigmoid gate (``gate = "token" | "head"``) that scales rho after the norm;
  - ``probe_init = "zero"`` makes every layer exactly softmax attention at step 0 and lets the probe
    grow from zero (the up-training path): the rho-norm weight starts at 0, W_R as W_Q;
  - a sliding window (``window = W``): query i reads keys i - W < j <= i (SPEC 1b);

* ``gated_deltanet``, ``kda``, ``mamba2``, ``mesa_net``: flash-linear-attention layers
  (``parallax_titan.mixers``, docs/mixers.md);
* ``exact_lla``, ``value_averaging``, ``affine_la``, ``affine_mesanet``: the Parallax family
  (``parallax_titan.mixers``, docs/models.md).

Besides ``forward`` (training, scoring), every mixer has ``forward_cached``, the inference path over
a cache (``parallax_titan.generation`` owns the caches): a :class:`PrefillStep` runs whole prompts
through the training kernels and writes their keys and values into the cache; a
:class:`DecodeStep` runs one new token per sequence against it (``kernels.parallax_decode`` for
Parallax, SDPA for softmax attention, fla's recurrent state for the fla mixers).

The SwiGLU MLP, the attention projections, the RoPE table and their initialisations are
TorchTitan's Qwen3 building blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
from torchtitan.models.qwen3.model.model import (
    Attention,
    FeedForward,
    precompute_rope_cache,
    reshape_for_broadcast,
    rotate_half,
)
from torchtitan.models.utils import get_moe_model_nparams_and_flops, trunc_normal_
from torchtitan.protocols.model import ModelProtocol

import kernels
from kernels.family.lla import DEFAULT_MAX_COST
from parallax_titan import mixers

Mixer = Literal["softmax", "parallax", "gated_deltanet", "kda", "mamba2", "mesa_net", "exact_lla",
                "value_averaging", "affine_la", "affine_mesanet"]
Gate = Literal["none", "token", "head"]
ProbeInit = Literal["normal", "zero"]
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
    probe_init: ProbeInit = "normal"
    attn_backend: Backend = "auto"
    fused_norm_rope: bool = True  # [parallax] fused_norm_rope: kernels.projection where it applies
    hopper_kernels: bool = True  # [parallax] hopper_kernels: kernels/parallax/hopper.py where it applies
    window: int = 0  # Parallax sliding window W; 0 = full causal
    lla_max_cost: int | None = DEFAULT_MAX_COST  # exact LLA: most multiply-adds per forward (None: no bound)
    eos_id: int = QWEN3_ENDOFTEXT_ID

    @property
    def needs_document_masks(self) -> bool:
        """True when attention stays within documents (``attn_mask_type = "block_causal"``): the
        forward then takes :class:`DocumentBoundaries` (:meth:`ParallaxQwen3Model.get_attention_masks`)."""
        return self.mixer != "softmax" and self.attn_mask_type == "block_causal"

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
            self.probe_init = section.probe_init
            self.window = section.window
        self.attn_backend = section.attn_backend
        self.fused_norm_rope = section.fused_norm_rope
        self.hopper_kernels = section.hopper_kernels
        self.attn_mask_type = section.attn_mask_type

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        # Parallax runs four attention matmuls per head (q.k, rho.k, p.v, (p*t).v), softmax two;
        # the fla mixers' chunked recurrences are not counted (their MFU covers the weights only).
        matmuls = {"parallax": 4, "softmax": 2}.get(self.mixer, 0)
        return get_moe_model_nparams_and_flops(self, model, matmuls * self.head_dim, seq_len)


def apply_rope(x: torch.Tensor, rope_cache: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """Rotate ``x`` (batch, seq, heads, head_dim) with TorchTitan's Qwen3 RoPE cache: the table
    (max_seq_len, 2 * head_dim) read at ``positions`` (None: 0..seq-1), or its rows for x already
    read, (batch, seq, 1, 2 * head_dim) (a decode step reads them once for every layer)."""
    cache = rope_cache if rope_cache.dim() == 4 else reshape_for_broadcast(rope_cache, x, positions)
    head_dim = x.shape[-1]
    cos = cache[..., :head_dim].to(dtype=x.dtype, device=x.device)
    sin = cache[..., head_dim:].to(dtype=x.dtype, device=x.device)
    return (x * cos + rotate_half(x) * sin).type_as(x)


# Smallest head dim whose projection takes kernels.projection: measured faster than Inductor's fusion
# at 128 and 64 (docs/bench/probe_cost.md, probe_cost_dagger.md); smaller heads are not timed.
FUSED_NORM_ROPE_MIN_HEAD_DIM = 64


def fused_linear(x: torch.Tensor, linears: list[nn.Module]) -> list[torch.Tensor]:
    """``[m(x) for m in linears]`` as one matmul: x (..., dim) times the weights concatenated along
    their outputs, split into views (..., out_i). The parameters stay the modules' own (their names,
    optimizer routing and checkpoints unchanged); the concatenation's backward splits the gradient.

    Only plain bias-free ``nn.Linear`` modules of one dtype and without hooks are fused: a subclass
    (torchao's ``Float8Linear`` after the float8 converter, which runs after the model is built, or
    a per-module FSDP wrapper) has its own forward, and a hook must see its module's call, so then
    every module is called on its own. The check runs on every call, so swapped modules are seen.
    """
    y = concat_linear(x, linears)
    if y is None:
        return [m(x) for m in linears]
    return list(y.split([m.weight.shape[0] for m in linears], dim=-1))


def concat_linear(x: torch.Tensor, linears: list[nn.Module]) -> torch.Tensor | None:
    """x (..., dim) times the modules' weights concatenated along their outputs: (..., sum of outputs),
    one matmul; None when ``fused_linear``'s rule leaves them unfused."""
    fusable = all(type(m) is nn.Linear and m.bias is None and not m._forward_hooks and not m._forward_pre_hooks
                  for m in linears)
    if not fusable or len({m.weight.dtype for m in linears}) != 1:
        return None
    return F.linear(x, torch.cat([m.weight for m in linears]))


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


@dataclass
class KVLayer:
    """One attention layer's part of a static KV cache: ``k``, ``v`` (batch, capacity, Hkv, D), the
    layout ``kernels.parallax_decode`` reads; slot p of a row holds the token at position p."""

    k: torch.Tensor
    v: torch.Tensor


@dataclass
class PrefillStep:
    """A cached forward over whole prompts (n, T), right-padded, that starts their sequences.

    ``rows`` (n,) int64: the cache rows the prompts fill, slots [0, T). Padding positions are
    written too; the sequence lengths kept by the cache exclude them, and causal attention keeps
    them from reaching any real position.
    """

    rows: torch.Tensor


@dataclass
class DecodeStep:
    """One new token for every cache row (batch, 1).

    slots: (batch,) int64, the new token's position and cache slot; seqlens: (batch,) int32, the
    valid slots after the write (slots + 1); rows: (batch,) int64, arange(batch); plan: the
    ``kernels.DecodePlan`` of the cache's geometry (Parallax layers); valid: (batch, 1, 1, capacity)
    bool, slot < seqlens (SDPA's mask for softmax layers). All device tensors: a step can be
    captured in a CUDA graph.
    """

    slots: torch.Tensor
    seqlens: torch.Tensor
    rows: torch.Tensor
    plan: object
    valid: torch.Tensor


def write_cache(layer: KVLayer, step, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store k, v (n, T, Hkv, D) at the step's slots: a prompt's [0, T) in its rows, or a decode
    step's one token per row (no host sync)."""
    if isinstance(step, PrefillStep):
        length = k.shape[1]
        layer.k[:, :length].index_copy_(0, step.rows, k.to(layer.k.dtype))
        layer.v[:, :length].index_copy_(0, step.rows, v.to(layer.v.dtype))
    else:
        layer.k[step.rows, step.slots] = k[:, 0].to(layer.k.dtype)
        layer.v[step.rows, step.slots] = v[:, 0].to(layer.v.dtype)


class SoftmaxAttention(Attention):
    """TorchTitan's Qwen3 attention (its ``forward`` unchanged) with the cached inference path.

    forward_cached(x (batch, seq, dim), rope_cache, layer (KVLayer), step (PrefillStep or
    DecodeStep)) -> (batch, seq, dim): a prefill attends as ``forward`` does (SDPA, causal); a
    decode step attends to the cache through SDPA with the step's mask, each kv head's query heads
    packed as rows of one query block.
    """

    def project(self, x: torch.Tensor, rope_cache: torch.Tensor, positions: torch.Tensor | None):
        """x (batch, seq, dim) -> q (batch, seq, Hq, D) and k, v (batch, seq, Hkv, D), after RoPE."""
        shape = (x.shape[0], x.shape[1], -1, self.head_dim)
        q, k, v = (t.view(shape) for t in fused_linear(x, [self.wq, self.wk, self.wv]))
        q = q if self.q_norm is None else self.q_norm(q)
        k = k if self.k_norm is None else self.k_norm(k)
        return apply_rope(q, rope_cache, positions), apply_rope(k, rope_cache, positions), v

    def forward_cached(self, x, rope_cache, layer: KVLayer, step):
        bs, seqlen, _ = x.shape
        q, k, v = self.project(x, rope_cache, None)
        write_cache(layer, step, k, v)
        if isinstance(step, PrefillStep):
            out = self.inner_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=self.scaling,
                                       enable_gqa=self.enable_gqa).transpose(1, 2)
        else:
            # query head h reads kv head h // G: (batch, 1, Hq, D) -> (batch, Hkv, G, D)
            packed = q.reshape(bs, self.n_kv_heads, self.n_rep, self.head_dim)
            out = F.scaled_dot_product_attention(packed, layer.k.transpose(1, 2), layer.v.transpose(1, 2),
                                                 attn_mask=step.valid, scale=self.scaling)
        return self.wo(out.reshape(bs, seqlen, -1))


class ParallaxAttention(Attention):
    """TorchTitan's Qwen3 attention (wq, wk, wv, wo, q_norm, k_norm) with a learned probe rho per
    query head.

    forward(x (batch, seq, dim), rope_cache, attention_masks (DocumentBoundaries or None),
    positions) -> (batch, seq, dim) in x's dtype.
    """

    # the input projections that run as one matmul of their concatenated weights (fused_linear)
    FUSED_INPUTS = ("wq", "wk", "wv", "wr", "gate")

    def __init__(self, model_args: ParallaxModelArgs):
        super().__init__(model_args)
        self.rho_rope = model_args.rho_rope
        self.gate_kind = model_args.gate
        self.probe_init = model_args.probe_init
        self.backend = model_args.attn_backend
        self.window = model_args.window or None  # the kernels' None is full causal attention
        self.wr = nn.Linear(model_args.dim, model_args.n_heads * self.head_dim, bias=False)
        self.r_norm = nn.RMSNorm(self.head_dim, eps=model_args.norm_eps, elementwise_affine=True)
        self.fused_norm_rope = model_args.fused_norm_rope  # where it applies: _fused_norm_rope
        self.hopper_kernels = model_args.hopper_kernels
        gate_out = {"none": 0, "token": 1, "head": model_args.n_heads}[model_args.gate]
        self.gate = nn.Linear(model_args.dim, gate_out, bias=False) if gate_out else None

    def init_weights(self, init_std: float):
        super().init_weights(init_std)
        trunc_normal_(self.wr.weight, mean=0.0, std=0.02)
        self.r_norm.reset_parameters()
        if self.probe_init == "zero":
            # rho = 0 through the norm's weight, not through W_R: with W_R = 0 the RMSNorm (eps 1e-6)
            # would blow its first update up to a unit-RMS probe. With weight 0 and W_R as W_Q, the
            # probe's size is that weight, which an optimizer step moves by about its lr.
            nn.init.zeros_(self.r_norm.weight)
        if self.gate is not None:
            trunc_normal_(self.gate.weight, mean=0.0, std=0.02)

    def project(self, x: torch.Tensor, rope_cache: torch.Tensor, positions: torch.Tensor | None):
        """x (batch, seq, dim) -> q, r (batch, seq, Hq, D) and k, v (batch, seq, Hkv, D), after RoPE.

        On CUDA with the fused attention (backend "auto" or "triton"), no gate, heads of 64 or more and
        positions 0..seq-1, the norms and RoPE of q, k and rho run as one Triton launch over the fused
        projection (``kernels.projection``); otherwise, or with ``fused_norm_rope`` off (``[parallax]
        fused_norm_rope = false``; the benchmarks' baseline), as TorchTitan's modules."""
        bs, seqlen, _ = x.shape
        inputs = [getattr(self, name) for name in self.FUSED_INPUTS if getattr(self, name) is not None]
        if self._fused_norm_rope(x, rope_cache, positions):  # no gate: inputs are wq, wk, wv, wr
            y = concat_linear(x, inputs)
            if y is not None:
                norms = (self.q_norm, self.k_norm, self.r_norm)
                q, k, v, r = kernels.split_norm_rope(y, self.n_heads, self.n_kv_heads, [n.weight for n in norms],
                                                     self.r_norm.eps, rope_cache, self.rho_rope)
                return q, r, k, v
        shape = (bs, seqlen, -1, self.head_dim)
        q, k, v, r, *g = fused_linear(x, inputs)
        q, k, v = self.q_norm(q.view(shape)), self.k_norm(k.view(shape)), v.view(shape)
        r = self.r_norm(r.view(shape))
        if g:
            # The gate must act after the norm: before it, the norm would undo the scaling.
            r = r * torch.sigmoid(g[0]).unsqueeze(-1)
        q, k = apply_rope(q, rope_cache, positions), apply_rope(k, rope_cache, positions)
        if self.rho_rope:
            r = apply_rope(r, rope_cache, positions)
        return q, r, k, v

    def _fused_norm_rope(self, x, rope_cache, positions) -> bool:
        """Whether ``project`` can take the fused norm + RoPE: CUDA, the fused attention backend, no
        gate, head_dim of at least ``FUSED_NORM_ROPE_MIN_HEAD_DIM`` and twice a power of two, RoPE rows of
        positions 0..seq-1, and three affine RMSNorms with one epsilon."""
        norms = (self.q_norm, self.k_norm, self.r_norm)
        half = self.head_dim // 2
        return (self.fused_norm_rope and x.is_cuda and self.backend != "reference" and self.gate is None
                and positions is None and self.head_dim >= FUSED_NORM_ROPE_MIN_HEAD_DIM
                and self.head_dim % 2 == 0 and half & (half - 1) == 0
                and rope_cache.dim() == 2 and all(type(n) is nn.RMSNorm and n.weight is not None for n in norms)
                and len({n.eps for n in norms}) == 1 and self.r_norm.eps is not None)

    def forward(self, x, rope_cache, attention_masks=None, positions=None):
        bs, seqlen, _ = x.shape
        q, r, k, v = self.project(x, rope_cache, positions)
        if isinstance(attention_masks, DocumentBoundaries):
            packed = [t.reshape(1, bs * seqlen, *t.shape[2:]) for t in (q, r, k, v)]
            out = self._attend(*packed, cu_seqlens=attention_masks.cu_seqlens)
        else:
            out = self._attend(q, r, k, v)
        return self.wo(out.reshape(bs, seqlen, -1))

    def _attend(self, q, r, k, v, cu_seqlens=None):
        """``kernels.parallax_attention`` with this layer's scale, backend, window and backward switch."""
        return kernels.parallax_attention(q, r, k, v, scale=self.scaling, backend=self.backend, cu_seqlens=cu_seqlens,
                                          window=self.window, hopper_kernels=self.hopper_kernels)

    def forward_cached(self, x, rope_cache, layer: KVLayer, step):
        """The inference path: x (batch, seq, dim) -> (batch, seq, dim). A :class:`PrefillStep`
        attends causally through ``kernels.parallax_attention`` (as ``forward``), a
        :class:`DecodeStep` through the step's ``kernels.DecodePlan`` over the cache; either
        first writes k, v into ``layer``."""
        bs, seqlen, _ = x.shape
        q, r, k, v = self.project(x, rope_cache, None)
        write_cache(layer, step, k, v)
        if isinstance(step, PrefillStep):
            out = self._attend(q, r, k, v)
        else:
            out = step.plan(q, r, layer.k, layer.v, step.seqlens)
        return self.wo(out.reshape(bs, seqlen, -1))


def sequence_mixer(layer_id: int, args: ParallaxModelArgs) -> nn.Module:
    """The attention slot of block ``layer_id``: softmax, Parallax, an fla layer or a family mixer
    (``args.mixer``)."""
    if args.mixer == "softmax":
        return SoftmaxAttention(args)
    if args.mixer == "parallax":
        return ParallaxAttention(args)
    if args.mixer in mixers.FLA_MIXERS:
        return mixers.build_mixer(layer_id, args)
    if args.mixer in mixers.FAMILY_MIXERS:
        return mixers.FAMILY_MIXERS[args.mixer](args)
    raise ValueError(f"mixer: {args.mixer!r} is unknown; expected 'softmax', 'parallax' or one of "
                     f"{', '.join(map(repr, [*mixers.FLA_MIXERS, *mixers.FAMILY_MIXERS]))}")


class Block(nn.Module):
    """Pre-norm Qwen3 block: ``h = x + mixer(norm(x))``, then ``h + SwiGLU(norm(h))``.

    forward(x (batch, seq, dim), rope_cache, attention_masks, positions) -> (batch, seq, dim).
    """

    moe_enabled = False  # TorchTitan's per-block compile asks every block

    def __init__(self, layer_id: int, args: ParallaxModelArgs):
        super().__init__()
        # Registration order fixes the parameter order (optimizer groups, state-dict layout).
        self.attention = sequence_mixer(layer_id, args)
        self.feed_forward = FeedForward(dim=args.dim, hidden_dim=args.hidden_dim)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        # Output projections (wo, w2, w3) start smaller in deeper blocks.
        depth = layer_id + 1 if args.depth_init else args.n_layers
        self.weight_init_std = 0.02 / (2 * depth) ** 0.5

    def forward(self, x, rope_cache, attention_masks=None, positions=None):
        h = x + self.attention(self.attention_norm(x), rope_cache, attention_masks, positions)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward_cached(self, x, rope_cache, layer_cache, step):
        """``forward`` through the mixer's cached path (``layer_cache``: the mixer's part of the cache;
        ``rope_cache``: the table, or for a decode step its rows, see :func:`apply_rope`)."""
        h = x + self.attention.forward_cached(self.attention_norm(x), rope_cache, layer_cache, step)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)


class ParallaxQwen3Model(ModelProtocol):
    """Qwen3 language model whose blocks use the sequence mixer ``model_args.mixer``.

    forward(tokens (batch, seq) int64, attention_masks=None, positions=None) -> logits
    (batch, seq, vocab) in the parameter dtype. ``attention_masks``: None (causal) or the
    :class:`DocumentBoundaries` of :meth:`get_attention_masks`.
    """

    def __init__(self, model_args: ParallaxModelArgs):
        super().__init__(model_args)
        self.model_args = model_args
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        # cos and sin per position (max_seq_len, 2 * head_dim), fp32; rebuilt by init_weights
        self.register_buffer("rope_cache", self._rope_cache(), persistent=False)
        self.layers = nn.ModuleDict({str(i): Block(i, model_args) for i in range(model_args.n_layers)})
        self.norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size, bias=False)
        if model_args.enable_weight_tying:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens, attention_masks=None, positions=None):
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h, self.rope_cache, attention_masks, positions)
        return self.output(self.norm(h))

    def forward_cached(self, tokens, layer_caches, step, last: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of one position per row through the cached path (``parallax_titan.generation``).

        tokens (batch, T) int64; layer_caches: one per block (its mixer's part of the cache);
        step: :class:`PrefillStep` or :class:`DecodeStep` (None for the fla mixers, whose state
        carries the positions); last: (batch,) int64 position whose
        logits are returned (default T - 1, the only one of a decode step). Returns (batch, vocab).
        """
        h = self.tok_embeddings(tokens)
        rope = self.rope_cache  # a prefill's positions are 0..T-1
        if isinstance(step, DecodeStep):  # each row's own position, read once for every layer
            rope = self.rope_cache[step.slots][:, None, None, :].to(h.dtype)
        for block, layer_cache in zip(self.layers.values(), layer_caches, strict=True):
            h = block.forward_cached(h, rope, layer_cache, step)
        h = h[:, -1] if last is None else h[torch.arange(h.shape[0], device=h.device), last]
        return self.output(self.norm(h))

    def get_attention_masks(self, input_batch, tokenizer, extra_inputs=None) -> DocumentBoundaries | None:
        """The masks ``forward`` takes for the packed batch ``input_batch`` (batch, seq) int64:
        document boundaries at ``tokenizer.eos_id`` when ``model_args.needs_document_masks``,
        else None (causal attention over the whole row)."""
        if not self.model_args.needs_document_masks:
            return None
        return document_boundaries(input_batch, tokenizer.eos_id)

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Initialise every weight in place (TorchTitan's Qwen3 scheme); also after ``to_empty``.

        Embeddings N(0, 1); per block its norms, mixer and MLP (:meth:`Block.init_weights`); the
        final norm; the output projection truncated N(0, dim^-0.5) at 3 std, which with tied
        embeddings re-initialises the embedding too. The order fixes the random stream.
        """
        buffer_device = buffer_device or self.rope_cache.device
        with torch.device(buffer_device):
            self.rope_cache = self._rope_cache()
        nn.init.normal_(self.tok_embeddings.weight)
        for block in self.layers.values():
            block.init_weights()
        self.norm.reset_parameters()
        if self.model_args.enable_weight_tying:
            # built on the meta device and moved with to_empty, the two are separate tensors again
            self.output.weight = self.tok_embeddings.weight
        std = self.model_args.dim**-0.5
        trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def _rope_cache(self) -> torch.Tensor:
        args = self.model_args
        return precompute_rope_cache(args.head_dim, args.max_seq_len, args.rope_theta)
