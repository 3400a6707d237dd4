"""Optimizer / lr-scheduler TOML keys added by Parallax-Titan (merged into TorchTitan's JobConfig).

Only the extra fields live here; TorchTitan's own ``[optimizer]`` (name, lr, beta1,
beta2, eps, weight_decay, ...) and ``[lr_scheduler]`` (warmup_steps, decay_ratio,
decay_type, min_lr_factor, total_steps) keys keep their meaning. For Muon runs
``beta1``/``beta2``/``eps`` configure the Adam group. See docs/optimizers.md.
"""


import math
from dataclasses import MISSING, dataclass, field, fields
from types import SimpleNamespace
from typing import Literal

from optimizers.directions import ORTHO_DTYPES, UPDATE_SCALES
from optimizers.orthogonalize import ORTHOGONALIZERS
from optimizers.routing import ATTN_CATEGORIES, DEFAULT_PARAM_RULES, parse_headwise, parse_rules
from optimizers.spectral import BANDS

__all__ = ["Optimizer", "LRScheduler", "JobConfig", "validate_optim_config", "validate_optimizer",
           "validate_lr_scheduler", "with_defaults", "parse_multipliers", "OPTIMIZER_NAMES"]

OPTIMIZER_NAMES = ("Muon", "AdamW")


@dataclass
class Optimizer:
    muon_momentum: float = 0.95
    """Muon momentum coefficient mu (B <- mu B + G)."""

    muon_nesterov: bool = True
    """Nesterov update U = G + mu B (else U = B)."""

    orthogonalizer: Literal["polar_express", "newton_schulz"] = "polar_express"
    """Muon orthogonaliser."""

    ortho_steps: int = 0
    """Orthogonaliser steps; 0 = its default (8 Polar Express, 5 Newton-Schulz)."""

    ortho_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """Orthogonaliser compute dtype; auto = bf16 on GPU, fp32 on CPU."""

    muon_update_scale: Literal["match_rms_adamw", "spectral", "none"] = "match_rms_adamw"
    """Update scale: 0.2 sqrt(max(m, n)) (Moonlight), sqrt(max(1, m/n)), or 1."""

    muon_headwise: str = "FFF"
    """Per projection Q,K,V(,R): H = orthogonalise per head, F = full matrix; R follows Q if omitted."""

    muon_head_dim: int = 0
    """Head dim for head-wise Muon; 0 = read `head_dim` from the model's attention modules."""

    param_rules: list[str] = field(default_factory=lambda: list(DEFAULT_PARAM_RULES))
    """Ordered 'category=regex' rules on parameter FQNs (first match; unmatched = 'other')."""

    muon_categories: list[str] = field(default_factory=lambda: [*ATTN_CATEGORIES, "mlp", "other"])
    """Categories whose 2-D parameters Muon updates; everything else goes to the Adam group."""

    lr_multipliers: list[str] = field(default_factory=list)
    """'category=multiplier' lr multipliers, e.g. ['embed=0.3', 'norm=0.015']."""

    no_decay_categories: list[str] = field(default_factory=list)
    """Categories without ordinary weight decay (e.g. ['norm', 'bias'])."""

    spectral_power_attn: int = 1
    """S_p power p_A for attention matrices (wq, wk, wv, wo, wr); 1 = ordinary decay."""

    spectral_coeff_attn: float = 0.0
    """S_p coefficient lambda_A for attention matrices; 0 disables."""

    spectral_power_mlp: int = 1
    """S_p power p_M for MLP matrices (w1, w2, w3)."""

    spectral_coeff_mlp: float = 0.0
    """S_p coefficient lambda_M for MLP matrices; 0 disables."""

    spectral_categories: list[str] = field(default_factory=lambda: [*ATTN_CATEGORIES, "mlp"])
    """Categories that receive the S_p term (e.g. ['attn_v'] for V-only decay)."""

    decay_coupling: Literal["lr", "independent"] = "lr"
    """Decay scale: 'lr' = coefficients times the current lr; 'independent' = times the
    schedule multiplier eta_t only. Applies to weight_decay and the S_p coefficients."""

    spectral_band: Literal["none", "top", "bottom", "top_only", "bottom_only"] = "none"
    """Band selection of the S_p term around spectral_band_tau (SPEC.md 3)."""

    spectral_band_tau: float = 0.0
    """Singular-value threshold tau for band selection."""

    msign_steps: int = 20
    """Iterations of the matrix-sign polynomial for band projectors."""


@dataclass
class LRScheduler:
    wd_anneal_gamma: float = 0.0
    """Weight-decay annealing lambda(t) = lambda (1 - t)^gamma over the lr decay stage; 0 = off."""


@dataclass
class JobConfig:
    """Usable directly as `job.custom_config_module = "parallax_titan.optim_config"`."""

    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)


def parse_multipliers(entries) -> dict[str, float]:
    """['cat=0.3', ...] -> {'cat': 0.3}; errors name the entry."""
    out = {}
    for entry in entries:
        cat, sep, value = str(entry).partition("=")
        try:
            out[cat.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not math.isfinite(out.get(cat.strip(), math.nan)) or out[cat.strip()] < 0:
            raise ValueError(f"optimizer.lr_multipliers: entry {entry!r}; expected 'category=float >= 0'")
    return out


def _need(ok: bool, key: str, value, expected: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r}; expected {expected}")


def _nonneg(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _int_ge(x, lo) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= lo


def validate_optim_config(opt, sched) -> None:
    """Check every optimizer / lr_scheduler key; raises ValueError naming key, value, expectation."""
    validate_optimizer(opt)
    validate_lr_scheduler(sched)


def with_defaults(cfg, cls):
    """Copy of the extra fields of ``cls`` read from ``cfg`` (dataclass defaults where missing)."""
    out = {}
    for f in fields(cls):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out[f.name] = getattr(cfg, f.name, default)
    return SimpleNamespace(**out)


def validate_optimizer(cfg) -> None:
    """Check TorchTitan's and our [optimizer] keys."""
    opt = SimpleNamespace(**vars(with_defaults(cfg, Optimizer)),
                          **{k: getattr(cfg, k) for k in ("name", "lr", "beta1", "beta2", "eps", "weight_decay")})
    _need(opt.name in OPTIMIZER_NAMES, "optimizer.name", opt.name, f"one of {OPTIMIZER_NAMES}")
    _need(_nonneg(opt.lr) and opt.lr > 0, "optimizer.lr", opt.lr, "a finite float > 0")
    for key in ("beta1", "beta2", "muon_momentum"):
        v = getattr(opt, key)
        _need(_nonneg(v) and v < 1, f"optimizer.{key}", v, "a float in [0, 1)")
    _need(_nonneg(opt.eps) and opt.eps > 0, "optimizer.eps", opt.eps, "a float > 0")
    for key in ("weight_decay", "spectral_coeff_attn", "spectral_coeff_mlp", "spectral_band_tau"):
        _need(_nonneg(getattr(opt, key)), f"optimizer.{key}", getattr(opt, key), "a finite float >= 0")
    _need(opt.orthogonalizer in ORTHOGONALIZERS, "optimizer.orthogonalizer", opt.orthogonalizer,
          f"one of {sorted(ORTHOGONALIZERS)}")
    _need(_int_ge(opt.ortho_steps, 0), "optimizer.ortho_steps", opt.ortho_steps, "an int >= 0")
    _need(opt.ortho_dtype in ORTHO_DTYPES, "optimizer.ortho_dtype", opt.ortho_dtype, f"one of {list(ORTHO_DTYPES)}")
    _need(opt.muon_update_scale in UPDATE_SCALES, "optimizer.muon_update_scale", opt.muon_update_scale,
          f"one of {UPDATE_SCALES}")
    try:
        parse_headwise(opt.muon_headwise)
    except ValueError as e:
        raise ValueError(f"optimizer.{e}") from None
    _need(_int_ge(opt.muon_head_dim, 0), "optimizer.muon_head_dim", opt.muon_head_dim, "an int >= 0")
    for key in ("spectral_power_attn", "spectral_power_mlp"):
        _need(_int_ge(getattr(opt, key), 0), f"optimizer.{key}", getattr(opt, key), "an int p >= 0")
    _need(opt.decay_coupling in ("lr", "independent"), "optimizer.decay_coupling", opt.decay_coupling,
          "'lr' or 'independent'")
    _need(opt.spectral_band in BANDS, "optimizer.spectral_band", opt.spectral_band, f"one of {BANDS}")
    _need(opt.spectral_band == "none" or opt.spectral_band_tau > 0, "optimizer.spectral_band_tau",
          opt.spectral_band_tau, "> 0 when spectral_band is set")
    _need(_int_ge(opt.msign_steps, 1), "optimizer.msign_steps", opt.msign_steps, "an int >= 1")
    try:
        parse_rules(opt.param_rules)
    except ValueError as e:
        raise ValueError(f"optimizer.{e}") from None
    parse_multipliers(opt.lr_multipliers)


def validate_lr_scheduler(cfg) -> None:
    """Check TorchTitan's and our [lr_scheduler] keys."""
    sched = cfg
    g = with_defaults(cfg, LRScheduler).wd_anneal_gamma
    _need(_nonneg(g), "lr_scheduler.wd_anneal_gamma", g, "a finite float >= 0")
    _need(_int_ge(sched.warmup_steps, 0), "lr_scheduler.warmup_steps", sched.warmup_steps, "an int >= 0")
    dr = sched.decay_ratio
    _need(dr is None or (_nonneg(dr) and dr <= 1), "lr_scheduler.decay_ratio", dr, "None or a float in [0, 1]")
    _need(sched.decay_type in ("linear", "sqrt", "cosine"), "lr_scheduler.decay_type", sched.decay_type,
          "'linear', 'sqrt' or 'cosine'")
    mf = sched.min_lr_factor
    _need(_nonneg(mf) and mf <= 1, "lr_scheduler.min_lr_factor", mf, "a float in [0, 1]")
