"""scripts.bench.checkpoint on the CPU test model: the byte prediction behind the 1.7B estimate
matches the files written, and the page reports every save and load kind."""

from __future__ import annotations

import json

from parallax_titan.launch import SHUTDOWN_TIMEOUT_S
from scripts.bench import checkpoint


def test_checkpoint_benchmark_predicts_the_bytes_it_writes(tmp_path):
    out = str(tmp_path / "checkpoint")
    checkpoint.main(["--config", "configs/test_cpu_2rank.toml", "--iters", "1", "--threads", "1",
                     "--dir", str(tmp_path / "ckpt"), "--out", out])
    data = json.loads(open(out + ".json").read())
    predicted, written = data["predicted_bytes"]["measured"], data["checkpoint_bytes"]
    # on disk: the tensors plus DCP's metadata, settings.json, manifest.json and per-tensor records
    assert predicted <= written <= 1.05 * predicted, (predicted, written)
    assert data["predicted_bytes"]["1.7B"] > 100 * predicted
    assert set(data["save_s"]) == {"torchtitan", "atomic", "checksums"}
    assert set(data["load_s"]) == {"torchtitan", "checksums"}
    assert all(t > 0 for times in data["save_s"].values() for t in times)
    assert data["files"] == 3  # .metadata, settings.json, one data file
    page = open(out + ".md").read()
    assert f"shutdown timeout (parallax_titan.launch.SHUTDOWN_TIMEOUT_S) is {SHUTDOWN_TIMEOUT_S} s" in page
