"""A run's state for the cluster launcher: the step it resumes from, whether it has finished.

    python -m scripts.launch.state --job.config_file X.toml --job.dump_folder D [overrides] prepare|step|finished

``prepare`` prints the step the next start resumes from (0: none) and trims ``D/metrics.jsonl`` to
the rows of steps up to it, so the rows a killed job logged after its last checkpoint are not
repeated when the resumed run logs those steps again: one continuous file across requeues.
``step`` prints the newest complete checkpoint step; ``finished`` exits 0 when it is
``training.steps`` (or later), else 1. An invalid config or ``checkpoint.load_step``: exit code 2.
"""

from __future__ import annotations

import json
import os
import sys

from parallax_titan.atomic import write_text
from parallax_titan.checkpoint_files import step_to_load
from parallax_titan.metrics import METRICS_FILE

COMMANDS = ("prepare", "step", "finished")


def resume_step(config) -> int:
    """The checkpoint step a start of ``config`` resumes from; 0 when there is none."""
    folder = os.path.join(config.job.dump_folder, config.checkpoint.folder)
    return step_to_load(folder, config.checkpoint.load_step) or 0


def trim_metrics(path: str, last_step: int) -> int:
    """Keep the rows of the JSONL file ``path`` whose ``step`` is at most ``last_step`` (atomically);
    returns how many rows were dropped. A missing file is left alone; a torn last line is dropped."""
    if not os.path.isfile(path):
        return 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict) and row.get("step", 0) <= last_step:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:  # a later step, a torn line, or a line that is no row
                dropped += 1
    if dropped:
        write_text(path, "".join(kept))
    return dropped


def main(argv: list[str]) -> int:
    from parallax_titan.config import load_config

    if not argv or argv[-1] not in COMMANDS:
        print(f"usage: python -m scripts.launch.state [config arguments] {{{','.join(COMMANDS)}}}", file=sys.stderr)
        return 2
    try:  # an invalid config or checkpoint.load_step: one line, as train.py says it (not a traceback)
        config = load_config(argv[:-1], check_data=False)
        step = resume_step(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if argv[-1] == "prepare":
        trim_metrics(os.path.join(config.job.dump_folder, METRICS_FILE), step)
    if argv[-1] == "finished":
        return 0 if step >= config.training.steps else 1
    print(step)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
