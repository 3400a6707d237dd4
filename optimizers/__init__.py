"""Parallax-Titan optimizers: orthogonalisers, spectral-power decay, Muon/AdamW, schedules."""

from .orthogonalize import newton_schulz, orthogonalize, polar_express
from .spectral import band_projectors, banded_spectral_power, msign, spectral_power

__all__ = [
    "polar_express",
    "newton_schulz",
    "orthogonalize",
    "spectral_power",
    "msign",
    "band_projectors",
    "banded_spectral_power",
]
