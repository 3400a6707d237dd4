"""Deterministic order of pre-tokenized sequences: seeded permutations and the interleaving of sources.

Every position g = 0, 1, 2, ... of the global sequence stream maps, by closed formulas and no
state, to one sequence of one source, so the position alone fixes what comes next:

* **Interleaving** (:class:`Mixture`): the stream is cut into periods of P slots; source s owns
  ``n_s`` slots of each period (its weight times P, rounded by largest remainder, at least one).
  Inside a period source s's j-th slot sits at time ``(j + 0.5) / n_s``; slots are ordered by time,
  ties by source index. Position g is slot ``g mod P`` of period ``g // P``; the source's draw
  count before g is read from a prefix table.
* **Permutation** (:func:`permutation`): the k-th draw from a source of N sequences is sequence
  ``perm_e[k mod N]`` of epoch ``e = k // N``; ``perm_e`` sorts ``0..N-1`` by the keys
  ``splitmix64(h ^ i)``, ``h`` a splitmix64 hash of (seed, source, epoch). Our own hash, so the
  order is the same under any NumPy version.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

PERIOD = 1 << 16
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's output function of uint64 array ``x`` (wrapping arithmetic), elementwise."""
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _hash(*values: int) -> np.uint64:
    h = np.zeros(1, np.uint64)
    for v in values:
        h = splitmix64(h ^ np.uint64(v))
    return h[0]


@functools.lru_cache(maxsize=4)
def permutation(n: int, seed: int, source: int, epoch: int) -> np.ndarray:
    """A permutation of ``0..n-1`` (int64) fixed by (seed, source, epoch); see the module docstring."""
    keys = splitmix64(np.arange(n, dtype=np.uint64) ^ _hash(seed, source, epoch))
    order = np.argsort(keys, kind="stable")
    order.flags.writeable = False
    return order


def shares(weights: list[float]) -> np.ndarray:
    """Each of ``weights`` (each > 0) divided by their sum (float64). Finite weights whose sum
    overflows to inf are scaled down first, keeping their ratios (the plain sum made every share 0);
    other weights are divided as they are, so their mixtures stay bit-identical."""
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(over="ignore"):
        if not np.isfinite(w.sum()):
            w = w / w.max()
    return w / w.sum()


def _slots(weights: list[float], period: int) -> np.ndarray:
    """``weights`` scaled to ``period`` slots by largest remainder (ties to the lower index)."""
    quota = shares(weights) * period
    counts = np.floor(quota).astype(np.int64)
    remainder = period - int(counts.sum())
    order = sorted(range(len(counts)), key=lambda s: (-(quota[s] - counts[s]), s))
    counts[order[:remainder]] += 1
    return counts


def _first_empty(counts: np.ndarray) -> int | None:
    """The first source (index) with no slot in ``counts``, or None."""
    empty = np.flatnonzero(counts == 0)
    return int(empty[0]) if len(empty) else None


def unmixable_source(weights: list[float], period: int = PERIOD) -> int | None:
    """The first source (index) of a mixture of ``weights`` (each > 0) that would get no slot of a
    period: its share is below the mixing resolution ``1/period``. None when each gets one."""
    return _first_empty(_slots(weights, period))


def apportion(weights: list[float], period: int) -> np.ndarray:
    """Slots per period of each source: ``weights`` (each > 0) scaled to ``period`` by largest
    remainder (ties to the lower index). ValueError when a weight would get no slot."""
    counts = _slots(weights, period)
    s = _first_empty(counts)
    if s is not None:
        raise ValueError(f"source {s}'s share {shares(weights)[s]:.3g} is below the mixing resolution 1/{period}")
    return counts


@dataclass(frozen=True)
class Mixture:
    """The interleaving of sources by weight (module docstring).

    ``source[r]``, ``rank[r]``: the source of slot r of a period and its index among that source's
    slots; ``counts[s]`` slots per period; ``prefix[r, s]`` slots of source s before slot r.
    """

    counts: np.ndarray
    source: np.ndarray
    rank: np.ndarray
    prefix: np.ndarray

    @classmethod
    def from_weights(cls, weights: list[float], period: int = PERIOD) -> "Mixture":
        """The mixture of ``len(weights)`` sources; one source needs no period (P = 1)."""
        if any(not w > 0 for w in weights):
            raise ValueError(f"weights must be > 0, got {weights}")
        counts = apportion(weights, period if len(weights) > 1 else 1)
        times = np.concatenate([(np.arange(n) + 0.5) / n for n in counts])
        owners = np.repeat(np.arange(len(counts)), counts)
        order = np.lexsort((owners, times))
        source = owners[order]
        rank = np.concatenate([np.arange(n) for n in counts])[order]
        prefix = np.zeros((len(source) + 1, len(counts)), np.int64)
        prefix[np.arange(1, len(source) + 1), source] = 1
        return cls(counts, source, rank, np.cumsum(prefix, axis=0))

    @property
    def period(self) -> int:
        return len(self.source)

    def locate(self, position: int) -> tuple[int, int]:
        """(source, draw index within that source) of global position ``position``."""
        period, slot = divmod(position, self.period)
        s = int(self.source[slot])
        return s, period * int(self.counts[s]) + int(self.rank[slot])

    def taken(self, position: int) -> np.ndarray:
        """Sequences drawn from each source at positions ``[0, position)`` (int64, one per source)."""
        period, slot = divmod(position, self.period)
        return period * self.counts + self.prefix[slot]
