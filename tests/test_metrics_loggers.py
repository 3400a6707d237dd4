"""A logger the config asks for must start: TorchTitan logged a W&B logger that failed to start and
trained on without it."""

from __future__ import annotations

import importlib.util

import pytest
import torch.distributed as dist
import torchtitan.components.metrics as titan_metrics
from torchtitan.distributed import ParallelDims

from parallax_titan.compat import configure_for_host
from parallax_titan.config import ConfigError, load_config
from parallax_titan.metrics import JsonlLogger, ParallaxMetricsProcessor
from parallax_titan.spec import register_all
from tests.test_config_hostile import DEMO

register_all()


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group (TorchTitan's logger asks for the rank)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _processor(tmp_path, *overrides):
    config = load_config(["--job.config_file", DEMO, "--job.dump_folder", str(tmp_path / "run"), *overrides],
                         check_data=False)
    configure_for_host(config)  # TorchTitan's memory monitor asks for CUDA unless told the host has none
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    return ParallaxMetricsProcessor(config, dims)


class _FailingWandB(titan_metrics.BaseLogger):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("wandb.init: invalid API key")


class _StandInWandB(titan_metrics.BaseLogger):
    def __init__(self, *args, **kwargs):
        pass


@pytest.mark.parametrize("tensorboard", ["--metrics.enable_tensorboard", "--metrics.no-enable_tensorboard"])
def test_wandb_that_fails_to_start_stops_the_run(tmp_path, one_rank, monkeypatch, tensorboard):
    monkeypatch.setattr(titan_metrics, "WandBLogger", _FailingWandB)
    with pytest.raises(RuntimeError, match="metrics.enable_wandb: true, but the W&B logger failed to start"):
        _processor(tmp_path, "--metrics.enable_wandb", tensorboard)


def test_wandb_that_starts_is_kept_beside_ours(tmp_path, one_rank, monkeypatch):
    monkeypatch.setattr(titan_metrics, "WandBLogger", _StandInWandB)
    processor = _processor(tmp_path, "--metrics.enable_wandb", "--metrics.enable_tensorboard")
    kinds = [type(x) for x in processor.logger._loggers]
    assert kinds[0] is _StandInWandB and JsonlLogger in kinds
    processor.close()


def test_wandb_not_installed_is_refused_when_training_loads_the_config(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"metrics.enable_wandb: true needs the wandb package, which is not "
                                          r"installed here \(pip install wandb\)"):
        load_config(["--job.config_file", DEMO, "--metrics.enable_wandb"])
    load_config(["--job.config_file", DEMO, "--metrics.enable_wandb"], check_data=False)  # evaluation tools
    load_config(["--job.config_file", DEMO])
