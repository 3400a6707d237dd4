"""A run's configuration: typed TOML sections and the one loader.

``load_config(argv)`` turns ``--job.config_file X.toml`` plus ``--section.key value`` overrides into
a validated :class:`JobConfig` (TorchTitan's sections plus ours), or raises :class:`ConfigError`
naming every bad key. Builders take the typed sections.
"""

from parallax_titan.config.diagnostics import Diagnostics
from parallax_titan.config.job import ConfigError, JobConfig, load_config, read_toml
from parallax_titan.config.optim import LRScheduler, Optimizer
from parallax_titan.config.sections import (
    Checkpoint, Eval, Metrics, Model, Parallax, Parallelism, Reliability, Training, Validation,
)

__all__ = [
    "Checkpoint", "ConfigError", "Diagnostics", "Eval", "JobConfig", "LRScheduler", "Metrics", "Model",
    "Optimizer", "Parallax", "Parallelism", "Reliability", "Training", "Validation",
    "load_config", "read_toml",
]
