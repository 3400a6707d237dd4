"""Weight-decay annealing (WDA) on top of TorchTitan's warmup-stable-decay lr schedule.

TorchTitan's ``linear_warmup_stable_decay`` (0-indexed scheduler step ``k``) is in
its decay stage once ``k >= warmup + stable`` with progress
``t = (k + 1 - warmup - stable) / decay``. WDA uses the same ``t``:

    wd_mult(k) = (1 - t)^gamma   in the decay stage, 1 before it.

``gamma = 0`` keeps the decay constant. The multiplier lands in each param group's
``wd_mult``, which scales every decay coefficient (ordinary and S_p).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kernels.checks import is_finite_number

__all__ = ["SchedulePhases", "decay_progress", "wd_anneal_factor"]


@dataclass(frozen=True)
class SchedulePhases:
    """Step counts of TorchTitan's schedule (its ``stable_steps`` includes a virtual last step), ints
    >= 0 (ValueError otherwise: a negative decay stage gave a progress outside [0, 1])."""

    warmup_steps: int
    stable_steps: int
    decay_steps: int

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SchedulePhases: {field.name}={value!r}; expected an int >= 0")


def decay_progress(step: int, phases: SchedulePhases) -> float:
    """Progress ``t`` in [0, 1] through the decay stage at 0-indexed scheduler step ``step``, an int
    (ValueError otherwise: a NaN step compares False with every bound, and a fractional one lands
    between the schedule's steps)."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"step={step!r}; expected an int (the scheduler's step count)")
    start = phases.warmup_steps + phases.stable_steps
    if step < start or phases.decay_steps == 0:
        return 0.0
    return min(1.0, (step + 1 - start) / phases.decay_steps)


def wd_anneal_factor(step: int, phases: SchedulePhases, gamma: float) -> float:
    """``(1 - t)^gamma`` (1.0 for gamma = 0 and before the decay stage); gamma a finite number >= 0
    (a NaN one gave NaN decay multipliers once the decay stage began)."""
    if not is_finite_number(gamma) or gamma < 0:
        raise ValueError(f"wd_anneal_gamma={gamma!r}; expected a finite number >= 0")
    if gamma == 0:
        return 1.0
    return (1.0 - decay_progress(step, phases)) ** gamma
