"""HSDP (FSDP2 on a 2-D ``dp_replicate`` x ``fsdp`` mesh, placements ``(Replicate(), Shard(0))``):
the owner-rank exchange runs within each replica's shard group and gives every rank the terms of one
process. Docs promise HSDP; the exchange used to raise NotImplementedError at the first Muon step."""

import contextlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parallax_titan.teardown import leave_process_group
from tests.test_optimizers_distributed import _exchange_case, _free_port

REPLICAS, SHARDS = 2, 2


@contextlib.contextmanager
def _hsdp_mesh(rank, world, port):
    """This rank of a gloo group of ``world`` ranks: the (REPLICAS, SHARDS) mesh; the group is left at the end."""
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield init_device_mesh("cpu", (REPLICAS, SHARDS), mesh_dim_names=("dp_replicate", "fsdp"))
    finally:
        leave_process_group(wait_s=30)


def _run_hsdp(worker, out):
    """``worker(rank, world, port, out)`` on REPLICAS x SHARDS processes; what rank 0 saved to ``out``."""
    world = REPLICAS * SHARDS
    mp.spawn(worker, args=(world, _free_port(), str(out)), nprocs=world, join=True)
    return torch.load(out)


def _hsdp_worker(rank, world, port, out):
    """full_matrix_terms on (Replicate(), Shard(0)) DTensors; rank 0 saves every rank's row pieces."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from optimizers import distributed

    with _hsdp_mesh(rank, world, port) as mesh:
        placements = [Replicate(), Shard(0)]
        specs, updates, weights = _exchange_case()
        params = [distribute_tensor(u if u is not None else w, mesh, placements) for u, w in zip(updates, weights)]
        local = [None if t is None else distribute_tensor(t, mesh, placements).to_local() for t in updates]
        local_w = [None if t is None else distribute_tensor(t, mesh, placements).to_local() for t in weights]
        terms = distributed.full_matrix_terms(specs, local, local_w, params)
        gathered = [None] * world
        dist.all_gather_object(gathered, terms)
        if rank == 0:
            torch.save(gathered, out)


def test_hsdp_exchange_equals_single_process_in_every_replica(tmp_path):
    from optimizers.directions import matrix_terms

    gathered = _run_hsdp(_hsdp_worker, tmp_path / "terms.pt")  # rank r = replica r // SHARDS, shard r % SHARDS
    specs, updates, weights = _exchange_case()
    ref = matrix_terms(specs, updates, weights)
    for replica in range(REPLICAS):
        ranks = gathered[replica * SHARDS:(replica + 1) * SHARDS]
        for k in (0, 1):
            assert sorted(ranks[0][k]) == sorted(ref[k])
            for i, term in ref[k].items():
                rows = torch.cat([r[k][i] for r in ranks])
                assert rows.dtype == term.dtype and torch.equal(rows, term), (replica, k, i)


def _train_worker(rank, world, port, out):
    """TinyParallax under HSDP (fully_shard on the 2-D mesh), trained with the Muon + S_p recipe."""
    from torch.distributed.fsdp import fully_shard

    from parallax_titan.optim_builder import build_lr_schedulers, build_optimizers
    from tests._optim_models import TinyParallax
    from tests.test_optimizers_distributed import STEPS, full_params, optim_cfg, sched_cfg, train

    with _hsdp_mesh(rank, world, port) as mesh:
        torch.manual_seed(0)
        model = TinyParallax()
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for m in model.modules():
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        opt = build_optimizers([model], optim_cfg(), None)
        sched = build_lr_schedulers(opt, sched_cfg(), STEPS)
        train(model, opt, sched, range(STEPS), rank, world)
        params = full_params(model)
        if rank == 0:
            torch.save(params, out)


def test_hsdp_training_matches_single_process(tmp_path):
    from tests.test_optimizers_distributed import STEPS, full_params, make, train

    got = _run_hsdp(_train_worker, tmp_path / "rank0.pt")
    model, opt, sched = make(1)
    train(model, opt, sched, range(STEPS))
    ref = full_params(model)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-5, msg=k)
