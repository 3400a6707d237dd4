"""Full-matrix work of one optimizer step: update directions and S_p decay.

Each ``MatrixSpec`` describes one 2-D parameter whose step needs the whole matrix: the update
direction of its algorithm (Muon: the orthogonalised momentum, as a full matrix or per head;
NorMuon, Aurora, SOAP: ``variants``) and/or the spectral-power decay term computed from the
pre-update weight. ``matrix_terms`` computes both terms for a list of full matrices, batching
same-shape matrices into one call per algorithm / S_p rule; ``apply_terms`` adds them, with their
coefficients, to the weights (or to row pieces of them).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from .orthogonalize import orthogonalize
from .skip_step import SkipStep
from .spectral import banded_spectral_power
from .variants import aurora_polar, normuon_normalize, soap_directions

__all__ = ["MatrixSpec", "update_scale", "matrix_terms", "apply_terms", "UPDATE_SCALES", "ORTHO_DTYPES",
           "GRAM_MODES", "MATRIX_ALGOS", "STATEFUL_ALGOS"]

MATRIX_ALGOS = ("muon", "normuon", "aurora", "soap")
# directions that keep per-matrix state on the owner rank: they run even with a zero coefficient
# (lr 0) so that the state advances, and exists before a checkpoint is loaded into it
STATEFUL_ALGOS = ("normuon", "soap")

UPDATE_SCALES = ("match_rms_adamw", "spectral", "none")
ORTHO_DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}
GRAM_MODES = {"off": False, "on": True}  # orthogonalize(gram=...)
ORTHO_KERNELS = {"auto": True, "torch": False}  # orthogonalize(kernel=...)


@dataclass(frozen=True)
class MatrixSpec:
    """How to turn (update U, weight W) of one matrix into its delta.

    delta = update_coeff * D(U) + sp_coeff * T_p(W); coefficients carry the sign and the lr /
    decay scale already. D is ``algo``'s direction (``muon``: ortho(U)) with ``options`` (a
    sorted tuple of (name, value) pairs, see ``variants``). U is the momentum update for the
    Muon algorithms and the gradient for SOAP.
    """

    shape: tuple[int, int]
    update_coeff: float = 0.0
    algo: str = "muon"
    options: tuple = ()
    method: str = "polar_express"
    steps: int = 0
    dtype: str = "auto"
    gram: str = "off"
    kernel: str = "auto"
    head_dim: int = 0
    sp_coeff: float = 0.0
    sp_power: int = 1
    band: str = "none"
    tau: float = 0.0
    msign_steps: int = 20

    @property
    def has_update(self) -> bool:
        return self.algo in MATRIX_ALGOS and (self.update_coeff != 0.0 or self.algo in STATEFUL_ALGOS)

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


def _stack_blocks(updates: list, head_dim: int) -> torch.Tensor:
    """Updates as one (batch, rows, cols) stack: (count, m, n) for same-shape full matrices (one
    ``torch.stack``: a view op per matrix was host time the GPU waited for), or (total heads,
    head_dim, n) for per-head updates of any head count."""
    if not head_dim:
        return torch.stack(updates)
    return torch.cat([U.reshape(U.shape[0] // head_dim, head_dim, U.shape[1]) for U in updates])


def _direction_key(spec: MatrixSpec, U: torch.Tensor) -> tuple:
    """Matrices with equal keys are computed in one batched call."""
    blocks = (spec.head_dim, U.shape[1]) if spec.head_dim else tuple(U.shape)
    whole = (spec.shape,) if spec.algo in STATEFUL_ALGOS else ()  # their state is per full matrix
    return (spec.algo, blocks, spec.method, spec.steps, spec.dtype, spec.gram, spec.kernel, U.dtype,
            spec.options) + whole


def _directions(algo, X, spec, states, skip):
    """Directions of a stack X of blocks ``(batch, rows, cols)`` (full matrices for the stateful
    algorithms) sharing ``spec``'s algorithm and options."""
    dtype, gram, opts = ORTHO_DTYPES[spec.dtype], GRAM_MODES[spec.gram], dict(spec.options)
    kernel = ORTHO_KERNELS[spec.kernel]
    if algo == "muon":
        return orthogonalize(X, spec.method, spec.steps, dtype, gram, kernel)
    if algo == "aurora":
        return aurora_polar(X, spec.method, spec.steps, dtype, gram=gram, kernel=kernel, **opts)
    if algo == "normuon":
        O = orthogonalize(X, spec.method, spec.steps, dtype, gram, kernel).reshape(len(states), *spec.shape)
        return normuon_normalize(O, states, opts["beta2"], opts["eps"], skip).reshape(X.shape)
    if algo == "soap":
        return soap_directions(X, states, skip, **opts)
    raise ValueError(f"matrix_terms: algo={algo!r}; expected one of {MATRIX_ALGOS}")


def _batched_directions(jobs, skip: SkipStep, states: list):
    """jobs: list of (index, spec, U). Returns {index: D(U)} with one call per key (zeros when
    ``skip`` is set), in U's dtype (fp32 or wider for the stateful algorithms)."""
    buckets = defaultdict(list)
    for idx, spec, U in jobs:
        buckets[_direction_key(spec, U)].append((idx, spec, U))
    out = {}
    for key, entries in buckets.items():
        spec = entries[0][1]
        stacked = _stack_blocks([U for _, _, U in entries], spec.head_dim)
        result = _directions(key[0], stacked, spec, [states[idx] for idx, _, _ in entries], skip)
        result = skip.zero_if_skipped(result)
        if spec.head_dim:  # one bucket holds matrices of any head count: split by each one's heads
            heads = [U.shape[0] // spec.head_dim for _, _, U in entries]
            pieces = [piece.reshape(U.shape) for piece, (_, _, U) in zip(result.split(heads), entries)]
        else:
            pieces = result.unbind(0)
        out.update({idx: piece for (idx, _, _), piece in zip(entries, pieces)})
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


def matrix_terms(specs: list[MatrixSpec], updates: list, weights: list, skip: SkipStep | None = None,
                 states: list | None = None) -> tuple[dict, dict]:
    """The two terms of each matrix's delta before their coefficients.

    Args:
        specs: one ``MatrixSpec`` per matrix.
        updates: full updates ``(m, n)`` (or None when the spec has none).
        weights: full pre-update weights ``(m, n)`` (or None when no S_p decay).
        skip: when its flag is set every term is zero (see ``SkipStep``).
        states: per matrix, the state dict the stateful algorithms keep (None entries elsewhere).
    Returns:
        ``({i: D(U_i)}, {i: T_p(W_i)})`` for the specs with an update (U's dtype; fp32 or wider
        for NorMuon and SOAP) and for those with S_p decay (W's dtype).
    """
    skip = skip or SkipStep(None)
    states = states if states is not None else [None] * len(specs)
    for spec, state in zip(specs, states):
        if spec.has_update and spec.algo in STATEFUL_ALGOS and state is None:
            raise ValueError(f"matrix_terms: algo={spec.algo!r} keeps per-matrix state; got states=None")
    jobs = [(i, s, u) for i, (s, u) in enumerate(zip(specs, updates)) if s.has_update]
    directions = _batched_directions(jobs, skip, states)
    decay = _batched_decay([(i, s, w) for i, (s, w) in enumerate(zip(specs, weights)) if s.has_decay], skip)
    return directions, decay


def apply_terms(targets: list[torch.Tensor], specs: list[MatrixSpec], directions: dict, decay: dict) -> None:
    """``targets[i] += update_coeff * directions[i]``, then ``+= sp_coeff * decay[i]``, in place.

    Works on whole matrices and on row pieces alike; the terms may be narrower than the targets
    (bf16 directions into fp32 weights are added in fp32). One foreach call per coefficient: a
    launch per matrix left the GPU idle while the host issued them. Zero terms (a skipped step)
    add ``coeff * 0 = -0.0`` (the coefficients are negative), which changes no bit of a target.
    """
    for terms, coeff in ((directions, lambda s: s.update_coeff), (decay, lambda s: s.sp_coeff)):
        by_coeff: dict = defaultdict(lambda: ([], []))
        for i, term in terms.items():
            lhs, rhs = by_coeff[coeff(specs[i])]
            lhs.append(targets[i]), rhs.append(term)
        for c, (lhs, rhs) in by_coeff.items():
            torch._foreach_add_(lhs, rhs, alpha=c)
