"""The six MAD tasks (Poli et al. 2024): generators and train/test datasets.

Each generator takes a numpy ``Generator`` and returns int64 arrays (inputs, train_targets,
test_targets) of shape (num_examples, length); ``IGNORE`` (-100) marks unscored positions.
``make_dataset(TaskSetting)`` draws the train split from ``default_rng([seed, 0])`` and the test
split from ``default_rng([seed, 1])``; the memorization map comes from ``default_rng([seed, 2])``,
so it is the same for every sample of both splits.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass

import numpy as np

from eval.mad.recall import IGNORE, _check, fuzzy_in_context_recall, in_context_recall
from parallax_titan.config.schema import describe, matches

TASKS = ("compression", "in-context-recall", "fuzzy-in-context-recall", "noisy-in-context-recall",
         "memorization", "selective-copying")
SHORT = {"compression": "CMP", "in-context-recall": "ICR", "fuzzy-in-context-recall": "FCR",
         "noisy-in-context-recall": "NCR", "memorization": "MEM", "selective-copying": "SC"}
_SIZES = ("vocab_size", "seq_len", "num_train_examples", "num_test_examples")
# The TaskSetting fields each task's generator reads (besides task and seed): a setting that gives
# another one a value would be labelled by a parameter its data does not have.
READS = {"compression": _SIZES, "memorization": _SIZES,
         "in-context-recall": (*_SIZES, "noise_vocab_size", "frac_noise"),
         "noisy-in-context-recall": (*_SIZES, "noise_vocab_size", "frac_noise"),
         "fuzzy-in-context-recall": (*_SIZES, "k_motif_size", "v_motif_size"),
         "selective-copying": (*_SIZES, "num_tokens_to_copy", "tokens_copied")}


def selective_copying(rng: np.random.Generator, num_examples: int, vocab_size: int = 16,
                      seq_len: int = 256, num_tokens_to_copy: int = 16):
    """Copy the non-blank tokens of the prefix, in order, after a copy token (mad-lab's layout).

    Layout: content ``[0, vocab_size - 2)``, blank ``vocab_size - 2``, copy ``vocab_size - 1``.
    A sequence is ``seq_len - n - 1`` prefix tokens, the copy token, then n blanks whose targets
    are the copied tokens. The prefix holds the n content tokens with ``seq_len - 2n - 1`` blanks,
    each blank placed before a content token drawn uniformly (mad-lab's ``np.insert`` at random
    indices in [0, n)), so the last content token always sits next to the copy token. Train and
    test targets are the same. Returns (inputs, targets, targets), int64 (N, seq_len).
    """
    n = num_tokens_to_copy
    _check(n >= 1, "num_tokens_to_copy", n, ">= 1")
    _check(seq_len > 2 * n + 1, "seq_len", seq_len, f"> 2 * num_tokens_to_copy + 1 = {2 * n + 1}")
    _check(vocab_size >= 3, "vocab_size", vocab_size, ">= 3 (content, blank, copy)")
    blank, copy = vocab_size - 2, vocab_size - 1
    prefix = seq_len - n - 1
    content = rng.integers(0, vocab_size - 2, size=(num_examples, n))
    before = rng.integers(0, n, size=(num_examples, prefix - n))  # the content token each blank precedes
    blanks_before = np.zeros((num_examples, n), dtype=np.int64)
    np.add.at(blanks_before, (np.repeat(np.arange(num_examples), prefix - n), before.ravel()), 1)
    positions = np.arange(n) + np.cumsum(blanks_before, axis=1)
    tokens = np.full((num_examples, seq_len), blank, dtype=np.int64)
    np.put_along_axis(tokens, positions, content, axis=1)
    tokens[:, prefix] = copy
    targets = np.full((num_examples, seq_len), IGNORE, dtype=np.int64)
    targets[:, prefix + 1:] = content
    return tokens, targets, targets.copy()


def compression(rng: np.random.Generator, num_examples: int, vocab_size: int = 16, seq_len: int = 32):
    """Random tokens ``[0, vocab_size - 1)`` then the compression token ``vocab_size - 1``.

    The model (an encoder whose last position feeds a decoder, see models.py) reconstructs
    every input token: targets = inputs. Returns (inputs, targets, targets), (N, seq_len).
    """
    _check(vocab_size >= 2, "vocab_size", vocab_size, ">= 2")
    _check(seq_len >= 2, "seq_len", seq_len, ">= 2 (a token and the compression token)")
    tokens = rng.integers(0, vocab_size - 1, size=(num_examples, seq_len))
    tokens[:, -1] = vocab_size - 1
    return tokens, tokens.copy(), tokens.copy()


def memorization_map(vocab_size: int, seed: int) -> np.ndarray:
    """The fixed key -> value map: keys ``[0, n/2)`` to distinct values in ``[n/2, n)``, n = vocab - 1."""
    n = vocab_size - 1
    return np.random.default_rng([seed, 2]).permutation(np.arange(n // 2, n))[: n // 2]


def memorization(rng: np.random.Generator, num_examples: int, kv_map: np.ndarray,
                 vocab_size: int = 256, seq_len: int = 32):
    """Pairs (key, insert token ``vocab_size - 1``); the insert position's target is kv_map[key].

    Returns (inputs, targets, targets), (N, seq_len); only insert positions are scored.
    """
    _check(seq_len >= 2 and seq_len % 2 == 0, "seq_len", seq_len, "an even number >= 2")
    _check(vocab_size >= 3 and len(kv_map) >= 1, "vocab_size", vocab_size, ">= 3 (a key, a value, the insert token)")
    keys = rng.integers(0, len(kv_map), size=(num_examples, seq_len // 2))
    tokens = np.stack([keys, np.full_like(keys, vocab_size - 1)], axis=2).reshape(num_examples, seq_len)
    targets = np.stack([np.full_like(keys, IGNORE), kv_map[keys]], axis=2).reshape(num_examples, seq_len)
    return tokens, targets, targets.copy()


@dataclass(frozen=True)
class TaskSetting:
    """One MAD task instance: the task, its parameters, and the dataset sizes and seed."""

    task: str
    vocab_size: int
    seq_len: int
    num_train_examples: int = 12_800
    num_test_examples: int = 1_280
    noise_vocab_size: int = 0
    frac_noise: float = 0.0
    num_tokens_to_copy: int = 0
    k_motif_size: int = 1
    v_motif_size: int = 1
    tokens_copied: int = 0  # selective copying: tokens actually copied; 0 = num_tokens_to_copy
    seed: int = 12345

    def __post_init__(self):
        """Every value checked when the setting is made (a grid's settings are made before any run):
        ValueError naming the setting, the field, its value and what was expected."""
        _check(self.task in TASKS, "task", self.task, f"one of {TASKS}")
        try:
            self._check_values()
        except ValueError as exc:
            raise ValueError(f"{self.label()}: {exc}") from None

    def _check_values(self) -> None:
        """Types, fields the task does not read left at their defaults, sizes, then the generator's checks."""
        hints = typing.get_type_hints(TaskSetting)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            _check(matches(value, hints[f.name]), f.name, value, describe(hints[f.name]))
            _check(not isinstance(value, float) or math.isfinite(value), f.name, value, "a finite number")
            _check(f.name in READS[self.task] or value == f.default or f.name in ("task", "seed"), f.name, value,
                   f"the default {f.default!r}: {self.task} does not read it")
        for name in ("num_train_examples", "num_test_examples"):
            _check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        for name in ("seed", "tokens_copied"):
            _check(getattr(self, name) >= 0, name, getattr(self, name), ">= 0")
        # the generator's own checks (vocabulary, length, motif and copy sizes), on one example
        _generate(self, np.random.default_rng(0), 1, training=False)

    def label(self) -> str:
        """Short name listing the parameters that differ from the dataclass defaults."""
        skip = {"task", "seed", "num_test_examples"}
        parts = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if f.name not in skip and (f.name in ("vocab_size", "seq_len")
                                            or getattr(self, f.name) != f.default)]
        return f"{SHORT[self.task]}(" + ",".join(parts) + ")"


def _generate(setting: TaskSetting, rng, num: int, training: bool):
    s = setting
    if s.task in ("in-context-recall", "noisy-in-context-recall"):
        return in_context_recall(rng, num, s.vocab_size, s.seq_len, s.noise_vocab_size, s.frac_noise)
    if s.task == "fuzzy-in-context-recall":
        return fuzzy_in_context_recall(rng, num, s.vocab_size, s.seq_len, s.k_motif_size, s.v_motif_size,
                                       training)
    if s.task == "selective-copying":
        return selective_copying(rng, num, s.vocab_size, s.seq_len, s.tokens_copied or s.num_tokens_to_copy)
    if s.task == "compression":
        return compression(rng, num, s.vocab_size, s.seq_len)
    return memorization(rng, num, memorization_map(s.vocab_size, s.seed), s.vocab_size, s.seq_len)


def make_dataset(setting: TaskSetting) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train": (inputs, train_targets), "test": (inputs, test_targets)}, int64 (N, length)."""
    x, y, _ = _generate(setting, np.random.default_rng([setting.seed, 0]), setting.num_train_examples, True)
    xt, _, yt = _generate(setting, np.random.default_rng([setting.seed, 1]), setting.num_test_examples, False)
    return {"train": (x, y), "test": (xt, yt)}
