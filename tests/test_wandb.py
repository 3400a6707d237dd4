"""TorchTitan's W&B logger from our configs (``[metrics] enable_wandb``), offline: the run records
our config and the same losses as metrics.jsonl."""

from __future__ import annotations

import glob
import json
import os

import pytest

from tests._train_runs import losses, train

wandb = pytest.importorskip("wandb")


@pytest.mark.slow
def test_wandb_offline_run_logs_config_and_losses(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "parallax-titan-test")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(tmp_path, "--training.dataset", "default_corpus", "--training.steps", "3", "--metrics.enable_wandb",
          "--metrics.no-enable_tensorboard")
    (run_file,) = glob.glob(os.path.join(tmp_path, "tb", "*", "wandb", "offline-run-*", "run-*.wandb"))
    # the run's records (protobuf, written by wandb's core): our config and every logged loss
    data = open(run_file, "rb").read()
    assert b"loss_metrics/global_avg_loss" in data and b"data_seed" in data and b"default_corpus" in data
    logged = losses(tmp_path)
    assert sorted(logged) == [1, 2, 3]
    for loss in logged.values():
        assert json.dumps(loss).encode() in data, loss
