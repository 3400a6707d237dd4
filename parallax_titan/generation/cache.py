"""Caches for generation: a static KV cache for the attention variants, fla's recurrent state for
the fla mixers.

:class:`KVCache` is allocated once for ``batch`` rows of ``capacity`` positions: per layer k and v
(batch, capacity, Hkv, D) in the layout ``kernels.parallax_decode`` reads, the valid length of
every row (``seqlens``, int32 on the device) and, for Parallax, one ``kernels.DecodePlan`` for the
cache's geometry. Nothing is allocated or read back per step, so a decode step over it can be
captured in a CUDA graph.

:class:`RecurrentCache` holds fla's ``Cache`` (conv and recurrent states per layer). fla's layers
replace their states every step, so it is eager only.
"""

from __future__ import annotations

import torch

from kernels import DecodePlan
from parallax_titan.mixers import FLA_MIXERS
from parallax_titan.model import DecodeStep, KVLayer

ATTENTION_MIXERS = ("softmax", "parallax")


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return value


def model_dtype_device(model: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    """The dtype and device of the model's parameters."""
    param = next(model.parameters())
    return param.dtype, param.device


class KVCache:
    """Static KV cache of a softmax or Parallax model: ``batch`` rows of ``capacity`` positions.

    k, v: (n_layers, batch, capacity, Hkv, D) in the model's dtype, zeroed (slots past a row's
    length are never read into a result, but SDPA multiplies them by zero weights, so they must be
    finite). seqlens: (batch,) int32, valid positions per row. ``layers[i]`` is block i's
    :class:`parallax_titan.model.KVLayer`. capacity may not exceed the model's RoPE table
    (``model_args.max_seq_len`` positions).
    """

    def __init__(self, model: torch.nn.Module, batch: int, capacity: int):
        args = model.model_args
        if args.mixer not in ATTENTION_MIXERS:
            raise ValueError(f"KVCache: mixer {args.mixer!r} has no KV cache; expected one of {ATTENTION_MIXERS} "
                             "(fla mixers use RecurrentCache)")
        self.batch, self.capacity = _positive("batch", batch), _positive("capacity", capacity)
        positions = model.rope_cache.shape[0]
        if capacity > positions:
            raise ValueError(f"capacity: {capacity} positions exceed the model's RoPE table of {positions} "
                             "(model_args.max_seq_len); build the model with a larger max_seq_len")
        dtype, device = model_dtype_device(model)
        shape = (args.n_layers, batch, capacity, args.n_kv_heads, args.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.rows = torch.arange(batch, device=device)
        self.slot_ids = torch.arange(capacity, device=device)
        self.layers = [KVLayer(self.k[i], self.v[i]) for i in range(args.n_layers)]
        self.plan = None
        if args.mixer == "parallax":
            scale = next(iter(model.layers.values())).attention.scaling
            self.plan = DecodePlan(batch, args.n_heads, args.n_kv_heads, args.head_dim, capacity, dtype, device,
                                   scale=scale, backend=args.attn_backend, window=args.window or None)

    def set_lengths(self, rows: torch.Tensor, lengths: torch.Tensor) -> None:
        """Rows ``rows`` now hold ``lengths`` valid positions (both (n,) on the cache's device)."""
        self.seqlens.index_copy_(0, rows, lengths.to(torch.int32))

    def decode_step(self) -> DecodeStep:
        """The step that appends one token to every row, read from ``seqlens`` on the device.

        A full row (length == capacity) writes over its last slot instead (its result is not
        valid: the caller starts it again with a prefill).
        """
        slots = self.seqlens.clamp(max=self.capacity - 1).long()
        seqlens = (slots + 1).to(torch.int32)
        valid = (self.slot_ids < seqlens[:, None])[:, None, None, :]
        return DecodeStep(slots=slots, seqlens=seqlens, rows=self.rows, plan=self.plan, valid=valid)

    def advance(self, step: DecodeStep) -> None:
        """Record the step's token in every row's length."""
        self.seqlens.copy_(step.seqlens)

    def layer_caches(self) -> list[KVLayer]:
        return self.layers


def fla_cache_class():
    """fla's cache (``fla.models.utils.Cache``): the state dicts of every fla layer, batch first."""
    from fla.models.utils import Cache

    return Cache


def _map_pair(function, target, source):
    """Apply ``function(target_tensor, source_tensor)`` over two state structures of one shape."""
    if isinstance(target, torch.Tensor):
        return function(target, source)
    if isinstance(target, dict):
        return {key: _map_pair(function, value, source[key]) for key, value in target.items()}
    if isinstance(target, (tuple, list)):
        return type(target)(_map_pair(function, t, s) for t, s in zip(target, source, strict=True))
    return target


def _stack_rows(states: list):
    """One state structure whose tensors are the per-row structures' tensors concatenated (dim 0)."""
    first = states[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(states, dim=0)
    if isinstance(first, dict):
        return {key: _stack_rows([s[key] for s in states]) for key in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_stack_rows(list(parts)) for parts in zip(*states, strict=True))
    return first


class RecurrentCache:
    """fla's recurrent state for a model whose mixers are fla layers (CUDA only).

    Prompts are prefilled one row at a time (fla's layers then see no padding) and their states are
    stacked along the batch; :meth:`merge_rows` replaces the states of some rows.
    """

    def __init__(self, model: torch.nn.Module, batch: int):
        mixer = model.model_args.mixer
        if mixer not in FLA_MIXERS:
            raise ValueError(f"RecurrentCache: mixer {mixer!r} is not an fla mixer ({', '.join(FLA_MIXERS)})")
        _, device = model_dtype_device(model)
        if device.type != "cuda":
            raise RuntimeError(f"mixer {mixer!r}: cached generation runs fla's recurrent kernels, which need a CUDA "
                               f"device; the model is on {device}")
        self.batch = _positive("batch", batch)
        self.n_layers = model.model_args.n_layers
        self.state = None  # fla Cache for the whole batch, set by the first full prefill

    def new_row_cache(self):
        """An empty fla cache for prefilling one prompt."""
        return fla_cache_class()()

    def merge_rows(self, rows: list[int], row_caches: list) -> None:
        """Make row ``rows[j]`` of the batch state that of ``row_caches[j]`` (a one-row fla cache)."""
        states = [cache.to_legacy_cache() for cache in row_caches]
        seen = max(cache.get_seq_length() for cache in row_caches)
        if self.state is None:
            if sorted(rows) != list(range(self.batch)):
                raise ValueError(f"rows: the first prefill must start every row 0..{self.batch - 1}, got {rows}")
            order = sorted(range(len(rows)), key=rows.__getitem__)
            merged = tuple(_stack_rows([states[j][layer] for j in order]) for layer in range(self.n_layers))
        else:
            merged = list(self.state.to_legacy_cache())
            index = torch.tensor(rows)
            for layer in range(self.n_layers):
                rows_state = _stack_rows([s[layer] for s in states])
                merged[layer] = _map_pair(lambda t, s: t.index_copy(0, index.to(t.device), s), merged[layer],
                                          rows_state)
            seen = max(seen, self.state.get_seq_length())
        self.state = fla_cache_class().from_legacy_cache(tuple(merged), seen_tokens=seen)

    def layer_caches(self) -> list:
        if self.state is None:
            raise RuntimeError("RecurrentCache: decode before any prefill")
        return [self.state] * self.n_layers
