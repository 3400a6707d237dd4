"""Optimizer-step timing on the Parallax 0.6B parameter set.

``parallax_parameters(flavor)`` builds the parameters of a Parallax Qwen3 model (TorchTitan FQNs,
so routing sends them to the same groups as the real model) without building the model;
``time_step(optimizer)`` times one ``optimizer.step()`` (median of CUDA-event or wall times).

    python -m optimizers.timing                    # every optimizer, 0.6B, on the GPU
    python -m optimizers.timing --optimizers muon  # one
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from .muon import MuonAdamW
from .routing import RoutingConfig, build_param_groups

__all__ = ["Flavor", "FLAVORS", "parallax_shapes", "parallax_parameters", "build_optimizer", "time_step", "step_times",
           "OPTIMIZERS"]


@dataclass(frozen=True)
class Flavor:
    """The shape-defining sizes of a Parallax Qwen3 model."""

    vocab: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int


# The shapes of parallax_titan.spec.BASE_FLAVORS (Parallax adds W_R beside W_Q).
FLAVORS = {
    "0.6B": Flavor(vocab=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, hidden=3072),
    "1.7B": Flavor(vocab=151936, dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, hidden=6144),
}


def parallax_shapes(flavor: str | Flavor = "0.6B") -> dict[str, tuple[int, ...]]:
    """{FQN: shape} of a Parallax model's parameters (tied output: no ``output.weight``)."""
    if isinstance(flavor, str):
        if flavor not in FLAVORS:
            raise ValueError(f"parallax_shapes: flavor={flavor!r}; expected one of {sorted(FLAVORS)} or a Flavor")
        flavor = FLAVORS[flavor]
    f = flavor
    q, kv = f.n_heads * f.head_dim, f.n_kv_heads * f.head_dim
    layer = {"attention.wq.weight": (q, f.dim), "attention.wk.weight": (kv, f.dim),
             "attention.wv.weight": (kv, f.dim), "attention.wo.weight": (f.dim, q),
             "attention.wr.weight": (q, f.dim), "feed_forward.w1.weight": (f.hidden, f.dim),
             "feed_forward.w2.weight": (f.dim, f.hidden), "feed_forward.w3.weight": (f.hidden, f.dim),
             "attention_norm.weight": (f.dim,), "ffn_norm.weight": (f.dim,),
             "attention.q_norm.weight": (f.head_dim,), "attention.k_norm.weight": (f.head_dim,),
             "attention.r_norm.weight": (f.head_dim,)}
    shapes = {"tok_embeddings.weight": (f.vocab, f.dim), "norm.weight": (f.dim,)}
    shapes.update({f"layers.{i}.{k}": s for i in range(f.n_layers) for k, s in layer.items()})
    return shapes


def parallax_parameters(flavor: str | Flavor = "0.6B", device="cuda", dtype=torch.float32, seed: int = 0) -> nn.Module:
    """A module holding the parameters of ``parallax_shapes(flavor)`` under their names, with
    small random values (``0.02 N(0, 1)``) and random gradients (``1e-3 N(0, 1)``) attached."""
    g = torch.Generator(device=device).manual_seed(seed)
    root = nn.Module()
    for fqn, shape in parallax_shapes(flavor).items():
        module = root
        *path, leaf = fqn.split(".")
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        p = nn.Parameter(torch.randn(shape, generator=g, device=device, dtype=dtype) * 0.02)
        p.grad = torch.randn(shape, generator=g, device=device, dtype=dtype) * 1e-3
        module.register_parameter(leaf, p)
    return root


# name -> options of the matrix groups (empty: every group AdamW); Adam groups as in SPEC's recipe
OPTIMIZERS: dict[str, dict] = {
    "adamw": {},
    "muon": {"algo": "muon"},
    "normuon": {"algo": "normuon"},
    "aurora": {"algo": "aurora"},
    "soap": {"algo": "soap"},
}


def build_optimizer(model: nn.Module, name: str, **overrides) -> MuonAdamW:
    """``MuonAdamW`` over ``model`` with SPEC's recipe (Muon lr 5e-3, wd 0.1, Adam betas (0.8, 0.95);
    AdamW-only: lr 3e-4, betas (0.9, 0.95)), matrices routed to ``OPTIMIZERS[name]``."""
    if name not in OPTIMIZERS:
        raise ValueError(f"build_optimizer: name={name!r}; expected one of {sorted(OPTIMIZERS)}")
    matrix = {**OPTIMIZERS[name], **overrides}
    use = bool(matrix)
    cfg = RoutingConfig(use_muon=use, lr=5e-3 if use else 3e-4, weight_decay=0.1, muon=matrix,
                        adam={"betas": (0.8, 0.95) if use else (0.9, 0.95)})
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


def main() -> None:
    ap = argparse.ArgumentParser(description="Time optimizer steps on the Parallax parameter set")
    ap.add_argument("--flavor", default="0.6B", choices=sorted(FLAVORS))
    ap.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = parallax_parameters(a.flavor, device)
    for name in a.optimizers:
        opt = build_optimizer(model, name)
        times = step_times(opt, iters=a.iters)
        print(f"{name}: median {statistics.median(times) * 1e3:.1f} ms, mean {statistics.mean(times) * 1e3:.1f} ms "
              f"(SOAP: one basis refresh per soap_precondition_frequency calls)", flush=True)
        del opt
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
