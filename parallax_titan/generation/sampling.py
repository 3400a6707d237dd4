"""Next-token choice: greedy, temperature, top-k, top-p, repetition penalty, seeded.

The order is that of Hugging Face ``generate``: the repetition penalty on the raw logits, then
temperature, top-k, top-p, and a draw from what is left. ``temperature = 0`` is greedy (the
penalty still applies). :func:`token_probabilities` is the distribution a draw is taken from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from parallax_titan.config.schema import seed_problem


NOT_FINITE = -1
"""The token :class:`Sampler` gives a row whose logits hold inf or NaN (:func:`token_ids` refuses it)."""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen (the same for every row of a batch).

    temperature: 0 = greedy (argmax), else logits / temperature. top_k: keep the k most likely
    tokens (0 = all). top_p: keep the smallest set of most likely tokens whose probability reaches
    top_p (1 = all). repetition_penalty: a token already in the sequence (prompt or generated) has
    its logit divided by the penalty if positive, multiplied if negative (1 = off). seed: seeds the
    draws, an integer in [0, 2**64) (None: a fresh random seed).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every out-of-range field, as ``"<field>: ..."``."""
        out = []
        if not _finite(self.temperature) or self.temperature < 0:
            out.append(f"temperature: expected a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            out.append(f"top_k: expected an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            out.append(f"top_p: expected a number in (0, 1] (1 = off), got {self.top_p!r}")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            out.append(f"repetition_penalty: expected a number > 0 (1 = off), got {self.repetition_penalty!r}")
        # torch.Generator takes a seed as 64 bits: -1 would silently be the fixed seed 2**64 - 1 (not
        # "random", as in other tools), and 2**64 an overflow error only once generation starts
        seed = seed_problem("seed", self.seed, unset="None (a fresh random seed)")
        return out + ([seed] if seed else [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Repetition penalty: logits (batch, vocab) fp32, seen (batch, vocab) bool -> new logits.

    Kept finite: a tiny penalty overflows a seen positive logit to inf (a huge one a negative
    logit to -inf), and the shift by the row's maximum in :func:`_tempered` gives inf - inf = NaN."""
    if penalty == 1.0:
        return logits
    largest = torch.finfo(logits.dtype).max
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty).clamp(-largest, largest)
    return torch.where(seen, scaled, logits)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits (batch, vocab) with every token outside the top-k and the top-p nucleus at -inf.

    The nucleus is the smallest prefix of the tokens sorted by probability (after top-k) whose
    probability reaches top_p; a token is kept when the tokens before it hold less than top_p.
    """
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def token_probabilities(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution the next token is drawn from, (batch, vocab) fp32, for temperature > 0.

    logits (batch, vocab) any float dtype; seen: (batch, vocab) bool on the logits' device, tokens
    already in each sequence (needed for a repetition penalty). ValueError for other shapes.
    """
    if params.greedy:
        raise ValueError("token_probabilities: temperature = 0 is greedy (argmax), not a distribution")
    check_logits("token_probabilities", logits)
    if seen is not None and (not isinstance(seen, torch.Tensor) or seen.dtype != torch.bool
                             or seen.shape != logits.shape or seen.device != logits.device):
        got = f"{seen.dtype} {tuple(seen.shape)} on {seen.device}" if isinstance(seen, torch.Tensor) else seen
        raise ValueError(f"token_probabilities: seen must be bool of the logits' shape {tuple(logits.shape)} on "
                         f"{logits.device}, got {got}")
    logits = _penalized(logits, params, seen)
    logits = filter_top_k_top_p(_tempered(logits, params.temperature), params.top_k, params.top_p)
    return torch.softmax(logits, dim=-1)


def check_logits(who: str, logits, shape=None) -> None:
    """Raise a ValueError naming ``who`` unless logits is a floating (batch, vocab) tensor (of
    ``shape`` where given): a wrong shape failed deep in the penalty or the top-k mask, or
    broadcast. Shapes only: nothing is read back."""
    if (not isinstance(logits, torch.Tensor) or logits.ndim != 2 or not logits.is_floating_point()
            or (shape is not None and logits.shape != shape)):
        got = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"{who}: logits must be a floating tensor of shape {shape or '(batch, vocab)'}, got {got}")


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature, shifted so that each row's largest is 0 (the softmax is the same).

    With a tiny temperature, unshifted fp32 logits overflow to inf and the softmax gives NaN;
    shifted, the others go to -inf and the draw is the argmax (ties shared). A temperature below
    the dtype's smallest normal number would round to 0 (0 / 0 at the maximum): it is that number.
    """
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    return shifted / max(temperature, torch.finfo(logits.dtype).tiny)


def _penalized(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None) -> torch.Tensor:
    logits = logits.float()
    if params.repetition_penalty != 1.0:
        if seen is None:
            raise ValueError("repetition_penalty: needs the tokens seen so far (seen)")
        logits = penalize(logits, seen, params.repetition_penalty)
    return logits


class Sampler:
    """Chooses one token per row from logits, remembering each row's tokens for the penalty.

    batch, vocab: the logits' shape; device: theirs. The draws use one ``torch.Generator`` seeded
    with ``params.seed``, so a seeded run repeats exactly on the same device.
    """

    def __init__(self, params: SamplingParams, batch: int, vocab: int, device: torch.device):
        self.params = params
        self.shape = (batch, vocab)
        self.seen = None
        if params.repetition_penalty != 1.0:
            self.seen = torch.zeros((batch, vocab), dtype=torch.bool, device=device)
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if params.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(params.seed)

    def observe(self, row: int, tokens) -> None:
        """Row ``row`` (an int in [0, batch)) now contains ``tokens`` (a list of ids in [0, vocab); a new
        prompt resets it). ValueError for another row or id: a negative one marked a row or token from
        the end."""
        if self.seen is not None:
            batch, vocab = self.shape
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < batch:  # -1: the last row
                raise ValueError(f"Sampler.observe: row must be an int in [0, {batch}), got {row!r}")
            if not all(0 <= t < vocab for t in tokens):
                raise ValueError(f"Sampler.observe: tokens of row {row} must lie in [0, {vocab}), got "
                                 f"{[t for t in tokens if not 0 <= t < vocab][:8]}")
            self.seen[row].zero_()
            self.seen[row, torch.as_tensor(list(tokens), dtype=torch.long, device=self.seen.device)] = True

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of every row, (batch,) int64 on the logits' device; each also counts as
        seen from now on. A row whose logits hold inf or NaN gets :data:`NOT_FINITE` (the argmax of
        NaN is a token like any other, and a draw from it fails inside torch.multinomial: a
        device-side assert on CUDA). Nothing is read back here: :func:`token_ids`, the one read of
        each step, refuses those rows."""
        check_logits("Sampler", logits, self.shape)
        finite = torch.isfinite(logits).all(dim=-1)
        logits = torch.where(finite[:, None], logits, 0.0)  # a legal draw; its token is replaced below
        if self.params.greedy:
            tokens = _penalized(logits, self.params, self.seen).argmax(dim=-1)
        else:
            probs = token_probabilities(logits, self.params, self.seen)
            tokens = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
        if self.seen is not None:
            rows = torch.arange(tokens.shape[0], device=tokens.device)
            self.seen[rows, tokens] |= finite
        return torch.where(finite, tokens, NOT_FINITE)


def token_ids(tokens: torch.Tensor) -> list[int]:
    """A step's tokens (batch,) from :class:`Sampler` as a list, read back once. Raises ValueError
    naming the rows whose logits were not finite (:data:`NOT_FINITE`)."""
    ids = tokens.tolist()
    rows = [i for i, token in enumerate(ids) if token == NOT_FINITE]
    if rows:
        raise ValueError(f"logits: rows {rows} of the batch hold inf or NaN; the model overflowed its dtype "
                         "(float16 holds at most 65504: run it in bfloat16 or float32) or its weights are "
                         "not finite")
    return ids
