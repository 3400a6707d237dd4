"""Training one MAD run: our optimizers (Muon + WSD as in the paper, AdamW + cosine as in MAD).

``optimizer = "muon"``: ``optimizers.MuonAdamW`` with the paper's recipe (SPEC.md section 3):
Muon (momentum 0.95, Nesterov) on the hidden matrices, Adam (0.8, 0.95, eps 1e-7) on embeddings,
norms and the head, lr multipliers embed 0.3, norm 0.015. ``"adamw"``: every parameter in AdamW
with torch's defaults (0.9, 0.999, eps 1e-8), as MAD trains. The lr schedule is stepped per
optimiser step.
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from eval.mad.grid import TrainConfig
from eval.mad.models import compile_blocks
from eval.mad.metrics import evaluate
from eval.mad.recall import IGNORE
from optimizers import MuonAdamW, RoutingConfig, build_param_groups

OPTIMIZERS = ("muon", "adamw")
SCHEDULES = ("wsd", "cosine")


def build_optimizer(model, name: str, lr: float, weight_decay: float) -> MuonAdamW:
    """MuonAdamW for ``name`` in OPTIMIZERS (see module docstring)."""
    if name == "muon":
        cfg = RoutingConfig(use_muon=True, lr=lr, weight_decay=weight_decay,
                            lr_multipliers={"embed": 0.3, "norm": 0.015},
                            adam={"betas": (0.8, 0.95), "eps": 1e-7}, muon={"momentum": 0.95, "nesterov": True})
    elif name == "adamw":
        cfg = RoutingConfig(use_muon=False, lr=lr, weight_decay=weight_decay,
                            adam={"betas": (0.9, 0.999), "eps": 1e-8})
    else:
        raise ValueError(f"optimizer={name!r}; expected one of {OPTIMIZERS}")
    return MuonAdamW(build_param_groups(model, cfg), lr=lr)


def lr_factor(step: int, total: int, schedule: str, decay_frac: float = 0.2, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak lr at 0-indexed step ``step`` of ``total``.

    wsd: 1 until ``(1 - decay_frac) * total``, then linear to 0 at ``total`` (no warmup).
    cosine: ``min_ratio + (1 - min_ratio) (1 + cos(pi step / total)) / 2``.
    """
    if schedule == "wsd":
        start = (1.0 - decay_frac) * total
        return 1.0 if step < start else max(0.0, (total - step) / max(total - start, 1e-12))
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * step / total))
    raise ValueError(f"schedule={schedule!r}; expected one of {SCHEDULES}")


def _loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE)


def autocast(precision: str, device) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision = "bf16"`` (mad-lab trains and scores in bf16), else nothing."""
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_and_evaluate(model, data: dict, cfg: TrainConfig, lr: float, weight_decay: float,
                       num_classes: int, device="cpu", seed: int = 0) -> dict:
    """Train ``model`` on data["train"] for cfg.epochs; returns test accuracy and run facts.

    data: {"train": (inputs, targets), "test": (inputs, targets)} int64 numpy (N, L).
    Returns {"test_acc" (MAD's score: macro accuracy per test batch of cfg.batch_size sequences,
    averaged over batches), "test_acc_micro", "test_acc_macro_all" (macro over the whole test set),
    "final_loss", "steps", "planned_steps", "seconds", "finite"}.
    """
    if cfg.compile:
        compile_blocks(model)
    x, y = (torch.as_tensor(a, device=device) for a in data["train"])
    xt, yt = (torch.as_tensor(a, device=device) for a in data["test"])
    opt = build_optimizer(model, cfg.optimizer, lr, weight_decay)
    per_epoch = math.ceil(len(x) / cfg.batch_size)
    plan = {"total": cfg.epochs * per_epoch}
    ratio = cfg.min_lr / lr
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: lr_factor(k, plan["total"], cfg.schedule, cfg.decay_frac, ratio))
    gen = torch.Generator().manual_seed(seed)
    start, losses = time.time(), []
    model.train()
    for _ in range(cfg.epochs):
        # the epoch's order goes to the device in one copy: a copy from pageable host memory waits
        # for every queued kernel, so a copy per step would keep the host from running ahead
        order = torch.randperm(len(x), generator=gen).to(device)
        for idx in order.split(cfg.batch_size):
            if len(losses) >= plan["total"]:
                break
            if cfg.max_seconds and len(losses) in (_WARM_STEPS, _PROBE_STEPS):
                plan[len(losses)] = _finished(device)  # pace is measured after warm-up (JIT, autotune)
                if len(losses) == _PROBE_STEPS:
                    _fit_time_budget(plan, cfg.max_seconds - (plan[_PROBE_STEPS] - start))
            with autocast(cfg.precision, device):
                loss = _loss(model, x[idx], y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            losses.append(loss.detach())
    model.eval()
    with autocast(cfg.precision, device):
        acc = evaluate(model, xt, yt, num_classes, batch_size=cfg.batch_size)
    tail = torch.stack(losses[-per_epoch:]).float().mean().item() if losses else float("nan")
    return {"test_acc": acc["batch_macro"], "test_acc_micro": acc["micro"], "test_acc_macro_all": acc["macro"],
            "final_loss": tail,
            "steps": len(losses), "planned_steps": cfg.epochs * per_epoch,
            "seconds": round(time.time() - start, 2), "finite": bool(np.isfinite(tail))}


_WARM_STEPS, _PROBE_STEPS = 10, 30


def _finished(device) -> float:
    """time.time() once the work queued on ``device`` has run (the host runs ahead of a GPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.time()


def _fit_time_budget(plan: dict, seconds_left: float) -> None:
    """Shorten the run (and its schedule) so it ends within seconds_left at the measured pace.

    Called after _PROBE_STEPS steps, while a WSD schedule is still constant, so the decay
    stage moves with the new end.
    """
    pace = (plan[_PROBE_STEPS] - plan[_WARM_STEPS]) / (_PROBE_STEPS - _WARM_STEPS)
    affordable = _PROBE_STEPS + int(max(0.0, seconds_left) / pace)
    plan["total"] = max(_PROBE_STEPS + 1, min(plan["total"], affordable))
