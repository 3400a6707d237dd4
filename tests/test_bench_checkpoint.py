"""scripts.bench.checkpoint on the CPU test model: the byte prediction behind the 1.7B estimate
matches the files written, the page reports every save and load kind, and the background saves
publish steps whose checksums hold."""

from __future__ import annotations

import json

import pytest

from parallax_titan.compat import pinned_memory_saves_problem
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
    assert set(data["first_save_s"]) == set(data["save_s"]) and all(len(t) == 1 for t in data["save_s"].values())
    assert data["files"] == 3  # .metadata, settings.json, one data file
    background = data["background"]
    assert set(background) == ({"async"} if pinned_memory_saves_problem() else {"async", "async_with_pinned_mem"})
    for kind, times in background.items():
        assert times["problem"] == [], kind  # the published step's checksums hold
        pairs = [(times["first_held_s"], times["first_published_s"]), *zip(times["held_s"], times["published_s"])]
        assert len(pairs) == 2 and all(0 < held <= done for held, done in pairs), (kind, times)
    page = open(out + ".md").read()
    assert "| background save (checksums) | first save held (s) | later saves held (median s) |" in page
    assert f"shutdown timeout (parallax_titan.launch.SHUTDOWN_TIMEOUT_S) is {SHUTDOWN_TIMEOUT_S} s" in page


@pytest.mark.parametrize("flag, value", [("--iters", "0"), ("--threads", "-2")])
def test_bad_counts_are_refused_before_any_save(tmp_path, flag, value, capsys):
    """--iters 0 saved every kind once and then failed on an empty median."""
    with pytest.raises(SystemExit) as info:
        checkpoint.main([flag, value, "--dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "page")])
    assert info.value.code == 2 and f"{value!r}: expected an int >= 1" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()
