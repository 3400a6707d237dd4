"""Running a grid: one job per (task setting, mixer, lr, weight decay).

Jobs run in worker processes (``workers`` > 0; several small models share one GPU) or inline
(``workers = 0``). Every finished run is appended to ``runs.jsonl`` at once, so a grid cut
short by a time limit still leaves its results; ``deadline`` (seconds) stops starting new jobs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context

import torch

from eval.mad.grid import RunConfig
from eval.mad.models import build_model
from eval.mad.tasks import TaskSetting, make_dataset
from eval.mad.training import train_and_evaluate


def run_job(setting: TaskSetting, mixer: str, lr: float, wd: float, cfg: RunConfig, device: str) -> list[dict]:
    """Train ``mixer`` on ``setting`` with (lr, wd); a one-record list."""
    data = make_dataset(setting)
    model = build_model(setting.task, mixer, setting.vocab_size, setting.seq_len, device=device,
                        seed=setting.seed, **dataclasses.asdict(cfg.model))
    result = train_and_evaluate(model, data, cfg.train, lr, wd, setting.vocab_size, device=device,
                                seed=setting.seed)
    return [{"task": setting.task, "setting": setting.label(), "params": dataclasses.asdict(setting),
             "mixer": mixer, "lr": lr, "weight_decay": wd, "device": device, **result}]


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _cost(job) -> float:
    setting = job[0]
    return setting.num_train_examples * setting.seq_len ** 1.2


def run_grid(cfg: RunConfig, mixers: list[str], out_dir: str, device: str = "cpu", workers: int = 0,
             threads: int = 1, deadline: float | None = None, log=print) -> list[dict]:
    """Run every (setting, mixer) job; returns all records (also appended to out_dir/runs.jsonl)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "runs.jsonl")
    jobs = sorted(((s, m, lr, wd) for s in cfg.settings() for m in mixers for lr in cfg.train.lrs
                   for wd in cfg.train.weight_decays), key=_cost, reverse=True)
    stop_at = time.time() + deadline if deadline else float("inf")
    records: list[dict] = []

    def save(batch):
        with open(path, "a") as f:
            for r in batch:
                f.write(json.dumps(r) + "\n")
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
            save(run_job(*job, cfg, device))
        return records
    ctx = get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(threads,)) as pool:
        pending, queue = set(), list(jobs)
        while queue or pending:
            while queue and len(pending) < workers and time.time() < stop_at:
                pending.add(pool.submit(run_job, *queue.pop(0), cfg, device))
            if not pending:
                log(f"[mad] deadline reached: {len(queue)} jobs not started")
                break
            done, pending = wait(pending, timeout=30, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    save(fut.result())
                except Exception as e:  # one failed job must not lose the rest of the grid
                    log(f"[mad] job failed: {type(e).__name__}: {e}")
    return records
