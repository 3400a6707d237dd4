"""MuonAdamW vs independent fp64 references; routing; head-wise; decay conventions."""

import math

import pytest
import torch
import torch.nn as nn

from optimizers import MuonAdamW, RoutingConfig, build_param_groups, categorize, parse_headwise
from optimizers.routing import DEFAULT_PARAM_RULES, parse_rules
from tests._optim_helpers import polar_svd, spectrum_matrix
from tests._optim_models import TinyParallax


def svd_sp(W, p):
    U, s, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    return (U * s**p) @ Vh


def reference_muon(W0, grads, lr, mu, wd, p, lam, scale_kind, head_dim=0, nesterov=True):
    """fp64 Muon + decoupled decay, polar by SVD (independent of the optimizer code)."""
    W, B = W0.double().clone(), torch.zeros_like(W0, dtype=torch.float64)
    m, n = W.shape
    scale = {"match_rms_adamw": 0.2 * math.sqrt(max(m, n)), "spectral": math.sqrt(max(1, m / n))}[scale_kind]
    for g in grads:
        g = g.double()
        B = mu * B + g
        U = g + mu * B if nesterov else B
        if head_dim:
            O = torch.cat([polar_svd(blk) for blk in U.split(head_dim)])
        else:
            O = polar_svd(U)
        W = W - lr * (wd * W + lam * svd_sp(W, p)) - lr * scale * O
    return W


@pytest.mark.parametrize("shape,scale_kind,p,head_dim", [
    ((32, 16), "match_rms_adamw", 2, 0),
    ((16, 40), "spectral", 0, 0),
    ((24, 16), "match_rms_adamw", 1, 8),
])
def test_muon_matches_fp64_reference(shape, scale_kind, p, head_dim):
    torch.manual_seed(0)
    W0 = torch.randn(shape) / 4
    grads = [torch.randn(shape) for _ in range(3)]
    param = nn.Parameter(W0.clone())
    opt = MuonAdamW([{"params": [param], "algo": "muon", "head_dim": head_dim}], lr=0.02, weight_decay=0.1,
                    sp_power=p, sp_coeff=0.05, update_scale=scale_kind, ortho_dtype="float32")
    for g in grads:
        param.grad = g.clone()
        opt.step()
    ref = reference_muon(W0, grads, 0.02, 0.95, 0.1, p, 0.05, scale_kind, head_dim)
    torch.testing.assert_close(param.detach().double(), ref, rtol=0, atol=2e-5)


def test_adamw_group_matches_torch_adamw():
    torch.manual_seed(1)
    a = [nn.Parameter(torch.randn(6, 5)), nn.Parameter(torch.randn(7))]
    b = [nn.Parameter(t.detach().clone()) for t in a]
    ours = MuonAdamW([{"params": a}], lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1)
    ref = torch.optim.AdamW(b, lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1, foreach=False)
    for _ in range(4):
        gs = [torch.randn_like(t) for t in a]
        for x, y, g in zip(a, b, gs):
            x.grad, y.grad = g.clone(), g.clone()
        ours.step(), ref.step()
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("coupling", ["lr", "independent"])
def test_decay_conventions_and_wd_mult(coupling):
    W, U, s, V = spectrum_matrix(12, 8, torch.linspace(2, 0.2, 8), 2, dtype=torch.float32)
    param = nn.Parameter(W.clone())
    opt = MuonAdamW([{"params": [param], "algo": "muon"}], lr=0.1, weight_decay=0.2, sp_power=2,
                    sp_coeff=0.3, decay_coupling=coupling)
    opt.param_groups[0]["lr"] = 0.05  # scheduler halved the lr: eta_t = 0.5
    opt.param_groups[0]["wd_mult"] = 0.25
    param.grad = torch.zeros_like(W)  # ortho(0) = 0: only the decay branch acts
    opt.step()
    scale = (0.05 if coupling == "lr" else 0.5) * 0.25
    ref = W.double() - scale * (0.2 * W.double() + 0.3 * svd_sp(W, 2))
    torch.testing.assert_close(param.detach().double(), ref, rtol=0, atol=1e-6)


def test_band_selected_decay_in_optimizer():
    W, U, s, V = spectrum_matrix(12, 8, torch.linspace(2, 0.2, 8), 4, dtype=torch.float32)
    param = nn.Parameter(W.clone())
    opt = MuonAdamW([{"params": [param]}], lr=0.1, sp_power=2, sp_coeff=0.5, sp_band="top_only", sp_band_tau=1.0)
    param.grad = torch.zeros_like(W)  # AdamW with zero grad: update 0
    opt.step()
    s64 = s.double()
    target = s64 - 0.1 * 0.5 * torch.where(s64 > 1.0, s64**2, 0 * s64)
    torch.testing.assert_close(torch.linalg.svdvals(param.detach().double()), target, atol=1e-4, rtol=0)


BAND_SIGMAS = [2.0, 1.6, 1.3, 1.15, 0.8, 0.6, 0.5, 0.3]  # full rank: S_0 of a null mode is 0, not 0**0


def svd_band_term(W, p, band, tau):
    """fp64 SVD reference of the band-selected decay direction: sigma^p on the selected modes,
    sigma (ordinary decay) on the other band for "top"/"bottom", zero there for the "*_only" bands."""
    U, s, Vh = torch.linalg.svd(W.double(), full_matrices=False)
    top = s > tau
    d = {"none": s**p, "top": torch.where(top, s**p, s), "bottom": torch.where(top, s, s**p),
         "top_only": torch.where(top, s**p, 0 * s), "bottom_only": torch.where(top, 0 * s, s**p)}[band]
    return (U * d) @ Vh


@pytest.mark.parametrize("shape", [(12, 8), (8, 14)])
@pytest.mark.parametrize("band", ["none", "top", "bottom", "top_only", "bottom_only"])
@pytest.mark.parametrize("p", [0, 1, 2, 4])
def test_band_selected_decay_matches_svd(p, band, shape):
    """One decay-only step (zero gradient: ortho(0) = 0) against an fp64 SVD of W: the band is
    applied for every p, p = 1 included (S_1 P_top = W P_top, not the whole W)."""
    m, n = shape
    W, *_ = spectrum_matrix(m, n, BAND_SIGMAS, 21, dtype=torch.float32)
    param = nn.Parameter(W.clone())
    opt = MuonAdamW([{"params": [param], "algo": "muon"}], lr=0.1, weight_decay=0.2, sp_power=p, sp_coeff=0.3,
                    sp_band=band, sp_band_tau=1.0)
    param.grad = torch.zeros_like(W)
    opt.step()
    ref = W.double() - 0.1 * (0.2 * W.double() + 0.3 * svd_band_term(W, p, band, 1.0))
    torch.testing.assert_close(param.detach().double(), ref, rtol=0, atol=2e-6)


def test_routing_from_config():
    model = TinyParallax()
    cfg = RoutingConfig(lr=5e-3, lr_multipliers={"embed": 0.3, "norm": 0.015}, weight_decay=0.1,
                        muon={"momentum": 0.9}, adam={"betas": (0.8, 0.95), "eps": 1e-7},
                        headwise="HHF", head_dim=4, spectral={"attn": (0, 1e-3), "mlp": (2, 2e-3)},
                        spectral_categories=("attn_v", "mlp"), no_decay_categories=("norm",))
    groups = {g["name"]: g for g in build_param_groups(model, cfg)}
    assert set(groups) == {"embed", "norm", "gate", "attn_q", "attn_k", "attn_v", "attn_o", "attn_r", "mlp"}
    # tied output routed once, with the embedding
    all_params = [p for g in groups.values() for p in g["params"]]
    assert len(all_params) == len({id(p) for p in all_params}) == len(list(model.parameters()))
    assert groups["embed"]["params"] == [model.tok_embeddings.weight]
    assert groups["embed"]["lr"] == pytest.approx(1.5e-3) and groups["norm"]["lr"] == pytest.approx(7.5e-5)
    assert groups["norm"]["weight_decay"] == 0.0 and groups["gate"]["weight_decay"] == 0.1
    assert all(groups[c]["algo"] == "adamw" for c in ("embed", "norm", "gate"))
    assert groups["gate"]["betas"] == (0.8, 0.95) and groups["gate"]["eps"] == 1e-7
    assert all(groups[c]["algo"] == "muon" and groups[c]["momentum"] == 0.9
               for c in ("attn_q", "attn_k", "attn_v", "attn_o", "attn_r", "mlp"))
    assert len(groups["mlp"]["params"]) == 6 and len(groups["norm"]["params"]) == 2 * 5 + 1
    # HHF: Q, K (and R, following Q) per head, V full; O never per head
    assert [groups[c].get("head_dim", 0) for c in ("attn_q", "attn_k", "attn_v", "attn_r", "attn_o")] == [4, 4, 0, 4, 0]
    # spectral decay only where requested
    assert (groups["attn_v"]["sp_power"], groups["attn_v"]["sp_coeff"]) == (0, 1e-3)
    assert (groups["mlp"]["sp_power"], groups["mlp"]["sp_coeff"]) == (2, 2e-3)
    assert "sp_coeff" not in groups["attn_q"]
    opt = MuonAdamW(list(groups.values()), lr=5e-3)
    loss = model(torch.randint(0, 32, (2, 5))).square().mean()
    loss.backward()
    opt.step()


def test_adamw_only_routing_and_untied_head():
    model = TinyParallax(tied=False)
    groups = {g["name"]: g for g in build_param_groups(model, RoutingConfig(use_muon=False))}
    assert groups["head"]["params"] == [model.output.weight]
    assert all(g["algo"] == "adamw" for g in groups.values())


def test_categorize_strips_wrappers_and_custom_rules():
    rules = parse_rules(DEFAULT_PARAM_RULES)
    assert categorize("_orig_mod.layers.3._checkpoint_wrapped_module.attention.wv.weight", rules) == "attn_v"
    assert categorize("layers.0.attention.q_norm.weight", rules) == "norm"
    assert categorize("layers.0.attention.gate.weight", rules) == "gate"
    assert categorize("something.else.weight", rules) == "other"
    custom = parse_rules(["mlp=experts", *DEFAULT_PARAM_RULES])
    assert categorize("layers.0.moe.experts.w1", custom) == "mlp"
    with pytest.raises(ValueError, match="expected 'category=regex'"):
        parse_rules(["noequals"])


def test_headwise_parse_and_errors():
    assert parse_headwise("HHF") == {"attn_q": True, "attn_k": True, "attn_v": False, "attn_r": True}
    assert parse_headwise("FFFH")["attn_r"] is True
    with pytest.raises(ValueError, match="muon_headwise: 'HXF'"):
        parse_headwise("HXF")
    with pytest.raises(ValueError, match="head_dim"):
        build_param_groups(TinyParallax(), RoutingConfig(headwise="HHH", head_dim=0))


def test_same_shape_matrices_are_stacked_without_a_view_per_matrix():
    """A bucket of same-shape matrices goes in with one stack and comes out with one unbind: no
    aten op per matrix on the way (each was host time the GPU waited for in a 0.6B step), and
    each direction equals the matrix's own polar factor."""
    from optimizers.directions import MatrixSpec, matrix_terms
    from optimizers.orthogonalize import polar_express
    from tests._aten_ops import AtenOps

    n = 40  # more matrices than any op of the 8-step iteration runs (16 bmm)
    updates = [torch.randn(12, 20, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    specs = [MatrixSpec(shape=(12, 20), update_coeff=-1.0)] * n
    with AtenOps() as mode:
        directions, _ = matrix_terms(specs, updates, [None] * n)
    ops = [op.split(".")[1] for op in mode.ops]  # per op, its overloads together ("aten.bmm.default" -> "bmm")
    per_matrix = [op for op in set(ops) if ops.count(op) >= n]
    assert not per_matrix, per_matrix
    for i, U in enumerate(updates):
        torch.testing.assert_close(directions[i], polar_express(U), rtol=1e-5, atol=1e-5)


def test_step_phases_are_named_in_a_profile():
    """A profiled step shows its phases as ranges (what trace_summary attributes the GPU's idle time
    to), in order: momentum, work list, matrix terms, decay and Adam, apply."""
    model = TinyParallax()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = MuonAdamW(build_param_groups(model, RoutingConfig()), lr=0.01)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    names = ["muon.momentum", "muon.work_list", "muon.matrix_terms", "muon.decay_and_adam", "muon.apply"]
    starts = {e.name: e.time_range.start for e in prof.events() if e.name in names}
    assert sorted(starts, key=starts.get) == names


def test_work_list_builds_one_spec_per_group_and_shape(monkeypatch):
    """The work list shares one MatrixSpec among a group's same-shape matrices (a spec per matrix
    was host time the GPU waited for), and every matrix gets its group's lr in its coefficient."""
    import optimizers.muon as muon_module

    built, spec_class = [], muon_module.MatrixSpec

    def counting_spec(**fields):
        built.append(fields["shape"])
        return spec_class(**fields)

    layers = nn.ModuleList(nn.Linear(8, 8, bias=False) for _ in range(6))
    opt = MuonAdamW([{"params": [l.weight for l in layers], "algo": "muon"}], lr=0.02)
    for layer in layers:
        layer.weight.grad = torch.randn(8, 8)
    monkeypatch.setattr(muon_module, "MatrixSpec", counting_spec)
    group = opt.param_groups[0]
    work = opt._matrix_work(group, group["params"])
    assert built == [(8, 8)]
    assert len(work) == 6 and all(spec is work[0][1] for _, spec, _ in work)
    assert work[0][1].update_coeff == -0.02 * muon_module.update_scale(group["update_scale"], 8, 8)
