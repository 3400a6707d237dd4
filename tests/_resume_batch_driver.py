"""Builds the trainer of a config, loads its checkpoint as ``trainer.train()`` does, and reports what
came back (test helper for a resume onto another dataset).

Prints one JSON line: the step loaded, whether the model's and the optimizer's state equal the
checkpoint's, and whether the first batch after the load is a freshly built loader's first batch.
Run as rank 0 of 1 (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT`` ... set):
``python tests/_resume_batch_driver.py --job.config_file ... --job.dump_folder ...``.
"""

import json
import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from torchtitan.tools.logging import init_logger

from parallax_titan.checkpoint_files import step_dir
from parallax_titan.config import load_config
from parallax_titan.data import build_dataloader
from parallax_titan.spec import register_all
from parallax_titan.teardown import leave_process_group
from parallax_titan.trainer import ParallaxTrainer


def equals_checkpoint(state: dict, path: str, prefix: str | None) -> bool:
    """Whether every tensor of the flat ``state`` equals the one saved in the DCP folder ``path`` (under
    ``prefix``, or at the top level as TorchTitan saves the model)."""
    tensors = {k: torch.empty_like(v) for k, v in state.items() if torch.is_tensor(v)}
    dcp.load({prefix: tensors} if prefix else tensors, checkpoint_id=path)
    return bool(tensors) and all(torch.equal(tensors[k], state[k]) for k in tensors)


def same_batch(a, b) -> bool:
    """Whether two ``(input_dict, labels)`` batches hold the same tensors."""
    (inputs_a, labels_a), (inputs_b, labels_b) = a, b
    return inputs_a.keys() == inputs_b.keys() and torch.equal(labels_a, labels_b) and all(
        torch.equal(inputs_a[k], inputs_b[k]) for k in inputs_a)


def main(argv):
    init_logger()
    register_all()
    config = load_config(argv)
    trainer = ParallaxTrainer(config)
    trainer.checkpointer.load(step=config.checkpoint.load_step)
    path = step_dir(os.path.join(config.job.dump_folder, config.checkpoint.folder), trainer.step)
    fresh = build_dataloader(1, 0, trainer.tokenizer, config)
    print(json.dumps({
        "step": trainer.step,
        "model_loaded": equals_checkpoint(trainer.model_parts[0].state_dict(), path, None),
        "optimizer_loaded": equals_checkpoint(trainer.optimizers.state_dict(), path, "optimizer"),
        "first_batch_is_fresh": same_batch(next(iter(trainer.dataloader)), next(iter(fresh))),
    }))
    trainer.close()
    leave_process_group(wait_s=30)


if __name__ == "__main__":
    main(sys.argv[1:])
