"""Parallax-Titan optimizers: orthogonalisers, spectral-power decay, the Muon family and AdamW,
skip-step, schedules."""

from .directions import MatrixSpec, update_scale
from .muon import ALGO_OPTIONS, ALGOS, GROUP_DEFAULTS, MuonAdamW
from .orthogonalize import newton_schulz, orthogonalize, polar_express
from .routing import DEFAULT_PARAM_RULES, RoutingConfig, build_param_groups, categorize, check_reached, parse_headwise
from .skip_step import SkipStep
from .spectral import band_projectors, banded_spectral_power, msign, spectral_power
from .variants import aurora_polar, normuon_normalize, soap_directions

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
    "ALGOS",
    "ALGO_OPTIONS",
    "SkipStep",
    "aurora_polar",
    "normuon_normalize",
    "soap_directions",
    "DEFAULT_PARAM_RULES",
    "RoutingConfig",
    "build_param_groups",
    "categorize",
    "check_reached",
    "parse_headwise",
]
