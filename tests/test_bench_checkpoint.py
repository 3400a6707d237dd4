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


@pytest.mark.parametrize("problem", ["config", "dir_file", "dir_foreign"])
def test_config_and_dir_are_checked_before_any_save(tmp_path, capsys, monkeypatch, problem):
    """A missing --config was a traceback; a --dir that is a file failed after the state was built; a
    --dir of the user's lost its folder of a kind's name (a torchtitan clone) to the cleanup after
    that kind's timings."""
    monkeypatch.setattr(checkpoint, "build_state", lambda *args: pytest.fail("the state was built"))
    folder = tmp_path / "dir"
    if problem == "dir_file":
        folder.write_text("a file")
    elif problem == "dir_foreign":  # a clone of TorchTitan, not a kind's folder with its checkpoint/
        (folder / "torchtitan").mkdir(parents=True)
        (folder / "torchtitan" / "README.md").write_text("keep")
    config = str(tmp_path / "missing.toml") if problem == "config" else checkpoint.RECIPE.format(flavor="0.6B")
    with pytest.raises(SystemExit) as info:
        checkpoint.main(["--config", config, "--dir", str(folder), "--out", str(tmp_path / "page")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert ("--config: job.config_file: " if problem == "config" else f"--dir: {str(folder)!r}") in err
    if problem == "dir_foreign":
        assert (folder / "torchtitan" / "README.md").read_text() == "keep"


def test_dir_of_an_earlier_run_is_accepted(tmp_path):
    for kind in ("checksums", "async"):  # kinds' folders a killed run left
        (tmp_path / kind / "checkpoint" / "step-1").mkdir(parents=True)
    assert checkpoint.kind_folder(str(tmp_path), "checksums") and checkpoint.kind_folder(str(tmp_path), "async")
    (tmp_path / "atomic").mkdir()
    (tmp_path / "atomic" / "notes.txt").write_text("x")
    assert not checkpoint.kind_folder(str(tmp_path), "atomic") and not checkpoint.kind_folder(str(tmp_path), "x")
