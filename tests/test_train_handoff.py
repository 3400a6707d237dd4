"""Training hands off to the downstream suite: ``[eval] at_end`` scores the final checkpoint, and
``[diagnostics]`` logs its scalars during the same run."""

from __future__ import annotations

from tests._train_runs import metric_rows, train


def test_eval_at_end_and_diagnostics(tmp_path):
    train(
        tmp_path, "--training.dataset", "default_corpus", "--training.steps", "2",
        "--eval.at_end", "--eval.tasks", "boolq,piqa", "--eval.limit", "4",
        "--eval.data_dir", "tests/fixtures/lm_eval",
        "--diagnostics.enable", "--diagnostics.freq", "2", "--diagnostics.seq_len", "32",
    )
    table = (tmp_path / "eval" / "results.md").read_text()
    assert "BoolQ" in table and "step-2" in table
    diag = [r for r in metric_rows(tmp_path) if any(k.startswith("diag/") for k in r)]
    assert diag and diag[0]["step"] == 2
    assert any(k.startswith("diag/layer_01/") for k in diag[0])
