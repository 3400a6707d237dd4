"""TorchTitan's metrics processor plus a progress bar and per-step schedule metrics."""

from __future__ import annotations

import json
import os

from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor

METRICS_FILE = "metrics.jsonl"


class JsonlLogger(BaseLogger):
    """Appends every logged metrics dict as one JSON line ``{"step": s, ...}`` (rank 0)."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def log(self, metrics, step):
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self):
        self._file.close()


class ParallaxMetricsProcessor(MetricsProcessor):
    """Adds a tqdm bar and a ``metrics.jsonl`` file (rank 0) and logs the optimizers'
    schedule values (lr, effective weight decay per group) every step."""

    def __init__(self, job_config, parallel_dims, tag=None):
        super().__init__(job_config, parallel_dims, tag)
        _check_wandb_started(self.logger, job_config.metrics)
        self._bar = None
        if job_config.metrics.save_jsonl and _is_rank0():
            if not isinstance(self.logger, LoggerContainer):
                # TorchTitan's logger is a bare no-op BaseLogger when TensorBoard and W&B are both off
                self.logger = LoggerContainer()
            self.logger.add_logger(JsonlLogger(os.path.join(job_config.job.dump_folder, METRICS_FILE)))

    def advance(self, step: int) -> None:
        """Called once per finished training step."""
        schedule = getattr(self.optimizers, "schedule_metrics", None)
        if schedule is not None:
            self.logger.log(schedule(), step)
        if not self.job_config.metrics.progress_bar or not _is_rank0():
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.job_config.training.steps, initial=step - 1, unit="step", dynamic_ncols=True)
        self._bar.update(1)

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics)
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{global_avg_loss:.4f}", grad_norm=f"{grad_norm:.3f}")

    def close(self):
        if self._bar is not None:
            self._bar.close()
        super().close()


def _check_wandb_started(built: BaseLogger, metrics) -> None:
    """TorchTitan logs a W&B logger that fails to start (wandb missing, a bad key or mode) and trains
    on without it, so a run the config asked to track would leave no record there. ``built``: the
    logger TorchTitan built (a LoggerContainer on the ranks that log, else a bare BaseLogger), before
    we add ours."""
    expected = int(metrics.enable_wandb) + int(metrics.enable_tensorboard)  # TensorBoard's raises itself
    if metrics.enable_wandb and isinstance(built, LoggerContainer) and built.number_of_loggers < expected:
        raise RuntimeError("metrics.enable_wandb: true, but the W&B logger failed to start (TorchTitan logged why "
                           "just above); fix that, or set metrics.enable_wandb = false")


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def build_metrics_processor(job_config, parallel_dims, model_args=None, tag=None) -> ParallaxMetricsProcessor:
    """TrainSpec hook: build the metrics processor."""
    return ParallaxMetricsProcessor(job_config, parallel_dims, tag)
