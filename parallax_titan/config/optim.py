"""``[optimizer]`` and ``[lr_scheduler]``: TorchTitan's keys plus the Muon family, S_p decay and WDA.

TorchTitan's ``name``, ``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay`` and the schedule keys
(``warmup_steps``, ``decay_ratio``, ``decay_type``, ``min_lr_factor``) keep their meaning; for runs of
the Muon family (Muon, NorMuon, Aurora, SOAP on the hidden matrices) ``beta1``/``beta2``/``eps``
configure the Adam group. See docs/optimizers.md.

No ``from __future__ import annotations`` here: tyro reads these annotations as real types.
"""

import math
from dataclasses import dataclass, field
from typing import Literal

from torchtitan.config import job_config as titan

from optimizers.directions import ORTHO_DTYPES, UPDATE_SCALES
from optimizers.orthogonalize import ORTHOGONALIZERS
from optimizers.routing import (
    ATTN_CATEGORIES, DEFAULT_PARAM_RULES, MODULE_OF, RoutingConfig, check_categories, parse_headwise, parse_rules,
)
from optimizers.spectral import MAX_TRAINING_POWER, TRAINING_POWERS
from parallax_titan.config.schema import value_problems
from parallax_titan.config.sections import finite_at_least

# optimizer.name -> MuonAdamW algorithm of the hidden matrices (optimizers.muon); AdamW: every group Adam
MATRIX_ALGO_OF = {"Muon": "muon", "NorMuon": "normuon", "Aurora": "aurora", "SOAP": "soap"}
OPTIMIZER_NAMES = (*MATRIX_ALGO_OF, "AdamW")
# the names whose update reads each key (docs/optimizers.md, "The Muon family"): under any other name
# the key is ignored, so a value other than its default is refused. SOAP preconditions the gradient
# itself (no momentum, orthogonaliser or update scale); AdamW reads none of them (every group is Adam,
# so muon_categories routes nothing).
ORTHOGONALISING = ("Muon", "NorMuon", "Aurora")
NAMES_OF_KEY = {
    "muon_categories": tuple(MATRIX_ALGO_OF),
    **{key: ORTHOGONALISING for key in ("muon_momentum", "muon_nesterov", "orthogonalizer", "ortho_steps",
                                        "ortho_dtype", "muon_update_scale", "muon_head_dim", "ortho_gram",
                                        "ortho_kernel", "muon_compile_momentum")},
    **{key: ("NorMuon",) for key in ("normuon_beta2", "normuon_eps")},
    **{key: ("Aurora",) for key in ("aurora_iterations", "aurora_beta", "aurora_eps")},
    **{key: ("SOAP",) for key in ("soap_beta1", "soap_beta2", "soap_shampoo_beta", "soap_eps",
                                  "soap_precondition_frequency")},
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_multipliers(entries: list[str]) -> dict[str, float]:
    """['cat=0.3', ...] -> {'cat': 0.3}; ValueError naming the entry, or a category given twice (a
    dict would keep the last value without a word)."""
    out, seen = {}, {}
    for entry in entries:
        category, sep, value = str(entry).partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not finite_at_least(number, 0):
            raise ValueError(f"optimizer.lr_multipliers: entry {entry!r}; expected 'category=float >= 0'")
        category = category.strip()
        if category in seen:
            raise ValueError(f"optimizer.lr_multipliers: category {category!r} given twice ({seen[category]!r} and "
                             f"{entry!r}); expected each category once")
        out[category], seen[category] = number, entry
    return out


@dataclass
class Optimizer(titan.Optimizer):
    """``[optimizer]``: TorchTitan's keys (``name`` = "Muon" | "NorMuon" | "Aurora" | "SOAP" | "AdamW") plus
    the options of the Muon family and of the decay."""

    muon_momentum: float = 0.95
    """Muon momentum coefficient mu (B <- mu B + G)."""

    muon_nesterov: bool = True
    """Nesterov update U = G + mu B (else U = B)."""

    orthogonalizer: Literal["polar_express", "newton_schulz"] = "polar_express"
    """Muon orthogonaliser."""

    ortho_steps: int = 0
    """Orthogonaliser steps; 0 = its default (8 Polar Express, 5 Newton-Schulz)."""

    ortho_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """Orthogonaliser compute dtype; auto = bf16 on GPU, fp32 on CPU."""

    muon_update_scale: Literal["match_rms_adamw", "spectral", "none"] = "match_rms_adamw"
    """Update scale: 0.2 sqrt(max(m, n)) (Moonlight), sqrt(max(1, m/n)), or 1."""

    muon_headwise: str = "FFF"
    """Per projection Q,K,V(,R): H = orthogonalise per head, F = full matrix; R follows Q if omitted."""

    muon_head_dim: int = 0
    """Head dim for head-wise Muon; 0 = read `head_dim` from the model's attention modules. Any other
    value must be the model's head_dim (a different one would split or merge heads)."""

    param_rules: list[str] = field(default_factory=lambda: list(DEFAULT_PARAM_RULES))
    """Ordered 'category=regex' rules on parameter FQNs (first match; unmatched = 'other')."""

    muon_categories: list[str] = field(default_factory=lambda: [*ATTN_CATEGORIES, "mlp", "other"])
    """Categories whose 2-D parameters Muon updates; everything else goes to the Adam group."""

    lr_multipliers: list[str] = field(default_factory=list)
    """'category=multiplier' lr multipliers, e.g. ['embed=0.3', 'norm=0.015']."""

    no_decay_categories: list[str] = field(default_factory=list)
    """Categories without ordinary weight decay (e.g. ['norm', 'bias'])."""

    spectral_power_attn: int = 1
    """S_p power p_A for attention matrices (wq, wk, wv, wo, wr); 1 = ordinary decay."""

    spectral_coeff_attn: float = 0.0
    """S_p coefficient lambda_A for attention matrices; 0 disables."""

    spectral_power_mlp: int = 1
    """S_p power p_M for MLP matrices (w1, w2, w3)."""

    spectral_coeff_mlp: float = 0.0
    """S_p coefficient lambda_M for MLP matrices; 0 disables."""

    spectral_categories: list[str] = field(default_factory=lambda: [*ATTN_CATEGORIES, "mlp"])
    """Categories that receive the S_p term (e.g. ['attn_v'] for V-only decay)."""

    decay_coupling: Literal["lr", "independent"] = "lr"
    """Decay scale: 'lr' = coefficients times the current lr; 'independent' = times the
    schedule multiplier eta_t only. Applies to weight_decay and the S_p coefficients."""

    spectral_band: Literal["none", "top", "bottom", "top_only", "bottom_only"] = "none"
    """Band selection of the S_p term around spectral_band_tau (SPEC.md 3)."""

    spectral_band_tau: float = 0.0
    """Singular-value threshold tau for band selection."""

    msign_steps: int = 20
    """Iterations of the matrix-sign polynomial for band projectors."""

    ortho_gram: Literal["off", "on"] = "off"
    """"on": orthogonalise on the Gram side (Muon, NorMuon, Aurora; fewer FLOPs on rectangular
    matrices). In bf16 it can turn a rank-deficient gradient into NaN weights
    (optimizers/orthogonalize.py says why), so it needs ``ortho_dtype = "float32"``."""

    ortho_kernel: Literal["auto", "torch"] = "auto"
    """"auto": Polar Express / Newton-Schulz form A = X X^T and H = aI + bA + cA^2 with the Triton
    symmetric-product kernel (``kernels.gram``) on CUDA in bf16/fp16, torch GEMMs elsewhere;
    "torch": torch GEMMs everywhere."""

    muon_compile_momentum: bool = True
    """Compile the momentum update into a few fused kernels on CUDA (eager on CPU or if compiling fails)."""

    normuon_beta2: float = 0.95
    """NorMuon: decay of the per-row second moment v_i of the orthogonalised update."""

    normuon_eps: float = 1e-8
    """NorMuon: guard in N_ij = O_ij / (sqrt(v_i) + eps)."""

    aurora_iterations: int = 2
    """Aurora: polar calls K of the leverage-uniform iteration (tall matrices)."""

    aurora_beta: float = 0.5
    """Aurora: damping exponent of the row rescaling, in (0, 1]."""

    aurora_eps: float = 1e-7
    """Aurora: floor of the row norms (and, squared, of the leverages)."""

    soap_beta1: float = 0.95
    """SOAP: first-moment decay in the eigenbasis."""

    soap_beta2: float = 0.95
    """SOAP: second-moment decay in the eigenbasis."""

    soap_shampoo_beta: float = 0.95
    """SOAP: decay of the Shampoo factors L = E[G G^T], R = E[G^T G]."""

    soap_eps: float = 1e-8
    """SOAP: Adam's denominator guard."""

    soap_precondition_frequency: int = 10
    """SOAP: refresh the eigenbases (one power iteration + QR) every this many steps."""

    def multipliers(self) -> dict[str, float]:
        """``lr_multipliers`` as {category: multiplier} (the section must be valid)."""
        return parse_multipliers(self.lr_multipliers)

    def validate(self) -> list[str]:
        problems = value_problems(self, "optimizer")

        def need(ok: bool, key: str, expected: str) -> None:
            if not ok:
                problems.append(f"optimizer.{key}: expected {expected}, got {getattr(self, key)!r}")

        need(self.name in OPTIMIZER_NAMES, "name", f"one of {OPTIMIZER_NAMES}")
        # no category: every parameter goes to the Adam group, an AdamW run under a matrix optimizer's name
        need(self.name not in MATRIX_ALGO_OF or self.muon_categories != [], "muon_categories",
             f"at least one category with name = {self.name!r} (empty: every parameter goes to the Adam group, so "
             f"{self.name} would update nothing; name = 'AdamW' trains with Adam alone)")
        need(finite_at_least(self.lr, 0) and self.lr > 0, "lr", "a finite float > 0")
        for key in ("beta1", "beta2", "muon_momentum", "normuon_beta2", "soap_beta1", "soap_beta2",
                    "soap_shampoo_beta"):
            need(finite_at_least(getattr(self, key), 0) and getattr(self, key) < 1, key, "a float in [0, 1)")
        for key in ("eps", "normuon_eps", "aurora_eps", "soap_eps"):
            need(finite_at_least(getattr(self, key), 0) and getattr(self, key) > 0, key, "a float > 0")
        need(finite_at_least(self.aurora_beta, 0) and 0 < self.aurora_beta <= 1, "aurora_beta", "a float in (0, 1]")
        for key in ("aurora_iterations", "soap_precondition_frequency"):
            need(_is_int(getattr(self, key)) and getattr(self, key) >= 1, key, "an int >= 1")
        for key in ("weight_decay", "spectral_coeff_attn", "spectral_coeff_mlp", "spectral_band_tau"):
            need(finite_at_least(getattr(self, key), 0), key, "a finite float >= 0")
        need(self.orthogonalizer in ORTHOGONALIZERS, "orthogonalizer", f"one of {sorted(ORTHOGONALIZERS)}")
        need(self.ortho_dtype in ORTHO_DTYPES, "ortho_dtype", f"one of {list(ORTHO_DTYPES)}")
        need(self.ortho_gram != "on" or self.ortho_dtype == "float32", "ortho_dtype",
             "'float32' with ortho_gram = 'on' (in bf16 the Gram-side iteration diverges on rank-deficient "
             "gradients: docs/optimizers.md)")
        need(self.muon_update_scale in UPDATE_SCALES, "muon_update_scale", f"one of {UPDATE_SCALES}")
        for key in ("ortho_steps", "muon_head_dim"):
            need(isinstance(getattr(self, key), int) and getattr(self, key) >= 0, key, "an int >= 0")
        for key in ("spectral_power_attn", "spectral_power_mlp"):
            need(isinstance(getattr(self, key), int) and 0 <= getattr(self, key) <= MAX_TRAINING_POWER, key,
                 TRAINING_POWERS)
        need(self.spectral_band == "none" or self.spectral_band_tau > 0, "spectral_band_tau",
             "> 0 when spectral_band is set")
        need(isinstance(self.msign_steps, int) and self.msign_steps >= 1, "msign_steps", "an int >= 1")
        need(self.name not in OPTIMIZER_NAMES or self.name in ORTHOGONALISING or "H" not in str(self.muon_headwise),
             "muon_headwise", f"only F letters with name = {self.name!r} (head-wise updates are for Muon, NorMuon "
             "and Aurora)")
        need(not self.early_step_in_backward, "early_step_in_backward", "false (not supported by MuonAdamW)")
        need(self.implementation == "fused", "implementation", "'fused' (MuonAdamW's Adam group always runs torch's "
             "fused AdamW kernel; TorchTitan's 'for-loop' and 'foreach' would be ignored)")
        parsed = [_problem_of(check) for check in (lambda: parse_headwise(self.muon_headwise),
                                                    lambda: parse_rules(self.param_rules), self.multipliers)]
        problems += [p for p in parsed if p]
        if not any(parsed[1:]):  # the category names, once the rules and multipliers parse
            problems += [p for p in [_problem_of(lambda: self._check_categories(parsed[0] is None))] if p]
        return problems + self._other_name_problems() + self._unused_coeff_problems() + self._unused_sp_problems()

    def _other_name_problems(self) -> list[str]:
        """Keys set (away from their defaults) that ``name`` does not read: e.g. ``normuon_beta2`` with
        ``name = "Muon"`` would train plain Muon, ``muon_momentum`` with SOAP or AdamW nothing."""
        if self.name not in OPTIMIZER_NAMES:
            return []  # reported by validate
        defaults = type(self)()
        return [f"optimizer.{key}: {getattr(self, key)!r} is read with name = {' or '.join(map(repr, names))} only, "
                f"not with name = {self.name!r}; expected the default {getattr(defaults, key)!r} or no key"
                for key, names in NAMES_OF_KEY.items()
                if self.name not in names and getattr(self, key) != getattr(defaults, key)]

    def _unused_coeff_problems(self) -> list[str]:
        """An S_p coefficient of a module none of whose categories is in ``spectral_categories``
        reaches no parameter (routing gives the S_p term to those categories only)."""
        problems = []
        for module in ("attn", "mlp"):
            key, coeff = f"spectral_coeff_{module}", getattr(self, f"spectral_coeff_{module}")
            mine = [c for c, m in MODULE_OF.items() if m == module]
            if finite_at_least(coeff, 0) and coeff > 0 and not set(mine) & set(self.spectral_categories):
                problems.append(f"optimizer.{key}: {coeff!r} reaches no parameter: spectral_categories = "
                                f"{list(self.spectral_categories)} has none of {mine}; expected 0, or one of "
                                f"them in spectral_categories")
        return problems

    def _unused_sp_problems(self) -> list[str]:
        """S_p settings that no S_p term reads: a power whose module's coefficient is 0, a band with
        both coefficients 0, and ``spectral_band_tau`` or ``msign_steps`` without a band (the band
        selection is the only reader of both)."""
        defaults = type(self)()
        problems = []
        for module in ("attn", "mlp"):
            power, coeff = f"spectral_power_{module}", f"spectral_coeff_{module}"
            if getattr(self, power) != getattr(defaults, power) and getattr(self, coeff) == 0:
                problems.append(f"optimizer.{power}: {getattr(self, power)!r} is read with {coeff} > 0 only, and "
                                f"{coeff} = 0; expected {coeff} > 0, or the default {getattr(defaults, power)!r}")
        if self.spectral_band != "none" and self.spectral_coeff_attn == 0 and self.spectral_coeff_mlp == 0:
            problems.append(f"optimizer.spectral_band: {self.spectral_band!r} selects the band of the S_p term, and "
                            "spectral_coeff_attn = spectral_coeff_mlp = 0; expected a coefficient > 0, or 'none'")
        for key in ("spectral_band_tau", "msign_steps"):
            if self.spectral_band == "none" and getattr(self, key) != getattr(defaults, key):
                problems.append(f"optimizer.{key}: {getattr(self, key)!r} is read with a spectral_band only, and "
                                f"spectral_band = 'none'; expected the default {getattr(defaults, key)!r} or a band")
        return problems

    def head_dim_problems(self, model_head_dim: int) -> list[str]:
        """``muon_head_dim`` must be 0 or the model's ``head_dim`` (from its model args): head-wise Muon
        orthogonalises the rows of one attention head at a time (SPEC.md 3), and any other divisor of
        the rows would split every head into pieces (or merge heads) without a word."""
        dim = self.muon_head_dim
        if not _is_int(dim) or dim in (0, model_head_dim):
            return []
        return [f"optimizer.muon_head_dim: {dim} is not the model's head_dim {model_head_dim} (per-head updates "
                f"would orthogonalise blocks of {dim} rows, not heads); expected 0 (the model's) or {model_head_dim}"]

    def _check_categories(self, headwise_parses: bool) -> None:
        """ValueError naming the key when a category list names a category no rule produces, or when
        ``muon_headwise`` (checked if it parses) has an H for a category outside ``muon_categories``
        (the optimizer build refuses both too, but only after the model is built). The H letters under
        a name without head-wise updates are reported by ``validate``."""
        check_categories(RoutingConfig(
            rules=list(self.param_rules), muon_categories=tuple(self.muon_categories),
            lr_multipliers=self.multipliers(), no_decay_categories=tuple(self.no_decay_categories),
            spectral_categories=tuple(self.spectral_categories),
            headwise=self.muon_headwise if headwise_parses and self.name in ORTHOGONALISING else "FFF"))


def _problem_of(check) -> str | None:
    """Run ``check``; its ValueError's message as an ``optimizer.<key>: ...`` problem, or None."""
    try:
        check()
    except ValueError as exc:
        message = str(exc)
        return message if message.startswith("optimizer.") else f"optimizer.{message}"
    return None


@dataclass
class LRScheduler(titan.LRScheduler):
    """``[lr_scheduler]``: TorchTitan's warmup / stable / decay schedule plus weight-decay annealing."""

    wd_anneal_gamma: float = 0.0
    """Weight-decay annealing lambda(t) = lambda (1 - t)^gamma over the lr decay stage; 0 = off."""

    def validate(self) -> list[str]:
        problems = value_problems(self, "lr_scheduler")
        if not finite_at_least(self.wd_anneal_gamma, 0):
            problems.append(f"lr_scheduler.wd_anneal_gamma: expected a finite float >= 0, got {self.wd_anneal_gamma!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            problems.append(f"lr_scheduler.warmup_steps: expected an int >= 0, got {self.warmup_steps!r}")
        ratio = self.decay_ratio
        if ratio is not None and not (finite_at_least(ratio, 0) and ratio <= 1):
            problems.append(f"lr_scheduler.decay_ratio: expected unset or a float in [0, 1], got {ratio!r}")
        if not (finite_at_least(self.min_lr_factor, 0) and self.min_lr_factor <= 1):
            problems.append(f"lr_scheduler.min_lr_factor: expected a float in [0, 1], got {self.min_lr_factor!r}")
        return problems

    def _schedule_steps(self, training_steps: int) -> int | None:
        """The steps the schedule spans (``total_steps``, else ``training_steps``), or None when the
        section is not valid on its own (``validate`` reports it) or they are not a positive int (the
        section that gives them reports it)."""
        total = self.total_steps if self.total_steps is not None else training_steps
        if self.validate() or not _is_int(total) or total < 1:
            return None
        return total

    def stage_problems(self, training_steps: int) -> list[str]:
        """Warmup or decay stages that do not fit the run's ``training_steps`` (or ``total_steps``):
        TorchTitan would shorten them with a log warning, so the run's schedule would not be the one
        its config gives. A section that is not valid on its own is reported by ``validate``."""
        total = self._schedule_steps(training_steps)
        if total is None:
            return []
        key = "lr_scheduler.total_steps" if self.total_steps is not None else "training.steps"
        if self.warmup_steps > total:
            return [f"lr_scheduler.warmup_steps: {self.warmup_steps} warmup steps do not fit the schedule's {total} "
                    f"steps ({key}); expected at most {total} (TorchTitan would cut the warmup to {total})"]
        if self.decay_ratio is None:
            return []
        decay = round(total * self.decay_ratio)
        if self.warmup_steps + decay > total:
            return [f"lr_scheduler.decay_ratio: {self.decay_ratio!r} of {total} steps ({key}) is a {decay}-step decay, "
                    f"which with lr_scheduler.warmup_steps = {self.warmup_steps} exceeds the {total} steps; expected "
                    f"warmup_steps + round({total} * decay_ratio) <= {total} (TorchTitan would cut the decay to "
                    f"{total - self.warmup_steps} steps)"]
        return []

    def anneal_problems(self, training_steps: int, optimizer: Optimizer) -> list[str]:
        """WDA (``wd_anneal_gamma`` > 0) that would never change a coefficient: the lr schedule of
        ``training_steps`` steps has no decay stage (WDA runs over that stage only), or ``optimizer``
        has no decay to anneal. A section that is not valid on its own is reported by ``validate``, stages
        that do not fit the run by ``stage_problems``."""
        gamma = self.wd_anneal_gamma
        total = self._schedule_steps(training_steps)
        if not (finite_at_least(gamma, 0) and gamma > 0) or total is None or self.stage_problems(training_steps):
            return []
        if titan_decay_steps(total, self.warmup_steps, self.decay_ratio) == 0:
            return [f"lr_scheduler.wd_anneal_gamma: {gamma!r} anneals the decay over the lr decay stage, which has "
                    f"0 of {total} steps (lr_scheduler.warmup_steps = {self.warmup_steps}, lr_scheduler.decay_ratio = "
                    f"{self.decay_ratio!r}); expected 0, or a decay stage (decay_ratio > 0 and warmup_steps below the "
                    f"{total} steps)"]
        if optimizer.weight_decay == 0 and optimizer.spectral_coeff_attn == 0 and optimizer.spectral_coeff_mlp == 0:
            return [f"lr_scheduler.wd_anneal_gamma: {gamma!r} anneals the weight decay, but optimizer.weight_decay, "
                    "spectral_coeff_attn and spectral_coeff_mlp are all 0; expected 0, or a decay coefficient > 0"]
        return []

    def decay_shape_problems(self, training_steps: int) -> list[str]:
        """``decay_type`` or ``min_lr_factor`` changed from its default on a schedule whose decay stage
        no trained step reaches: 0 steps, or 1 (TorchTitan's lr at the last step is 1/decay_steps of
        its peak: a 1-step decay begins at the virtual step after the run), so the key would be
        ignored. A section that is not valid on its own, or stages that do not fit the run, are
        reported by ``validate`` and ``stage_problems``."""
        defaults = titan.LRScheduler()
        changed = [key for key in ("decay_type", "min_lr_factor") if getattr(self, key) != getattr(defaults, key)]
        total = self._schedule_steps(training_steps)
        if not changed or total is None or self.stage_problems(training_steps):
            return []
        decay = titan_decay_steps(total, self.warmup_steps, self.decay_ratio)
        if decay > 1:
            return []
        virtual = "; its one step is TorchTitan's virtual last step, after the run" if decay else ""
        return [f"lr_scheduler.{key}: {getattr(self, key)!r} shapes the lr decay stage, which has {decay} of {total} "
                f"steps (lr_scheduler.warmup_steps = {self.warmup_steps}, lr_scheduler.decay_ratio = "
                f"{self.decay_ratio!r}{virtual}), so no trained step reads it (it would be ignored); expected the "
                f"default {getattr(defaults, key)!r}, or a decay stage of 2 steps or more" for key in changed]


def titan_decay_steps(total: int, warmup: int, ratio: float | None) -> int:
    """Steps of the lr decay stage as TorchTitan 0.2.2's ``build_lr_schedulers`` clamps them:
    warmup to the run, then decay to what the warmup leaves (``round(total * ratio)``; all of it
    when ``ratio`` is unset). ``optim_builder`` reads the built schedule's counts back and checks
    them again."""
    warmup = min(warmup, total)
    decay = round(total * ratio) if ratio is not None else total - warmup
    return min(decay, total - warmup)
