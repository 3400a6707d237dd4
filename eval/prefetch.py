"""Fill a Hugging Face datasets cache with the suite's data (run where the hub is reachable).

    HF_HOME=/shared/hf python -m eval.prefetch [--tasks boolq,piqa] [--jsonl-dir /shared/lm_eval_data]

Every task's dataset is downloaded into ``$HF_HOME`` (copy that folder to the offline cluster and
run there with ``HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1``). With ``--jsonl-dir`` the evaluated
split of each task is also written as ``<dir>/<task>.jsonl``, for ``python -m eval.lm_eval --data-dir``.
"""

from __future__ import annotations

import argparse
import os
import sys

from eval.tasks import eval_split, parse_tasks, task_config
from parallax_titan.atomic import replacing
from parallax_titan.checkpoint_files import check_output_files, output_folder_problem


def hub_source(task: str) -> dict:
    """Where lm-eval reads ``task``: ``{"path", "name", "split", "kwargs"}`` from its YAML."""
    config = task_config(task)
    return {"path": config["dataset_path"], "name": config.get("dataset_name"), "split": eval_split(config),
            "kwargs": dict(config.get("dataset_kwargs") or {})}


def prefetch(tasks: list[str], jsonl_dir: str | None = None) -> list[str]:
    """Download each task's dataset into the HF cache; optionally write its evaluated split as JSONL
    (each file whole: :func:`parallax_titan.atomic.replacing`)."""
    import datasets

    written = []
    for task in tasks:
        source = hub_source(task)
        data = datasets.load_dataset(source["path"], source["name"], **source["kwargs"])
        print(f"{task}: {source['path']} ({source['name']}) {dict(data.num_rows)}")
        if jsonl_dir:
            os.makedirs(jsonl_dir, exist_ok=True)
            path = os.path.join(jsonl_dir, f"{task}.jsonl")
            with replacing(path) as temporary:  # --data-dir would score a cut file's documents only
                data[source["split"]].to_json(temporary, lines=True, force_ascii=False)
            written.append(path)
    return written


def check_jsonl_dir(folder: str, tasks: list[str]) -> None:
    """ValueError naming ``--jsonl-dir`` when it names no folder (``""``, e.g. an unset shell variable:
    nothing was written), or when ``folder`` or the ``<task>.jsonl`` of one of ``tasks`` in it cannot
    be written: found before the downloads, not after the first dataset's."""
    problem = output_folder_problem(folder, "--jsonl-dir")
    if problem:
        raise ValueError(f"{problem}; expected a folder (made when missing) for <task>.jsonl")
    check_output_files(folder, "--jsonl-dir", tuple(f"{task}.jsonl" for task in tasks))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.prefetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="paper", help="comma-separated subset of the suite (default: all)")
    parser.add_argument("--jsonl-dir", default=None, help="also write <dir>/<task>.jsonl (the evaluated split)")
    parser.add_argument("--list", action="store_true", help="only print each task's dataset and split")
    args = parser.parse_args(argv)
    try:
        tasks = parse_tasks(args.tasks, key="--tasks")
        if args.jsonl_dir is not None:
            check_jsonl_dir(args.jsonl_dir, tasks)
    except ValueError as exc:
        parser.error(str(exc))  # exit code 2, the usage and the message; no traceback
    if args.list and args.jsonl_dir is not None:
        parser.error(f"--jsonl-dir {args.jsonl_dir!r} with --list, which only prints the tasks' sources; expected "
                     "one of them")
    if args.list:
        for task in tasks:
            s = hub_source(task)
            print(f"{task}\t{s['path']}\t{s['name']}\t{s['split']}")
        return 0
    prefetch(tasks, args.jsonl_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
