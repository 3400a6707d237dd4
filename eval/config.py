"""``[eval]``: score the final checkpoint on the downstream suite when training ends.

``parallax_titan/config.py`` merges :class:`Eval` into the JobConfig as ``eval``; the trainer calls
:func:`run_at_end` on rank 0 after the last checkpoint is saved. No ``from __future__ import
annotations`` here: TorchTitan's config merge and tyro read these annotations as real types.
"""

import os
from dataclasses import dataclass, field

from eval.suite import PAPER_SUITE


@dataclass
class Eval:
    """``[eval]``: downstream evaluation of the final checkpoint (lm-eval, zero-shot)."""

    at_end: bool = False
    """Run the suite on the final checkpoint when training ends; the table goes to <dump_folder>/eval/."""

    tasks: list[str] = field(default_factory=lambda: list(PAPER_SUITE))
    """Tasks to run: the paper's suite or a subset of it (lambada_openai, wikitext, boolq, ...)."""

    limit: int = 0
    """Documents per task, 0 = all."""

    batch_size: int = 8
    """Sequences per forward pass."""

    device: str = ""
    """cpu, cuda, cuda:N; empty: CUDA when available."""

    dtype: str = "auto"
    """auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16 or float16."""

    max_length: int = 0
    """Scoring window in tokens; 0 = training.seq_len."""

    data_dir: str = ""
    """Folder with <task>.jsonl files read instead of the Hugging Face hub/cache (offline)."""

    bootstrap_iters: int = 100000
    """lm-eval bootstrap iterations for the standard errors (0 = none)."""


def output_dir(job_config) -> str:
    """``<job.dump_folder>/eval``: where :func:`run_at_end` writes."""
    return os.path.join(job_config.job.dump_folder, "eval")


def run_at_end(job_config, checkpoint_dir: str) -> str:
    """Score ``checkpoint_dir`` with ``job_config``'s model and tokenizer and ``[eval]`` settings.

    Writes ``<dump_folder>/eval/results.md`` and the lm-eval JSON; returns the table's path.
    Runs on this process only (call it on rank 0); the model is rebuilt from the checkpoint.
    """
    from eval.lm_eval import evaluate, row_name, write_outputs
    from eval.model import ParallaxLM
    from eval.tasks import parse_tasks

    section = job_config.eval
    tasks = parse_tasks(section.tasks)
    lm = ParallaxLM.from_job_config(
        job_config, checkpoint_dir, device=section.device or None, dtype=section.dtype,
        batch_size=section.batch_size, max_length=section.max_length,
    )
    results = evaluate(lm, tasks, data_dir=section.data_dir or None, limit=section.limit,
                       bootstrap_iters=section.bootstrap_iters)
    return write_outputs(output_dir(job_config), [(row_name(checkpoint_dir), results)])
