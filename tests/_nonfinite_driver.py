"""Runs a 4-step CPU training in which one gradient turns NaN at step 2 (test helper).

Prints one JSON line: the parameter's values after steps 1 and 2 and whether training went on.
``--max-norm-nan`` (first argument) instead sets ``training.max_norm`` to NaN past validation, so
that every clipped gradient is NaN, and reports whether any parameter changed.
"""

import json
import sys

import torch

from parallax_titan.config import load_config
from parallax_titan.spec import register_all
from parallax_titan.teardown import leave_process_group
from parallax_titan.trainer import NonFiniteStop, ParallaxTrainer

TARGET = "layers.1.feed_forward.w2.weight"


def main(argv):
    register_all()
    nan_max_norm = argv[:1] == ["--max-norm-nan"]
    config = load_config(argv[1:] if nan_max_norm else argv)
    if nan_max_norm:
        config.training.max_norm = float("nan")
    trainer = ParallaxTrainer(config)
    if nan_max_norm:
        return report_max_norm_nan(trainer)
    param = dict(trainer.model_parts[0].named_parameters())[TARGET]
    param.register_hook(lambda g: g * float("nan") if trainer.step == 2 else g)
    snapshots = {}
    original_step = trainer.train_step

    def recording_step(it):
        original_step(it)
        snapshots[trainer.step] = param.detach().clone()

    trainer.train_step = recording_step
    try:
        trainer.train()
        stopped = None
    except NonFiniteStop as exc:
        stopped = str(exc)
    print(json.dumps({
        "stopped": stopped,
        "unchanged_at_2": bool(torch.equal(snapshots[1], snapshots[2])),
        "changed_at_3": bool(not torch.equal(snapshots[2], snapshots.get(3, snapshots[2]))),
        "last_step": trainer.step,
        "nonfinite_steps": trainer.nonfinite_steps,
        "finite_params": all(bool(torch.isfinite(p).all()) for p in trainer.model_parts[0].parameters()),
    }))
    trainer.close()
    leave_process_group(wait_s=30)


def report_max_norm_nan(trainer) -> None:
    """Train; print whether every parameter kept its initial value and how many steps were skipped."""
    initial = [p.detach().clone() for p in trainer.model_parts[0].parameters()]
    trainer.train()
    after = list(trainer.model_parts[0].parameters())
    print(json.dumps({
        "unchanged": all(torch.equal(a, b) for a, b in zip(initial, after)),
        "finite_params": all(bool(torch.isfinite(p).all()) for p in after),
        "last_step": trainer.step,
        "nonfinite_steps": trainer.nonfinite_steps,
    }))
    trainer.close()
    leave_process_group(wait_s=30)


if __name__ == "__main__":
    main(sys.argv[1:])
