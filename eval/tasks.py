"""The paper's downstream suite (SPEC.md section 4) and local-file data sources for its tasks.

Each task is lm-eval's own YAML (prompt, choices, metrics unchanged). With a data folder the
dataset source alone is replaced: ``dataset_path`` becomes the ``json`` (or ``parquet``) builder
and ``dataset_kwargs.data_files`` maps the split the task evaluates to ``<data_dir>/<task>.jsonl``.
"""

from __future__ import annotations

import os
from pathlib import Path

import lm_eval.tasks
from lm_eval.tasks._yaml_loader import load_yaml

from parallax_titan.suite import PAPER_SUITE

# lm-eval's YAML of each task, relative to the lm_eval/tasks folder of the pinned version.
TASK_YAMLS = {
    "lambada_openai": "lambada/lambada_openai.yaml",
    "wikitext": "wikitext/wikitext.yaml",
    "boolq": "super_glue/boolq/default.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "piqa": "piqa/piqa.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "winogrande": "winogrande/default.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "sciq": "sciq/sciq.yaml",
}

DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def parse_tasks(spec: str | list[str] | tuple[str, ...] | None, key: str = "tasks") -> list[str]:
    """``"paper"``, a comma-separated string or a list of suite task names -> task names.

    None (not given) means the whole suite. An explicit selection naming no task (``""``, blanks or
    commas only, ``[]``) is refused rather than read as "all": it is more likely a mistake (an unset
    shell variable) than a request for the whole suite. Raises ValueError naming ``key`` (the
    option or config key that gave ``spec``) for an unknown name or an empty selection.
    """
    if spec is None or spec == "paper":
        return list(PAPER_SUITE)
    names = [t.strip() for t in spec.split(",")] if isinstance(spec, str) else [str(t).strip() for t in spec]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"{key}: got {spec!r}, which names no task; expected 'paper' or a comma-separated "
                         f"subset of {list(PAPER_SUITE)} (leave {key} out for the whole suite)")
    unknown = [n for n in names if n not in PAPER_SUITE]
    if unknown:
        raise ValueError(f"{key}: got {spec!r}; expected 'paper' or names from {list(PAPER_SUITE)}")
    return list(dict.fromkeys(names))


def task_config(task: str) -> dict:
    """lm-eval's config of ``task`` (includes merged, ``!function`` entries resolved)."""
    if task not in TASK_YAMLS:
        raise ValueError(f"tasks: unknown task {task!r}; expected one of {list(PAPER_SUITE)}")
    return load_yaml(Path(lm_eval.tasks.__file__).parent / TASK_YAMLS[task], resolve_func=True)


def eval_split(config: dict) -> str:
    """The split lm-eval scores: the test split when the task has one, else validation."""
    return config.get("test_split") or config["validation_split"]


def data_file(data_dir: str, task: str, key: str = "data_dir") -> str:
    """``<data_dir>/<task>.jsonl`` (or .json/.parquet); ValueError naming ``key`` (the option or
    config key that gave ``data_dir``) if none exists."""
    for suffix in DATA_SUFFIXES:
        path = os.path.join(data_dir, task + suffix)
        if os.path.isfile(path):
            if os.path.getsize(path) == 0:  # lm-eval would load the model, then stop on a bare StopIteration
                raise ValueError(f"{key}: {path!r} is empty; expected the {eval_split(task_config(task))!r} split "
                                 f"of task {task!r} in the Hugging Face schema")
            return os.path.abspath(path)
    raise ValueError(
        f"{key}: {data_dir!r} has no file for task {task!r}; expected {task}.jsonl (or "
        f".json/.parquet) holding its {eval_split(task_config(task))!r} split in the Hugging Face schema"
    )


def check_data_dir(section) -> None:
    """ValueError naming ``eval.data_dir`` and the first task of ``section.tasks`` without its file
    there (``section``: a config's ``[eval]``). Without a data_dir the tasks come from the Hugging Face
    hub or cache: nothing to check."""
    for task in parse_tasks(section.tasks, key="eval.tasks") if section.data_dir else ():
        data_file(section.data_dir, task, key="eval.data_dir")


def local_task_config(task: str, data_dir: str) -> dict:
    """``task``'s lm-eval config reading its evaluated split from a local file in ``data_dir``."""
    config = task_config(task)
    split = eval_split(config)
    path = data_file(data_dir, task)
    config.pop("tag", None)  # tags would register suite-wide groups; one task per config here
    config.update(
        dataset_path=DATA_SUFFIXES[os.path.splitext(path)[1]],
        dataset_name=None,
        dataset_kwargs={"data_files": {split: path}},
        training_split=None,
        fewshot_split=None,
        validation_split=split if config.get("validation_split") == split else None,
        test_split=split if config.get("test_split") == split else None,
    )
    return config


def task_specs(tasks: list[str], data_dir: str | None) -> list:
    """What ``lm_eval.simple_evaluate(tasks=...)`` gets: names (hub or cache) or local configs."""
    if not data_dir:
        return list(tasks)
    return [local_task_config(t, data_dir) for t in tasks]
