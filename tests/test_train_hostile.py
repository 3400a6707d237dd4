"""train.py's own command line: arguments it must refuse before any work."""

from __future__ import annotations

import pytest

from tests._train_runs import run_single

ARGS = ["--training.dataset", "default_corpus", "--training.steps", "1"]


@pytest.mark.parametrize("second", [["--job.config_file", "configs/demo_cpu.toml"],
                                    ["--job.config-file=configs/demo_cpu.toml"]])
def test_a_second_config_file_is_refused(tmp_path, second):
    """TorchTitan read the first file's TOML and recorded the second as job.config_file: the run
    trained the first config while naming the second (the Slurm launcher's --job.config_file
    followed by the user's own in its extra arguments)."""
    result = run_single(tmp_path, *ARGS, *second)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "error: job.config_file: given 2 times ('configs/test_cpu_2rank.toml', 'configs/demo_cpu.toml')" in (
        result.stderr)
    assert not (tmp_path / "metrics.jsonl").exists()
