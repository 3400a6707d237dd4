"""A model and its cache: prefill prompts into cache rows, then one token per row per step.

:class:`DecodeSession` keeps ``batch`` sequences. :meth:`~DecodeSession.prefill` runs prompts
through the training kernels and fills their rows; :meth:`~DecodeSession.step` appends one token to
every row and returns the next-token logits. With ``graph=True`` (CUDA, attention variants) the
whole step, from the embedding to the logits, is one CUDA graph captured when the session is
built, for its fixed batch and capacity: a step is then one graph replay.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from parallax_titan.generation.cache import ATTENTION_MIXERS, KVCache, RecurrentCache, model_dtype_device
from parallax_titan.model import PrefillStep


def _index(value) -> bool:
    """Whether ``value`` is an int (a bool is not: it would run as 0 or 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def prompt_tokens(index: int, prompt, vocab_size: int) -> list[int]:
    """Prompt ``index`` (a sequence of int token ids, or a 1-D integer tensor) as a list of ints, each
    a row of the embedding; ValueError naming the prompt otherwise. A float id was truncated and a
    bool taken as 0 or 1 without a word, a string split into characters; an id outside
    ``[0, vocab_size)`` (a prompt from another tokenizer) was an IndexError in the embedding on CPU
    and a device-side assert, which ends the process, on CUDA."""
    if isinstance(prompt, torch.Tensor):
        if prompt.ndim != 1 or prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise ValueError(f"prompts[{index}]: a tensor prompt must be 1-D of an integer dtype, got {prompt.dtype} "
                             f"of shape {tuple(prompt.shape)}")
        tokens = prompt.tolist()
    elif isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)):
        tokens = list(prompt)
    else:
        raise ValueError(f"prompts[{index}]: expected a sequence of token ids, got {type(prompt).__name__} "
                         f"{prompt!r:.60} (a prompt is a list of int ids: tokenize text first)")
    wrong = next(((p, t) for p, t in enumerate(tokens) if not _index(t)), None)
    if wrong is not None:
        raise ValueError(f"prompts[{index}]: token id {wrong[1]!r} at position {wrong[0]} is a "
                         f"{type(wrong[1]).__name__}; expected an int")
    tokens = [int(t) for t in tokens]
    if not tokens:
        raise ValueError(f"prompts[{index}]: empty; expected at least one token")
    if not 0 <= min(tokens) <= max(tokens) < vocab_size:  # cheap on long prompts; find the culprit only then
        position, token = next((p, t) for p, t in enumerate(tokens) if not 0 <= t < vocab_size)
        raise ValueError(f"prompts[{index}]: token id {token} at position {position} is outside the model's "
                         f"vocabulary of {vocab_size} (expected 0 to {vocab_size - 1})")
    return tokens


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
        """Start the sequences of cache rows ``rows`` (distinct ints or a 1-D integer tensor; default
        0..len(prompts)-1) with ``prompts``.

        prompts: token id lists (or 1-D integer tensors), each of 1..capacity ids in [0, vocab)
        (ValueError otherwise, before any work). Returns the next-token logits (len(prompts), vocab)
        in the model's dtype. Other rows keep their sequences.
        """
        if rows is None:
            rows = list(range(len(prompts)))
        rows = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)  # tensors hash by identity
        prompts = self._check_prompts(prompts, rows)
        if isinstance(self.cache, KVCache):
            logits = self._prefill_attention(prompts, rows)
        else:
            logits = self._prefill_recurrent(prompts, rows)
        for row, prompt in zip(rows, prompts):
            self.lengths[row] = len(prompt)
        return logits

    def _check_prompts(self, prompts, rows) -> list[list[int]]:
        """The prompts as lists of ids (``prompt_tokens``), each at most capacity long."""
        if not prompts:  # else "max() arg is an empty sequence" from the padding
            raise ValueError("prompts: expected at least one prompt, got none")
        if (len(rows) != len(prompts) or len(set(rows)) != len(rows)
                or not all(_index(r) and 0 <= r < self.batch for r in rows)):
            raise ValueError(f"rows: expected {len(prompts)} distinct int rows in [0, {self.batch}), got {rows}")
        prompts = [prompt_tokens(i, prompt, self.model.model_args.vocab_size) for i, prompt in enumerate(prompts)]
        for prompt in prompts:
            if len(prompt) > self.capacity:
                raise ValueError(f"prompts: a prompt of {len(prompt)} tokens; expected 1 to capacity = "
                                 f"{self.capacity} tokens")
        return prompts

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
        """Append ``tokens`` (batch,) int64 (one per row, on the model's device, ids in [0, vocab):
        not checked, that would read them back) and return the next-token logits (batch, vocab) in
        the model's dtype.

        With a graph the result is the graph's output buffer, overwritten by the next step: read
        it (or clone it) first. A row already at capacity gets an undefined result; start it
        again with :meth:`prefill`.
        """
        if tokens.shape != (self.batch,) or tokens.dtype != torch.long or tokens.device != self.device:
            raise ValueError(f"tokens: expected int64 of shape ({self.batch},) on {self.device}, got {tokens.dtype} "
                             f"{tuple(tokens.shape)} on {tokens.device}")
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
