"""Optimizer-step timing: SPEC's recipe for each algorithm, and a step timer.

``build_optimizer(model, name)`` routes ``model``'s matrices to ``OPTIMIZERS[name]``;
``time_step(optimizer)`` times one ``optimizer.step()`` (median of CUDA-event or wall times).
``python -m scripts.bench.optimizers`` uses them on the 0.6B model's parameters.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn

from .muon import MuonAdamW
from .routing import RoutingConfig, build_param_groups

__all__ = ["build_optimizer", "time_step", "step_times", "OPTIMIZERS"]


# name -> options of the matrix groups (empty: every group AdamW); Adam groups as in SPEC's recipe
OPTIMIZERS: dict[str, dict] = {
    "adamw": {},
    "muon": {"algo": "muon"},
    "normuon": {"algo": "normuon"},
    "aurora": {"algo": "aurora"},
    "soap": {"algo": "soap"},
}


def build_optimizer(model: nn.Module, name: str, spectral: dict | None = None, **overrides) -> MuonAdamW:
    """``MuonAdamW`` over ``model`` with SPEC's recipe (Muon lr 5e-3, wd 0.1, Adam betas (0.8, 0.95);
    AdamW-only: lr 3e-4, betas (0.9, 0.95)), matrices routed to ``OPTIMIZERS[name]`` with
    ``overrides`` (e.g. ``orthogonalizer``); ``spectral``: RoutingConfig's S_p terms."""
    if name not in OPTIMIZERS:
        raise ValueError(f"build_optimizer: name={name!r}; expected one of {sorted(OPTIMIZERS)}")
    matrix = {**OPTIMIZERS[name], **overrides}
    use = bool(OPTIMIZERS[name])
    cfg = RoutingConfig(use_muon=use, lr=5e-3 if use else 3e-4, weight_decay=0.1, muon=matrix,
                        adam={"betas": (0.8, 0.95) if use else (0.9, 0.95)}, spectral=spectral or {})
    return MuonAdamW(build_param_groups(model, cfg))


def time_step(optimizer: torch.optim.Optimizer, warmup: int = 2, iters: int = 10, **step_kwargs) -> float:
    """Median seconds of ``optimizer.step(**step_kwargs)`` (see ``step_times``)."""
    return statistics.median(step_times(optimizer, warmup, iters, **step_kwargs))


def step_times(optimizer: torch.optim.Optimizer, warmup: int = 2, iters: int = 10, **step_kwargs) -> list[float]:
    """Seconds of each of ``iters`` calls of ``optimizer.step(**step_kwargs)`` after ``warmup``
    untimed ones (CUDA events on GPUs: from the step's first kernel to its last, host time
    included where it starves the GPU; wall time on CPUs)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    cuda = params[0].is_cuda
    for _ in range(warmup):
        optimizer.step(**step_kwargs)
    times = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            optimizer.step(**step_kwargs)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        else:
            t0 = time.perf_counter()
            optimizer.step(**step_kwargs)
            times.append(time.perf_counter() - t0)
    return times
