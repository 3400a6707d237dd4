"""Running a grid: one job per (task setting, mixer, lr, weight decay), resumable.

Jobs run in worker processes (``workers`` > 0; several small models share one GPU) or inline
(``workers = 0``). Every finished run is appended to ``runs.jsonl`` as one line at once (flushed
and synced), and a rerun with the same ``--out`` skips the runs already there, so a grid can be
filled over several calls; ``deadline`` (seconds) stops starting new jobs. A run killed midway
leaves nothing in ``runs.jsonl`` (or a partial last line, dropped on the next start). With
``[train] checkpoint_seconds`` > 0 each run also saves its whole training state that often to
``partial/`` beside ``runs.jsonl`` (one file per run, deleted when the run finishes), and a rerun
continues a killed run from its last state, bit for bit as if it had not stopped, and starts those
runs first; otherwise a killed run starts over. Records carry the grid's ``config_id`` (training,
model and data settings); a ``runs.jsonl`` or partial state of another config is refused rather
than mixed in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context

import torch

from eval.mad.grid import RunConfig, check_config_id, config_id
from eval.mad.models import build_model
from eval.mad.report import load_runs, run_key
from eval.mad.tasks import TaskSetting, make_dataset
from eval.mad.training import train_and_evaluate
from parallax_titan.atomic import write_text

PARTIAL = "partial"  # the folder in --out of the partial states of unfinished runs


def run_job(setting: TaskSetting, mixer: str, lr: float, wd: float, cfg: RunConfig, device: str,
            checkpoint: str | None = None) -> list[dict]:
    """Train ``mixer`` on ``setting`` with (lr, wd); a one-record list. ``checkpoint``: the file of
    the run's partial state (``partial_path``), resumed from when it exists."""
    data = make_dataset(setting)
    model = build_model(setting.task, mixer, setting.vocab_size, setting.seq_len, device=device,
                        seed=setting.seed, **dataclasses.asdict(cfg.model))
    facts = {"task": setting.task, "setting": setting.label(), "params": dataclasses.asdict(setting),
             "mixer": mixer, "lr": lr, "weight_decay": wd, "device": device, "config_id": config_id(cfg)}
    identity = {k: facts[k] for k in ("setting", "mixer", "lr", "weight_decay", "config_id")}
    result = train_and_evaluate(model, data, cfg.train, lr, wd, setting.vocab_size, device=device,
                                seed=setting.seed, checkpoint=checkpoint, identity=identity)
    return [{**facts, **result}]


def partial_path(out_dir: str, setting: str, mixer: str, lr: float, wd: float) -> str:
    """``out_dir/partial/<file>``: where the run with this key keeps its partial state. Labels hold
    "(", "=" and ","; the name is the task, mixer, lr and wd for reading and a hash of the whole key
    for uniqueness."""
    digest = hashlib.sha1(json.dumps([setting, mixer, float(lr), float(wd)]).encode()).hexdigest()[:10]
    return os.path.join(out_dir, PARTIAL, f"{setting.split('(')[0]}_{mixer}_lr{lr:g}_wd{wd:g}_{digest}.pt")


def finished_runs(path: str, cfg: RunConfig) -> set[tuple]:
    """Keys of the runs in ``path`` (drops a partial last line left by a kill); ValueError when the
    file holds runs of another config or a line that is not a run record."""
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        text = f.read()
    if text and not text.endswith("\n"):  # a write cut short: keep the complete lines only
        write_text(path, text[: text.rfind("\n") + 1])  # not truncated in place: a kill then would lose every run
    records = load_runs(path)
    check_config_id(records, cfg, path)
    return {run_key(r) for r in records}


def append_records(path: str, batch: list[dict]) -> None:
    """Append ``batch`` to ``path`` in one write, flushed to disk."""
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in batch))
        f.flush()
        os.fsync(f.fileno())


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _cost(job) -> float:
    setting = job[0]
    return setting.num_train_examples * setting.seq_len ** 1.2


class JobsFailed(RuntimeError):
    """Jobs of a grid run in worker processes failed; the others finished and were recorded."""


def run_grid(cfg: RunConfig, mixers: list[str], out_dir: str, device: str = "cpu", workers: int = 0,
             threads: int = 1, deadline: float | None = None, log=print) -> list[dict]:
    """Run every (setting, mixer, lr, wd) job not yet in out_dir/runs.jsonl; returns the new records
    (also appended to it). With ``cfg.train.checkpoint_seconds`` > 0, runs save their partial state
    under out_dir/partial/; the runs that have one continue from it and start first (they are the
    closest to finishing), the others by size, largest first; the log's first line counts them.
    With ``workers``, a failed job is logged and the others go on; then :class:`JobsFailed` names
    how many failed (inline, the first failure is raised as it is)."""
    os.makedirs(out_dir, exist_ok=True)
    if cfg.train.checkpoint_seconds > 0:
        os.makedirs(os.path.join(out_dir, PARTIAL), exist_ok=True)
    path = os.path.join(out_dir, "runs.jsonl")
    done = finished_runs(path, cfg)
    planned = [(s, m, lr, wd) for s in cfg.settings() for m in mixers for lr in cfg.train.lrs
               for wd in cfg.train.weight_decays]
    checkpoints = {j: partial_path(out_dir, j[0].label(), *j[1:]) if cfg.train.checkpoint_seconds > 0 else None
                   for j in planned if (j[0].label(), j[1], float(j[2]), float(j[3])) not in done}
    resumed = {j for j, c in checkpoints.items() if c and os.path.exists(c)}
    jobs = sorted(checkpoints, key=lambda j: (j in resumed, _cost(j)), reverse=True)
    log(f"[mad] {len(planned) - len(jobs)} of {len(planned)} runs already in {path}; {len(jobs)} to run, "
        f"{len(resumed)} of them from a partial state")
    stop_at = time.time() + deadline if deadline else float("inf")
    records: list[dict] = []

    def save(batch):
        append_records(path, batch)
        records.extend(batch)
        best = max(r["test_acc"] for r in batch)
        r = batch[0]
        log(f"[mad] {r['mixer']:>16s} {r['setting']} lr {r['lr']:g} wd {r['weight_decay']:g}: "
            f"acc {best:.3f} loss {r['final_loss']:.3f} ({r['seconds']:.0f}s)")

    if workers <= 0:
        _worker_init(threads)
        for i, job in enumerate(jobs):
            if time.time() > stop_at:
                log(f"[mad] deadline reached: {len(jobs) - i} jobs not started")
                break
            save(run_job(*job, cfg, device, checkpoints[job]))
        return records
    ctx = get_context("spawn")
    failed = []
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(threads,)) as pool:
        pending, queue = set(), list(jobs)
        while queue or pending:
            while queue and len(pending) < workers and time.time() < stop_at:
                job = queue.pop(0)
                pending.add(pool.submit(run_job, *job, cfg, device, checkpoints[job]))
            if not pending:
                log(f"[mad] deadline reached: {len(queue)} jobs not started")
                break
            done, pending = wait(pending, timeout=30, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    save(fut.result())
                except Exception as e:  # one failed job must not lose the rest of the grid
                    log(f"[mad] job failed: {type(e).__name__}: {e}")
                    failed.append(f"{type(e).__name__}: {e}")
    if failed:
        raise JobsFailed(f"[mad] {len(failed)} of {len(jobs)} jobs failed (first: {failed[0]}); the "
                         f"{len(records)} that finished are in {path}, and a rerun runs the rest")
    return records
