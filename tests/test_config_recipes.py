"""The shipped configs carry the recipes of SPEC.md and the seed papers.

Every number below is typed in from SPEC.md section 3 or the seed text it cites (not read from
scripts/make_configs.py); each config is loaded through ``load_config``, so the check sees what a
run would train with.
"""

from __future__ import annotations

import glob
import os

import pytest

from parallax_titan.config import load_config
from parallax_titan.spec import model_args_for, register_all

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
register_all()


def load(rel: str):
    return load_config(["--job.config_file", os.path.join(REPO, "configs", rel)], check_data=False)


def files(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, os.path.join(REPO, "configs"))
                  for p in glob.glob(os.path.join(REPO, "configs", pattern)))


# SPEC.md section 3, "Paper recipe (0.6B/1.7B)".
PAPER_MUON = dict(lr=5e-3, weight_decay=0.1, muon_momentum=0.95, beta1=0.8, beta2=0.95, eps=1e-7,
                  lr_multipliers={"embed": 0.3, "norm": 0.015})
PAPER_ADAMW = dict(lr=3e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)
PAPER_BATCH = {"0.6B": 960, "1.7B": 1920}


def check_optimizer(cfg, expected: dict) -> None:
    opt = cfg.optimizer
    for key, value in expected.items():
        got = opt.multipliers() if key == "lr_multipliers" else getattr(opt, key)
        assert got == pytest.approx(value), (key, got, value)


def check_schedule(cfg, warmup: int, decay_type: str, min_factor: float, decay_ratio=None) -> None:
    s = cfg.lr_scheduler
    assert (s.warmup_steps, s.decay_type) == (warmup, decay_type)
    assert s.min_lr_factor == pytest.approx(min_factor)
    assert s.decay_ratio == (None if decay_ratio is None else pytest.approx(decay_ratio))


@pytest.mark.parametrize("size", ["0.6B", "1.7B"])
def test_paper_recipes(size):
    paths = files(f"paper/{size}/*.toml")
    assert len(paths) >= 15
    for rel in paths:
        cfg = load(rel)
        t = cfg.training
        assert (t.seq_len, t.steps, t.global_batch_size, t.max_norm) == (4096, 20_000, PAPER_BATCH[size], 1.0), rel
        assert t.mixed_precision_param == "bfloat16", rel
        if rel.endswith("muon_wsd.toml"):
            assert cfg.optimizer.name == "Muon"
            check_optimizer(cfg, PAPER_MUON)
            assert cfg.optimizer.muon_nesterov and cfg.optimizer.muon_update_scale == "match_rms_adamw"
        else:
            assert cfg.optimizer.name == "AdamW", rel
            check_optimizer(cfg, PAPER_ADAMW)
        if "_wsd" in rel:  # WSD: no warmup, constant to 80%, linear decay to 0
            check_schedule(cfg, 0, "linear", 0.0, decay_ratio=0.2)
        else:  # cosine: 1% warmup, to 0
            check_schedule(cfg, 200, "cosine", 0.0)


def test_paper_model_shapes():
    """SPEC.md section 2's table and controls."""
    shapes = {"0.6B": (1024, 3072, 28, 16, 8, 128, 151936), "1.7B": (2048, 6144, 28, 16, 8, 128, 151936)}
    for size, (dim, ffn, layers, hq, hkv, d, vocab) in shapes.items():
        a = model_args_for(load(f"paper/{size}/parallax_muon_wsd.toml"))
        assert (a.dim, a.hidden_dim, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.vocab_size) == (
            dim, ffn, layers, hq, hkv, d, vocab)
        assert a.enable_weight_tying == (size == "0.6B")
    dagger = model_args_for(load("paper/0.6B/parallax_dagger_muon_wsd.toml"))
    assert (dagger.head_dim, dagger.hidden_dim) == (64, 4480)
    assert model_args_for(load("paper/0.6B/transformer_dagger_muon_wsd.toml")).n_heads == 24
    assert load("paper/0.6B/parallax_norope_muon_wsd.toml").parallax.rho_rope is False


def test_wda_ablations():
    """Seed 000 appendix G: lambda(t) = lambda (1 - t)^gamma, gamma in {0.5, 1, 2}, 0.6B, Muon + WSD."""
    gammas = sorted(load(rel).lr_scheduler.wd_anneal_gamma for rel in files("ablations/0.6B/*wda*.toml"))
    assert gammas == [0.5, 1.0, 2.0]


def test_sp_power_sweep_is_ours_and_sp1_is_the_paper_recipe():
    paper = load("paper/0.6B/parallax_muon_wsd.toml")
    for p in (0, 1, 2, 4):
        rel = f"ablations/0.6B/parallax_muon_wsd_sp{p}.toml"
        with open(os.path.join(REPO, "configs", rel)) as f:
            assert "EXPLORATORY SWEEP OF OURS" in f.read()
        opt = load(rel).optimizer
        assert (opt.spectral_power_attn, opt.spectral_power_mlp) == (p, p)
        # S_p replaces ordinary decay on the matrices at the recipe's own coefficient, LR-coupled
        assert opt.spectral_coeff_attn == opt.spectral_coeff_mlp == paper.optimizer.weight_decay
        assert opt.decay_coupling == "lr"
        assert set(opt.no_decay_categories) == {"attn_q", "attn_k", "attn_v", "attn_o", "attn_r", "mlp"}


# Seed 003 section 4 ("训练协议与系数扫描"), SPEC.md section 3 "Seed 003's experiments".
SEED003_SHAPE = dict(n_layers=12, dim=768, head_dim=128)
SEED003_TOKENS_PER_STEP = 524_288
SEED003_HEADWISE = dict(steps=16_204, tokens=8_495_562_752, lr=0.005, warmup=256, min_factor=0.1, wd=0.1, seed=42)


def check_seed003_model(cfg) -> None:
    a = model_args_for(cfg)
    assert cfg.model.name == "transformer"  # softmax attention: the seed's model has no probe
    assert (a.n_layers, a.dim, a.head_dim) == (SEED003_SHAPE["n_layers"], SEED003_SHAPE["dim"],
                                               SEED003_SHAPE["head_dim"])
    assert a.n_heads * a.head_dim == a.n_kv_heads * a.head_dim == 768  # V is the full 768 x 768 matrix
    assert a.n_heads == 6  # "六个 head 的 15 对 CKA"
    t = cfg.training
    assert t.seq_len * t.global_batch_size == SEED003_TOKENS_PER_STEP
    assert cfg.debug.seed == 42
    assert cfg.optimizer.name == "Muon" and cfg.optimizer.muon_update_scale == "match_rms_adamw"


@pytest.mark.parametrize("letters,power,coeff", [("HHH", 1, 0.0), ("HHF", 1, 0.0), ("HHF_p2v", 2, 7e-5)])
def test_seed003_headwise_recipes(letters, power, coeff):
    cfg = load(f"seed003/headwise_{letters}.toml")
    check_seed003_model(cfg)
    r = SEED003_HEADWISE
    assert cfg.training.steps == r["steps"]
    assert cfg.training.steps * cfg.training.global_batch_size * cfg.training.seq_len == r["tokens"]
    opt = cfg.optimizer
    assert opt.lr == r["lr"] and opt.weight_decay == r["wd"] and opt.decay_coupling == "lr"
    assert opt.muon_headwise == letters[:3]
    check_schedule(cfg, r["warmup"], "cosine", r["min_factor"])
    if coeff:  # S_2 on the full V only, on top of the ordinary decay
        assert (opt.spectral_power_attn, opt.spectral_coeff_attn, opt.spectral_categories) == (power, coeff, ["attn_v"])
    assert opt.spectral_coeff_mlp == 0.0 and (coeff or opt.spectral_coeff_attn == 0.0)


def test_seed003_headwise_sweeps():
    """lambda_V swept 1e-5 to 5e-4 dense near 7e-5 (S_2); p = 0 control at 0.005 and 0.004-0.010."""
    by_power = {0: [], 2: []}
    for rel in files("seed003/headwise_sweeps/*.toml"):
        cfg = load(rel)
        check_seed003_model(cfg)
        opt = cfg.optimizer
        assert opt.muon_headwise == "HHF" and opt.weight_decay == 0.1 and opt.spectral_categories == ["attn_v"]
        assert cfg.training.steps == 16_204
        by_power[opt.spectral_power_attn].append(opt.spectral_coeff_attn)
    lam2, lam0 = sorted(by_power[2]), sorted(by_power[0])
    assert lam2[0] == pytest.approx(1e-5) and lam2[-1] == pytest.approx(5e-4) and 7e-5 in lam2
    assert sum(5e-5 <= x <= 1e-4 for x in lam2) > len(lam2) / 2  # dense near 7e-5
    assert lam0[0] == pytest.approx(0.004) and lam0[-1] == pytest.approx(0.010) and 0.005 in lam0


# Seed 003 section 5.1 ("按模块选择谱偏好").
ASYM_ALPHAS = {8e-4, 2.529822e-3, 8e-3}
ASYM_LAMBDAS = {8e-5, 2.529822e-4, 8e-4}


def check_asymmetric_run(cfg) -> tuple:
    opt = cfg.optimizer
    check_seed003_model(cfg)
    assert cfg.training.steps == 7_268
    assert opt.decay_coupling == "independent" and opt.weight_decay == 0.0  # no ordinary WD on top
    assert cfg.lr_scheduler.warmup_steps > 0  # Figure 10: "预热后的训练"
    return (opt.spectral_power_attn, opt.spectral_power_mlp), opt.lr, opt.spectral_coeff_attn, opt.spectral_coeff_mlp


def test_seed003_asymmetric_grid():
    runs = [check_asymmetric_run(load(rel)) for rel in files("seed003/asymmetric_grid/*.toml")]
    assert len(runs) == 54
    grid = {(a, la, lm) for a in ASYM_ALPHAS for la in ASYM_LAMBDAS for lm in ASYM_LAMBDAS}
    for powers in ((1, 1), (0, 2)):
        family = {(a, la, lm) for p, a, la, lm in runs if p == powers}
        assert len(family) == 27 and family == grid


@pytest.mark.parametrize("name,powers,lam_a,lam_m", [("ordinary", (1, 1), 2.52982213e-4, 8e-5),
                                                     ("asymmetric", (0, 2), 8e-5, 8e-5)])
def test_seed003_matched_pair(name, powers, lam_a, lam_m):
    assert check_asymmetric_run(load(f"seed003/asymmetric_pair_{name}.toml")) == (powers, 8e-4, lam_a, lam_m)


def test_headwise_ports_say_so():
    for letters in ("HHH", "HHF", "HHF_p2v"):
        rel = f"ablations/0.6B/parallax_muon_headwise_{letters}.toml"
        with open(os.path.join(REPO, "configs", rel)) as f:
            assert "PORT of seed 003" in f.read()
        cfg = load(rel)
        assert cfg.model.name == "parallax" and cfg.optimizer.muon_headwise == letters[:3]
        check_schedule(cfg, 256, "cosine", 0.1)
        has_v_term = cfg.optimizer.spectral_coeff_attn > 0
        assert has_v_term == letters.endswith("p2v")  # HHH and HHF are the plain controls


def test_readme_lists_every_ablation_config():
    with open(os.path.join(REPO, "configs", "README.md")) as f:
        text = f.read()
    for rel in files("ablations/0.6B/*.toml") + files("seed003/*.toml"):
        assert f"`{rel}`" in text, rel
    for folder in ("seed003/headwise_sweeps/", "seed003/asymmetric_grid/"):
        assert f"`{folder}`" in text
