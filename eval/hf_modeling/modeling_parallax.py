"""Qwen3 with Parallax attention for Hugging Face transformers (remote code).

Exported beside ``config.json`` by Parallax-Titan, so that

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

loads a Parallax (or Parallax-dagger) checkpoint, and ``generate`` runs with transformers' KV cache.
The layer is Qwen3's decoder layer with one change in the attention. Per query head h, besides q,
a probe ``rho = RMSNorm_r(W_R x)_h`` (times ``sigmoid(r_gate x)`` when gated), with RoPE when
``rho_rope``, and

    p_ij = softmax_j(q_i . k_j / sqrt(D))   (causal; GQA: head h reads kv head h // (Hq / Hkv))
    t_ij = rho_i . k_j                      (not scaled)
    o_i  = sum_j p_ij (1 - t_ij + sum_l p_il t_il) v_j

Self-contained: imports torch and transformers, and Parallax-Titan's ``kernels`` package when it is
importable, whose fused Triton kernels then run on CUDA (prefill without padding, and one-token
decode steps); everywhere else the exact PyTorch reference below runs.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import types

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_parallax import ParallaxQwen3Config, checked_parallax

try:  # Parallax-Titan's kernels, when this runs inside (or beside) its repository, and Triton
    import kernels as _titan_kernels

    FUSED_KERNELS = (hasattr(_titan_kernels, "parallax_attention") and hasattr(_titan_kernels, "parallax_decode")
                     and importlib.util.find_spec("triton") is not None)
except ImportError:
    _titan_kernels, FUSED_KERNELS = None, False

# transformers 5 renamed the cache argument and output field "past_key_values" -> "cache".
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
QUERY_BLOCK = 512  # query rows per block of the reference (bounds its (Tq, Tk) score matrices)


# ------------------------------------------------------------------------------ attention math
def parallax_reference(q, r, k, v, allowed, scale):
    """Parallax attention with an explicit mask, in fp32 (fp64 for fp64 inputs).

    q, r: (B, Hq, Tq, D); k, v: (B, Hkv, Tk, D); allowed: (B, 1, Tq, Tk) bool (key j visible to
    query i). A query that sees no key gets zeros. Returns (B, Hq, Tq, D) in q's dtype.
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    k = k.to(acc).repeat_interleave(group, dim=1)
    v = v.to(acc).repeat_interleave(group, dim=1)
    blocks = []
    for start in range(0, q.shape[2], QUERY_BLOCK):
        rows = slice(start, start + QUERY_BLOCK)
        seen = allowed[:, :, rows]
        s = (q[:, :, rows].to(acc) @ k.transpose(-1, -2)) * scale
        s = s.masked_fill(~seen, -math.inf)
        top = s.amax(dim=-1, keepdim=True)
        weights = torch.exp(s - torch.where(torch.isinf(top), torch.zeros_like(top), top))
        p = weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(acc).tiny)
        t = (r[:, :, rows].to(acc) @ k.transpose(-1, -2)).masked_fill(~seen, 0.0)
        tbar = (p * t).sum(dim=-1, keepdim=True)
        blocks.append((1.0 + tbar) * (p @ v) - (p * t) @ v)
    return torch.cat(blocks, dim=2).to(q.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(position_ids, head_dim: int, theta: float):
    """cos, sin (B, T, D) fp32 of positions (B, T) (Parallax-Titan's table: fp32 angles pos * inv_freq)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device)[: head_dim // 2].float()
                                / head_dim))
    angles = position_ids.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x (B, H, T, D), cos/sin (B, T, D) fp32 (cast to x's dtype first, as in training)."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return (x * cos + rotate_half(x) * sin).type_as(x)


# ------------------------------------------------------------------------------ modules
class ParallaxQwen3Attention(nn.Module):
    """Qwen3 attention (q/k RMSNorm before RoPE, GQA) with the Parallax probe (r_proj, r_norm,
    r_gate)."""

    def __init__(self, config: ParallaxQwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.rho_rope = config.parallax["rho_rope"]
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.q_proj = nn.Linear(dim, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, dim, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.r_proj = nn.Linear(dim, self.n_heads * self.head_dim, bias=False)
        self.r_norm = nn.RMSNorm(self.head_dim, eps=eps)
        gate_out = {"none": 0, "token": 1, "head": self.n_heads}[config.parallax["gate"]]
        self.r_gate = nn.Linear(dim, gate_out, bias=False) if gate_out else None

    def forward(self, x, cos, sin, allowed, cache, plain: bool):
        """x (B, T, dim) -> (B, T, dim); allowed (B, 1, T, kv_len) over the cache's filled slots.
        ``plain``: the mask is causal over the whole cache (no padding, no document boundaries), so
        the fused kernels may run."""
        bs, seqlen, _ = x.shape
        shape = (bs, seqlen, -1, self.head_dim)
        q = self.q_norm(self.q_proj(x).view(shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(shape)).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        r = self.r_norm(self.r_proj(x).view(shape))
        if self.r_gate is not None:  # after the norm, which would otherwise undo it
            r = r * torch.sigmoid(self.r_gate(x)).unsqueeze(-1)
        r = r.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.rho_rope:
            r = apply_rope(r, cos, sin)
        if cache is not None:
            # a static cache returns all its slots, those past the filled ones zero: none is a key
            kv_len = allowed.shape[-1]
            k, v = cache.update(k, v, self.layer_idx)
            k, v = k[:, :, :kv_len], v[:, :, :kv_len]
        out = self._attend(q, r, k, v, allowed, plain, past=k.shape[2] - seqlen)
        return self.o_proj(out.transpose(1, 2).reshape(bs, seqlen, -1))

    def _attend(self, q, r, k, v, allowed, plain, past):
        if FUSED_KERNELS and plain and q.is_cuda:
            if past == 0:  # (B, T, H, D) layout for the kernels
                out = _titan_kernels.parallax_attention(q.transpose(1, 2), r.transpose(1, 2), k.transpose(1, 2),
                                                        v.transpose(1, 2), scale=self.scaling)
                return out.transpose(1, 2)
            if q.shape[2] == 1:
                out = _titan_kernels.parallax_decode(q.transpose(1, 2), r.transpose(1, 2), k.transpose(1, 2),
                                                     v.transpose(1, 2), scale=self.scaling)
                return out.transpose(1, 2)
        return parallax_reference(q, r, k, v, allowed, self.scaling)


class ParallaxQwen3MLP(nn.Module):
    def __init__(self, config: ParallaxQwen3Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ParallaxQwen3DecoderLayer(nn.Module):
    def __init__(self, config: ParallaxQwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = ParallaxQwen3Attention(config, layer_idx)
        self.mlp = ParallaxQwen3MLP(config)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h, cos, sin, allowed, cache, plain):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, allowed, cache, plain)
        return h + self.mlp(self.post_attention_layernorm(h))


class ParallaxQwen3PreTrainedModel(PreTrainedModel):
    config_class = ParallaxQwen3Config
    base_model_prefix = "model"
    _no_split_modules = ["ParallaxQwen3DecoderLayer"]
    supports_gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained``; raises ValueError naming the weights that the folder
        lacks, that the model has no place for, or (with ``ignore_mismatched_sizes``) of another
        shape. transformers would initialise the first and last at random and drop the others with a
        warning: a config.json edited to another ``parallax.gate``, layer count or
        ``tie_word_embeddings`` than the weights' would load and compute something else."""
        with_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        kinds = {"missing_keys": "missing weights", "unexpected_keys": "unexpected weights",
                 "mismatched_keys": "weights of another shape"}
        problems = [f"{kind} {sorted(map(str, info[key]))[:4]} ({len(info[key])} in all)"
                    for key, kind in kinds.items() if info.get(key)]
        if problems:
            raise ValueError(f"{'; '.join(problems)}: the weights do not fit config.json (its parallax.gate, "
                             "num_hidden_layers or tie_word_embeddings edited?); Parallax-Qwen3 loads a checkpoint "
                             "whole")
        return (model, info) if with_info else model


def attention_allowed(batch, q_len, past, mask_2d, doc_start, device):
    """(B, 1, Tq, Tk) bool: key j visible to query i (cache index past + i): causal, not padding
    (``mask_2d`` (B, Tk), 1 = token), not before the query's document (``doc_start`` (B, Tq))."""
    kv_len = past + q_len
    keys = torch.arange(kv_len, device=device)
    queries = past + torch.arange(q_len, device=device)
    allowed = (keys[None, :] <= queries[:, None])[None].expand(batch, -1, -1)
    if mask_2d is not None:
        allowed = allowed & mask_2d[:, None, -kv_len:].bool()
    if doc_start is not None:
        allowed = allowed & (keys[None, None, :] >= doc_start[:, :, None])
    return allowed[:, None]


def document_starts(input_ids, eos_id: int, past: int, start):
    """Block-causal documents: the cache index where each query's document starts (B, Tq), and
    where the document of a token after each one starts (B, Tq). A document ends after each
    ``eos_id``; ``start`` (B,) is that of the first of these tokens."""
    index = past + torch.arange(input_ids.shape[1], device=input_ids.device)
    after_eos = torch.where(input_ids == eos_id, index + 1, torch.zeros_like(index))
    previous = torch.cat([start[:, None], after_eos[:, :-1]], dim=1)
    starts = torch.cummax(torch.maximum(previous, start[:, None]), dim=1).values
    return starts, torch.maximum(starts, after_eos)


def packed_starts(position_ids):
    """Index (B, T) where each token's sequence starts in a packed row: a new sequence wherever the
    position does not follow the previous one by 1 (transformers' reading of ``position_ids``
    without an attention mask or cache, e.g. padding-free fine-tuning), or None for one sequence."""
    previous = torch.cat([position_ids[:, :1] - 1, position_ids[:, :-1]], dim=1)
    index = torch.arange(position_ids.shape[1], device=position_ids.device).expand_as(position_ids)
    new = position_ids - previous != 1
    if not bool(new[:, 1:].any()):
        return None
    return torch.cummax(torch.where(new, index, torch.zeros_like(index)), dim=1).values


def checked_position_bound(position_ids, bound, limit: int) -> int:
    """The largest of ``position_ids`` (B, T) as known on the host: ``bound`` (int, or None for
    unknown) while it is below ``limit``, else their maximum read back from the device. Raises
    ValueError for a position at or past ``limit`` (max_position_embeddings)."""
    if bound is not None and bound < limit:
        return bound
    largest = int(position_ids.max())
    if largest >= limit:
        raise ValueError(f"position_ids: position {largest} is past max_position_embeddings = {limit}, the "
                         "positions the model was built for; pass at most that many tokens")
    return largest


class ParallaxQwen3DecoderModel(ParallaxQwen3PreTrainedModel):
    """Embeddings, decoder layers, final norm: hidden states (B, T, hidden_size)."""

    def __init__(self, config: ParallaxQwen3Config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ParallaxQwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # the layers hold these (rho's RoPE, the gate's weights); the mask type is read at each forward
        self.built_parallax = {key: config.parallax[key] for key in ("rho_rope", "gate")}
        self.post_init()

    def mask_type(self) -> str:
        """The config's ``parallax.attn_mask_type`` now, after checking its ``parallax`` block as it is
        now (edited in place, ``config.parallax["gate"] = ...``, it was not checked) and that its
        ``rho_rope`` and ``gate`` are still those this model was built with.

        Raises ValueError naming the key, its value and the built one."""
        block = checked_parallax(self.config.parallax, self.config.eos_token_id)
        for key, built in self.built_parallax.items():
            if block[key] != built:
                raise ValueError(f"config.parallax.{key} = {block[key]!r}, but this model was built with {built!r} "
                                 f"(its layers hold it); expected {built!r}, or a model built from the new config")
        return block["attn_mask_type"]

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, cache=None,
                output_hidden_states=False, position_bound=None):
        """Hidden states after the final norm, ``last_hidden_state`` (B, T, hidden_size), and with
        ``output_hidden_states`` ``hidden_states``: the embeddings, then each layer's output, the last
        one after the final norm (n_layers + 1 of them, as transformers' models give them).

        position_ids (B, T) default to the tokens' positions after the cache's, counting only the
        tokens of a 2-D ``attention_mask`` (1 = token), so that a left-padded row starts at 0.
        Raises ValueError for a position at or past ``max_position_embeddings`` (the positions the
        model was built for: Parallax-Titan's RoPE table holds no more). Given position_ids are read
        back from the device for that check unless ``position_bound`` (int), a bound on them known
        on the host (generate's decode steps pass one), is below the limit."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("input_ids / inputs_embeds: pass exactly one of them")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        bs, q_len = h.shape[:2]
        past = int(cache.get_seq_length()) if cache is not None else 0  # a static cache's is a tensor
        mask_2d, mask_4d = _split_mask(attention_mask, past + q_len)
        packed = None
        if position_ids is None:
            # positions made here count tokens: below the mask's width, or past + q_len
            position_bound = (past + q_len if mask_2d is None else mask_2d.shape[1]) - 1
            if mask_2d is None:
                position_ids = (past + torch.arange(q_len, device=h.device))[None].expand(bs, -1)
            else:  # left padding: every sequence starts at position 0
                position_ids = (mask_2d.long().cumsum(-1) - 1).clamp(min=0)[:, -q_len:]
        elif attention_mask is None and cache is None:
            packed = packed_starts(position_ids.expand(bs, -1))
        if q_len:
            largest = checked_position_bound(position_ids, position_bound, self.config.max_position_embeddings)
            if cache is not None:  # generate's next positions follow these (prepare_inputs_for_generation)
                cache.parallax_max_position = max(largest, getattr(cache, "parallax_max_position", largest))
        doc_start = self._document_starts(input_ids, cache, past, bs)
        if packed is not None:
            doc_start = packed if doc_start is None else torch.maximum(doc_start, packed)
        # only the fused kernels need to know (a host read per call); the reference takes any mask
        plain = (FUSED_KERNELS and h.is_cuda and mask_4d is None and (mask_2d is None or bool(mask_2d.all()))
                 and (doc_start is None or not bool(doc_start.any())))
        allowed = mask_4d
        if allowed is None:
            allowed = attention_allowed(bs, q_len, past, mask_2d, doc_start, h.device)
        else:  # a static cache's mask (all its slots): its filled ones, documents on top
            allowed = allowed[..., : past + q_len]
            if doc_start is not None:
                slots = torch.arange(allowed.shape[-1], device=h.device)
                allowed = allowed & (slots[None, None, :] >= doc_start[:, :, None])[:, None]
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        hidden = [h] if output_hidden_states else None
        for layer in self.layers:
            h = layer(h, cos, sin, allowed, cache, plain)
            if hidden is not None:
                hidden.append(h)
        h = self.norm(h)
        if hidden is not None:
            hidden[-1] = h
        return BaseModelOutputWithPast(last_hidden_state=h, hidden_states=tuple(hidden) if hidden else None)

    def _document_starts(self, input_ids, cache, past, bs):
        """Block-causal documents: where each query's document starts (B, T), or None. The cache
        keeps, per filled slot, the start for a token after it (``parallax_document_starts`` (B,
        past)), so that a cache cut back (``crop``, as assisted generation does) is read at its end."""
        if self.mask_type() != "block_causal":
            return None
        if input_ids is None:
            raise ValueError("inputs_embeds: block-causal documents are found from input_ids (eos_token_id); "
                             "pass input_ids")
        kept = getattr(cache, "parallax_document_starts", None)
        if kept is not None and kept.shape[0] != bs:
            raise ValueError(f"cache: its block-causal document starts are kept for {kept.shape[0]} rows, the input "
                             f"has {bs}: the cache's rows were changed other than by its own {sorted(_ROW_OPS)} or "
                             "crop, which the starts follow")
        if kept is None or kept.shape[1] < past:  # a cache filled elsewhere: one document from slot 0
            kept = torch.zeros(bs, past, dtype=torch.long, device=input_ids.device)
        kept = kept[:, :past]
        start = kept[:, -1] if past else torch.zeros(bs, dtype=torch.long, device=input_ids.device)
        starts, following = document_starts(input_ids, self.config.eos_token_id, past, start)
        if cache is not None:
            cache.parallax_document_starts = torch.cat([kept, following], dim=1)
            _rows_follow(cache)
        return starts


def _select_rows(starts, rows):
    """Rows ``rows`` (indices: a tensor or a list) of the document starts (B, filled slots)."""
    return starts[torch.as_tensor(rows, device=starts.device)]


# The cache's operations on its rows (beam search's reorder, contrastive search's repeat and select):
# how the block-causal document starts kept on it (B, filled slots) follow them.
_ROW_OPS = {
    "reorder_cache": _select_rows,
    "batch_select_indices": _select_rows,
    "batch_repeat_interleave": lambda starts, repeats: starts.repeat_interleave(repeats, dim=0),
}


def _rows_follow(cache) -> None:
    """Bind to ``cache`` its row operations (``_ROW_OPS``) with the document starts following its rows:
    whoever calls them (transformers' beam or contrastive search, a user), the starts stay with their
    rows. Bound methods: a deep copy of the cache rebinds them to the copy."""
    for name, follow in _ROW_OPS.items():
        if name not in vars(cache) and hasattr(type(cache), name):
            setattr(cache, name, types.MethodType(functools.partial(_row_op, name, follow), cache))


def _row_op(name, follow, cache, *args, **kwargs):
    """The class's ``name`` on ``cache``, then ``follow`` on its document starts (``_ROW_OPS``)."""
    result = getattr(type(cache), name)(cache, *args, **kwargs)
    starts = getattr(cache, "parallax_document_starts", None)
    if starts is not None:
        cache.parallax_document_starts = follow(starts, *args, **kwargs)
    return result


def _split_mask(attention_mask, kv_len):
    """transformers' attention mask -> (2-D padding mask (B, kv_len) or None, 4-D (B, 1, Tq, Tk)
    bool mask or None). A 4-D mask (a static cache's, over all its slots) is boolean (True =
    attend) or additive (0 = attend)."""
    if isinstance(attention_mask, dict):
        attention_mask = attention_mask.get("full_attention")
    if attention_mask is None:
        return None, None
    if attention_mask.dim() == 4:
        return None, attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    if attention_mask.dim() != 2 or attention_mask.shape[1] < kv_len:
        raise ValueError(f"attention_mask: expected (batch, length >= {kv_len}) with 1 for tokens, or a 4-D mask; "
                         f"got shape {tuple(attention_mask.shape)}")
    return attention_mask, None


class ParallaxQwen3ForCausalLM(ParallaxQwen3PreTrainedModel, GenerationMixin):
    """Causal LM head on :class:`ParallaxQwen3DecoderModel`; ``generate`` uses a ``DynamicCache``."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: ParallaxQwen3Config):
        super().__init__(config)
        self.model = ParallaxQwen3DecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, cache=None,
                output_hidden_states=None, output_attentions=None, return_dict=None, num_items_in_batch=None,
                shift_labels=None, position_bound=None, **kwargs):
        """Logits (B, T, vocab) (the last ``logits_to_keep`` positions when > 0); the cache is
        transformers' (``cache`` or ``past_key_values``, created when ``use_cache``; a legacy tuple
        of (key, value) per layer is read into a ``DynamicCache``).

        loss (with ``labels`` (B, T), or ``shift_labels`` already shifted): cross-entropy of the
        logit at i against the label at i + 1, -100 ignored; the mean over the labelled tokens, or
        their sum over ``num_items_in_batch`` when given (transformers' Trainer passes it).
        ``output_hidden_states``, ``return_dict`` (default: the config's) as transformers' models;
        ``output_attentions`` is refused: no attention weights give Parallax's output alone.
        ``position_bound``: see :meth:`ParallaxQwen3DecoderModel.forward`."""
        if output_attentions if output_attentions is not None else getattr(self.config, "output_attentions", False):
            raise ValueError("output_attentions: Parallax attention's output is sum_j p_ij (1 - t_ij + tbar_i) v_j, "
                             "which no attention-weight matrix gives; call without output_attentions")
        if output_hidden_states is None:
            output_hidden_states = getattr(self.config, "output_hidden_states", False)
        if not isinstance(output_hidden_states, bool):  # transformers 5 also takes layer indices
            raise ValueError(f"output_hidden_states: expected true or false, got {output_hidden_states!r}")
        cache = cache if cache is not None else past_key_values
        if isinstance(cache, (tuple, list)):
            cache = _legacy_cache(cache)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache()
        out = self.model(input_ids, attention_mask, position_ids, inputs_embeds, cache if use_cache else None,
                         output_hidden_states, position_bound)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep > 0 else h
        else:
            h = h[:, logits_to_keep]
        logits = self.lm_head(h)
        loss = None
        if labels is not None or shift_labels is not None:
            if shift_labels is None:  # the label after each position; none after the last
                shift_labels = F.pad(labels[:, 1:], (0, 1), value=-100)
            wide = torch.promote_types(logits.dtype, torch.float32)  # bf16 up to fp32; fp64 stays fp64
            loss = F.cross_entropy(logits.flatten(0, 1).to(wide), shift_labels.flatten().to(logits.device),
                                   ignore_index=-100, reduction="mean" if num_items_in_batch is None else "sum")
            if num_items_in_batch is not None:
                loss = loss / num_items_in_batch
        output = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        **{CACHE_FIELD: cache if use_cache else None})
        return_dict = getattr(self.config, "return_dict", True) if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()

    def prepare_inputs_for_generation(self, input_ids, inputs_embeds=None, **kwargs):
        """transformers' inputs of a generate step, with ``position_bound`` after the first step:
        generate makes each new token's position one more than the last one's, so no new position
        passes the largest the cache has seen (``parallax_max_position``, checked) plus the new tokens,
        and the check against max_position_embeddings reads nothing back from the device until that
        bound reaches the limit. The first step's positions (the prompt's, or the caller's) are read."""
        # keywords only: transformers' own parameters were renamed across versions (cache / past_key_values);
        # inputs_embeds is named, as generate looks for it in this signature
        inputs = super().prepare_inputs_for_generation(input_ids, inputs_embeds=inputs_embeds, **kwargs)
        cache = inputs.get("cache", inputs.get("past_key_values"))
        seen = getattr(cache, "parallax_max_position", None)
        positions = inputs.get("position_ids")
        if not kwargs.get("is_first_iteration") and seen is not None and positions is not None:
            inputs["position_bound"] = seen + positions.shape[-1]
        return inputs


def _legacy_cache(cache):
    """transformers' older cache format, a (key, value) pair per layer, as a ``DynamicCache``."""
    if hasattr(DynamicCache, "from_legacy_cache"):  # transformers 4
        return DynamicCache.from_legacy_cache(tuple(cache))
    return DynamicCache(tuple(cache))
