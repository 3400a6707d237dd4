"""MAD synthetic benchmark (Poli et al. 2024) for the mixers of this repo; see docs/mad.md.

Public API: ``TaskSetting``, ``make_dataset``, the generators in ``eval.mad.tasks`` /
``eval.mad.recall``, ``task_settings`` / ``load_config`` (grid), ``build_model`` (models),
``train_and_evaluate`` (training), ``AccuracyCounter`` / ``evaluate`` (metrics),
``run_grid`` (runner), ``write_report`` (report). CLI: ``python -m eval.mad``.
"""

from eval.mad.grid import RunConfig, TrainConfig, ModelConfig, load_config, task_settings
from eval.mad.tasks import TASKS, TaskSetting, make_dataset

__all__ = ["TASKS", "TaskSetting", "make_dataset", "task_settings", "load_config", "RunConfig",
           "TrainConfig", "ModelConfig"]
