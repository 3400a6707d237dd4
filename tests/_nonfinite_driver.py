"""Runs a 4-step CPU training in which one gradient turns NaN at step 2 (test helper).

Prints one JSON line: the parameter's values after steps 1 and 2 and whether training went on.
"""

import json
import sys

import torch

from parallax_titan.config import load_config
from parallax_titan.spec import register_all
from parallax_titan.trainer import ParallaxTrainer

TARGET = "layers.1.feed_forward.w2.weight"


def main(argv):
    register_all()
    trainer = ParallaxTrainer(load_config(argv))
    param = dict(trainer.model_parts[0].named_parameters())[TARGET]
    param.register_hook(lambda g: g * float("nan") if trainer.step == 2 else g)
    snapshots = {}
    original_step = trainer.train_step

    def recording_step(it):
        original_step(it)
        snapshots[trainer.step] = param.detach().clone()

    trainer.train_step = recording_step
    trainer.train()
    print(json.dumps({
        "unchanged_at_2": bool(torch.equal(snapshots[1], snapshots[2])),
        "changed_at_3": bool(not torch.equal(snapshots[2], snapshots.get(3, snapshots[2]))),
        "last_step": trainer.step,
        "nonfinite_steps": trainer.nonfinite_steps,
        "finite_params": all(bool(torch.isfinite(p).all()) for p in trainer.model_parts[0].parameters()),
    }))
    trainer.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
