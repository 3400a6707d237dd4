"""``[eval] at_end``: score the final checkpoint on the downstream suite when training ends.

``train.py`` calls :func:`check_before_training` on every rank before training (the task files of
``data_dir``, for this and for ``every_n_steps``; the device of ``at_end``) and :func:`run_at_end` on
rank 0 after the last checkpoint is saved; the section's keys are :class:`parallax_titan.config.Eval`.
"""

import os

from parallax_titan.config import ConfigError, JobConfig


def output_dir(job_config: JobConfig) -> str:
    """``<job.dump_folder>/eval``: where :func:`run_at_end` writes."""
    return os.path.join(job_config.job.dump_folder, "eval")


def check_before_training(job_config: JobConfig) -> None:
    """ConfigError naming ``eval.data_dir`` when it lacks the file of a task the final evaluation
    (``at_end``) or the evaluation during training (``every_n_steps``) scores, and ``eval.device``
    when ``at_end`` names a CUDA device this machine lacks. ``train.py`` calls it before training:
    :func:`run_at_end` would find out only after the last step, and a plain ValueError from the
    evaluator's construction would end the run with a traceback. (The config's own validation checks
    the device's name only: a config may be checked on another machine than the one that trains;
    and ``parallax_titan`` does not import ``eval``, which knows the task files.)"""
    from eval.checkpoint import resolve_device
    from eval.tasks import check_data_dir

    try:
        check_data_dir(job_config.eval)
        if job_config.eval.at_end:
            resolve_device(job_config.eval.device or None, "eval.device")
    except ValueError as exc:
        raise ConfigError(f"invalid config:\n  {exc}") from None


def run_at_end(job_config: JobConfig, checkpoint_dir: str) -> str:
    """Score ``checkpoint_dir`` with ``job_config``'s model and tokenizer and ``[eval]`` settings.

    Writes ``<dump_folder>/eval/results.md`` and the lm-eval JSON; returns the table's path.
    Runs on this process only (call it on rank 0); the model is rebuilt from the checkpoint, checked
    against its checksum manifest first as the run's ``checkpoint.verify`` says.
    """
    from eval.lm_eval import evaluate, row_name, write_outputs
    from eval.model import ParallaxLM
    from eval.tasks import parse_tasks

    section = job_config.eval
    tasks = parse_tasks(section.tasks)
    lm = ParallaxLM.from_job_config(
        job_config, checkpoint_dir, device=section.device or None, dtype=section.dtype,
        batch_size=section.batch_size, max_length=section.max_length,
        verify=job_config.checkpoint.verify, who="eval.at_end", off_switch="checkpoint.verify = false",
    )
    results = evaluate(lm, tasks, data_dir=section.data_dir or None, limit=section.limit,
                       bootstrap_iters=section.bootstrap_iters)
    return write_outputs(output_dir(job_config), [(row_name(checkpoint_dir), results)])
