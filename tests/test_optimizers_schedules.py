"""TorchTitan glue: WSD / cosine / WDA boundary values, TOML parsing, validation, metrics."""

import math
import textwrap

import pytest
import torch

from optimizers.schedules import SchedulePhases, decay_progress, wd_anneal_factor
from parallax_titan.optim_builder import build_lr_schedulers, build_optimizers
from parallax_titan.config import JobConfig
from tests._optim_models import TinyParallax


def parse_toml(tmp_path, body):
    from torchtitan.config import ConfigManager

    path = tmp_path / "cfg.toml"
    path.write_text(textwrap.dedent(body))
    return ConfigManager(JobConfig).parse_args([f"--job.config_file={path}"])


def optim_problems(cfg) -> list[str]:
    return cfg.optimizer.validate() + cfg.lr_scheduler.validate()


def run_schedule(tmp_path, body, steps):
    cfg = parse_toml(tmp_path, body)
    opt = build_optimizers([TinyParallax()], cfg.optimizer, None)
    sched = build_lr_schedulers(opt, cfg.lr_scheduler, steps)
    lrs, mults = [], []
    for _ in range(steps):  # train step s uses the values after s - 1 scheduler steps
        group = opt.optimizers[0].param_groups[0]
        lrs.append(group["lr"] / group["base_lr"]), mults.append(group["wd_mult"])
        sched.step()
    return lrs, mults, opt, sched


def test_wsd_boundaries_and_wda(tmp_path):
    body = """
    [optimizer]
    name = "Muon"
    lr = 5e-3
    [lr_scheduler]
    warmup_steps = 0
    decay_ratio = 0.2
    decay_type = "linear"
    wd_anneal_gamma = 2.0
    """
    lrs, mults, *_ = run_schedule(tmp_path, body, 100)
    # 100 steps, 20 decay steps; TorchTitan's virtual last step: stable = 81 scheduler steps
    assert lrs[:81] == [1.0] * 81
    assert lrs[81] == pytest.approx(1 - 1 / 20) and lrs[99] == pytest.approx(1 - 19 / 20)
    assert mults[:81] == [1.0] * 81
    assert mults[81] == pytest.approx((1 - 1 / 20) ** 2) and mults[99] == pytest.approx((1 / 20) ** 2)


def test_cosine_with_warmup_and_floor(tmp_path):
    body = """
    [optimizer]
    name = "AdamW"
    lr = 3e-4
    [lr_scheduler]
    warmup_steps = 10
    decay_type = "cosine"
    min_lr_factor = 0.1
    """
    lrs, mults, *_ = run_schedule(tmp_path, body, 100)
    assert lrs[0] == pytest.approx(1 / 10) and lrs[9] == pytest.approx(1.0)
    # decay from step 10 over 90 steps (stable = 1 virtual step)
    for k in (11, 50, 99):
        t = (k + 1 - 11) / 90
        assert lrs[k] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
    assert mults == [1.0] * 100  # gamma 0: no annealing


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0])
def test_wd_anneal_factor_closed_form(gamma):
    ph = SchedulePhases(warmup_steps=5, stable_steps=20, decay_steps=10)
    assert wd_anneal_factor(24, ph, gamma) == 1.0
    assert decay_progress(25, ph) == pytest.approx(0.1)
    assert wd_anneal_factor(25, ph, gamma) == pytest.approx(0.9**gamma)
    assert wd_anneal_factor(34, ph, gamma) == 0.0 and wd_anneal_factor(40, ph, gamma) == 0.0


def test_toml_recipe_builds_groups_and_metrics(tmp_path):
    body = """
    [optimizer]
    name = "Muon"
    lr = 5e-3
    beta1 = 0.8
    eps = 1e-7
    weight_decay = 0.1
    lr_multipliers = ["embed=0.3", "norm=0.015"]
    muon_headwise = "HHF"
    spectral_power_attn = 2
    spectral_coeff_attn = 7e-5
    spectral_categories = ["attn_v"]
    [lr_scheduler]
    warmup_steps = 0
    decay_ratio = 0.2
    """
    cfg = parse_toml(tmp_path, body)
    assert optim_problems(cfg) == []
    model = TinyParallax()
    opt = build_optimizers([model], cfg.optimizer, None)
    groups = {g["name"]: g for g in opt.optimizers[0].param_groups}
    assert groups["attn_q"]["head_dim"] == 4 and groups["attn_v"]["head_dim"] == 0  # from model.head_dim
    assert groups["attn_v"]["sp_power"] == 2 and groups["attn_q"]["sp_coeff"] == 0.0
    assert groups["embed"]["betas"] == (0.8, 0.95) and groups["embed"]["lr"] == pytest.approx(1.5e-3)
    build_lr_schedulers(opt, cfg.lr_scheduler, 10)
    m = opt.schedule_metrics()
    assert m["optim/lr/norm"] == pytest.approx(7.5e-5)
    assert m["optim/wd/attn_q"] == pytest.approx(5e-3 * 0.1)
    assert m["optim/sp_decay_p2/attn_v"] == pytest.approx(5e-3 * 7e-5)
    model(torch.randint(0, 32, (2, 6))).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("section,key,value,match", [
    ("optimizer", "orthogonalizer", '"svd"', "optimizer.orthogonalizer: expected one of"),
    ("optimizer", "muon_headwise", '"HQF"', "optimizer.muon_headwise: 'HQF'"),
    ("optimizer", "lr", "-1.0", "optimizer.lr: expected a finite float > 0, got -1.0"),
    ("optimizer", "spectral_power_mlp", "-2",
     "optimizer.spectral_power_mlp: expected an int from 0 to 16 (sigma^p overflows fp32 above it), got -2"),
    ("optimizer", "name", '"SGD"', "optimizer.name: expected one of ('Muon', 'NorMuon', 'Aurora', 'SOAP', 'AdamW'), got 'SGD'"),
    ("optimizer", "lr_multipliers", '["embed:0.3"]', "optimizer.lr_multipliers: entry 'embed:0.3'"),
    ("optimizer", "spectral_band", '"top"', "optimizer.spectral_band_tau: expected > 0 when spectral_band is set, got 0.0"),
    ("lr_scheduler", "wd_anneal_gamma", "-1.0", "lr_scheduler.wd_anneal_gamma: expected a finite float >= 0, got -1.0"),
])
def test_validation_errors_name_key_and_value(tmp_path, section, key, value, match):
    try:
        cfg = parse_toml(tmp_path, f"[{section}]\n{key} = {value}\n")
    except (SystemExit, Exception) as e:  # tyro rejects Literal violations while parsing
        assert section == "optimizer" and key in ("orthogonalizer", "spectral_band"), e
        return
    assert any(match in p for p in optim_problems(cfg)), optim_problems(cfg)
