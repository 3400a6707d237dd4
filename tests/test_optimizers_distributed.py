"""FSDP2 owner-rank path (2 gloo ranks == 1 process) and DCP save/load round trips."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from parallax_titan.config import LRScheduler, Optimizer

from optimizers.distributed import assign_owners, shard_rows
from parallax_titan.optim_builder import build_lr_schedulers, build_optimizers
from parallax_titan.teardown import leave_process_group
from tests._optim_models import TinyParallax

STEPS, RESUME_AT = 4, 2


def optim_cfg():
    return Optimizer(name="Muon", lr=2e-2, beta1=0.8, beta2=0.95, eps=1e-7, weight_decay=0.1,
                     muon_headwise="HHF", spectral_power_attn=2, spectral_coeff_attn=0.5,
                     spectral_power_mlp=0, spectral_coeff_mlp=0.05, ortho_dtype="float32",
                     lr_multipliers=["embed=0.3", "norm=0.015"])


def sched_cfg():
    return LRScheduler(warmup_steps=1, total_steps=None, decay_ratio=0.5, decay_type="linear",
                       min_lr_factor=0.0, wd_anneal_gamma=1.0)


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 32, (4, 6), generator=g)


def make(world_size=1):
    torch.manual_seed(0)
    model = TinyParallax()
    if world_size > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)  # tied tok_embeddings/output stay in the root group
        for m in model.modules():
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    opt = build_optimizers([model], optim_cfg(), None)
    sched = build_lr_schedulers(opt, sched_cfg(), STEPS)
    return model, opt, sched


def train(model, opt, sched, steps, rank=0, world=1):
    for s in steps:
        tokens = batch(s).chunk(world)[rank]
        model(tokens).float().pow(2).mean().backward()
        opt.step(), sched.step(), opt.zero_grad()


def full_params(model):
    out = {}
    for k, v in model.state_dict().items():
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k] = v.detach().clone()
    return out


def run_round_trip(world, rank, ckpt):
    """Train to RESUME_AT, save, finish; then load into fresh objects and finish again."""
    model, opt, sched = make(world)
    train(model, opt, sched, range(RESUME_AT), rank, world)
    dcp.save({"model": get_model_state_dict(model), "optim": opt, "lr": sched}, checkpoint_id=ckpt)
    train(model, opt, sched, range(RESUME_AT, STEPS), rank, world)
    straight = full_params(model)
    model2, opt2, sched2 = make(world)
    state = {"model": get_model_state_dict(model2), "optim": opt2, "lr": sched2}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model2, state["model"])
    train(model2, opt2, sched2, range(RESUME_AT, STEPS), rank, world)
    return straight, full_params(model2), opt2


def _worker(rank, world, port, ckpt, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        straight, resumed, _ = run_round_trip(world, rank, ckpt)
        if rank == 0:
            torch.save({"straight": straight, "resumed": resumed}, out)
    finally:
        leave_process_group(wait_s=30)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_owner_assignment_balanced_and_chunk_rows():
    owners = assign_owners([(64, 64)] * 4 + [(8, 8)] * 4, 2)
    assert sorted(owners[:4]) == [0, 0, 1, 1]
    assert [shard_rows(5, 2, r) for r in range(2)] == [(0, 3), (3, 5)]
    assert [shard_rows(2, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_single_process_dcp_round_trip(tmp_path):
    straight, resumed, opt = run_round_trip(1, 0, str(tmp_path / "ckpt"))
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    assert opt.optimizers[0].param_groups[0]["wd_mult"] == pytest.approx(1 - 2 / 2)


def test_two_rank_fsdp_matches_single_process(tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path / "ckpt2"), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    model, opt, sched = make(1)
    train(model, opt, sched, range(STEPS))
    ref = full_params(model)
    for k in ref:
        torch.testing.assert_close(got["straight"][k], ref[k], rtol=1e-4, atol=1e-5, msg=k)
        assert torch.equal(got["straight"][k], got["resumed"][k]), k
    # the run moved the parameters (the comparison is not vacuous)
    torch.manual_seed(0)
    init = TinyParallax().state_dict()
    assert all((ref[k] - init[k]).abs().max() > 1e-3 for k in ref if "layers.0.attention.w" in k)


def local_bits(container):
    """Bit patterns of this rank's pieces of every parameter and state tensor."""
    from tests._optim_helpers import bits

    out = []
    for opt in container.optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p, {})
                for t in [p] + [state[k] for k in sorted(state) if torch.is_tensor(state[k])]:
                    out.append(bits(t.to_local() if hasattr(t, "to_local") else t))
    return out


def train_with_skipped_step(model, opt, sched, rank=0, world=1):
    """Steps 0, 1; a step with NaN gradients and skip=True (checked to change no bit of this
    rank's pieces); steps 2, 3. Returns whether the skipped step left everything unchanged."""
    from tests._optim_helpers import same_bits

    train(model, opt, sched, range(2), rank, world)
    model(batch(9).chunk(world)[rank]).float().pow(2).mean().backward()
    for p in model.parameters():
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        grad.view(-1)[::2] = float("nan")
    before = local_bits(opt)
    opt.step(skip=torch.tensor(True))
    opt.zero_grad()
    unchanged = same_bits(local_bits(opt), before)
    train(model, opt, sched, range(2, STEPS), rank, world)
    return unchanged


def _skip_worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, opt, sched = make(world)
        unchanged = train_with_skipped_step(model, opt, sched, rank, world)
        params = full_params(model)
        flags = [None] * world
        dist.all_gather_object(flags, unchanged)
        if rank == 0:
            torch.save({"params": params, "unchanged": flags}, out)
    finally:
        leave_process_group(wait_s=30)


@pytest.mark.slow  # two gloo ranks; the Muon two-rank tests stay in the default selection
def test_two_rank_fsdp_skipped_step_is_no_step(tmp_path):
    """Under FSDP2 (owner-rank exchange of NaN momenta) a skipped step changes no bit on either
    rank, and the run equals the one-process run without that step (to the 2-rank tolerance);
    in one process it equals it bit for bit."""
    out = tmp_path / "skip.pt"
    mp.spawn(_skip_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    assert got["unchanged"] == [True, True]
    model, opt, sched = make(1)
    train(model, opt, sched, range(STEPS))
    ref = full_params(model)
    model1, opt1, sched1 = make(1)
    assert train_with_skipped_step(model1, opt1, sched1)
    one = full_params(model1)
    for k in ref:
        torch.testing.assert_close(got["params"][k], ref[k], rtol=1e-4, atol=1e-5, msg=k)
        assert torch.equal(one[k], ref[k]), k


def _exchange_worker(rank, world, port, out):
    """full_matrix_terms on Shard(0) DTensors (bf16 orthogonaliser, S_p, per-head, uneven rows)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from optimizers import distributed

    sent = []  # (dtype, elements) of every all-to-all this rank sends
    original = distributed._all_to_all

    def recording(send, recv_sizes, group, device, dtype, *rest):
        sent.append((dtype, sum(t.numel() for s in send for t in s)))
        return original(send, recv_sizes, group, device, dtype, *rest)

    distributed._all_to_all = recording
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        specs, updates, weights = _exchange_case()
        params = [distribute_tensor(u if u is not None else w, mesh, [Shard(0)]) for u, w in zip(updates, weights)]
        local = [None if t is None else distribute_tensor(t, mesh, [Shard(0)]).to_local() for t in updates]
        local_w = [None if t is None else distribute_tensor(t, mesh, [Shard(0)]).to_local() for t in weights]
        terms = distributed.full_matrix_terms(specs, local, local_w, params)
        gathered = [None] * world
        dist.all_gather_object(gathered, terms)
        if rank == 0:
            torch.save({"terms": [{i: torch.cat([g[k][i] for g in gathered]) for i in terms[k]} for k in (0, 1)],
                        "sent": sent}, out)
    finally:
        leave_process_group(wait_s=30)


def _exchange_case():
    from optimizers.directions import MatrixSpec

    g = torch.Generator().manual_seed(3)
    shapes = [(7, 12), (12, 7), (8, 16), (7, 12)]
    specs = [MatrixSpec(shape=shapes[0], update_coeff=-0.1, dtype="bfloat16"),
             MatrixSpec(shape=shapes[1], update_coeff=-0.2, dtype="bfloat16", sp_coeff=-0.05, sp_power=2),
             MatrixSpec(shape=shapes[2], update_coeff=-0.3, dtype="bfloat16", head_dim=4),
             MatrixSpec(shape=shapes[3], sp_coeff=-0.01, sp_power=2)]
    # updates in the orthogonaliser's dtype, as MuonAdamW's momentum step writes them
    updates = [torch.randn(*s, generator=g).bfloat16() if sp.has_update else None for s, sp in zip(shapes, specs)]
    weights = [torch.randn(*s, generator=g) if sp.has_decay else None for s, sp in zip(shapes, specs)]
    return specs, updates, weights


def test_owner_exchange_equals_single_process_bit_for_bit(tmp_path):
    """Updates travel in the orthogonaliser's dtype (bf16 here) and both terms come back as
    rows: they equal the single-process terms exactly, in the same dtypes."""
    from optimizers.directions import matrix_terms

    out = tmp_path / "terms.pt"
    mp.spawn(_exchange_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    specs, updates, weights = _exchange_case()
    ref = matrix_terms(specs, updates, weights)
    assert [sorted(r) for r in ref] == [[0, 1, 2], [1, 3]]
    for k in (0, 1):
        assert sorted(got["terms"][k]) == sorted(ref[k])
        for i, term in ref[k].items():
            assert got["terms"][k][i].dtype == term.dtype and torch.equal(got["terms"][k][i], term), (k, i)
            assert term.abs().max() > 0
    # rank 0's sends: updates out and orthogonalised rows back in bf16; S_p weights and terms in fp32
    assert [dtype for dtype, _ in got["sent"]] == [torch.bfloat16, torch.float32, torch.bfloat16, torch.float32]


# ------------------------------------------------------------------ NorMuon, Aurora, SOAP under FSDP2

FAMILY = ("normuon", "aurora", "soap")


def family_make(algo, world):
    """TinyParallax (FSDP2 over ``world`` ranks when > 1) and a MuonAdamW whose matrix groups run
    ``algo``: S_p on attention, head-wise Q/K/R (not for SOAP), SOAP refreshing every 2nd call."""
    from optimizers import MuonAdamW, RoutingConfig, build_param_groups

    torch.manual_seed(0)
    model = TinyParallax()
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.layers.values():
            fully_shard(block)
        fully_shard(model)
        for m in model.modules():
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)
    cfg = RoutingConfig(lr=2e-2, weight_decay=0.1, adam={"betas": (0.8, 0.95), "eps": 1e-7},
                        muon={"algo": algo, "ortho_dtype": "float32", "soap_precondition_frequency": 2},
                        headwise="FFF" if algo == "soap" else "HHF", head_dim=4, spectral={"attn": (2, 0.5)})
    return model, MuonAdamW(build_param_groups(model, cfg), lr=2e-2)


def family_train(model, opt, steps, rank, world):
    for s in steps:
        model(batch(s).chunk(world)[rank]).float().pow(2).mean().backward()
        opt.step(), opt.zero_grad()


def family_round_trip(algo, world, rank, ckpt):
    """As ``run_round_trip``, with the optimizer state through DCP as TorchTitan's container
    stores it (flattened get/set_optimizer_state_dict)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    model, opt = family_make(algo, world)
    family_train(model, opt, range(RESUME_AT), rank, world)
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=flat)},
             checkpoint_id=ckpt)
    family_train(model, opt, range(RESUME_AT, STEPS), rank, world)
    straight = full_params(model)
    model2, opt2 = family_make(algo, world)
    state = {"model": get_model_state_dict(model2), "optim": get_optimizer_state_dict(model2, opt2, options=flat)}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model2, state["model"])
    set_optimizer_state_dict(model2, opt2, state["optim"], options=flat)
    family_train(model2, opt2, range(RESUME_AT, STEPS), rank, world)
    owned = sorted({k for st in opt.state.values() for k in st if k.startswith(("normuon_", "soap_"))})
    return straight, full_params(model2), owned


def _family_worker(rank, world, port, ckpt, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {algo: family_round_trip(algo, world, rank, f"{ckpt}_{algo}") for algo in FAMILY}
        gathered = [None] * world
        dist.all_gather_object(gathered, {algo: r[2] for algo, r in results.items()})
        if rank == 0:
            torch.save({"results": {a: r[:2] for a, r in results.items()}, "owned": gathered}, out)
    finally:
        leave_process_group(wait_s=30)


@pytest.mark.slow  # two gloo ranks; the Muon two-rank tests stay in the default selection
def test_two_rank_fsdp_family_matches_single_process_and_resumes(tmp_path):
    """NorMuon, Aurora and SOAP under FSDP2 on 2 gloo ranks: a DCP save/load midway resumes bit
    for bit, NorMuon's and SOAP's per-matrix state living on the owner ranks only (both ranks own
    some). NorMuon and Aurora equal one process to the 2-rank tolerance. SOAP is not compared
    here: after its first gradient the eigenbasis of a rectangular matrix's null space is
    arbitrary, so the 2-rank gradients' last-bit differences change its trajectory; its owner
    path is compared bit for bit with identical inputs in the exchange test below."""
    out = tmp_path / "family.pt"
    mp.spawn(_family_worker, args=(2, _free_port(), str(tmp_path / "ckpt"), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    for algo in FAMILY:
        straight, resumed = got["results"][algo]
        ref, _, _ = family_round_trip(algo, 1, 0, str(tmp_path / f"one_{algo}"))
        for k in ref:
            if algo != "soap":
                torch.testing.assert_close(straight[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"{algo} {k}")
            assert torch.equal(straight[k], resumed[k]), (algo, k)
        torch.manual_seed(0)
        init = TinyParallax().state_dict()
        assert all((ref[k] - init[k]).abs().max() > 1e-3 for k in ref if "layers.0.attention.w" in k), algo
    for algo, keys in [("normuon", ["normuon_v"]), ("soap", ["soap_L", "soap_QL", "soap_exp_avg_sq"])]:
        assert all(set(keys) <= set(rank_keys[algo]) for rank_keys in got["owned"]), algo
    assert got["owned"][0]["aurora"] == []


def _family_exchange_case(call):
    """NorMuon (bf16 orthogonaliser, head-wise), Aurora (bf16) and SOAP specs on uneven row
    shards; SOAP refreshes on call 2. Updates differ per call. One matrix per shape and
    algorithm: owners batch the same matrices as one process does (a batch of two can round
    differently from two batches of one)."""
    from optimizers.directions import MatrixSpec

    soap = (("beta1", 0.9), ("beta2", 0.95), ("eps", 1e-8), ("refresh", call == 2), ("shampoo_beta", 0.9))
    specs = [MatrixSpec(shape=(8, 12), update_coeff=-0.1, algo="normuon", dtype="bfloat16", head_dim=4,
                        options=(("beta2", 0.9), ("eps", 1e-8))),
             MatrixSpec(shape=(12, 7), update_coeff=-0.2, algo="aurora", dtype="bfloat16",
                        options=(("beta", 0.5), ("eps", 1e-7), ("iterations", 2))),
             MatrixSpec(shape=(7, 12), update_coeff=-0.3, algo="soap", options=soap),
             MatrixSpec(shape=(10, 6), update_coeff=-0.3, algo="soap", options=soap, sp_coeff=-0.01, sp_power=2),
             MatrixSpec(shape=(9, 5), update_coeff=-0.1, algo="normuon", options=(("beta2", 0.9), ("eps", 1e-8)))]
    g = torch.Generator().manual_seed(10 + call)
    updates = [torch.randn(*s.shape, generator=g) for s in specs]
    weights = [torch.randn(*s.shape, generator=g) if s.has_decay else None for s in specs]
    return specs, updates, weights


def _family_exchange_worker(rank, world, port, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from optimizers import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        states, calls = None, []
        for call in (1, 2, 3):
            specs, updates, weights = _family_exchange_case(call)
            states = states or [{} for _ in specs]
            params = [distribute_tensor(u, mesh, [Shard(0)]) for u in updates]
            local = [distribute_tensor(u, mesh, [Shard(0)]).to_local() for u in updates]
            local_w = [None if w is None else distribute_tensor(w, mesh, [Shard(0)]).to_local() for w in weights]
            terms = distributed.full_matrix_terms(specs, local, local_w, params, None, states)
            gathered = [None] * world
            dist.all_gather_object(gathered, terms)
            calls.append([{i: torch.cat([g[k][i] for g in gathered]) for i in terms[k]} for k in (0, 1)])
        owned = [sorted(k for st in states for k in st)]
        all_owned = [None] * world
        dist.all_gather_object(all_owned, owned)
        if rank == 0:
            torch.save({"calls": calls, "owned": all_owned}, out)
    finally:
        leave_process_group(wait_s=30)


@pytest.mark.slow  # two gloo ranks; the Muon two-rank tests stay in the default selection
def test_owner_exchange_family_equals_single_process_bit_for_bit(tmp_path):
    """Three calls of NorMuon / Aurora / SOAP (first call, a refresh, a plain one) through the
    owner exchange give the single-process terms exactly; each rank holds only its own
    matrices' state."""
    from optimizers.directions import matrix_terms

    out = tmp_path / "family_terms.pt"
    mp.spawn(_family_exchange_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    states = None
    for call, terms in zip((1, 2, 3), got["calls"]):
        specs, updates, weights = _family_exchange_case(call)
        states = states or [{} for _ in specs]
        ref = matrix_terms(specs, updates, weights, None, states)
        for k in (0, 1):
            assert sorted(terms[k]) == sorted(ref[k]), (call, k)
            for i, term in ref[k].items():
                assert terms[k][i].dtype == term.dtype and torch.equal(terms[k][i], term), (call, k, i)
                assert call == 1 and specs[i].algo == "soap" and k == 0 or term.abs().max() > 0, (call, k, i)
    owned = [set(keys) for (keys,) in got["owned"]]
    assert owned[0] and owned[1] and owned[0] | owned[1] >= {"normuon_v", "soap_L", "soap_QR"}
