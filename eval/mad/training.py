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
import os
import time
import warnings

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
                       num_classes: int, device="cpu", seed: int = 0, checkpoint: str | None = None,
                       identity: dict | None = None) -> dict:
    """Train ``model`` on data["train"] for cfg.epochs; returns test accuracy and run facts.

    data: {"train": (inputs, targets), "test": (inputs, targets)} int64 numpy (N, L).
    Returns {"test_acc" (MAD's score: macro accuracy per test batch of cfg.batch_size sequences,
    averaged over batches), "test_acc_micro", "test_acc_macro_all" (macro over the whole test set),
    "final_loss", "steps", "planned_steps", "seconds" (training and scoring, over every piece of a
    resumed run), "finite"}.
    checkpoint: a file for the run's training state (``_run_state``), written every
    cfg.checkpoint_seconds (0: after every step); when it exists the run continues from it, bit for
    bit as if it had not stopped (same device and software), and it is deleted once the run is scored.
    identity: what names the run (the runner's run key and config id), saved with the state; a
    state saved under another identity is refused (ValueError).
    """
    resumed = _load_run_state(checkpoint, identity, device) if checkpoint else None
    if resumed:  # into the eager modules: saved keys are the eager model's, compiled or not
        model.load_state_dict(resumed["model"])
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
    losses, first_epoch, order, seconds = [], 0, None, 0.0
    if resumed:
        losses, first_epoch, order, seconds = _restore(resumed, opt, sched, gen, plan)
    start = time.time() - seconds  # time.time() - start: seconds over every piece of the run
    next_save = time.time() + cfg.checkpoint_seconds
    model.train()
    for epoch in range(first_epoch, cfg.epochs):
        if len(losses) >= plan["total"]:
            break
        if order is None:  # a resumed run goes on through its saved epoch's order
            order = torch.randperm(len(x), generator=gen)
        # the epoch's order goes to the device in one copy: a copy from pageable host memory waits
        # for every queued kernel, so a copy per step would keep the host from running ahead
        for idx in order.to(device).split(cfg.batch_size)[len(losses) - epoch * per_epoch:]:
            if len(losses) >= plan["total"]:
                break
            if cfg.max_seconds and len(losses) in (_WARM_STEPS, _PROBE_STEPS):
                # pace is measured after warm-up (JIT, autotune), in seconds since the run began
                plan[len(losses)] = _finished(device) - start
                if len(losses) == _PROBE_STEPS:
                    _fit_time_budget(plan, cfg.max_seconds - plan[_PROBE_STEPS])
            losses.append(train_step(model, opt, sched, x[idx], y[idx], cfg, device))
            if checkpoint and time.time() >= next_save:  # host clock only: no device sync unless saving
                _save_run_state(checkpoint, _run_state(model, opt, sched, gen, plan, losses, epoch, order,
                                                       time.time() - start, identity))
                next_save = time.time() + cfg.checkpoint_seconds
        order = None
    model.eval()
    with autocast(cfg.precision, device):
        acc = evaluate(model, xt, yt, num_classes, batch_size=cfg.batch_size)
    tail = torch.stack(losses[-per_epoch:]).float().mean().item() if losses else float("nan")
    if checkpoint:
        _remove_run_state(checkpoint)
    return {"test_acc": acc["batch_macro"], "test_acc_micro": acc["micro"], "test_acc_macro_all": acc["macro"],
            "final_loss": tail,
            "steps": len(losses), "planned_steps": cfg.epochs * per_epoch,
            "seconds": round(time.time() - start, 2), "finite": bool(np.isfinite(tail))}


def train_step(model, opt, sched, inputs, targets, cfg: TrainConfig, device) -> torch.Tensor:
    """One optimiser and schedule step on a batch (inputs, targets: int64 (B, L)); the loss, a
    detached fp32 0-dim tensor on the device (not read here: that would wait for the device)."""
    with autocast(cfg.precision, device):
        loss = _loss(model, inputs, targets)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    sched.step()
    return loss.detach()


def _run_state(model, opt, sched, gen, plan: dict, losses: list, epoch: int, order: torch.Tensor,
               seconds: float, identity: dict | None) -> dict:
    """Everything a run needs to continue exactly where it is: weights (under the eager model's
    keys), optimizer and schedule state, the batch-order generator, the current epoch and its order
    (int64 CPU (N,); the position in it is len(losses) - epoch * steps per epoch), the losses so far
    (fp32 (steps,), on the run's device), the plan (a time budget may have shortened it), the
    seconds spent so far and the run's identity."""
    # compiled blocks prefix their keys with "_orig_mod."; without it a state loads into the eager
    # modules whether or not either piece compiled (config_id leaves compile out)
    weights = {k.replace("_orig_mod.", ""): v for k, v in model.state_dict().items()}
    return {"identity": identity, "model": weights, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "generator": gen.get_state(), "plan": dict(plan), "losses": torch.stack(losses), "epoch": epoch,
            "order": order, "seconds": seconds}


def _restore(state: dict, opt, sched, gen, plan: dict) -> tuple[list, int, torch.Tensor, float]:
    """Loads a ``_run_state`` into the optimizer, schedule, generator and plan (in place: the
    schedule's lambda reads plan["total"]); returns (losses, epoch, its order, seconds so far)."""
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    gen.set_state(state["generator"].cpu())  # map_location moved it with the rest
    plan.update(state["plan"])
    return list(state["losses"].unbind()), state["epoch"], state["order"].cpu(), state["seconds"]


def _temporary(path: str) -> str:
    """The file a save writes before it replaces ``path`` (same folder, so the rename is atomic)."""
    return path + ".tmp"


def _save_run_state(path: str, state: dict) -> None:
    """Writes ``state`` to ``path`` atomically: to a temporary file beside it, synced to disk, then
    renamed over it, so a kill during a save leaves the previous state whole."""
    with open(_temporary(path), "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(_temporary(path), path)


def _remove_run_state(path: str) -> None:
    """Deletes a finished run's state and the temporary file a save cut short may have left."""
    for name in (path, _temporary(path)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def _load_run_state(path: str, identity: dict | None, device) -> dict | None:
    """The ``_run_state`` saved at ``path`` with its tensors on ``device``, or None when there is
    none. A file that cannot be read gives a warning naming it and None: the run starts over
    (runs.jsonl, not the partial state, records what finished). ValueError when the state is
    another run's (its identity differs)."""
    if not os.path.exists(path):
        return None
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        saved = state["identity"]
    except Exception as exc:  # truncated, corrupt or not a run state: what it held is lost either way
        warnings.warn(f"{path}: unreadable partial run state ({type(exc).__name__}: {exc}); "
                      "the run starts from its first step", stacklevel=2)
        return None
    if saved != identity:
        raise ValueError(f"{path}: the partial state of another run ({_differences(saved, identity)}); "
                         "move it away or use another --out")
    return state


def _differences(saved: dict | None, ours: dict | None) -> str:
    """'key: saved A, this run B' for each identity entry that differs."""
    saved, ours = saved or {}, ours or {}
    return "; ".join(f"{k}: saved {saved.get(k)!r}, this run {ours.get(k)!r}"
                     for k in sorted({*saved, *ours}) if saved.get(k) != ours.get(k))


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
