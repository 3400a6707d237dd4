"""Owner-rank full-matrix work for FSDP2-sharded (DTensor Shard(0)) parameters.

Orthogonalisation and S_p need whole matrices. Each matrix gets ONE owner rank
(greedy balance by a cubic cost estimate, identical on every rank); one
all-to-all sends every rank's row shards to the owners, the owners compute all
their matrices (same shapes batched), and a second all-to-all returns each rank
its rows of the deltas. Plain tensors (single process) are computed in place.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from .directions import MatrixSpec, matrix_deltas

__all__ = ["assign_owners", "shard_rows", "full_matrix_deltas"]


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
    """Process group of a 1-D Shard(0) DTensor, None for fully replicated ones."""
    placements = tuple(t.placements)
    if all(isinstance(p, Replicate) for p in placements):
        return None
    if len(placements) == 1 and placements[0] == Shard(0):
        return t.device_mesh.get_group(0)
    raise NotImplementedError(
        f"full_matrix_deltas: parameter placements={placements}; expected (Shard(0),) on a 1-D "
        "mesh (FSDP2) or all Replicate"
    )


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def full_matrix_deltas(specs: list[MatrixSpec], updates: list, weights: list, params: list) -> list[torch.Tensor]:
    """Local (this rank's rows) deltas for each matrix.

    Args:
        specs: per-matrix ``MatrixSpec`` (global shape, coefficients), same on all ranks.
        updates / weights: this rank's local pieces (plain tensors) or None.
        params: the parameters (DTensor or plain) the pieces belong to.
    Returns:
        list of local delta tensors shaped like each local piece.
    """
    out: list = [None] * len(specs)
    by_group: dict = {}
    local_idx = []
    for i, p in enumerate(params):
        group = _mesh_group(p) if isinstance(p, DTensor) else None
        if group is None:
            local_idx.append(i)
        else:
            by_group.setdefault(group, []).append(i)
    if local_idx:
        deltas = matrix_deltas([specs[i] for i in local_idx], [updates[i] for i in local_idx],
                               [weights[i] for i in local_idx])
        for i, d in zip(local_idx, deltas):
            out[i] = d
    for group, idx in by_group.items():
        deltas = _owner_exchange(group, [specs[i] for i in idx], [updates[i] for i in idx],
                                 [weights[i] for i in idx])
        for i, d in zip(idx, deltas):
            out[i] = d
    return out


def _pieces(update, weight):
    return [t for t in (update, weight) if t is not None]


def _owner_exchange(group, specs, updates, weights):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    owners = assign_owners([s.shape for s in specs], world)
    ref = next(t for t in updates + weights if t is not None)
    dtype = torch.promote_types(ref.dtype, torch.float32)
    nparts = [len(_pieces(u, w)) for u, w in zip(updates, weights)]

    def rows(i, q):
        start, stop = shard_rows(specs[i].shape[0], world, q)
        return stop - start

    for i, (u, w) in enumerate(zip(updates, weights)):
        for t in _pieces(u, w):
            if t.shape != (rows(i, rank), specs[i].shape[1]):
                raise RuntimeError(f"full_matrix_deltas: local shard {tuple(t.shape)} of matrix {i} does not "
                                   f"match the chunk layout {rows(i, rank), specs[i].shape[1]}")
    # forward: my rows of every matrix to its owner
    send = [[] for _ in range(world)]
    for i, (u, w) in enumerate(zip(updates, weights)):
        send[owners[i]].extend(t.reshape(-1).to(dtype) for t in _pieces(u, w))
    mine = [i for i in range(len(specs)) if owners[i] == rank]
    recv_sizes = [sum(rows(i, q) * specs[i].shape[1] * nparts[i] for i in mine) for q in range(world)]
    received = _all_to_all(send, recv_sizes, group, ref.device, dtype)
    full_u, full_w = _assemble(mine, specs, updates, weights, received, world, rows)
    deltas = matrix_deltas([specs[i] for i in mine], full_u, full_w)
    # backward: each rank's rows of the deltas
    back = [[] for _ in range(world)]
    for i, d in zip(mine, deltas):
        for q in range(world):
            start, stop = shard_rows(specs[i].shape[0], world, q)
            back[q].append(d[start:stop].reshape(-1))
    back_sizes = [sum(rows(i, rank) * specs[i].shape[1] for i in range(len(specs)) if owners[i] == q)
                  for q in range(world)]
    got = _all_to_all(back, back_sizes, group, ref.device, dtype)
    result, offsets = [], [0] * world
    for i in range(len(specs)):
        q, n = owners[i], rows(i, rank) * specs[i].shape[1]
        result.append(got[q][offsets[q]:offsets[q] + n].reshape(rows(i, rank), specs[i].shape[1]))
        offsets[q] += n
    return result


def _assemble(mine, specs, updates, weights, received, world, rows):
    """Rebuild full matrices of the owned items from every rank's row pieces."""
    offsets = [0] * world
    full_u, full_w = [], []
    for i in mine:
        m, n = specs[i].shape
        has = [updates[i] is not None, weights[i] is not None]
        parts = [[None] * world for _ in range(2)]
        for q in range(world):
            size = rows(i, q) * n
            for k in (0, 1):
                if has[k]:
                    parts[k][q] = received[q][offsets[q]:offsets[q] + size].reshape(rows(i, q), n)
                    offsets[q] += size
        full_u.append(torch.cat(parts[0]) if has[0] else None)
        full_w.append(torch.cat(parts[1]) if has[1] else None)
    return full_u, full_w


def _all_to_all(send, recv_sizes, group, device, dtype):
    """Variable-size all-to-all of flat tensors; returns the per-source received pieces."""
    send_flat = [torch.cat(s) if s else torch.empty(0, dtype=dtype, device=device) for s in send]
    inp = torch.cat(send_flat)
    out = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_sizes,
                           input_split_sizes=[t.numel() for t in send_flat], group=group)
    return list(out.split(recv_sizes))
