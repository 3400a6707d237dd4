"""TorchTitan's own trainer and Qwen3 model: the reference our Transformer's throughput is held to.

    torchrun --nproc_per_node=1 -m scripts.bench.titan_reference \\
        --job.config_file configs/paper/0.6B/transformer_adamw_wsd.toml --training.dataset default_corpus
    python -m scripts.bench.train titan_qwen3 transformer --recipe adamw_wsd   # both, one invocation

``torchtitan.train.Trainer`` runs TorchTitan's ``qwen3`` train spec unchanged (its model,
parallelize, optimizers, lr schedule, data loader, loss), registered as ``titan_qwen3`` with two
additions so that it reads the data our runs read and writes the file ``scripts.bench.train``
summarises: the embedded corpus as a dataset (``parallax_titan.data`` registers it on import)
and ``metrics.jsonl`` through the spec's metrics-processor hook. The TOML is parsed with our
JobConfig, a superset of TorchTitan's; the Trainer ignores the sections it does not know (our
non-finite guard, diagnostics, probe settings), so none of our trainer's additions run.
"""

from __future__ import annotations

import dataclasses
import sys

from parallax_titan.launch_env import set_defaults  # imports no torch

set_defaults()  # the same environment as train.py (and TorchTitan's own launcher's allocator setting)

from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.models.qwen3 import qwen3_args  # noqa: E402
from torchtitan.protocols.train_spec import get_train_spec, register_train_spec  # noqa: E402
from torchtitan.tools.logging import init_logger  # noqa: E402
from torchtitan.train import Trainer  # noqa: E402

import parallax_titan.data  # noqa: E402,F401  (registers default_corpus in TorchTitan's datasets)
from parallax_titan.compat import configure_for_host  # noqa: E402
from parallax_titan.config import JobConfig  # noqa: E402
from parallax_titan.metrics import build_metrics_processor  # noqa: E402
from parallax_titan.teardown import leave_process_group  # noqa: E402

NAME = "titan_qwen3"
# TorchTitan's flavors, plus a small one for CPU tests (the tiny tokenizer has 4096 tokens)
FLAVORS = {**qwen3_args, "debug": dataclasses.replace(qwen3_args["debugmodel"], vocab_size=4096, n_layers=2)}


class ReferenceTrainer(Trainer):
    """TorchTitan's Trainer; on a CPU-only host with the device shims train.py uses (none on CUDA)."""

    def __init__(self, job_config):
        configure_for_host(job_config)
        super().__init__(job_config)


def register() -> None:
    """``titan_qwen3``: TorchTitan's qwen3 spec with our metrics processor (metrics.jsonl)."""
    spec = dataclasses.replace(get_train_spec("qwen3"), model_args=FLAVORS,
                               build_metrics_processor_fn=build_metrics_processor)
    register_train_spec(NAME, spec)


def main(argv: list[str]) -> None:
    """Train ``titan_qwen3`` with TorchTitan's Trainer on the TOML and overrides in ``argv``."""
    init_logger()
    register()
    config = ConfigManager(JobConfig).parse_args([*argv, "--model.name", NAME])
    trainer = ReferenceTrainer(config)
    try:
        trainer.train()
    finally:
        trainer.close()
        leave_process_group(wait_s=300.0)


if __name__ == "__main__":
    main(sys.argv[1:])
