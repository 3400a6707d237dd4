"""A model and its cache: prefill prompts into cache rows, then one token per row per step.

:class:`DecodeSession` keeps ``batch`` sequences. :meth:`~DecodeSession.prefill` runs prompts
through the training kernels and fills their rows; :meth:`~DecodeSession.step` appends one token to
every row and returns the next-token logits. With ``graph=True`` (CUDA, attention variants) the
whole step, from the embedding to the logits, is one CUDA graph captured when the session is
built, for its fixed batch and capacity: a step is then one graph replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from parallax_titan.generation.cache import ATTENTION_MIXERS, KVCache, RecurrentCache, model_dtype_device
from parallax_titan.model import PrefillStep


class DecodeSession:
    """``model`` (eval mode, any variant) with a cache of ``batch`` rows of ``capacity`` positions.

    graph: capture the decode step in a CUDA graph (attention variants on CUDA). ``lengths`` (host
    list) mirrors the valid positions per row, so no step reads anything back from the device.
    """

    def __init__(self, model: torch.nn.Module, batch: int, capacity: int, *, graph: bool = False):
        self.model = model
        self.mixer = model.model_args.mixer
        _, self.device = model_dtype_device(model)
        if self.mixer in ATTENTION_MIXERS:
            self.cache = KVCache(model, batch, capacity)
        else:
            self.cache = RecurrentCache(model, batch)
        self.batch, self.capacity = batch, capacity
        self.lengths = [0] * batch
        self._graph = None
        if graph:
            self._capture()

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, prompts: Sequence[Sequence[int]], rows: Sequence[int] | None = None) -> torch.Tensor:
        """Start the sequences of cache rows ``rows`` (default 0..len(prompts)-1) with ``prompts``.

        prompts: token id lists, each of 1..capacity tokens. Returns the next-token logits
        (len(prompts), vocab) in the model's dtype. Other rows keep their sequences.
        """
        rows = list(range(len(prompts))) if rows is None else list(rows)
        self._check_prompts(prompts, rows)
        if isinstance(self.cache, KVCache):
            logits = self._prefill_attention(prompts, rows)
        else:
            logits = self._prefill_recurrent(prompts, rows)
        for row, prompt in zip(rows, prompts):
            self.lengths[row] = len(prompt)
        return logits

    def _check_prompts(self, prompts, rows) -> None:
        if len(rows) != len(prompts) or len(set(rows)) != len(rows) or not all(0 <= r < self.batch for r in rows):
            raise ValueError(f"rows: expected {len(prompts)} distinct rows in [0, {self.batch}), got {rows}")
        for prompt in prompts:
            if not 1 <= len(prompt) <= self.capacity:
                raise ValueError(f"prompts: a prompt of {len(prompt)} tokens; expected 1 to capacity = "
                                 f"{self.capacity} tokens")

    def _prefill_attention(self, prompts, rows) -> torch.Tensor:
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        tokens = torch.zeros((len(prompts), int(max(map(len, prompts)))), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long)
        rows_t = torch.tensor(rows, device=self.device)
        logits = self.model.forward_cached(tokens.to(self.device), self.cache.layer_caches(), PrefillStep(rows_t),
                                           last=lengths - 1)
        self.cache.set_lengths(rows_t, lengths)
        return logits

    def _prefill_recurrent(self, prompts, rows) -> torch.Tensor:
        logits, row_caches = [], []
        for prompt in prompts:
            row_cache = self.cache.new_row_cache()
            tokens = torch.as_tensor([list(prompt)], dtype=torch.long, device=self.device)
            logits.append(self.model.forward_cached(tokens, [row_cache] * self.cache.n_layers, None))
            row_caches.append(row_cache)
        self.cache.merge_rows(rows, row_caches)
        return torch.cat(logits)

    # ------------------------------------------------------------------ decode
    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` (batch,) int64 (one per row, on the model's device) and return the
        next-token logits (batch, vocab) in the model's dtype.

        With a graph the result is the graph's output buffer, overwritten by the next step: read
        it (or clone it) first. A row already at capacity gets an undefined result; start it
        again with :meth:`prefill`.
        """
        if tokens.shape != (self.batch,) or tokens.dtype != torch.long:
            raise ValueError(f"tokens: expected int64 of shape ({self.batch},), got {tokens.dtype} "
                             f"{tuple(tokens.shape)}")
        if self._graph is not None:
            self._tokens.copy_(tokens)
            self._graph.replay()
            logits = self._logits
        else:
            logits = self._decode(tokens)
        self.lengths = [min(n + 1, self.capacity) for n in self.lengths]
        return logits

    def _decode(self, tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(self.cache, KVCache):
            step = self.cache.decode_step()
            logits = self.model.forward_cached(tokens[:, None], self.cache.layer_caches(), step)
            self.cache.advance(step)
            return logits
        return self.model.forward_cached(tokens[:, None], self.cache.layer_caches(), None)

    def _capture(self) -> None:
        """Capture :meth:`_decode` for the session's fixed shapes in a CUDA graph.

        Two warm-up steps run first on a side stream (Triton compiles its kernels, the decode
        plan's first call); they write slot 0 of every row, which the first prefill overwrites.
        """
        if not isinstance(self.cache, KVCache) or self.device.type != "cuda":
            raise ValueError(f"graph: CUDA-graph decoding needs an attention model ({', '.join(ATTENTION_MIXERS)}) "
                             f"on CUDA; got mixer {self.mixer!r} on {self.device}")
        self._tokens = torch.zeros(self.batch, dtype=torch.long, device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(2):
                self._decode(self._tokens)
                self.cache.seqlens.zero_()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self._graph):
            self._logits = self._decode(self._tokens)
