"""MuonAdamW: Muon for hidden matrices, AdamW for the rest, one shared decay branch.

Each param group has ``algo`` = "muon" or "adamw". Per step and group:

    decay scale  s = lr            (decay_coupling = "lr", LR-coupled)
                 s = lr / base_lr  (decay_coupling = "independent": schedule multiplier eta_t)
                 times wd_mult     (weight-decay annealing, set by the scheduler)
    W <- W - s [lambda_1 W + lambda_p T_p(W)]        (T_p from the pre-update W)
    muon:  B <- mu B + G;  U = G + mu B (Nesterov) or B;  W <- W - lr * scale * ortho(U)
    adamw: the usual bias-corrected Adam update with betas and eps.

Full-matrix work (ortho, T_p) goes through ``distributed.full_matrix_deltas``, which
gathers FSDP2 shards to one owner rank per matrix. ``step(skip=flag)`` skips a step on the
device (``skip_step.SkipStep``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from .directions import MatrixSpec, update_scale
from .distributed import full_matrix_deltas
from .skip_step import SkipStep

__all__ = ["MuonAdamW", "GROUP_DEFAULTS", "ALGOS"]

ALGOS = ("muon", "adamw")

GROUP_DEFAULTS: dict[str, Any] = {
    "name": "",
    "algo": "adamw",
    "betas": (0.9, 0.95),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "momentum": 0.95,
    "nesterov": True,
    "orthogonalizer": "polar_express",
    "ortho_steps": 0,
    "ortho_dtype": "auto",
    "update_scale": "match_rms_adamw",
    "head_dim": 0,
    "sp_power": 1,
    "sp_coeff": 0.0,
    "decay_coupling": "lr",
    "sp_band": "none",
    "sp_band_tau": 0.0,
    "msign_steps": 20,
    "wd_mult": 1.0,
}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class MuonAdamW(torch.optim.Optimizer):
    """Muon + AdamW hybrid with spectral-power decoupled decay.

    Args:
        params: param groups (dicts with "params" and any key of ``GROUP_DEFAULTS``).
        lr: default learning rate.
        **defaults: overrides of ``GROUP_DEFAULTS``.
    """

    def __init__(self, params, lr: float = 1e-3, **defaults: Any) -> None:
        unknown = set(defaults) - set(GROUP_DEFAULTS)
        if unknown:
            raise ValueError(f"MuonAdamW: unknown options {sorted(unknown)}; expected keys of GROUP_DEFAULTS")
        super().__init__(params, {**GROUP_DEFAULTS, "lr": lr, **defaults})
        for group in self.param_groups:
            group.setdefault("base_lr", group["lr"])
            if group["algo"] not in ALGOS:
                raise ValueError(f"MuonAdamW: group {group['name']!r} algo={group['algo']!r}; expected {ALGOS}")
            if group["algo"] == "muon" and any(p.ndim != 2 for p in group["params"]):
                raise ValueError(f"MuonAdamW: group {group['name']!r} is Muon but holds non-2-D parameters")
            for key in ("lr", "weight_decay", "sp_coeff"):  # SkipStep relies on non-positive delta coefficients
                if not group[key] >= 0:
                    raise ValueError(f"MuonAdamW: group {group['name']!r} {key}={group[key]!r}; expected >= 0")

    @staticmethod
    def decay_scale(group: dict) -> float:
        """Multiplier of the decay coefficients this step (see module docstring)."""
        if group["decay_coupling"] == "lr":
            scale = group["lr"]
        else:
            scale = group["lr"] / group["base_lr"] if group["base_lr"] else 0.0
        return float(scale) * group["wd_mult"]

    @staticmethod
    def _sp_is_ordinary(group: dict) -> bool:
        """S_1(W) = W: an unbanded p = 1 term is ordinary decay (a banded one is W P_top etc.)."""
        return group["sp_power"] == 1 and group["sp_band"] == "none"

    @staticmethod
    def _ordinary_wd(group: dict) -> float:
        """Ordinary decay coefficient: ``weight_decay`` plus an unbanded p = 1 S_p coefficient."""
        extra = group["sp_coeff"] if MuonAdamW._sp_is_ordinary(group) else 0.0
        return group["weight_decay"] + extra

    @torch.no_grad()
    def step(self, closure=None, *, skip: torch.Tensor | None = None):
        """One update.

        Args:
            closure: optional callable re-evaluating the loss (run with gradients enabled).
            skip: optional 0-dim bool or float tensor on the parameters' device, the same on every
                rank; nonzero leaves every parameter and every state tensor bit for bit as it was
                (NaN/inf gradients included), zero gives the same result as ``skip=None``. Never
                read on the host (see ``SkipStep``).
        Returns:
            the closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        mask = SkipStep(skip)
        live_groups, specs, updates, weights, params = [], [], [], [], []
        for group in self.param_groups:
            live = [p for p in group["params"] if p.grad is not None]
            if not live:
                continue
            mask.check_device(_local(live[0]).device)
            live_groups.append((group, live))
            by_param = self._muon_momentum(group, live, mask) if group["algo"] == "muon" else {}
            for p, spec, w in self._matrix_work(group, live):
                if spec.has_update or spec.has_decay:
                    specs.append(spec), updates.append(by_param.get(id(p))), weights.append(w), params.append(p)
        # the deltas read the pre-update weights: issued before any write below
        deltas = full_matrix_deltas(specs, updates, weights, params, mask) if specs else []
        for group, live in live_groups:
            mask.scale_([_local(p) for p in live], 1.0 - self.decay_scale(group) * self._ordinary_wd(group))
            if group["algo"] == "adamw":
                self._adam_update(group, live, mask)
        if params:
            # one foreach call: a launch per matrix left the GPU idle while the host issued them
            torch._foreach_add_([_local(p) for p in params], [d.to(p.dtype) for p, d in zip(params, deltas)])
        return loss

    def _matrix_work(self, group, live):
        """(param, spec, local weight or None) for each 2-D param: the weight when S_p decay reads it."""
        dscale = self.decay_scale(group)
        sp = group["sp_coeff"] != 0.0 and not self._sp_is_ordinary(group) and dscale != 0.0
        out = []
        for p in live:
            if p.ndim != 2:
                continue
            m, n = p.shape
            coeff = -group["lr"] * update_scale(group["update_scale"], m, n) if group["algo"] == "muon" else 0.0
            spec = MatrixSpec(
                shape=(m, n), update_coeff=float(coeff), method=group["orthogonalizer"],
                steps=group["ortho_steps"], dtype=group["ortho_dtype"], head_dim=group["head_dim"],
                sp_coeff=-dscale * group["sp_coeff"] if sp else 0.0, sp_power=group["sp_power"],
                band=group["sp_band"], tau=group["sp_band_tau"], msign_steps=group["msign_steps"],
            )
            out.append((p, spec, _local(p) if sp else None))
        return out

    def _muon_momentum(self, group, live, mask):
        """{id(param): update}: B <- mu B + G, U = G + mu B (Nesterov) or B; B kept when skipped."""
        mu = group["momentum"]
        bufs = []
        for p in live:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)  # zeros: as if there were no state
            bufs.append(_local(state["momentum_buffer"]))
        grads = [_local(p.grad) for p in live]
        if mask.active:
            new = torch._foreach_mul(bufs, mu)
            torch._foreach_add_(new, grads)
            mask.select_(bufs, new)
        else:
            torch._foreach_mul_(bufs, mu)
            torch._foreach_add_(bufs, grads)
            new = bufs
        upd = torch._foreach_add(grads, new, alpha=mu) if group["nesterov"] else new
        return {id(p): u for p, u in zip(live, upd)}

    def _adam_update(self, group, live, mask):
        """Adam (bias-corrected; decay is applied before, by ``SkipStep.scale_``) through PyTorch's
        fused kernel: one pass over param, grad and moments per (device, dtype) bucket instead of
        seven foreach passes. Step counts live on the parameters' device, where the kernel reads
        them and where a skipped step can leave them unchanged without the host seeing the flag."""
        beta1, beta2 = group["betas"]
        buckets: dict = {}
        for p in live:
            state, local = self.state[p], _local(p)
            if "exp_avg" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=local.device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            elif state["step"].device != local.device:  # a checkpoint that kept counts on the CPU
                state["step"] = state["step"].to(device=local.device, dtype=torch.float32)
            bucket = buckets.setdefault((local.device, local.dtype), ([], [], [], [], []))
            for lst, t in zip(bucket, (local, _local(p.grad), _local(state["exp_avg"]),
                                       _local(state["exp_avg_sq"]), state["step"])):
                lst.append(t)
        for (device, _), (ps, grads, m1, m2, steps) in buckets.items():
            mask.advance_(steps)
            torch._fused_adamw_(ps, grads, m1, m2, [], steps, lr=float(group["lr"]), beta1=beta1, beta2=beta2,
                                weight_decay=0.0, eps=group["eps"], amsgrad=False, maximize=False,
                                found_inf=mask.found_inf(device))
