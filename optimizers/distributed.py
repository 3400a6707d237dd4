"""Owner-rank full-matrix work for FSDP2-sharded (DTensor Shard(0)) parameters, HSDP's included.

Update directions (Muon's orthogonalisation, NorMuon, Aurora, SOAP) and S_p need whole
matrices. Each matrix gets ONE owner rank (greedy balance by a cubic cost estimate, identical on
every rank); one all-to-all sends every rank's row shards to the owners (updates in the
orthogonaliser's compute dtype, bf16 on GPUs, since it casts to it first; SOAP's gradients and
S_p weights in fp32), the owners compute both terms of their matrices (same shapes batched,
keeping NorMuon's and SOAP's per-matrix state), and a second all-to-all returns each rank its
rows of the two terms (directions in the orthogonaliser's dtype where they are exact in it), which
it adds to its rows of the weights exactly as the single-process path does. Plain tensors (single
process) are computed in place.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from .directions import ORTHO_DTYPES, STATEFUL_ALGOS, MatrixSpec, matrix_terms
from .orthogonalize import default_compute_dtype
from .skip_step import SkipStep

__all__ = ["assign_owners", "shard_rows", "full_matrix_terms"]


def shard_rows(m: int, world: int, rank: int) -> tuple[int, int]:
    """Row range ``[start, stop)`` of ``rank``'s Shard(0) piece (torch.chunk semantics)."""
    chunk = -(-m // world)
    start = min(m, rank * chunk)
    return start, min(m, start + chunk)


def assign_owners(shapes: list[tuple[int, int]], world: int) -> list[int]:
    """Owner rank per matrix: largest first onto the least-loaded rank (deterministic)."""
    load = [0.0] * world
    owners = [0] * len(shapes)
    order = sorted(range(len(shapes)), key=lambda i: (-_cost(shapes[i]), i))
    for i in order:
        r = min(range(world), key=lambda q: (load[q], q))
        owners[i] = r
        load[r] += _cost(shapes[i])
    return owners


def _cost(shape):
    m, n = shape
    return float(m) * n * min(m, n)


def _mesh_group(t: DTensor):
    """Process group over which a DTensor's rows are sharded: the mesh dimension of its one Shard(0)
    placement, None for fully replicated ones. FSDP2 gives ``(Shard(0),)``; HSDP gives
    ``(Replicate(), Shard(0))``, whose replicas hold the same weights and (all-reduced) gradients,
    so each replica's shard group computes the same terms on its own."""
    placements = tuple(t.placements)
    sharded = [dim for dim, p in enumerate(placements) if not isinstance(p, Replicate)]
    if not sharded:
        return None
    if len(sharded) == 1 and placements[sharded[0]] == Shard(0):
        return t.device_mesh.get_group(sharded[0])
    raise NotImplementedError(
        f"full_matrix_terms: parameter placements={placements}; expected one Shard(0) (FSDP2: (Shard(0),), "
        "HSDP: (Replicate(), Shard(0))), the other mesh dimensions Replicate"
    )


def full_matrix_terms(specs: list[MatrixSpec], updates: list, weights: list, params: list,
                      skip: SkipStep | None = None, states: list | None = None) -> tuple[dict, dict]:
    """This rank's rows of both terms of each matrix (``directions.matrix_terms`` on the owners).

    Args:
        specs: per-matrix ``MatrixSpec`` (global shape, coefficients), same on all ranks.
        updates / weights: this rank's local pieces (plain tensors) or None.
        params: the parameters (DTensor or plain) the pieces belong to.
        skip: the step's ``SkipStep`` (same flag on every rank): terms are zeros when set.
        states: per matrix, the optimizer's state dict of its parameter. The stateful
            algorithms (NorMuon, SOAP) keep their per-matrix state there on the matrix's owner
            rank only (plain tensors under keys no other rank has, so a DCP checkpoint stores
            each once and loads it back on the same owner).
    Returns:
        ``({i: direction rows}, {i: S_p rows})`` shaped like the local pieces, for
        ``directions.apply_terms``.
    """
    directions, decay = {}, {}
    states = states if states is not None else [None] * len(specs)
    by_group: dict = {}
    local_idx = []
    for i, p in enumerate(params):
        group = _mesh_group(p) if isinstance(p, DTensor) else None
        if group is None:
            local_idx.append(i)
        else:
            by_group.setdefault(group, []).append(i)
    parts = [(local_idx, matrix_terms)] if local_idx else []
    parts += [(idx, functools.partial(_owner_exchange, group)) for group, idx in by_group.items()]
    for idx, terms in parts:
        d, t = terms([specs[i] for i in idx], [updates[i] for i in idx], [weights[i] for i in idx], skip,
                     [states[i] for i in idx])
        directions.update({idx[k]: v for k, v in d.items()})
        decay.update({idx[k]: v for k, v in t.items()})
    return directions, decay


def _comm_dtypes(specs, updates, fallback):
    """(send, return) dtypes of the updates and their directions, when all matrices share them.

    The orthogonaliser casts its input to its compute dtype first and returns values exact in it
    (Muon, Aurora): both travel in it, moving fewer bytes for the same result. SOAP reads the
    gradient in fp32 and NorMuon's and SOAP's directions are fp32: those travel in ``fallback``."""
    send, back = set(), set()
    for s, u in zip(specs, updates):
        if u is None:
            continue
        compute = fallback if s.algo == "soap" else (ORTHO_DTYPES[s.dtype] or default_compute_dtype(u))
        send.add(compute)
        back.add(fallback if s.algo in STATEFUL_ALGOS else compute)
    one = lambda d: d.pop() if len(d) == 1 else fallback  # noqa: E731
    return one(send), one(back)


def _owner_exchange(group, specs, updates, weights, skip, states):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    layout = _Layout(specs, assign_owners([s.shape for s in specs], world), world, rank)
    ref = next(t for t in updates + weights if t is not None)
    wide = torch.promote_types(ref.dtype, torch.float32)
    for i, (u, w) in enumerate(zip(updates, weights)):
        for t in (u, w):
            if t is not None and t.shape != (layout.rows(i, rank), specs[i].shape[1]):
                raise RuntimeError(f"full_matrix_terms: local shard {tuple(t.shape)} of matrix {i} does not "
                                   f"match the chunk layout {layout.rows(i, rank), specs[i].shape[1]}")
    udtype, ddtype = _comm_dtypes(specs, updates, wide)
    # forward: my rows of every matrix to its owner; the owner computes both terms of its matrices
    full_u = layout.to_owners(group, updates, udtype, ref.device)
    full_w = layout.to_owners(group, weights, wide, ref.device)
    dirs, decay = matrix_terms([specs[i] for i in layout.mine], [full_u.get(i) for i in layout.mine],
                                [full_w.get(i) for i in layout.mine], skip, [states[i] for i in layout.mine])
    # backward: every rank gets its rows of both terms, in the dtypes the owners computed them in
    own_dirs = layout.from_owners(group, {i: dirs[k] for k, i in enumerate(layout.mine) if k in dirs},
                                  [u is not None for u in updates], ddtype, ref.device)
    own_decay = layout.from_owners(group, {i: decay[k] for k, i in enumerate(layout.mine) if k in decay},
                                   [w is not None for w in weights], wide, ref.device)
    return own_dirs, own_decay


class _Layout:
    """Which rank owns each matrix and which rows each rank holds (Shard(0), torch.chunk)."""

    def __init__(self, specs, owners, world, rank):
        self.specs, self.owners, self.world, self.rank = specs, owners, world, rank
        self.mine = [i for i in range(len(specs)) if owners[i] == rank]
        self.cols = [s.shape[1] for s in specs]

    def rows(self, i, q):
        start, stop = shard_rows(self.specs[i].shape[0], self.world, q)
        return stop - start

    def to_owners(self, group, pieces, dtype, device):
        """{i: full matrix} for the owned matrices that have pieces (pieces[i] None on every rank
        or on none), gathered from every rank's row piece in ``dtype``."""
        has = [p is not None for p in pieces]
        if not any(has):
            return {}
        send = [[] for _ in range(self.world)]
        for i, piece in enumerate(pieces):
            if piece is not None:
                send[self.owners[i]].append(piece.reshape(-1))
        n = self.cols
        sizes = [sum(self.rows(i, q) * n[i] for i in self.mine if has[i]) for q in range(self.world)]
        received = _all_to_all(send, sizes, group, device, dtype)
        full, offsets = {}, [0] * self.world
        for i in (i for i in self.mine if has[i]):
            parts = []
            for q in range(self.world):
                size = self.rows(i, q) * n[i]
                parts.append(received[q][offsets[q]:offsets[q] + size].reshape(self.rows(i, q), n[i]))
                offsets[q] += size
            full[i] = torch.cat(parts)
        return full

    def from_owners(self, group, terms, has, dtype, device):
        """{i: this rank's rows of term i} for every matrix with has[i], from each owner's
        ``terms`` (full matrices of the matrices it owns), sent in ``dtype``."""
        if not any(has):
            return {}
        send = [[] for _ in range(self.world)]
        for i in (i for i in self.mine if has[i]):
            for q in range(self.world):
                start, stop = shard_rows(self.specs[i].shape[0], self.world, q)
                send[q].append(terms[i][start:stop].reshape(-1))
        n = self.cols
        sizes = [sum(self.rows(i, self.rank) * n[i] for i in range(len(self.specs)) if has[i] and self.owners[i] == q)
                 for q in range(self.world)]
        received = _all_to_all(send, sizes, group, device, dtype)
        out, offsets = {}, [0] * self.world
        for i in (i for i in range(len(self.specs)) if has[i]):
            q, size = self.owners[i], self.rows(i, self.rank) * n[i]
            out[i] = received[q][offsets[q]:offsets[q] + size].reshape(self.rows(i, self.rank), n[i])
            offsets[q] += size
        return out


def _all_to_all(send, recv_sizes, group, device, dtype):
    """Variable-size all-to-all of flat tensors, sent in ``dtype`` (one cast per destination, not per
    piece); returns the per-source received pieces."""
    send_flat = [torch.cat(s).to(dtype) if s else torch.empty(0, dtype=dtype, device=device) for s in send]
    inp = torch.cat(send_flat)
    out = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_sizes,
                           input_split_sizes=[t.numel() for t in send_flat], group=group)
    return list(out.split(recv_sizes))
