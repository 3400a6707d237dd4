"""TrainSpec builders: MuonAdamW optimizers and WDA-aware lr schedulers for TorchTitan.

``build_optimizers`` / ``build_lr_schedulers`` have TorchTitan 0.2.2's builder signatures and take
the validated typed sections ``[optimizer]`` (:class:`parallax_titan.config.Optimizer`) and
``[lr_scheduler]`` (:class:`parallax_titan.config.LRScheduler`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torchtitan.components.lr_scheduler import LRSchedulersContainer
from torchtitan.components.lr_scheduler import build_lr_schedulers as titan_lr_schedulers
from torchtitan.components.optimizer import OptimizersContainer

from optimizers.muon import MuonAdamW
from optimizers.routing import RoutingConfig, build_param_groups, check_reached
from optimizers.schedules import SchedulePhases, wd_anneal_factor
from parallax_titan.compat import schedule_phases
from parallax_titan.config import LRScheduler, Optimizer
from parallax_titan.config.optim import MATRIX_ALGO_OF
from parallax_titan.step_flags import StepFlags

__all__ = ["ParallaxOptimizersContainer", "WDALRSchedulersContainer", "build_optimizers", "build_lr_schedulers",
           "routing_config", "matrix_options", "model_head_dim", "head_dim_of"]

# [optimizer] keys that are MuonAdamW group options of the same name (optimizers.muon.GROUP_DEFAULTS)
FAMILY_OPTIONS = ("normuon_beta2", "normuon_eps", "aurora_iterations", "aurora_beta", "aurora_eps", "soap_beta1",
                  "soap_beta2", "soap_shampoo_beta", "soap_eps", "soap_precondition_frequency")


def model_head_dim(model: nn.Module) -> int:
    """The ``head_dim`` shared by the model's attention modules (0 if none declare one)."""
    dims = {m.head_dim for m in model.modules() if isinstance(getattr(m, "head_dim", None), int)}
    if len(dims) > 1:
        raise ValueError(f"model has attention modules with different head_dim {sorted(dims)}; "
                         "head-wise Muon (optimizer.muon_head_dim) needs one head_dim")
    return dims.pop() if dims else 0


def head_dim_of(config: Optimizer, model: nn.Module) -> int:
    """Rows per head of the head-wise Muon groups: the model's ``head_dim``. ``muon_head_dim`` may only
    restate it (config validation checks it against the model args; this checks the built model)."""
    found = model_head_dim(model)
    if config.muon_head_dim and found and config.muon_head_dim != found:
        raise ValueError(f"optimizer.muon_head_dim: {config.muon_head_dim} is not the model's head_dim {found}; "
                         f"expected 0 (the model's) or {found}")
    return config.muon_head_dim or found


def matrix_options(config: Optimizer) -> dict[str, Any]:
    """Options of the hidden-matrix groups (``MuonAdamW`` group keys): the algorithm ``name`` picks
    (``muon``, ``normuon``, ``aurora``, ``soap``) and the options of every algorithm of the family, of
    which each group reads its own."""
    return {"algo": MATRIX_ALGO_OF.get(config.name, "adamw"), "momentum": config.muon_momentum,
            "nesterov": config.muon_nesterov, "compile_momentum": config.muon_compile_momentum,
            "orthogonalizer": config.orthogonalizer, "ortho_steps": config.ortho_steps,
            "ortho_dtype": config.ortho_dtype, "ortho_gram": config.ortho_gram,
            "ortho_kernel": config.ortho_kernel,
            "update_scale": config.muon_update_scale,
            **{key: getattr(config, key) for key in FAMILY_OPTIONS}}


def routing_config(config: Optimizer, model: nn.Module) -> RoutingConfig:
    """The parameter routing of ``model`` that the ``[optimizer]`` section asks for: with a Muon-family
    ``name`` the hidden matrices get that algorithm (:func:`matrix_options`) and the rest Adam."""
    return RoutingConfig(
        use_muon=config.name in MATRIX_ALGO_OF,
        rules=list(config.param_rules),
        muon_categories=tuple(config.muon_categories),
        lr=config.lr,
        lr_multipliers=config.multipliers(),
        weight_decay=config.weight_decay,
        no_decay_categories=tuple(config.no_decay_categories),
        muon=matrix_options(config),
        adam={"betas": (config.beta1, config.beta2), "eps": config.eps},
        headwise=config.muon_headwise,
        head_dim=head_dim_of(config, model),
        spectral={"attn": (config.spectral_power_attn, config.spectral_coeff_attn),
                  "mlp": (config.spectral_power_mlp, config.spectral_coeff_mlp)},
        spectral_categories=tuple(config.spectral_categories),
        decay={"decay_coupling": config.decay_coupling, "sp_band": config.spectral_band,
               "sp_band_tau": config.spectral_band_tau, "msign_steps": config.msign_steps},
    )


class ParallaxOptimizersContainer(OptimizersContainer):
    """One ``MuonAdamW`` per model part, and the one place that decides whether a step is skipped.

    Skip-step: with ``skip_nonfinite`` on (the trainer sets it from ``[reliability] nonfinite``),
    :meth:`step` skips the update (parameters and optimizer state stay bit-identical) when any loss
    passed to :meth:`observe_backward` since the last step, or any gradient after clipping, is not
    finite on any rank. The decision is made on the device and
    handed to ``MuonAdamW.step(skip=...)``: the ranks agree through one small all-reduce queued
    behind the gradients, and no host waits before the update is issued. Reading the decision
    (:meth:`last_step_skipped`) waits only for that flag, while the update itself runs on the GPU;
    a host-side check before the update would instead leave the GPU idle while the host waits.

    state_dict/load_state_dict are TorchTitan's (DCP).
    """

    def __init__(self, model_parts: list[nn.Module], config: Optimizer, skip_nonfinite: bool = False) -> None:
        # over all parts: each part's groups are built alone, and a category may live in one part only
        check_reached(model_parts, routing_config(config, model_parts[0]))
        part_of = {id(p): model for model in model_parts for p in model.parameters()}

        def optimizer_for(params, **kwargs) -> MuonAdamW:  # TorchTitan passes one part's parameters
            model = part_of[id(params[0])]
            return MuonAdamW(build_param_groups(model, routing_config(config, model)), **kwargs)

        super().__init__(model_parts, optimizer_for, {"lr": config.lr})
        self.skip_nonfinite = skip_nonfinite
        self._losses: list[torch.Tensor] = []
        self._pre_clip: tuple[list[str], torch.Tensor | None] = ([], None)
        self._flags = StepFlags()

    def observe_backward(self, loss: torch.Tensor) -> None:
        """Record one microbatch's loss (a device tensor) and the gradients' norms after its backward,
        before clipping (clipping spreads one non-finite gradient to all: these name the first)."""
        if self.skip_nonfinite:
            self._losses.append(loss.detach())
            named = list(self._named_grads())
            names, grads = [n for n, _ in named], [g for _, g in named]
            self._pre_clip = (names, torch.stack(torch._foreach_norm(grads)) if grads else None)

    def step(self, *args, **kwargs) -> None:
        if not self.skip_nonfinite:
            return super().step(*args, **kwargs)
        skip = self._nonfinite_on_any_rank()
        for optimizer in self.optimizers:
            optimizer.step(*args, skip=skip, **kwargs)

    def _nonfinite_on_any_rank(self) -> torch.Tensor:
        """0-dim bool device tensor: a recorded loss or a gradient as the optimizer sees it (after
        clipping, so a bad clip coefficient counts too) is not finite on some rank."""
        grads = [g for _, g in self._named_grads()]
        values = [loss.float().reshape(1) for loss in self._losses]
        values += [torch.stack(torch._foreach_norm(grads)).float()] if grads else []
        self._losses = []
        local = ~torch.isfinite(torch.cat(values)).all() if values else torch.zeros((), dtype=torch.bool)
        return self._flags.agree(local)

    def _named_grads(self):
        """(name, local gradient) of every parameter with a gradient, over all model parts."""
        multi = len(self.model_parts) > 1
        for k, model in enumerate(self.model_parts):
            for name, param in model.named_parameters():
                if param.grad is not None:
                    grad = param.grad
                    yield (f"part {k}: {name}" if multi else name), (grad.to_local() if hasattr(grad, "to_local") else grad)

    def last_step_skipped(self) -> bool:
        """Whether the last :meth:`step` skipped its update (waits for that step's flag only)."""
        return bool(self._flags.read()) if self.skip_nonfinite else False

    def first_nonfinite_gradient(self) -> str:
        """This rank's first parameter whose gradient was not finite before clipping (after a skip)."""
        names, norms = self._pre_clip
        bad = (~torch.isfinite(norms)).nonzero() if norms is not None else []
        return names[int(bad[0])] if len(bad) else "none on this rank (non-finite loss)"

    def schedule_metrics(self) -> dict[str, float]:
        """Per group: lr, effective ordinary decay and S_p decay per step (for TensorBoard)."""
        out: dict[str, float] = {}
        multi = len(self.optimizers) > 1
        for k, opt in enumerate(self.optimizers):
            for group in opt.param_groups:
                name = f"{k}.{group['name']}" if multi else group["name"]
                scale = MuonAdamW.decay_scale(group)
                out[f"optim/lr/{name}"] = float(group["lr"])
                out[f"optim/wd/{name}"] = scale * MuonAdamW.ordinary_wd(group)
                if group["sp_coeff"] and not MuonAdamW.sp_is_ordinary(group):
                    out[f"optim/sp_decay_p{group['sp_power']}/{name}"] = scale * group["sp_coeff"]
        if self.optimizers and self.optimizers[0].param_groups:
            out["optim/wd_mult"] = float(self.optimizers[0].param_groups[0]["wd_mult"])
        return out


def build_optimizers(model_parts: list[nn.Module], optimizer_config: Optimizer, parallel_dims,
                     ft_manager=None) -> ParallaxOptimizersContainer:
    """TorchTitan TrainSpec ``build_optimizers_fn`` (``[optimizer]`` validated by ``load_config``).

    The non-finite skip is switched on by the trainer (``[reliability] nonfinite``)."""
    if ft_manager is not None and getattr(ft_manager, "enabled", False):
        raise NotImplementedError("fault_tolerance.enable: TorchFT is not supported by ParallaxOptimizersContainer")
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


def build_lr_schedulers(optimizers: OptimizersContainer, lr_scheduler_config: LRScheduler, training_steps: int
                        ) -> WDALRSchedulersContainer:
    """TorchTitan TrainSpec ``build_lr_schedulers_fn``: TorchTitan's WSD/cosine lr plus WDA.

    Raises ValueError for a warmup or decay stage that does not fit ``training_steps`` (TorchTitan
    would shorten it) and for WDA on a schedule without a decay stage (it would never anneal)."""
    problems = lr_scheduler_config.stage_problems(training_steps)
    if problems:  # load_config refuses them too; callers may skip it
        raise ValueError("; ".join(problems))
    base = titan_lr_schedulers(optimizers, lr_scheduler_config, training_steps)
    phases = SchedulePhases(*schedule_phases(base))
    gamma = lr_scheduler_config.wd_anneal_gamma
    if gamma > 0 and phases.decay_steps == 0:  # load_config refuses it too; callers may skip it
        total = phases.warmup_steps + phases.stable_steps - 1  # TorchTitan's virtual last step
        raise ValueError(f"lr_scheduler.wd_anneal_gamma: {gamma!r} anneals over the lr decay stage, which has 0 of "
                         f"{total} steps (lr_scheduler.warmup_steps = {lr_scheduler_config.warmup_steps}, "
                         f"lr_scheduler.decay_ratio = {lr_scheduler_config.decay_ratio!r}); expected 0, or a decay "
                         "stage")
    return WDALRSchedulersContainer(base.schedulers, optimizers, phases, lr_scheduler_config.wd_anneal_gamma)
