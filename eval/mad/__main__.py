"""``python -m eval.mad``: run a MAD grid and write its tables (see docs/mad.md).

    python -m eval.mad --tasks all --mixers attention,parallax --out DIR [--config TOML]
    python -m eval.mad --report-only --out DIR     # rebuild the tables from DIR/runs.jsonl

Rerunning a command with the same --out skips the runs already in DIR/runs.jsonl; with
--checkpoint-seconds S it also continues each unfinished run from its state saved in DIR/partial/.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tomllib

from eval.mad.grid import (SWEEPS, RunConfig, check_checkpoint_seconds, check_config_id, check_mixers, check_schedule,
                           check_value, load_config)
from eval.mad.models import MIXERS
from eval.mad.report import load_runs, write_report
from eval.mad.tasks import SHORT, TASKS
from parallax_titan.checkpoint_files import output_folder_problem
from parallax_titan.mixers import FLA_MIXERS


def _parse_tasks(text: str) -> list[str]:
    if text == "all":
        return list(TASKS)
    by_short = {v.lower(): k for k, v in SHORT.items()}
    tasks = [by_short.get(t.strip().lower(), t.strip()) for t in text.split(",")]
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise SystemExit(f"--tasks: unknown {bad}; expected 'all' or names/short names from {TASKS}")
    return tasks


def split_fragments(text: str) -> list[str]:
    """``--settings``'s comma-separated label fragments; a comma inside parentheses belongs to its
    fragment, so a whole label such as "ICR(vocab_size=16,seq_len=128)" is one fragment."""
    fragments, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth <= 0:
            fragments.append(text[start:i].strip())
            start, depth = i + 1, 0
    return [f for f in fragments if f]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.mad", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/mad/paper_baseline.toml", help="TOML run config")
    p.add_argument("--tasks", default=None, help="'all' or comma list (names or ICR, FCR, ...)")
    p.add_argument("--mixers", default=None,
                   help=f"comma list from {sorted(MIXERS)} (overrides [grid] mixers; default attention,parallax)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--sweep", choices=SWEEPS, default=None, help="override [grid] sweep")
    p.add_argument("--settings", default=None,
                   help="only the settings whose label contains one of these comma-separated fragments, "
                        "e.g. 'seq_len=512,vocab_size=64' or a whole label 'ICR(vocab_size=16,seq_len=128)' "
                        "(override [grid] only_settings)")
    p.add_argument("--epochs", type=int, default=None, help="override [train] epochs")
    p.add_argument("--optimizer", choices=("muon", "adamw"), default=None, help="override [train] optimizer")
    p.add_argument("--schedule", choices=("wsd", "cosine"), default=None, help="override [train] schedule")
    p.add_argument("--lrs", default=None, help="override [train] lrs, comma list")
    p.add_argument("--wds", default=None, help="override [train] weight_decays, comma list")
    p.add_argument("--precision", choices=("bf16", "fp32"), default=None, help="override [train] precision")
    p.add_argument("--num-train-examples", type=int, default=None,
                   help="replace every setting's train set size (MAD's training-size changes and MEM's 256 too)")
    p.add_argument("--num-test-examples", type=int, default=None, help="override every setting's test set size")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (override [train] compile; runs count in the same grid)")
    p.add_argument("--checkpoint-seconds", type=float, default=None,
                   help="save each run's training state this often into OUT/partial/, so that a rerun continues "
                        "an unfinished run from it with the same result; 0 = off (override [train] "
                        "checkpoint_seconds)")
    p.add_argument("--backend", choices=("auto", "reference", "triton"), default=None,
                   help="override [model] backend")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--workers", type=int, default=0, help="worker processes (0 = inline)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--max-run-seconds", type=float, default=None,
                   help="shorten each run to about this many seconds (runs record their steps)")
    p.add_argument("--deadline", type=float, default=None, help="seconds after which no job starts")
    p.add_argument("--title", default=None, help="title of table.md")
    p.add_argument("--note", default="", help="text under the title of table.md")
    p.add_argument("--report-only", action="store_true", help="only rebuild tables from runs.jsonl")
    return p


def _floats(text: str, flag: str) -> list[float]:
    """A comma list of numbers (each once, in order); ValueError naming ``flag`` for another entry."""
    try:
        return list(dict.fromkeys(float(x) for x in text.split(",")))
    except ValueError:
        raise ValueError(f"{flag} = {text!r}: expected a comma list of numbers, e.g. 5e-3,1e-3") from None


def read_config(path: str, flag: str = "--config") -> RunConfig:
    """:func:`eval.mad.grid.load_config` of ``path``; ValueError naming ``flag`` (the option that gave
    it) for a path that is no readable file or holds no valid TOML (a traceback, or TOML's message
    without the file's name)."""
    try:
        return load_config(path)
    except OSError as exc:
        raise ValueError(f"{flag} = {path!r}: cannot be read ({exc.strerror}); expected a MAD run config, "
                         "e.g. configs/mad/paper_baseline.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{flag} = {path!r}: not valid TOML ({exc})") from None


def _apply_overrides(cfg: RunConfig, args) -> RunConfig:
    """The command's options over the config; a given value is checked (0 is a value, not "unset", and
    "" is a value that names nothing, refused rather than read as the config's)."""
    if args.tasks is not None:
        cfg.tasks = _parse_tasks(args.tasks)
    if args.mixers is not None:
        cfg.mixers = list(dict.fromkeys(m.strip() for m in args.mixers.split(",")))
    if args.sweep:
        cfg.sweep = args.sweep
    if args.settings is not None:
        cfg.only_settings = split_fragments(args.settings)
        if not cfg.only_settings:  # e.g. "," would otherwise keep every setting
            raise ValueError(f"--settings = {args.settings!r}: expected label fragments, e.g. seq_len=512")
    overrides = [("train", "epochs", args.epochs, "--epochs"),
                 ("train", "lrs", args.lrs and _floats(args.lrs, "--lrs"), "--lrs"),
                 ("train", "weight_decays", args.wds and _floats(args.wds, "--wds"), "--wds"),
                 ("data", "num_train_examples", args.num_train_examples, "--num-train-examples"),
                 ("data", "num_test_examples", args.num_test_examples, "--num-test-examples"),
                 ("train", "max_seconds", args.max_run_seconds, "--max-run-seconds")]
    for section, key, value, flag in overrides:
        if value is not None:  # given: checked (grid.RANGES), then set
            check_value(section, key, value, flag)
            if section == "data":
                cfg.data[key] = value
            else:
                setattr(cfg.train, key, value)
    if args.optimizer:
        cfg.train.optimizer = args.optimizer
    if args.schedule:
        cfg.train.schedule = args.schedule
    if args.precision:
        cfg.train.precision = args.precision
    if args.checkpoint_seconds is not None:
        check_checkpoint_seconds(args.checkpoint_seconds, "--checkpoint-seconds")
        cfg.train.checkpoint_seconds = args.checkpoint_seconds
    if args.backend:
        cfg.model.backend = args.backend
    if args.compile:
        cfg.train.compile = True
    return cfg


def _check_running(args) -> None:
    """--out, --workers, --threads and --deadline, before any run, and none of the run options with
    --report-only (ValueError naming the option)."""
    problem = output_folder_problem(args.out, "--out")  # "" would put runs.jsonl in the working directory
    if problem:
        raise ValueError(f"{problem}; expected a folder (made when missing) for runs.jsonl and the tables")
    if args.workers < 0:
        raise ValueError(f"--workers = {args.workers}: expected 0 (inline) or a number of processes")
    if args.threads < 1:
        raise ValueError(f"--threads = {args.threads}: expected an integer >= 1")
    if args.deadline is not None and not (math.isfinite(args.deadline) and args.deadline > 0):
        raise ValueError(f"--deadline = {args.deadline}: expected a number of seconds > 0")
    if args.report_only:
        # --compile and --checkpoint-seconds change how a run executes, not its config id: results.json
        # would record them as the runs' settings
        given = [flag for flag, value, unset in (("--device", args.device, None), ("--workers", args.workers, 0),
                                                  ("--threads", args.threads, 1), ("--deadline", args.deadline, None),
                                                  ("--compile", args.compile, False),
                                                  ("--checkpoint-seconds", args.checkpoint_seconds, None))
                 if value != unset]
        if given:  # nothing runs: the options would be ignored without a word
            raise ValueError(f"{', '.join(given)}: options of the runs, and --report-only runs nothing; expected "
                             "them left out (the report is rebuilt from runs.jsonl)")


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:  # a bad config or option stops here, before any run, with the key named
        cfg = _apply_overrides(read_config(args.config), args)
        check_schedule(cfg.train, f"{args.config}:")  # after --schedule and --lrs
        _check_running(args)
        check_mixers(cfg.mixers, "--mixers" if args.mixers is not None else f"{args.config}: [grid] mixers",
                     installed=not args.report_only)  # rebuilding tables needs no fla
        cfg.settings()  # an --settings fragment that matches nothing
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    mixers = cfg.mixers
    title = args.title or f"MAD ({cfg.sweep} sweep): {', '.join(mixers)}"
    config = {"argv": sys.argv[1:] if argv is None else list(argv), "sweep": cfg.sweep,
              **dataclasses.asdict(cfg)}
    failed = None
    if not args.report_only:
        import torch

        from eval.checkpoint import resolve_device
        from eval.mad.runner import JobsFailed, run_grid

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:  # every job would fail on a device this machine lacks (logged one by one by the workers)
            resolve_device(device, "--device")
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        on_fla = [m for m in mixers if MIXERS[m][0] in FLA_MIXERS]
        if on_fla and not device.startswith("cuda"):
            raise SystemExit(f"mixers {on_fla} run fla's Triton kernels, which need CUDA; got device {device!r}")
        try:
            run_grid(cfg, mixers, args.out, device=device, workers=args.workers, threads=args.threads,
                     deadline=args.deadline)
        except ValueError as exc:  # runs.jsonl of another config in --out, or a damaged one
            raise SystemExit(str(exc)) from None
        except JobsFailed as exc:  # the report of the finished runs is still written; the exit code says it
            failed = str(exc)
    runs_path = os.path.join(args.out, "runs.jsonl")
    if not os.path.exists(runs_path):  # e.g. every run of a call still unfinished, its state saved
        print(f"[mad] no finished run in {runs_path} yet: no report written")
        return _failed(failed)
    try:  # a damaged runs.jsonl, or one of another config, would give a wrong report
        runs = load_runs(runs_path)
        check_config_id(runs, cfg, runs_path)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    planned = {(s.label(), m, float(lr), float(wd)) for s in cfg.settings() for m in mixers for lr in cfg.train.lrs
               for wd in cfg.train.weight_decays}  # run_key of each run of the grid
    scores = write_report(runs, args.out, title, args.note, config, planned, mixers)
    for mixer, s in sorted(scores.items()):
        print(mixer, {k: round(v[0], 3) for k, v in s.items()})
    return _failed(failed)


def _failed(message: str | None) -> int:
    """The exit code: 1 after failed jobs (named on stderr), else 0."""
    if message:
        print(message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
