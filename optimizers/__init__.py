"""Parallax-Titan optimizers: orthogonalisers, spectral-power decay, Muon/AdamW, schedules."""

from .directions import MatrixSpec, update_scale
from .muon import GROUP_DEFAULTS, MuonAdamW
from .orthogonalize import newton_schulz, orthogonalize, polar_express
from .routing import DEFAULT_PARAM_RULES, RoutingConfig, build_param_groups, categorize, parse_headwise
from .spectral import band_projectors, banded_spectral_power, msign, spectral_power

__all__ = [
    "polar_express",
    "newton_schulz",
    "orthogonalize",
    "spectral_power",
    "msign",
    "band_projectors",
    "banded_spectral_power",
    "MatrixSpec",
    "update_scale",
    "MuonAdamW",
    "GROUP_DEFAULTS",
    "DEFAULT_PARAM_RULES",
    "RoutingConfig",
    "build_param_groups",
    "categorize",
    "parse_headwise",
]
