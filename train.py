"""Parallax-Titan training entry point.

    python -m parallax_titan.launch --nproc_per_node=N train.py --job.config_file configs/<name>.toml \
        [--section.key value ...]

(``parallax_titan.launch`` is torchrun with a shutdown timeout that covers a checkpoint save and
SIGTERM handled as a stop; plain ``torchrun`` works too.) Without a launcher, ``python train.py ...``
runs as one process. Any TOML key can be overridden on the command line (``--training.steps 100``);
``--job.config_file`` may be given once. The config is checked (unknown keys, types, meaning) before
any model is built or data is read.

Exit codes: 0 done (or stopped by SIGTERM / ``reliability.stop_at_step`` with a checkpoint saved;
SIGTERM with ``checkpoint.enable = false`` stops without one and logs so), 2 invalid config (also
an ``[eval] at_end`` data_dir without a task's file) or a refused resume, 3 stopped on a non-finite
step (``reliability.nonfinite = "stop"``), 4 a checkpoint could not be saved or loaded.
"""

from __future__ import annotations

import os
import socket
import sys

from parallax_titan.launch_env import set_defaults  # imports no torch

set_defaults()  # before torch: the allocator reads its setting once

import torch  # noqa: E402  (after the allocator setting)
from torchtitan.tools.logging import init_logger, logger  # noqa: E402

from parallax_titan.checkpoint_files import CheckpointError  # noqa: E402
from parallax_titan.config import ConfigError, JobConfig, load_config  # noqa: E402
from parallax_titan.spec import register_all  # noqa: E402
from parallax_titan.teardown import leave_process_group  # noqa: E402
from parallax_titan.trainer import NonFiniteStop, ParallaxTrainer  # noqa: E402

EXIT_CODES = ((ConfigError, 2), (NonFiniteStop, 3), (CheckpointError, 4))
LEAVE_WAIT_S, FAILED_LEAVE_WAIT_S = 300.0, 5.0  # ranks that finished arrive within seconds of each other


def single_process_env() -> None:
    """Without torchrun's variables, run as rank 0 of 1 on a free local port."""
    if "LOCAL_RANK" in os.environ or "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def main(argv: list[str]) -> None:
    init_logger()
    register_all()
    single_process_env()
    config = load_config(argv)
    if config.eval.at_end or config.eval.every_n_steps:
        from eval.at_end import check_before_training

        check_before_training(config)  # before training, not after the last step
    finished = False
    try:
        final_step = train(config)
        if config.eval.at_end and final_step == config.training.steps:
            evaluate_final_checkpoint(config, final_step)
        finished = True
    finally:
        # a failing rank waits briefly: its peers may be blocked in a collective it will never join
        leave_process_group(wait_s=LEAVE_WAIT_S if finished else FAILED_LEAVE_WAIT_S)
    logger.info("Training finished")


def train(config: JobConfig) -> int:
    """Train (or write the seed checkpoint) with ``config``; the last step trained."""
    trainer = ParallaxTrainer(config, step_callbacks=step_callbacks(config))
    try:
        if config.checkpoint.create_seed_checkpoint:
            # Same weights for any world size: runs load it via checkpoint.initial_load_path.
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created seed checkpoint")
        else:
            trainer.train()
        return trainer.step
    finally:
        trainer.close()


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
    except tuple(error for error, _ in EXIT_CODES) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(next(code for error, code in EXIT_CODES if isinstance(exc, error)))
