"""Score checkpoints on the paper's downstream suite and write its table.

    python -m eval.lm_eval --config X.toml --checkpoint OUT/checkpoint/step-N [more step folders] \
        --suite paper --output eval_out [--tasks boolq,piqa] [--limit 100] [--batch-size 16] \
        [--device cuda] [--data-dir DIR] [--no-verify]

Writes ``<output>/results.md`` (one row per checkpoint, the paper's column order) and
``<output>/<row>.json`` (lm-eval's full output per checkpoint), and prints the table.
``--data-dir`` reads each task from ``DIR/<task>.jsonl`` instead of the Hugging Face hub/cache.
Every checkpoint's files are checked against its checksum manifest before the first is scored
(a corrupt or truncated file, or a folder without a manifest: exit code 4); ``--no-verify`` skips that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import lm_eval  # the harness (absolute import: this module is eval.lm_eval)
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable
from tqdm import tqdm

from eval.checkpoint import DTYPES, check_job_checkpoint, load_job_config, resolve_device
from eval.model import ParallaxLM
from eval.table import markdown_table
from eval.tasks import data_file, parse_tasks, task_specs
from parallax_titan.atomic import write_text
from parallax_titan.checkpoint_files import (CheckpointError, check_output_files, output_folder_problem,
                                             verify_before_load)

SUITES = ("paper",)
DEFAULT_BOOTSTRAP_ITERS = 100000  # lm-eval's default


# The scoring counts: key -> (least value, what is expected). One check for the API's keys and the
# command's options (--limit, ...); a negative bootstrap_iters would be taken as 0 by lm-eval and
# silently compute no standard errors.
COUNTS = {
    "limit": (0, "0 (all documents) or a positive count"),
    "batch_size": (1, "a positive integer"),
    "max_length": (0, "0 (training seq_len) or a positive length"),
    "bootstrap_iters": (0, "0 (no standard errors) or a positive count"),
}


def count_problem(key: str, value) -> str | None:
    """What is wrong with ``value`` for the count ``key`` of :data:`COUNTS` (an int >= its least
    value), without the name the caller gives it; None when it is right."""
    least, expected = COUNTS[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        return f"got {value!r}; expected {expected}"
    return None


def check_count(key: str, value) -> None:
    """ValueError naming ``key`` (the argument's name) when :func:`count_problem` finds a problem."""
    problem = count_problem(key, value)
    if problem:
        raise ValueError(f"{key}: {problem}")


def evaluate(lm, tasks: list[str], *, data_dir: str | None = None, limit: int = 0,
             bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS, task_manager: TaskManager | None = None) -> dict | None:
    """Run ``tasks`` zero-shot on ``lm`` (any lm-eval LM); returns lm-eval's results dict (None on
    the ranks other than 0 of a distributed ``lm``).

    data_dir: local task files (offline); None reads the Hugging Face hub or its cache.
    limit: documents per task, 0 = all. task_manager: lm-eval's (built here when None; building
    the default index takes seconds, so repeated calls pass one).
    """
    check_count("limit", limit)
    manager = task_manager or TaskManager(include_defaults=not data_dir)
    results = lm_eval.simple_evaluate(
        model=lm, tasks=task_specs(tasks, data_dir), task_manager=manager, num_fewshot=0,
        limit=limit or None, log_samples=False, bootstrap_iters=bootstrap_iters,
    )
    if results is None and lm.rank == 0:
        raise RuntimeError("lm_eval.simple_evaluate returned no results on rank 0")
    return results


def row_name(checkpoint_dir: str) -> str:
    """``.../<run>/checkpoint/step-N`` -> ``<run>/step-N``; any other folder -> its last two parts."""
    parts = Path(os.path.abspath(checkpoint_dir)).parts
    if len(parts) >= 3 and parts[-2] == "checkpoint":
        return f"{parts[-3]}/{parts[-1]}"
    return "/".join(parts[-2:])


def json_name(row: str) -> str:
    """The file of a row's lm-eval JSON: its name with every run of other characters than
    letters, digits, ``.``, ``_`` and ``-`` replaced by ``_`` (``run/step-2`` -> ``run_step-2.json``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", row) + ".json"


TABLE_FILE = "results.md"


def write_outputs(output_dir: str, rows: list[tuple[str, dict]]) -> str:
    """Write ``results.md`` and one lm-eval JSON per row into ``output_dir``; returns the table's path.

    Every file is written whole (:func:`parallax_titan.atomic.write_text`), the table last, and all of them are
    rendered before the first is written: a failure leaves the files of an earlier run as they were."""
    files = {json_name(name): json.dumps(results, indent=2, default=handle_non_serializable) for name, results in rows}
    table = markdown_table(rows)
    os.makedirs(output_dir, exist_ok=True)
    for name, text in files.items():
        write_text(os.path.join(output_dir, name), text)
    table_path = os.path.join(output_dir, TABLE_FILE)
    write_text(table_path, table)
    return table_path


def check_settings(*, limit: int, batch_size: int, max_length: int, bootstrap_iters: int, dtype: str,
                   device: str | None = None) -> None:
    """The scoring settings, checked before any checkpoint is read (ValueError naming the key)."""
    resolve_device(device)
    counts = {"limit": limit, "batch_size": batch_size, "max_length": max_length, "bootstrap_iters": bootstrap_iters}
    for key, value in counts.items():
        check_count(key, value)
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"dtype: got {dtype!r}; expected 'auto' or one of {sorted(DTYPES)}")


def row_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a row of the table (and its JSON file), or None: blank (an unset shell
    variable: the JSON file would be the hidden ``.json``, the row nameless), or holding ``|`` (a cell
    border: every score would shift a column) or a line break (the row would end in its name)."""
    if not name.strip():
        return "is blank"
    if "|" in name:
        return "holds '|'"
    if "\n" in name or "\r" in name:
        return "holds a line break"
    return None


def check_outputs(output: str, names: list[str]) -> None:
    """Check that ``output`` can be the results folder and that every row gets a JSON file of its own,
    before hours of scoring; nothing is created (a run that fails later leaves no empty folder).

    Two rows of one name (runs of the same name in different folders), or names that differ only in
    the characters a file name replaces, would write one JSON file, the last overwriting the others.
    An empty ``output`` is refused too: no folder can be made of it, which would show only when the table
    is written; and a folder holding the JSON files of rows this run does not score (they would stay
    beside a table without them)."""
    problem = output_folder_problem(output, "output")
    if problem:
        raise ValueError(f"{problem}; expected a writable folder for results.md and the lm-eval JSON files")
    for name in names:  # a blank name writes the hidden file ".json"; "|" or a line break breaks its row
        problem = row_name_problem(name)
        if problem:
            raise ValueError(f"names: got {name!r}, which {problem}; expected a row name for results.md "
                             "(give one with --names)")
    files: dict[str, list[str]] = {}
    for name in names:
        files.setdefault(json_name(name), []).append(name)
    shared = {f: rows for f, rows in files.items() if len(rows) > 1}
    if shared:
        clashes = "; ".join(f"{rows} -> {f}" for f, rows in shared.items())
        raise ValueError(f"names: rows {clashes} would share one JSON file in {output!r}; "
                         "expected distinct row names (give them with --names)")
    check_output_files(output, "output", (TABLE_FILE, *files))  # a folder there fails the rename after the scoring
    earlier = sorted(f for f in (os.listdir(output) if os.path.isdir(output) else ())
                     if f.endswith(".json") and f not in files)
    if earlier:  # they would stay beside a results.md that no longer lists them
        raise ValueError(f"output: {output!r} holds {', '.join(earlier[:3])}{' ...' if len(earlier) > 3 else ''} of "
                         "rows this run does not score; expected a new folder, or one whose rows are all scored again")


def evaluate_checkpoints(configs: list[str], checkpoints: list[str], *, tasks: list[str] | str, output: str,
                         data_dir: str | None = None, limit: int = 0, batch_size: int = 8, device=None,
                         dtype: str = "auto", max_length: int = 0, names: list[str] | None = None,
                         bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS, verify: bool = True) -> str:
    """Score each checkpoint (with its config: one for all, or one each); returns the table's path.

    The settings, ``tasks`` (suite names, or a comma-separated string of them:
    :func:`eval.tasks.parse_tasks`), ``data_dir`` (None for the hub or cache; a blank one is refused)
    and its task files, ``output`` and the row names (:func:`check_settings`, :func:`check_outputs`)
    and every config are checked first: ValueError naming the key, before any checkpoint is read.
    verify: check every checkpoint's files against its checksum manifest (CheckpointError naming
    ``--checkpoint``, the file and ``--no-verify``). Then every checkpoint is checked against its config
    (:func:`eval.checkpoint.check_job_checkpoint`), all of them before the first is scored: the table is written
    only when every row is scored, so a pairing found wrong only when its turn came lost the hours spent on the
    rows before it. Each load takes its checkpoint's verdict instead of reading the metadata and
    ``settings.json`` again."""
    # lm-eval names an unknown task only once a model is loaded; a string is split at commas, as --tasks is
    tasks = parse_tasks(tasks, key="tasks")
    if data_dir is not None and not str(data_dir).strip():  # not the hub: an unset shell variable
        raise ValueError(f"data_dir: got {data_dir!r}, which names no folder; expected a folder holding "
                         "<task>.jsonl (or no data_dir: the Hugging Face hub or cache)")
    if len(configs) not in (1, len(checkpoints)):
        raise ValueError(
            f"config: got {len(configs)} configs for {len(checkpoints)} checkpoints; expected 1 or one per checkpoint"
        )
    names = names or [row_name(c) for c in checkpoints]
    if len(names) != len(checkpoints):
        raise ValueError(f"names: got {len(names)} names for {len(checkpoints)} checkpoints")
    configs = configs * len(checkpoints) if len(configs) == 1 else configs
    check_settings(limit=limit, batch_size=batch_size, max_length=max_length, bootstrap_iters=bootstrap_iters,
                   dtype=dtype, device=device)
    for task in tasks if data_dir else ():  # the task files too, before any checkpoint is read
        data_file(data_dir, task)
    check_outputs(output, names)
    job_configs = {path: load_job_config(path) for path in configs}
    for checkpoint in checkpoints:  # all of them before hours of scoring
        verify_before_load(checkpoint, "--checkpoint", "--no-verify", verify)
    # each checkpoint's metadata and settings.json are read here only: the load takes the verdict
    verdicts = [check_job_checkpoint(job_configs[config], checkpoint, max_length)
                for config, checkpoint in zip(configs, checkpoints)]
    rows = []
    for name, config, verdict in tqdm(list(zip(names, configs, verdicts)), desc="checkpoints"):
        lm = ParallaxLM.from_job_config(job_configs[config], verdict.path, device=device, dtype=dtype,
                                        batch_size=batch_size, max_length=max_length, verify=False, checked=verdict)
        rows.append((name, evaluate(lm, tasks, data_dir=data_dir, limit=limit, bootstrap_iters=bootstrap_iters)))
        del lm
    return write_outputs(output, rows)


def count(key: str):
    """argparse type of the option for the count ``key``: :func:`count_problem`'s check of its int,
    an error that argparse prefixes with the option's name."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = text
        problem = count_problem(key, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m eval.lm_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", nargs="+", required=True, help="training TOML: one for all checkpoints or one each")
    parser.add_argument("--checkpoint", nargs="+", required=True, help="DCP folders <dump>/checkpoint/step-N")
    parser.add_argument("--suite", default="paper", choices=SUITES, help="task suite (SPEC.md section 4)")
    parser.add_argument("--tasks", default=None, help="comma-separated subset of the suite (default: all)")
    parser.add_argument("--output", required=True, help="folder for results.md and the lm-eval JSON files")
    parser.add_argument("--limit", type=count("limit"), default=0, help="documents per task (0 = all)")
    parser.add_argument("--batch-size", type=count("batch_size"), default=8, help="sequences per forward pass")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    parser.add_argument("--max-length", type=count("max_length"), default=0,
                        help="scoring window (0 = the config's training.seq_len)")
    parser.add_argument("--data-dir", default=None, help="read each task from DIR/<task>.jsonl (offline)")
    parser.add_argument("--names", nargs="+", default=None, help="row names (default: <run>/step-N)")
    parser.add_argument("--bootstrap-iters", type=count("bootstrap_iters"), default=DEFAULT_BOOTSTRAP_ITERS,
                        help="lm-eval bootstrap iterations for standard errors (0 = none)")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="load the checkpoints without checking their files against their checksum manifests")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        # --tasks "" is a selection of nothing, refused by name; only a missing --tasks means the suite
        tasks = parse_tasks(args.suite if args.tasks is None else args.tasks, key="--tasks")
        path = evaluate_checkpoints(
            args.config, args.checkpoint, tasks=tasks, output=args.output, data_dir=args.data_dir,
            limit=args.limit, batch_size=args.batch_size, device=args.device, dtype=args.dtype,
            max_length=args.max_length, names=args.names, bootstrap_iters=args.bootstrap_iters, verify=args.verify,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4
    with open(path, encoding="utf-8") as f:
        print(f.read())
    print(f"table: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
