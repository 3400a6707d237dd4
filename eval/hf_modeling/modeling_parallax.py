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

import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_parallax import ParallaxQwen3Config

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
        """x (B, T, dim) -> (B, T, dim). ``plain``: the mask is causal over the whole cache (no
        padding, no document boundaries), so the fused kernels may run."""
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
            k, v = cache.update(k, v, self.layer_idx)
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
    """Block-causal documents: the cache index where each query's document starts (B, Tq), and the
    start for the next token (B,). A document ends after each ``eos_id``; ``start`` (B,) is that of
    the tokens before these."""
    index = past + torch.arange(input_ids.shape[1], device=input_ids.device)
    after_eos = torch.where(input_ids == eos_id, index + 1, torch.zeros_like(index))
    previous = torch.cat([start[:, None], after_eos[:, :-1]], dim=1)
    starts = torch.cummax(torch.maximum(previous, start[:, None]), dim=1).values
    return starts, torch.maximum(starts[:, -1], after_eos[:, -1])


class ParallaxQwen3DecoderModel(ParallaxQwen3PreTrainedModel):
    """Embeddings, decoder layers, final norm: hidden states (B, T, hidden_size)."""

    def __init__(self, config: ParallaxQwen3Config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(ParallaxQwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, cache=None):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("input_ids / inputs_embeds: pass exactly one of them")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        bs, q_len = h.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        mask_2d, mask_4d = _split_mask(attention_mask, past + q_len)
        if position_ids is None:
            if mask_2d is None:
                position_ids = (past + torch.arange(q_len, device=h.device))[None].expand(bs, -1)
            else:  # left padding: every sequence starts at position 0
                position_ids = (mask_2d.long().cumsum(-1) - 1).clamp(min=0)[:, -q_len:]
        doc_start = self._document_starts(input_ids, cache, past, bs)
        plain = mask_4d is None and (mask_2d is None or bool(mask_2d.all()))
        plain = plain and (doc_start is None or not bool(doc_start.any()))
        allowed = mask_4d
        if allowed is None:
            allowed = attention_allowed(bs, q_len, past, mask_2d, doc_start, h.device)
        elif doc_start is not None:  # a static cache's mask (all its slots): documents on top
            slots = torch.arange(allowed.shape[-1], device=h.device)
            allowed = allowed & (slots[None, None, :] >= doc_start[:, :, None])[:, None]
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        for layer in self.layers:
            h = layer(h, cos, sin, allowed, cache, plain)
        return self.norm(h)

    def _document_starts(self, input_ids, cache, past, bs):
        if self.config.parallax["attn_mask_type"] != "block_causal":
            return None
        if input_ids is None:
            raise ValueError("inputs_embeds: block-causal documents are found from input_ids (eos_token_id); "
                             "pass input_ids")
        start = getattr(cache, "parallax_document_start", None) if past else None
        start = torch.zeros(bs, dtype=torch.long, device=input_ids.device) if start is None else start
        starts, following = document_starts(input_ids, self.config.eos_token_id, past, start)
        if cache is not None:
            cache.parallax_document_start = following
        return starts


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
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, cache=None, **kwargs):
        """Logits (B, T, vocab) (the last ``logits_to_keep`` positions when > 0); the cache is
        transformers' (``cache`` or ``past_key_values``, created when ``use_cache``)."""
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache()
        h = self.model(input_ids, attention_mask, position_ids, inputs_embeds, cache if use_cache else None)
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep > 0 else h
        else:
            h = h[:, logits_to_keep]
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache if use_cache else None})
