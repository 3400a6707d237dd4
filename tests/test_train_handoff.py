"""Training hands off to the downstream suite: ``[eval] at_end`` scores the final checkpoint, and
``[diagnostics]`` logs its scalars during the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_eval_at_end_and_diagnostics(tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "train.py",
        "--job.config_file", "configs/test_cpu_2rank.toml", "--job.dump_folder", str(tmp_path),
        "--training.dataset", "default_corpus", "--training.steps", "2",
        "--eval.at_end", "--eval.tasks", "boolq,piqa", "--eval.limit", "4",
        "--eval.data_dir", "tests/fixtures/lm_eval",
        "--diagnostics.enable", "--diagnostics.freq", "2", "--diagnostics.seq_len", "32",
    ]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    table = (tmp_path / "eval" / "results.md").read_text()
    assert "BoolQ" in table and "step-2" in table
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    diag = [r for r in rows if any(k.startswith("diag/") for k in r)]
    assert diag and diag[0]["step"] == 2
    assert any(k.startswith("diag/layer_01/") for k in diag[0])
