"""Result files of the evaluation commands are written whole: a write that fails midway (a full
disk) leaves the earlier file as it was and no part of the new one (fast: no model is built)."""

from __future__ import annotations

import builtins
import errno
import json
import os

import pytest

from eval.lm_eval import write_outputs
from eval.mad.grid import RunConfig
from eval.mad.report import write_report
from eval.mad.runner import config_id, finished_runs


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(folder)``: from then on a file opened for writing under ``folder`` takes the first
    half of what is written to it, then raises ENOSPC."""

    def arm(folder):
        real_open = builtins.open

        class HalfWriter:
            def __init__(self, f):
                self.f = f

            def write(self, text):
                self.f.write(text[: len(text) // 2])
                self.f.flush()
                raise OSError(errno.ENOSPC, "No space left on device")

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

        def open_(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            inside = os.path.abspath(str(file)).startswith(os.path.abspath(folder) + os.sep)
            return HalfWriter(f) if inside and any(m in mode for m in "wa") else f

        monkeypatch.setattr(builtins, "open", open_)

    return arm


def results(acc: float) -> dict:
    return {"results": {"boolq": {"acc,none": acc}}, "n-samples": {"boolq": {"original": 4, "effective": 4}}}


def test_lm_eval_results_survive_a_failed_rewrite(tmp_path, full_disk):
    """A second evaluation into the same --output that fails while writing used to leave a truncated
    lm-eval JSON (and, had it reached it, a cut table) in place of the first run's files."""
    out = str(tmp_path / "out")
    write_outputs(out, [("run/step-1", results(0.25))])
    before = {name: (tmp_path / "out" / name).read_text() for name in os.listdir(out)}
    assert sorted(before) == ["results.md", "run_step-1.json"]
    full_disk(out)
    with pytest.raises(OSError, match="No space left"):
        write_outputs(out, [("run/step-1", results(0.75))])
    assert {name: (tmp_path / "out" / name).read_text() for name in os.listdir(out)} == before


def test_mad_runs_survive_a_failed_repair_of_a_cut_last_line(tmp_path, full_disk):
    """runs.jsonl with a partial last line (a kill mid-append) is repaired on the next start; that
    repair truncated the file in place, so a failure there lost every finished run."""
    cfg = RunConfig(tasks=["in-context-recall"], sweep="baseline")
    record = {"task": "in-context-recall", "setting": "ICR(x)", "mixer": "attention", "lr": 1e-3,
              "weight_decay": 0.0, "config_id": config_id(cfg)}
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record) + "\n" + '{"task": "in-con')
    full_disk(str(tmp_path))
    with pytest.raises(OSError, match="No space left"):
        finished_runs(str(path), cfg)
    assert path.read_text().startswith(json.dumps(record) + "\n")
    assert os.listdir(tmp_path) == ["runs.jsonl"]  # no temporary file left behind


def test_mad_report_survives_a_failed_rewrite(tmp_path, full_disk):
    run = {"task": "in-context-recall", "setting": "ICR(x)", "params": {}, "mixer": "attention", "lr": 1e-3,
           "weight_decay": 0.0, "test_acc": 0.5, "test_acc_micro": 0.5}
    write_report([run], str(tmp_path), "first")
    before = {name: (tmp_path / name).read_text() for name in os.listdir(tmp_path)}
    assert sorted(before) == ["results.json", "table.md"]
    full_disk(str(tmp_path))
    with pytest.raises(OSError, match="No space left"):
        write_report([run, {**run, "lr": 5e-3, "test_acc": 0.9}], str(tmp_path), "second")
    assert {name: (tmp_path / name).read_text() for name in os.listdir(tmp_path)} == before


def test_prefetch_leaves_no_cut_jsonl_for_data_dir(tmp_path, monkeypatch):
    """An interrupted --jsonl-dir export used to leave <task>.jsonl holding the documents written so
    far, which --data-dir then scored as if they were the whole split."""
    import datasets

    from eval import prefetch

    class Split:
        def to_json(self, path, **kwargs):
            with open(path, "w") as f:
                f.write('{"question": "q1", "answer": true}\n')
            raise ConnectionError("download interrupted")

    class Data(dict):
        num_rows = {"validation": 2}

    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: Data(validation=Split()))
    with pytest.raises(ConnectionError):
        prefetch.prefetch(["boolq"], str(tmp_path))
    assert os.listdir(tmp_path) == []
