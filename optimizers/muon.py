"""MuonAdamW: the Muon family for hidden matrices, AdamW for the rest, one shared decay branch.

Each param group has ``algo`` = "muon", "normuon", "aurora", "soap" or "adamw". Per step and group:

    decay scale  s = lr            (decay_coupling = "lr", LR-coupled)
                 s = lr / base_lr  (decay_coupling = "independent": schedule multiplier eta_t)
                 times wd_mult     (weight-decay annealing, set by the scheduler)
    W <- W - s [lambda_1 W + lambda_p T_p(W)]        (T_p from the pre-update W)
    muon:    B <- mu B + G;  U = G + mu B (Nesterov) or B;  W <- W - lr * scale * ortho(U)
    normuon: as muon with D(U) = NorMuon's row-normalised ortho(U) in place of ortho(U)
    aurora:  as muon with D(U) = Aurora's leverage-uniform polar factor
    soap:    W <- W - lr * D(G), D = Adam in Shampoo's eigenbasis (``variants``)
    adamw:   the usual bias-corrected Adam update with betas and eps.

Full-matrix work (directions, T_p) goes through ``distributed.full_matrix_terms``, which
gathers FSDP2 shards to one owner rank per matrix; NorMuon's and SOAP's per-matrix state lives
on that owner. ``step(skip=flag)`` skips a step on the device (``skip_step.SkipStep``).
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.profiler import record_function

from .directions import (GRAM_MODES, MATRIX_ALGOS, ORTHO_DTYPES, ORTHO_KERNELS, UPDATE_SCALES, MatrixSpec,
                         apply_terms, update_scale)
from .distributed import full_matrix_terms
from .momentum import momentum_updates
from .orthogonalize import FLOAT_DTYPES, ORTHOGONALIZERS, default_compute_dtype
from .skip_step import SkipStep
from .spectral import BANDS, MAX_TRAINING_POWER, TRAINING_POWERS
from .variants import NORMUON_STATE, SOAP_STATE

__all__ = ["MuonAdamW", "GROUP_DEFAULTS", "ALGOS", "ALGO_OPTIONS"]

ALGOS = MATRIX_ALGOS + ("adamw",)

GROUP_DEFAULTS: dict[str, Any] = {
    "name": "",
    "algo": "adamw",
    "betas": (0.9, 0.95),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "momentum": 0.95,
    "nesterov": True,
    "compile_momentum": True,
    "orthogonalizer": "polar_express",
    "ortho_steps": 0,
    "ortho_dtype": "auto",
    "ortho_gram": "off",
    "ortho_kernel": "auto",
    "update_scale": "match_rms_adamw",
    "head_dim": 0,
    "sp_power": 1,
    "sp_coeff": 0.0,
    "decay_coupling": "lr",
    "sp_band": "none",
    "sp_band_tau": 0.0,
    "msign_steps": 20,
    "wd_mult": 1.0,
    "normuon_beta2": 0.95,
    "normuon_eps": 1e-8,
    "aurora_iterations": 2,
    "aurora_beta": 0.5,
    "aurora_eps": 1e-7,
    "soap_beta1": 0.95,
    "soap_beta2": 0.95,
    "soap_shampoo_beta": 0.95,
    "soap_eps": 1e-8,
    "soap_precondition_frequency": 10,
}

# per algorithm: the direction's option name (``variants``) -> its group key
ALGO_OPTIONS = {
    "muon": {},
    "normuon": {"beta2": "normuon_beta2", "eps": "normuon_eps"},
    "aurora": {"iterations": "aurora_iterations", "beta": "aurora_beta", "eps": "aurora_eps"},
    "soap": {"beta1": "soap_beta1", "beta2": "soap_beta2", "shampoo_beta": "soap_shampoo_beta", "eps": "soap_eps"},
}
_UNIT = ("momentum", "normuon_beta2", "soap_beta1", "soap_beta2", "soap_shampoo_beta")  # decays in [0, 1)
_POSITIVE = ("eps", "normuon_eps", "aurora_eps", "soap_eps")
_COUNTS = ("aurora_iterations", "soap_precondition_frequency", "msign_steps")  # ints >= 1
_NATURALS = ("ortho_steps", "head_dim", "sp_power")  # ints >= 0 (ortho_steps 0: the method's default)
_BOOLS = ("nesterov", "compile_momentum")
_CHOICES = {"algo": ALGOS, "decay_coupling": ("lr", "independent"), "orthogonalizer": sorted(ORTHOGONALIZERS),
            "ortho_dtype": list(ORTHO_DTYPES), "ortho_gram": sorted(GRAM_MODES), "ortho_kernel": sorted(ORTHO_KERNELS),
            "update_scale": UPDATE_SCALES, "sp_band": BANDS}
# keys a group holds besides GROUP_DEFAULTS: its parameters and lr, the lr its schedule starts from
# (ours and LambdaLR's), the host's count of SOAP calls, torch's parameter names
_GROUP_EXTRAS = ("params", "lr", "base_lr", "initial_lr", "soap_calls", "param_names")


def _real(value) -> float | None:
    """``value`` as a float (a real Python number or a 0-dim real tensor), None for anything else: a
    bool, a complex number, or a string such as "0.1", which ``float`` would take while the step's
    arithmetic would not."""
    if isinstance(value, torch.Tensor):
        real = value.ndim == 0 and value.dtype != torch.bool and not value.is_complex()
    else:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    try:
        return float(value) if real else None
    except OverflowError:  # an int beyond the float range
        return None


def _is_count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _finite_at_least(value, least: float) -> bool:
    x = _real(value)
    return x is not None and math.isfinite(x) and x >= least


def _check_group(group: dict, who: str = "MuonAdamW") -> None:
    """Raise a ValueError naming ``who``, the group, the key and the value of the first bad option (a
    bad value would otherwise be ignored, e.g. a misspelled ``decay_coupling`` meaning "independent",
    or fail inside the first step with an error that does not name it)."""
    name = group["name"]

    def bad(key, expected):
        raise ValueError(f"{who}: group {name!r} {key}={group[key]!r}; expected {expected}")

    unknown = sorted(set(group) - set(GROUP_DEFAULTS) - set(_GROUP_EXTRAS))
    if unknown:  # torch keeps unknown group keys: a misspelled option would be ignored
        raise ValueError(f"{who}: group {name!r} has unknown options {unknown}; expected keys of GROUP_DEFAULTS")
    for key, choices in _CHOICES.items():
        if not isinstance(group[key], str) or group[key] not in choices:
            bad(key, f"one of {choices}")
    _check_numbers(group, bad)
    _check_params(group, who)
    _check_matrices(group, bad, who)


def _check_numbers(group: dict, bad) -> None:
    """The numeric and boolean options of ``group`` (``bad(key, expected)`` raises)."""
    for key in _BOOLS:
        if not isinstance(group[key], bool):
            bad(key, "a bool")
    # SkipStep relies on non-positive delta coefficients; base_lr and wd_mult scale the decay (a NaN
    # one would make every weight NaN at the first step that decays)
    for key in ("lr", "weight_decay", "sp_coeff", "base_lr", "wd_mult"):
        if not _finite_at_least(group[key], 0):
            bad(key, "a finite float >= 0")
    for key in _UNIT:
        if not (_finite_at_least(group[key], 0) and _real(group[key]) < 1):
            bad(key, "a float in [0, 1)")
    betas = group["betas"]
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(_finite_at_least(b, 0) and _real(b) < 1 for b in betas)):
        bad("betas", "two floats in [0, 1)")
    for key in _POSITIVE:  # finite too: an infinite eps divides every update to zero, freezing the group
        if not (_finite_at_least(group[key], 0) and _real(group[key]) > 0):
            bad(key, "a finite float > 0")
    for key in _COUNTS:
        if not _is_count(group[key], 1):
            bad(key, "an int >= 1")
    for key in _NATURALS:
        if not _is_count(group[key], 0):
            bad(key, "an int >= 0")
    if group["sp_power"] > MAX_TRAINING_POWER:
        bad("sp_power", TRAINING_POWERS)
    if not (_finite_at_least(group["aurora_beta"], 0) and 0 < _real(group["aurora_beta"]) <= 1):
        bad("aurora_beta", "a float in (0, 1]")
    if not _finite_at_least(group["sp_band_tau"], 0):
        bad("sp_band_tau", "a finite float >= 0")
    if group["sp_band"] != "none" and not group["sp_band_tau"] > 0:
        bad("sp_band_tau", f"a finite float > 0 with sp_band={group['sp_band']!r}")
    # the schedule and WDA only lower the decay scale, so the first step's is the largest; at 1 or
    # more every step multiplies the weights by 1 - shrink <= 0: zeroed or sign-flipped, no NaN
    shrink = MuonAdamW.decay_scale(group) * MuonAdamW.ordinary_wd(group)
    if shrink >= 1:
        extra = " + sp_coeff (p = 1)" if MuonAdamW.sp_is_ordinary(group) and group["sp_coeff"] else ""
        bad("weight_decay", f"weight_decay{extra} times the decay scale below 1 (decay_coupling="
                            f"{group['decay_coupling']!r}: scale {MuonAdamW.decay_scale(group):g}, so each step "
                            f"would multiply the weights by {1 - shrink:g})")


def _check_params(group: dict, who: str) -> None:
    """Real floating parameters: a complex or integer one failed inside the first step (the momentum's
    or Adam's kernels), not naming it."""
    bad = sorted({str(p.dtype) for p in group["params"] if p.dtype not in FLOAT_DTYPES})
    if bad:
        raise ValueError(f"{who}: group {group['name']!r} holds parameters of dtype {', '.join(bad)}; expected "
                         f"one of {[str(d) for d in FLOAT_DTYPES]}")


def _check_matrices(group: dict, bad, who: str) -> None:
    """The options that depend on the algorithm and on the parameters' shapes."""
    algo = group["algo"]
    shapes = sorted({tuple(p.shape) for p in group["params"] if p.ndim != 2})
    if algo in MATRIX_ALGOS and shapes:
        raise ValueError(f"{who}: group {group['name']!r} is {algo} but holds parameters of shapes {shapes}; "
                         "expected 2-D matrices (route the others to an 'adamw' group)")
    if algo == "soap" and group["head_dim"]:
        bad("head_dim", "0 for algo 'soap' (head-wise updates are for muon, normuon and aurora)")
    if algo in MATRIX_ALGOS and group["head_dim"]:
        rows = sorted({p.shape[0] for p in group["params"]})
        if any(r % group["head_dim"] for r in rows):
            bad("head_dim", f"a divisor of the rows of every parameter (rows {rows})")


_PARAM_SHAPED = ("momentum_buffer", "exp_avg", "exp_avg_sq")  # state buffers of the parameter's shape
_ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
_WHO_LOADS = "MuonAdamW.load_state_dict"


def _state_shapes(shape: tuple) -> dict[str, tuple]:
    """The shape of each state tensor of a parameter of ``shape`` (global shape under FSDP2): the
    param-shaped buffers, Adam's 0-dim step, and for a matrix NorMuon's v and SOAP's state (plain
    tensors of the full matrix on its owner rank)."""
    shapes = {**{name: shape for name in _PARAM_SHAPED}, "step": ()}
    if len(shape) == 2:
        m, n = shape
        shapes[NORMUON_STATE] = (m, 1)
        shapes.update(zip(SOAP_STATE, ((m, m), (n, n), (m, m), (n, n), (m, n), (m, n), ())))
    return shapes


def _check_loaded_group(index: int, merged: dict, group: dict, ids: list, state: dict) -> None:
    """Group ``index`` of a state_dict being loaded, ``merged`` over this optimizer's ``group``
    (``MuonAdamW.load_state_dict``); ``ids``: its parameters' keys in ``state``."""
    if merged["algo"] != group["algo"]:
        raise ValueError(f"{_WHO_LOADS}: group {index} ({group['name']!r}) is algo={merged['algo']!r} in the "
                         f"state_dict and {group['algo']!r} here; its state holds the other algorithm's buffers")
    _check_group(merged, _WHO_LOADS)
    for position, (key, p) in enumerate(zip(ids, group["params"])):
        buffers = state.get(key, {})
        where = f"group {index} ({group['name']!r}) parameter {position} of shape {tuple(p.shape)}"
        # torch checks counts only: SOAP's bases of a transposed matrix, or an Adam step count that is
        # no 0-dim tensor, would fail inside the next step (a matmul, the fused kernel), not naming them
        for name, shape in _state_shapes(tuple(p.shape)).items():
            value = buffers.get(name)
            if value is None or (isinstance(value, torch.Tensor) and tuple(value.shape) == shape):
                continue
            got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"type {type(value).__name__}"
            expected = "the parameter's shape" if name in _PARAM_SHAPED else f"shape {shape}"
            raise ValueError(f"{_WHO_LOADS}: {where} has {name} of {got} in the state_dict; expected {expected} (a "
                             "state_dict of another model, or of parameters in another order?)")
        for algo, who, names in (("adamw", "Adam's", _ADAM_STATE), ("soap", "SOAP's", SOAP_STATE)):
            missing = [name for name in names if name not in buffers]
            if group["algo"] == algo and len(missing) not in (0, len(names)):
                raise ValueError(f"{_WHO_LOADS}: {where} lacks {who} {missing} in the state_dict; expected all of "
                                 f"{list(names)} or none")


def _check_dense_grads(group: dict, live: list) -> None:
    """Dense gradients only: a sparse one (``nn.Embedding(sparse=True)``) failed inside the momentum's
    or Adam's kernels, naming neither the group nor the parameter."""
    sparse = [tuple(p.shape) for p in live if p.grad.layout != torch.strided]
    if sparse:
        raise ValueError(f"MuonAdamW.step: group {group['name']!r} has sparse gradients for parameters of shapes "
                         f"{sparse}; expected dense (strided) gradients (nn.Embedding(sparse=False))")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class MuonAdamW(torch.optim.Optimizer):
    """Muon-family + AdamW hybrid with spectral-power decoupled decay.

    Args:
        params: param groups (dicts with "params" and any key of ``GROUP_DEFAULTS``).
        lr: default learning rate.
        **defaults: overrides of ``GROUP_DEFAULTS``.
    """

    def __init__(self, params, lr: float = 1e-3, **defaults: Any) -> None:
        unknown = set(defaults) - set(GROUP_DEFAULTS)
        if unknown:
            raise ValueError(f"MuonAdamW: unknown options {sorted(unknown)}; expected keys of GROUP_DEFAULTS")
        super().__init__(params, {**GROUP_DEFAULTS, "lr": lr, **defaults})  # each group through add_param_group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, then the checks of every group (``_check_group``) and its ``base_lr`` and SOAP call
        count: the constructor adds its groups here, so a group added later is checked and stepped the
        same way. A parameter listed twice in the group is refused (torch only warns, and each step
        would update it twice). A refused group is not added."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("base_lr", group["lr"])
        try:
            _check_group(group)
            if len({id(p) for p in group["params"]}) != len(group["params"]):
                raise ValueError(f"MuonAdamW: group {group['name']!r} lists a parameter more than once; expected "
                                 "each parameter once (every step would update it once per listing)")
        except ValueError:
            self.param_groups.pop()
            raise
        if group["algo"] == "soap":
            # step() calls that reached the group, skipped ones included: the host decides when
            # SOAP refreshes its bases without reading the device's skip flag
            group.setdefault("soap_calls", 0)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load (the saved options and state replace the current ones), after checking that
        ``state_dict`` fits this optimizer; nothing is loaded when it does not (ValueError naming the
        group, and the option or the parameter's buffer). Per group: the same ``algo`` (its state
        holds that algorithm's buffers), options that pass the constructor's checks (an option the
        state_dict lacks, one from before it existed, keeps this optimizer's value), and per
        parameter, buffers of its shape (Adam's complete). Group and parameter counts are torch's
        checks."""
        saved = state_dict["param_groups"]
        if len(saved) == len(self.param_groups) and all(
                len(s["params"]) == len(g["params"]) for s, g in zip(saved, self.param_groups)):
            groups = [{**g, **s, "params": g["params"]} for s, g in zip(saved, self.param_groups)]
            for index, (merged, group) in enumerate(zip(groups, self.param_groups)):
                _check_loaded_group(index, merged, group, saved[index]["params"], state_dict["state"])
            state_dict = {**state_dict, "param_groups": [{**g, "params": s["params"]} for g, s in zip(groups, saved)]}
        super().load_state_dict(state_dict)

    @staticmethod
    def decay_scale(group: dict) -> float:
        """Multiplier of the decay coefficients this step (see module docstring)."""
        if group["decay_coupling"] == "lr":
            scale = group["lr"]
        else:
            scale = group["lr"] / group["base_lr"] if group["base_lr"] else 0.0
        return float(scale) * group["wd_mult"]

    @staticmethod
    def sp_is_ordinary(group: dict) -> bool:
        """S_1(W) = W: an unbanded p = 1 term is ordinary decay (a banded one is W P_top etc.)."""
        return group["sp_power"] == 1 and group["sp_band"] == "none"

    @staticmethod
    def ordinary_wd(group: dict) -> float:
        """Ordinary decay coefficient: ``weight_decay`` plus an unbanded p = 1 S_p coefficient."""
        extra = group["sp_coeff"] if MuonAdamW.sp_is_ordinary(group) else 0.0
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
        live_groups = [(g, [p for p in g["params"] if p.grad is not None]) for g in self.param_groups]
        live_groups = [(g, live) for g, live in live_groups if live]
        for group, live in live_groups:
            mask.check_device(_local(live[0]).device)
            _check_dense_grads(group, live)
        # named ranges let a profile attribute the step's host time, the GPU's idle gaps included
        with record_function("muon.momentum"):
            by_param = self._updates(live_groups, mask)
        with record_function("muon.work_list"):
            specs, updates, weights, params = [], [], [], []
            for group, live in live_groups:
                for p, spec, w in self._matrix_work(group, live):
                    if spec.has_update or spec.has_decay:
                        specs.append(spec), updates.append(by_param.get(id(p))), weights.append(w), params.append(p)
            states = [self.state[p] for p in params]
        with record_function("muon.matrix_terms"):  # they read the pre-update weights: before any write below
            directions, decay = full_matrix_terms(specs, updates, weights, params, mask, states) if specs else ({}, {})
        with record_function("muon.decay_and_adam"):
            for group, live in live_groups:
                mask.scale_([_local(p) for p in live], 1.0 - self.decay_scale(group) * self.ordinary_wd(group))
                if group["algo"] == "adamw":
                    self._adam_update(group, live, mask)
        with record_function("muon.apply"):
            apply_terms([_local(p) for p in params], specs, directions, decay)
        return loss

    def _updates(self, live_groups, mask):
        """{id(param): U}, the input of each matrix's direction: the momentum update for the Muon
        algorithms (one momentum call for all groups that share its settings), the gradient for
        SOAP (its moments live with its bases); nothing for AdamW."""
        out, batches = {}, defaultdict(list)
        for group, live in live_groups:
            if group["algo"] == "soap":
                group["soap_calls"] += 1
                out.update({id(p): _local(p.grad) for p in live})
            elif group["algo"] != "adamw":
                dtype = ORTHO_DTYPES[group["ortho_dtype"]] or default_compute_dtype(_local(live[0]))
                key = (group["momentum"], group["nesterov"], dtype, group["compile_momentum"])
                batches[key].extend(live)
        for (mu, nesterov, dtype, compiled), live in batches.items():
            for p in live:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)  # zeros: as if there were no state
            bufs = [_local(self.state[p]["momentum_buffer"]) for p in live]
            upd = momentum_updates(bufs, [_local(p.grad) for p in live], mu, nesterov, dtype, mask, compiled)
            out.update({id(p): u for p, u in zip(live, upd)})
        return out

    @staticmethod
    def _direction_options(group) -> tuple:
        """The group's ``MatrixSpec.options``: its algorithm's hyperparameters (and, for SOAP,
        whether this call refreshes the eigenbases)."""
        algo = group["algo"]
        opts = {name: group[key] for name, key in ALGO_OPTIONS.get(algo, {}).items()}
        if algo == "soap":
            opts["refresh"] = group["soap_calls"] % group["soap_precondition_frequency"] == 0
        return tuple(sorted(opts.items()))

    def _matrix_work(self, group, live):
        """(param, spec, local weight or None) for each 2-D param: the weight when S_p decay reads it."""
        dscale = self.decay_scale(group)
        sp = group["sp_coeff"] != 0.0 and not self.sp_is_ordinary(group) and dscale != 0.0
        algo, options = group["algo"], self._direction_options(group)
        out, by_shape = [], {}
        for p in live:
            if p.ndim != 2:
                continue
            # one spec per shape: a spec per matrix (hundreds per step) was host time the GPU waited for
            spec = by_shape.get(p.shape)
            if spec is None:
                m, n = p.shape
                # SOAP's direction is Adam-normalised already: the Muon update scales do not apply
                scale = 1.0 if algo == "soap" else update_scale(group["update_scale"], m, n)
                coeff = -group["lr"] * scale if algo in MATRIX_ALGOS else 0.0
                spec = by_shape[p.shape] = MatrixSpec(
                    shape=(m, n), update_coeff=float(coeff), algo=algo, options=options,
                    method=group["orthogonalizer"], steps=group["ortho_steps"], dtype=group["ortho_dtype"],
                    gram=group["ortho_gram"], kernel=group["ortho_kernel"], head_dim=group["head_dim"],
                    sp_coeff=-dscale * group["sp_coeff"] if sp else 0.0, sp_power=group["sp_power"],
                    band=group["sp_band"], tau=group["sp_band_tau"], msign_steps=group["msign_steps"],
                )
            out.append((p, spec, _local(p) if sp else None))
        return out

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
