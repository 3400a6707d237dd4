"""Full-matrix work of one optimizer step: orthogonalised Muon updates and S_p decay.

Each ``MatrixWork`` describes one 2-D parameter whose step needs the whole matrix:
the Muon update direction (momentum, orthogonalised as a full matrix or per head)
and/or the spectral-power decay term computed from the pre-update weight.
``matrix_deltas`` turns a list of full matrices into the additive deltas,
batching same-shape matrices into one orthogonaliser / S_p call.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from .orthogonalize import orthogonalize
from .skip_step import SkipStep
from .spectral import banded_spectral_power

__all__ = ["MatrixSpec", "update_scale", "matrix_deltas", "matrix_terms", "combine_terms", "UPDATE_SCALES",
           "ORTHO_DTYPES"]

UPDATE_SCALES = ("match_rms_adamw", "spectral", "none")
ORTHO_DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class MatrixSpec:
    """How to turn (update U, weight W) of one matrix into its delta.

    delta = update_coeff * ortho(U) + sp_coeff * T_p(W); coefficients carry the
    sign and the lr / decay scale already.
    """

    shape: tuple[int, int]
    update_coeff: float = 0.0
    method: str = "polar_express"
    steps: int = 0
    dtype: str = "auto"
    head_dim: int = 0
    sp_coeff: float = 0.0
    sp_power: int = 1
    band: str = "none"
    tau: float = 0.0
    msign_steps: int = 20

    @property
    def has_update(self) -> bool:
        return self.update_coeff != 0.0

    @property
    def has_decay(self) -> bool:
        return self.sp_coeff != 0.0


def update_scale(kind: str, m: int, n: int) -> float:
    """Muon update scale for a (m out, n in) matrix: Moonlight RMS match or spectral."""
    if kind == "match_rms_adamw":
        return 0.2 * math.sqrt(max(m, n))
    if kind == "spectral":
        return math.sqrt(max(1.0, m / n))
    if kind == "none":
        return 1.0
    raise ValueError(f"update_scale: kind={kind!r}; expected one of {UPDATE_SCALES}")


def _blocks(U: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(m, n) -> (heads, head_dim, n) for per-head updates, (1, m, n) for full."""
    m, n = U.shape
    if head_dim:
        return U.reshape(m // head_dim, head_dim, n)
    return U.unsqueeze(0)


def _batched_ortho(jobs, skip: SkipStep):
    """jobs: list of (index, spec, U). Returns {index: ortho(U)} with one call per shape (zeros
    when ``skip`` is set)."""
    buckets = defaultdict(list)
    for idx, spec, U in jobs:
        blocks = _blocks(U, spec.head_dim)
        key = (tuple(blocks.shape[1:]), spec.method, spec.steps, spec.dtype, U.dtype)
        buckets[key].append((idx, spec, blocks))
    out = {}
    for (_, method, steps, dtype, _), entries in buckets.items():
        stacked = torch.cat([b for _, _, b in entries])
        ortho = skip.zero_if_skipped(orthogonalize(stacked, method, steps, ORTHO_DTYPES[dtype]))
        for (idx, spec, b), piece in zip(entries, ortho.split([b.shape[0] for _, _, b in entries])):
            out[idx] = piece.reshape(spec.shape)
    return out


def _batched_decay(jobs, skip: SkipStep):
    """jobs: list of (index, spec, W). Returns {index: T_p(W)} batched per shape and rule (zeros
    when ``skip`` is set)."""
    buckets = defaultdict(list)
    for idx, spec, W in jobs:
        buckets[(spec.shape, spec.sp_power, spec.band, spec.tau, spec.msign_steps)].append((idx, W))
    out = {}
    for (_, p, band, tau, msteps), entries in buckets.items():
        terms = banded_spectral_power(torch.stack([W for _, W in entries]), p, band, tau, msteps)
        terms = skip.zero_if_skipped(terms)
        out.update({idx: t for (idx, _), t in zip(entries, terms)})
    return out


def matrix_deltas(specs: list[MatrixSpec], updates: list, weights: list,
                  skip: SkipStep | None = None) -> list[torch.Tensor]:
    """Additive deltas for full matrices.

    Args:
        specs: one ``MatrixSpec`` per matrix.
        updates: full momentum updates ``(m, n)`` (or None when the spec has none).
        weights: full pre-update weights ``(m, n)`` (or None when no S_p decay).
        skip: when its flag is set every delta is ``-0.0`` (see ``SkipStep``).
    Returns:
        list of ``(m, n)`` fp32-or-wider tensors, ``delta = W_new - W``.
    """
    ortho, decay = matrix_terms(specs, updates, weights, skip)
    return combine_terms(specs, ortho, decay, updates, weights)


def matrix_terms(specs: list[MatrixSpec], updates: list, weights: list,
                 skip: SkipStep | None = None) -> tuple[dict, dict]:
    """The two terms of each delta before their coefficients: ``{i: ortho(U_i)}`` for the specs
    with an update (in U's dtype) and ``{i: T_p(W_i)}`` for those with S_p decay (W's dtype);
    zeros when ``skip`` is set."""
    skip = skip or SkipStep(None)
    ortho = _batched_ortho([(i, s, u) for i, (s, u) in enumerate(zip(specs, updates)) if s.has_update], skip)
    decay = _batched_decay([(i, s, w) for i, (s, w) in enumerate(zip(specs, weights)) if s.has_decay], skip)
    return ortho, decay


def combine_terms(specs: list[MatrixSpec], ortho: dict, decay: dict, updates: list,
                  weights: list) -> list[torch.Tensor]:
    """``update_coeff * ortho[i] + sp_coeff * decay[i]`` (absent terms skipped) for every matrix, as
    fresh tensors of ``updates[i]``'s shape, dtype and device (``weights[i]``'s without an update);
    the same arithmetic on whole matrices or on row pieces. A few foreach calls for all matrices: a
    multiply per matrix left the GPU idle while the host issued them."""
    likes = [u if u is not None else w for u, w in zip(updates, weights)]
    deltas: list = [None] * len(specs)
    first = [(i, ortho[i], s.update_coeff) if i in ortho else (i, decay[i], s.sp_coeff)
             for i, s in enumerate(specs) if i in ortho or i in decay]
    if first:
        scaled = torch._foreach_mul([t.to(likes[i].dtype) for i, t, _ in first], [c for _, _, c in first])
        for (i, _, _), delta in zip(first, scaled):
            deltas[i] = delta
    second: dict = defaultdict(list)  # the S_p term of matrices that also have an update, by coefficient
    for i in (i for i in ortho if i in decay):
        second[specs[i].sp_coeff].append(i)
    for coeff, idx in second.items():
        torch._foreach_add_([deltas[i] for i in idx], [decay[i].to(deltas[i].dtype) for i in idx], alpha=coeff)
    return [d if d is not None else torch.zeros_like(like) for d, like in zip(deltas, likes)]
