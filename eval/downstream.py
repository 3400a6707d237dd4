"""Downstream evaluation during training: lm-eval tasks on the live model every N steps.

``train.py`` builds a :class:`DownstreamEvaluator` when ``[eval] every_n_steps`` > 0 and hands it
to the trainer, which calls it after every step (``ParallaxTrainer(step_callbacks=...)``). On an
evaluation step:

1. every rank all-gathers the live model's full weights (FSDP shards or not) into a replica of its
   own, unsharded, in eval mode and in ``[eval] dtype`` (built once, reloaded each time);
2. lm-eval gives each data-parallel rank its share of every task's documents (``limit`` per task),
   each rank scores its share on its replica (no collective inside the forward), and rank 0
   gathers the per-document scores and aggregates them;
3. rank 0 logs ``eval/downstream/<task>/<metric>`` (e.g. ``eval/downstream/piqa/acc``) and
   ``eval/downstream/seconds`` to TensorBoard and metrics.jsonl at that step.

Training is unchanged by it, bit for bit: the live model is only read, the optimizer and the data
are not touched, and the random number generators (Python, NumPy, torch, CUDA), which lm-eval
seeds, are restored. Standard errors are not computed (no bootstrap).
"""

from __future__ import annotations

import contextlib
import random
import time

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from eval.checkpoint import build_model, model_args_of, resolve_dtype
from eval.lm_eval import evaluate
from eval.model import ParallaxLM
from eval.tasks import check_data_dir, parse_tasks
from parallax_titan.tokenizer import build_tokenizer

PREFIX = "eval/downstream"


@contextlib.contextmanager
def preserved_rng_states():
    """Restore the Python, NumPy, torch CPU and CUDA generators' states on exit."""
    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def scalar_metrics(results: dict) -> dict[str, float]:
    """lm-eval's results -> ``{"eval/downstream/<task>/<metric>": value}`` (numbers, no stderr)."""
    out = {}
    for task, metrics in results["results"].items():
        for key, value in metrics.items():
            name, _, _ = key.partition(",")
            if "," in key and "_stderr" not in name and isinstance(value, (int, float)):
                out[f"{PREFIX}/{task}/{name}"] = float(value)
    return out


def _device_of(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters())
    local = getattr(param, "to_local", None)
    return (local() if local is not None else param).device


class DownstreamEvaluator:
    """The ``[eval] every_n_steps`` callback: ``evaluator(trainer)`` after every training step.

    job_config: the run's (its ``[eval]`` section: ``every_n_steps``, ``tasks``, ``limit``,
    ``batch_size``, ``dtype``, ``max_length``, ``data_dir``). A ``data_dir`` without a task's file
    raises ValueError naming ``eval.data_dir`` here, before training starts.
    """

    def __init__(self, job_config):
        section = job_config.eval
        self.job_config, self.every = job_config, section.every_n_steps
        self.tasks = parse_tasks(section.tasks)
        check_data_dir(section)  # now, not at the first evaluation step
        self.tokenizer = build_tokenizer(job_config)
        self.replica: torch.nn.Module | None = None
        self.task_manager = None

    def __call__(self, trainer) -> None:
        if self.every <= 0 or trainer.step % self.every:
            return
        metrics = self.evaluate(trainer.model_parts[0])
        if metrics is not None:
            trainer.metrics_processor.logger.log(metrics, trainer.step)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float] | None:
        """Score the tasks on ``model``'s current weights; the metrics on rank 0, None elsewhere.
        Every rank must call it (the weights are all-gathered)."""
        start = time.perf_counter()
        with preserved_rng_states():
            lm = ParallaxLM(self._load_replica(model), self.tokenizer, batch_size=self.job_config.eval.batch_size,
                            max_length=self.job_config.eval.max_length, distributed=True)
            results = evaluate(lm, self.tasks, data_dir=self.job_config.eval.data_dir or None,
                               limit=self.job_config.eval.limit, bootstrap_iters=0, task_manager=self._manager())
        if results is None:
            return None
        return {**scalar_metrics(results), f"{PREFIX}/seconds": time.perf_counter() - start}

    def _load_replica(self, model: torch.nn.Module) -> torch.nn.Module:
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        if self.replica is None:
            device = _device_of(model)
            args = model_args_of(self.job_config, self.job_config.eval.max_length)
            self.replica = build_model(args, device)
            rope_cache = self.replica.rope_cache  # fp32, as the loaders keep it
            self.replica.to(resolve_dtype(self.job_config.eval.dtype, device))
            self.replica.rope_cache = rope_cache
        self.replica.load_state_dict(state)
        return self.replica.eval()

    def _manager(self):
        if self.task_manager is None:
            from lm_eval.tasks import TaskManager

            self.task_manager = TaskManager(include_defaults=not self.job_config.eval.data_dir)
        return self.task_manager
