"""`python -m eval.mad` end to end on a tiny grid, and the report/plot from run records."""

import json
import os

import pytest

from eval.mad.__main__ import main
from eval.mad.grid import load_config, task_settings
from eval.mad.report import best_per_setting, task_scores, write_report

TINY = """
[grid]
tasks = ["in-context-recall", "memorization"]
sweep = "baseline"
[data]
num_train_examples = 32
num_test_examples = 16
[train]
epochs = 1
batch_size = 16
lrs = [5e-3, 1e-3]
[model]
dim = 32
n_heads = 2
hidden_dim = 64
backend = "reference"
"""


def test_cli_tiny_grid(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    assert main(["--config", str(cfg), "--mixers", "attention,parallax", "--out", str(out), "--device", "cpu"]) == 0
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 * 2 * 2  # settings x mixers x lrs
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["scores"]) == {"attention", "parallax"}
    assert summary["scores"]["parallax"]["avg"]["n"] == 2
    table = (out / "table.md").read_text()
    assert "| ICR |" in table and "| MEM |" in table and "0.716" in table  # paper numbers beside ours


def test_report_best_and_mean(tmp_path):
    runs = []
    for mixer, accs in {"attention": [0.2, 0.6], "parallax": [0.9, 0.1]}.items():
        for s, task in zip(task_settings("in-context-recall", "hard")[:2], ["in-context-recall"] * 2):
            for lr, acc in zip([1e-3, 5e-3], accs):
                runs.append({"task": task, "setting": s.label(), "params": s.__dict__, "mixer": mixer, "lr": lr,
                             "weight_decay": 0.1, "test_acc": acc if s.seq_len == 256 else acc / 2})
    best = best_per_setting(runs)
    assert best[("attention", "in-context-recall", task_settings("in-context-recall", "hard")[0].label())]["lr"] == 5e-3
    scores = task_scores(best)
    assert scores["attention"]["ICR"] == (pytest.approx((0.6 + 0.3) / 2), 2)
    write_report(runs, str(tmp_path), "t", config={"sweep": "hard"})
    assert os.path.getsize(tmp_path / "hard_sweep.png") > 10_000


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepoch = 3\n")
    with pytest.raises(ValueError, match="epoch"):
        load_config(str(bad))
    assert load_config("configs/mad/paper_baseline.toml").train.lrs == [5e-3, 1e-3, 5e-4]
    assert len(load_config("configs/mad/paper_baseline.toml").settings()) == 66
    assert len(load_config("configs/mad/paper_hard.toml").settings()) == 12


def test_mixers_come_from_the_toml_unless_the_cli_names_them(tmp_path, monkeypatch):
    """[grid] mixers picks the mixers (the paper config lists its five); --mixers overrides it; an
    unknown name, or an fla mixer without flash-linear-attention, stops before any run, naming the key."""
    import importlib.util
    import sys

    paper = load_config("configs/mad/paper_baseline.toml")
    assert paper.mixers == ["attention", "parallax", "gated_deltanet", "mamba2", "mesa_net"]
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY.replace("[grid]\n", '[grid]\nmixers = ["parallax"]\n'))
    out = tmp_path / "out"
    assert main(["--config", str(cfg), "--out", str(out), "--device", "cpu"]) == 0
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["mixer"] for r in runs} == {"parallax"}
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.replace("[grid]\n", '[grid]\nmixers = ["lstm"]\n'))
    with pytest.raises(SystemExit, match=r"\[grid\] mixers = \['lstm'\]: unknown \['lstm'\]"):
        main(["--config", str(bad), "--out", str(tmp_path / "o2"), "--device", "cpu"])
    with pytest.raises(SystemExit, match="--mixers = \\['attention', 'gru'\\]"):
        main(["--config", str(cfg), "--mixers", "attention,gru", "--out", str(tmp_path / "o3"), "--device", "cpu"])
    if importlib.util.find_spec("fla") is not None:  # installed (scripts/test.sh): a CPU run is refused up front
        with pytest.raises(SystemExit, match=r"mixers \['mamba2'\] run fla's Triton kernels, which need CUDA"):
            main(["--config", str(cfg), "--mixers", "mamba2", "--out", str(tmp_path / "o5"), "--device", "cpu"])
    monkeypatch.setitem(sys.modules, "fla.layers", None)  # flash-linear-attention not importable
    fla = tmp_path / "fla.toml"
    fla.write_text(TINY.replace("[grid]\n", '[grid]\nmixers = ["attention", "mamba2"]\n'))
    with pytest.raises(SystemExit, match=r"\[grid\] mixers = \['attention', 'mamba2'\]: \['mamba2'\] need flash-linear"):
        main(["--config", str(fla), "--out", str(tmp_path / "o4"), "--device", "cpu"])
    assert load_config(str(fla)).mixers == ["attention", "mamba2"]  # --mixers may still replace them
    assert not any((tmp_path / d).exists() for d in ("o2", "o3", "o4", "o5"))
