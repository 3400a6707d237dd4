"""Generation over a :class:`~parallax_titan.generation.session.DecodeSession`.

:class:`Generator` holds one session (cache, and the CUDA graph when asked for) and reuses it for
every call. :meth:`Generator.generate` takes token-id prompts, runs them in batches of the
session's size (in the order given: sort by length for similar lengths per batch), prefills each
batch, then samples one token per row per step until every row has finished: an end token, a stop
string, ``max_new_tokens``, or a full cache.

A row whose sequence outgrows the cache either finishes (``overflow = "stop"``) or keeps the last
``capacity`` tokens as its context, prefilled again for every further token (``"slide"``: what
recomputing the whole window per token gives, lm-eval's truncation). With a model trained on
block-causal masks, a token after the end-of-document token starts its row again from itself
(RoPE is relative, so this is the document mask of training).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from parallax_titan.generation.cache import ATTENTION_MIXERS
from parallax_titan.generation.sampling import Sampler, SamplingParams, token_ids
from parallax_titan.generation.session import DecodeSession, prompt_tokens
from parallax_titan.generation.text import TextStream, cut_at_stop

Overflow = Literal["stop", "slide"]
OnText = Callable[[int, str], None]


@dataclass(frozen=True)
class StopCriteria:
    """When one sequence ends. max_new_tokens: tokens to generate at most; stop: strings that end it
    (the text is cut before the first; empty ones are ignored), or one string; stop_token_ids: int
    tokens that end it (not included), or one int. ValueError naming the field otherwise."""

    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected a positive integer, got {self.max_new_tokens!r}")
        # a bare string is one stop string (tuple("###") would stop at any "#"), a bare int one id
        stop = (self.stop,) if isinstance(self.stop, str) else _items("stop", self.stop)
        ids = self.stop_token_ids
        one_id = isinstance(ids, numbers.Integral) and not isinstance(ids, bool)
        ids = (ids,) if one_id else _items("stop_token_ids", ids)
        # an int stop string failed in the text search after the prefill; a float id was truncated
        # (1.5 stopped at token 1), a bool taken as 0 or 1
        if not all(isinstance(s, str) for s in stop):
            raise ValueError(f"stop: expected strings, got {stop!r}")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"stop_token_ids: expected ints, got {ids!r}")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))


def _items(name: str, value) -> tuple:
    """``value`` (an iterable) as a tuple; ValueError naming ``name`` for anything else (None, a float)."""
    if not isinstance(value, Iterable):
        raise ValueError(f"{name}: expected a sequence, got {type(value).__name__} {value!r:.60}")
    return tuple(value)


@dataclass
class Completion:
    """One generated sequence: tokens (the end token excluded), text (when a tokenizer was given,
    cut before a stop string) and why it ended: "stop_token", "stop", "length" (max_new_tokens) or
    "capacity" (the cache is full)."""

    tokens: list[int] = field(default_factory=list)
    text: str | None = None
    finish_reason: str = ""


class _Row:
    """A sequence being generated in one cache row.

    Its context, what the cache holds for the next token, is the end of ``history``: from the
    first token after the last end of document before the newest token (block-causal models:
    ``document_end``), and at most ``capacity`` tokens when the window slides. ``start`` is where
    the cached context begins; when the context's start moves, the row is prefilled again.
    """

    def __init__(self, index: int, prompt: list[int], stopping: StopCriteria, decode, capacity: int,
                 overflow: Overflow, document_end: int | None):
        self.index, self.stopping = index, stopping
        self.capacity, self.overflow, self.document_end = capacity, overflow, document_end
        self.history = list(prompt)
        ends = [i for i, t in enumerate(prompt[:-1]) if t == document_end] if document_end is not None else []
        self.document_start = ends[-1] + 1 if ends else 0
        self.start = self.context_start()
        self.completion = Completion()
        self.stream = TextStream(decode, stopping.stop) if decode is not None else None

    def context_start(self) -> int:
        if self.overflow == "slide":
            return max(self.document_start, len(self.history) - self.capacity)
        return self.document_start

    def context(self) -> list[int]:
        """The tokens the cache holds for the next token."""
        return self.history[self.context_start():]

    def accept(self, token: int) -> str:
        """Take the sampled ``token``; returns newly settled text. Sets ``finish_reason`` when the
        row ends."""
        done = self.completion
        if token in self.stopping.stop_token_ids:
            done.finish_reason = "stop_token"
            return self.stream.flush() if self.stream else ""
        if self.history[-1] == self.document_end:
            self.document_start = len(self.history)  # this token starts a new document
        done.tokens.append(token)
        self.history.append(token)
        text = ""
        if self.stream is not None:
            text = self.stream.add(token)
            if self.stream.stopped:
                done.finish_reason = "stop"
        if not done.finish_reason and len(done.tokens) >= self.stopping.max_new_tokens:
            done.finish_reason = "length"
        if not done.finish_reason and len(self.history) - self.context_start() > self.capacity:
            done.finish_reason = "capacity"  # overflow == "stop": the token cannot be cached
        if done.finish_reason and self.stream is not None:
            text += self.stream.flush()
        return text

    @property
    def finished(self) -> bool:
        return bool(self.completion.finish_reason)


class Generator:
    """Generation with ``model`` (eval mode, any variant) for up to ``batch_size`` sequences of
    ``capacity`` positions at once; graph: decode steps as one CUDA graph (CUDA, attention models).

    document_end: the end-of-document token id, needed by models trained with block-causal masks
    (``model_args.needs_document_masks``): a token after it does not see the tokens before it.
    """

    def __init__(self, model: torch.nn.Module, *, batch_size: int, capacity: int, graph: bool = False,
                 document_end: int | None = None):
        if model.model_args.needs_document_masks and document_end is None:
            raise ValueError("document_end: the model attends within documents (attn_mask_type = 'block_causal'); "
                             "pass the end-of-document token id")
        vocab = model.model_args.vocab_size
        if document_end is not None and (isinstance(document_end, bool) or not isinstance(document_end, int)
                                         or not 0 <= document_end < vocab):
            # an id the model never emits: no document would ever end
            raise ValueError(f"document_end: expected a token id in [0, {vocab}) or None, got {document_end!r}")
        self.session = DecodeSession(model, batch_size, capacity, graph=graph)
        self.batch_size, self.capacity = batch_size, capacity
        self.vocab_size = vocab
        self.document_end = document_end if model.model_args.needs_document_masks else None

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams = SamplingParams(),
                 stopping: StopCriteria | Sequence[StopCriteria] = StopCriteria(), *,
                 decode: Callable[[list[int]], str] | None = None, on_text: OnText | None = None,
                 overflow: Overflow = "stop") -> list[Completion]:
        """Complete every prompt (lists of token ids, at least one token each).

        stopping: one for all prompts or one each. decode: token ids -> text, needed for stop
        strings and text. on_text(prompt_index, text): called with each piece of settled text as
        it is generated (streaming; needs decode). overflow: "stop" or "slide" (module docstring);
        with "stop" a prompt longer than the capacity is an error, with "slide" it keeps its last
        tokens. ValueError for a stop token id outside the model's vocabulary (it would stop nothing).
        """
        _check_prompt_list(prompts)
        stoppings = _per_prompt(stopping, len(prompts))
        _check_stop_ids(stoppings, self.vocab_size)
        if overflow not in ("stop", "slide"):
            raise ValueError(f"overflow: expected 'stop' or 'slide', got {overflow!r}")
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling: expected a SamplingParams, got {type(sampling).__name__}")
        for name, function in (("decode", decode), ("on_text", on_text)):
            if function is not None and not callable(function):  # they are first called after the prefill
                raise ValueError(f"{name}: expected a callable or None, got {type(function).__name__}")
        if on_text is not None and decode is None:  # it receives decoded text: it would never be called
            raise ValueError("on_text: streaming text needs decode (token ids -> text), got decode None")
        rows = []
        for i, (prompt, crit) in enumerate(zip(prompts, stoppings)):
            tokens = prompt_tokens(i, prompt, self.vocab_size)
            if crit.stop and decode is None:
                raise ValueError("stop: stop strings need decode (token ids -> text)")
            rows.append(_Row(i, tokens, crit, decode, self.capacity, overflow, self.document_end))
            if len(rows[-1].context()) > self.capacity:
                raise ValueError(f"prompts[{i}]: {len(rows[-1].context())} tokens exceed the capacity of "
                                 f"{self.capacity}")
        sampler = None
        for start in range(0, len(rows), self.batch_size):
            sampler = self._run_batch(rows[start : start + self.batch_size], sampling, sampler, on_text)
        for row in rows:
            row.completion.text = row.stream.text if row.stream is not None else None
        return [row.completion for row in rows]

    def _run_batch(self, rows: list[_Row], sampling: SamplingParams, sampler, on_text) -> Sampler:
        session = self.session
        contexts = [row.context() for row in rows]
        contexts += [contexts[0][:1]] * (self.batch_size - len(rows))  # idle rows keep the shapes fixed
        logits = session.prefill(contexts)
        if sampler is None:
            sampler = Sampler(sampling, self.batch_size, logits.shape[-1], logits.device)
        for i, context in enumerate(contexts):
            sampler.observe(i, rows[i].history if i < len(rows) else context)
        while True:
            tokens = sampler(logits)
            for row, token in zip(rows, token_ids(tokens)):
                if not row.finished:
                    text = row.accept(token)
                    if text and on_text is not None:
                        on_text(row.index, text)
            if all(row.finished for row in rows):
                return sampler
            logits = session.step(tokens)
            moved = [i for i, row in enumerate(rows) if not row.finished and row.context_start() != row.start]
            if moved:  # a new document or a sliding window: the row's context, prefilled again
                logits = logits.clone()
                logits[moved] = session.prefill([rows[i].context() for i in moved], rows=moved).to(logits.dtype)
                for i in moved:
                    rows[i].start = rows[i].context_start()


def _check_prompt_list(prompts) -> None:
    """ValueError unless ``prompts`` is a sequence (of prompts) or a tensor: its length is taken
    before any prompt is read (a generator has none)."""
    if not isinstance(prompts, (Sequence, torch.Tensor)) or isinstance(prompts, (str, bytes)):
        raise ValueError(f"prompts: expected a sequence of prompts (each a list of int token ids), got "
                         f"{type(prompts).__name__} {prompts!r:.60}")


def _check_stop_ids(stoppings: list[StopCriteria], vocab_size: int) -> None:
    """ValueError naming the stop criteria whose stop_token_ids the model never emits (outside
    ``[0, vocab_size)``, such as the end token of another tokenizer): their rows would silently run
    to max_new_tokens."""
    for i, crit in enumerate(stoppings):
        bad = [t for t in crit.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"stopping[{i}]: stop_token_ids {bad} are outside the model's vocabulary of {vocab_size} "
                             f"(expected 0 to {vocab_size - 1}); no row would stop on them")


def _per_prompt(stopping, count: int) -> list[StopCriteria]:
    if isinstance(stopping, StopCriteria):
        return [stopping] * count
    stoppings = list(stopping) if isinstance(stopping, Sequence) else None
    if stoppings is None or len(stoppings) != count or not all(isinstance(s, StopCriteria) for s in stoppings):
        got = f"{len(stoppings)} items" if stoppings is not None else type(stopping).__name__
        raise ValueError(f"stopping: expected one StopCriteria or {count} of them, got {got}")
    return stoppings


def generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], sampling: SamplingParams = SamplingParams(),
             stopping: StopCriteria | Sequence[StopCriteria] = StopCriteria(), *, batch_size: int | None = None,
             capacity: int | None = None, graph: bool = False, decode=None, on_text: OnText | None = None,
             document_end: int | None = None) -> list[Completion]:
    """One-off generation: a :class:`Generator` sized for these prompts (batch: all of them, or
    ``batch_size``; capacity: the longest prompt plus its max_new_tokens, which must fit an
    attention model's RoPE table, or ``capacity``)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        # 0 would have meant "all prompts", unlike every other count here
        raise ValueError(f"batch_size: expected a positive integer or None (all prompts at once), got {batch_size!r}")
    _check_prompt_list(prompts)
    stoppings = _per_prompt(stopping, len(prompts))
    if not stoppings:
        return []  # no prompts: nothing to size a generator for
    if capacity is None:
        capacity = _capacity_for(model, prompts, stoppings)
    generator = Generator(model, batch_size=batch_size or len(prompts), capacity=capacity, graph=graph,
                          document_end=document_end)
    return generator.generate(prompts, sampling, stoppings, decode=decode, on_text=on_text)


def _capacity_for(model: torch.nn.Module, prompts, stoppings: list[StopCriteria]) -> int:
    """The positions of the longest prompt plus its max_new_tokens (the prompts checked as ids
    first). ValueError naming max_new_tokens, the value the caller chose, when an attention
    model's RoPE table is shorter (the cache would name the capacity sized here)."""
    vocab = model.model_args.vocab_size
    lengths = [len(prompt_tokens(i, prompt, vocab)) for i, prompt in enumerate(prompts)]
    need, i = max((n + crit.max_new_tokens, i) for i, (n, crit) in enumerate(zip(lengths, stoppings)))
    positions = model.rope_cache.shape[0]
    if model.model_args.mixer in ATTENTION_MIXERS and need > positions:
        raise ValueError(f"max_new_tokens: prompts[{i}] ({lengths[i]} tokens) plus max_new_tokens = "
                         f"{stoppings[i].max_new_tokens} need {need} positions, more than the model's RoPE table of "
                         f"{positions} (model_args.max_seq_len); ask for fewer new tokens, or pass "
                         f"capacity={positions} (a row then ends with finish_reason 'capacity')")
    return need


__all__ = ["Completion", "Generator", "StopCriteria", "cut_at_stop", "generate"]
