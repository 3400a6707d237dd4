"""TrainSpec glue: build MuonAdamW optimizers and WDA-aware lr schedulers for TorchTitan.

``build_optimizers`` / ``build_lr_schedulers`` have TorchTitan 0.2.2's builder
signatures. All settings come from ``[optimizer]`` and ``[lr_scheduler]``
(TorchTitan's keys plus those in ``parallax_titan.optim_config``).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torchtitan.components.lr_scheduler import LRSchedulersContainer
from torchtitan.components.lr_scheduler import build_lr_schedulers as _titan_lr_schedulers
from torchtitan.components.optimizer import OptimizersContainer

from optimizers.muon import MuonAdamW
from optimizers.routing import RoutingConfig, build_param_groups
from optimizers.schedules import SchedulePhases, wd_anneal_factor
from parallax_titan.optim_config import (
    LRScheduler,
    Optimizer,
    parse_multipliers,
    validate_lr_scheduler,
    validate_optimizer,
    with_defaults,
)

__all__ = ["ParallaxOptimizersContainer", "WDALRSchedulersContainer", "build_optimizers", "build_lr_schedulers",
           "routing_config", "model_head_dim"]


def model_head_dim(model: nn.Module) -> int:
    """The ``head_dim`` shared by the model's attention modules (0 if none declare one)."""
    dims = {m.head_dim for m in model.modules() if isinstance(getattr(m, "head_dim", None), int)}
    if len(dims) > 1:
        raise ValueError(f"model has attention modules with different head_dim {sorted(dims)}; "
                         "set optimizer.muon_head_dim or use one head_dim")
    return dims.pop() if dims else 0


def routing_config(cfg, model: nn.Module) -> RoutingConfig:
    """Map the ``[optimizer]`` section onto a ``RoutingConfig`` for ``model``."""
    x = with_defaults(cfg, Optimizer)
    return RoutingConfig(
        use_muon=cfg.name == "Muon",
        rules=list(x.param_rules),
        muon_categories=tuple(x.muon_categories),
        lr=cfg.lr,
        lr_multipliers=parse_multipliers(x.lr_multipliers),
        weight_decay=cfg.weight_decay,
        no_decay_categories=tuple(x.no_decay_categories),
        muon={"momentum": x.muon_momentum, "nesterov": x.muon_nesterov, "orthogonalizer": x.orthogonalizer,
              "ortho_steps": x.ortho_steps, "ortho_dtype": x.ortho_dtype, "update_scale": x.muon_update_scale},
        adam={"betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps},
        headwise=x.muon_headwise,
        head_dim=x.muon_head_dim or model_head_dim(model),
        spectral={"attn": (x.spectral_power_attn, x.spectral_coeff_attn),
                  "mlp": (x.spectral_power_mlp, x.spectral_coeff_mlp)},
        spectral_categories=tuple(x.spectral_categories),
        decay={"decay_coupling": x.decay_coupling, "sp_band": x.spectral_band,
               "sp_band_tau": x.spectral_band_tau, "msign_steps": x.msign_steps},
    )


class ParallaxOptimizersContainer(OptimizersContainer):
    """One ``MuonAdamW`` per model part; state_dict/load_state_dict are TorchTitan's (DCP).

    ``step_guard``, when set, is asked once per step, after each optimizer has issued the
    read-only part of its step (momentum, orthogonalisation) and before anything is written;
    returning False skips the update (the trainer uses it to skip steps with a non-finite loss or
    gradient). Its host sync then waits while that work runs instead of before it.
    """

    step_guard = None

    def __init__(self, model_parts: list[nn.Module], optimizer_config) -> None:
        self.model_parts = model_parts
        self.optimizers = []
        all_params = []
        for model in model_parts:
            groups = build_param_groups(model, routing_config(optimizer_config, model))
            self.optimizers.append(MuonAdamW(groups, lr=optimizer_config.lr))
            all_params.extend(p for g in groups for p in g["params"])
        self._validate_length(len(model_parts))
        self._post_init(all_params, {"lr": optimizer_config.lr})

    def step(self, *args, **kwargs) -> None:
        if self.step_guard is None:
            return super().step(*args, **kwargs)
        decision: list[bool] = []

        def once() -> bool:  # one answer for all model parts: the guard reads and clears a flag
            if not decision:
                decision.append(bool(self.step_guard()))
            return decision[0]

        for optimizer in self.optimizers:
            optimizer.step(*args, guard=once, **kwargs)

    def schedule_metrics(self) -> dict[str, float]:
        """Per group: lr, effective ordinary decay and S_p decay per step (for TensorBoard)."""
        out: dict[str, float] = {}
        multi = len(self.optimizers) > 1
        for k, opt in enumerate(self.optimizers):
            for group in opt.param_groups:
                name = f"{k}.{group['name']}" if multi else group["name"]
                scale = MuonAdamW.decay_scale(group)
                out[f"optim/lr/{name}"] = float(group["lr"])
                out[f"optim/wd/{name}"] = scale * MuonAdamW._ordinary_wd(group)
                if group["sp_coeff"] and group["sp_power"] != 1:
                    out[f"optim/sp_decay_p{group['sp_power']}/{name}"] = scale * group["sp_coeff"]
        if self.optimizers and self.optimizers[0].param_groups:
            out["optim/wd_mult"] = float(self.optimizers[0].param_groups[0]["wd_mult"])
        return out


def build_optimizers(model_parts: list[nn.Module], optimizer_config, parallel_dims, ft_manager=None
                     ) -> ParallaxOptimizersContainer:
    """TorchTitan TrainSpec ``build_optimizers_fn``: optimizer.name is 'Muon' or 'AdamW'."""
    validate_optimizer(optimizer_config)
    if getattr(optimizer_config, "early_step_in_backward", False):
        raise NotImplementedError("optimizer.early_step_in_backward=True is not supported by MuonAdamW; "
                                  "expected false")
    if ft_manager is not None and getattr(ft_manager, "enabled", False):
        raise NotImplementedError("TorchFT is not supported by ParallaxOptimizersContainer")
    if parallel_dims is not None and getattr(parallel_dims, "tp_enabled", False):
        raise NotImplementedError("tensor parallelism is not supported by the owner-rank Muon path; "
                                  "expected FSDP / data parallel only")
    return ParallaxOptimizersContainer(model_parts, optimizer_config)


class WDALRSchedulersContainer(LRSchedulersContainer):
    """TorchTitan's LambdaLR schedulers plus weight-decay annealing into ``wd_mult``."""

    def __init__(self, schedulers, optimizers: OptimizersContainer, phases: SchedulePhases, gamma: float) -> None:
        self.schedulers = schedulers
        self.optimizers = optimizers
        self.phases = phases
        self.gamma = gamma
        self._sync_wd()

    def _sync_wd(self) -> None:
        factor = wd_anneal_factor(self.schedulers[0].last_epoch, self.phases, self.gamma)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["wd_mult"] = factor

    def step(self) -> None:
        super().step()
        self._sync_wd()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._sync_wd()


def build_lr_schedulers(optimizers: OptimizersContainer, lr_scheduler_config, training_steps: int
                        ) -> WDALRSchedulersContainer:
    """TorchTitan TrainSpec ``build_lr_schedulers_fn``: TorchTitan's WSD/cosine lr plus WDA."""
    validate_lr_scheduler(lr_scheduler_config)
    base = _titan_lr_schedulers(optimizers, lr_scheduler_config, training_steps)
    kw = base.schedulers[0].lr_lambdas[0].keywords  # TorchTitan's phase lengths, reused as is
    phases = SchedulePhases(kw["warmup_steps"], kw["stable_steps"], kw["decay_steps"])
    gamma = with_defaults(lr_scheduler_config, LRScheduler).wd_anneal_gamma
    return WDALRSchedulersContainer(base.schedulers, optimizers, phases, gamma)
