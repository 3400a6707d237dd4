"""Parallax-Titan training entry point.

    torchrun --nproc_per_node=N train.py --job.config_file configs/<name>.toml [--section.key value ...]

Any TOML key can be overridden on the command line (``--training.steps 100``). The config is
checked (unknown keys, types, meaning) before any model is built or data is read.
"""

from __future__ import annotations

import os
import sys

from parallax_titan.launch_env import set_defaults  # imports no torch

set_defaults()  # before torch: the allocator reads its setting once

import torch  # noqa: E402  (after the allocator setting)
from torchtitan.tools.logging import init_logger, logger  # noqa: E402

from parallax_titan.config import ConfigError, JobConfig, load_config  # noqa: E402
from parallax_titan.spec import register_all  # noqa: E402
from parallax_titan.trainer import ParallaxTrainer  # noqa: E402


def main(argv: list[str]) -> None:
    init_logger()
    register_all()
    config = load_config(argv)
    trainer = ParallaxTrainer(config, step_callbacks=step_callbacks(config))
    try:
        if config.checkpoint.create_seed_checkpoint:
            # Same weights for any world size: runs load it via checkpoint.initial_load_path.
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created seed checkpoint")
        else:
            trainer.train()
        final_step = trainer.step
        trainer.close()
        del trainer
        if config.eval.at_end and final_step == config.training.steps:
            evaluate_final_checkpoint(config, final_step)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    logger.info("Training finished")


def step_callbacks(config: JobConfig) -> list:
    """What the trainer calls after every step: downstream evaluation (``[eval] every_n_steps``)."""
    if not config.eval.every_n_steps:
        return []
    from eval.downstream import DownstreamEvaluator

    return [DownstreamEvaluator(config)]


def evaluate_final_checkpoint(config: JobConfig, step: int) -> None:
    """Hand-off to the downstream suite (``[eval] at_end``): rank 0 scores the final checkpoint."""
    from eval.at_end import run_at_end

    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        folder = os.path.join(config.job.dump_folder, config.checkpoint.folder, f"step-{step}")
        logger.info(f"Evaluation table written to {run_at_end(config, folder)}")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
