"""One MAD training step per mixer, eager and with compiled blocks: where a grid run's time goes.

Reproduce (one H200), writing docs/bench/mad_step.md and .json:
    python -m scripts.bench.mad_step --out docs/bench/mad_step
Each mixer trains the model of ``--config``'s [model] with its [train] optimizer and precision
(MuonAdamW, bf16 autocast for configs/mad/family.toml) on random ICR-shaped batches (vocabulary
16, length 128, ``batch_size`` sequences) through ``eval.mad.training``'s own step; the time is
the mean over ``--steps`` steps after ``--warmup`` (compiles, autotuning), the device synchronised
around them. A run of the grid is 6000 such steps at ICR(16, 128).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from eval.checkpoint import resolve_device
from eval.mad.__main__ import read_config
from eval.mad.grid import TrainConfig, check_mixers
from eval.mad.models import build_model, compile_blocks
from eval.mad.training import train_step, build_optimizer
from scripts.bench.results import command_line, describe, table, write_result_page

MIXERS = ["attention", "parallax", "exact_lla", "value_averaging", "affine_la", "affine_mesanet"]
VOCAB, SEQ_LEN = 16, 128


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def step_ms(mixer: str, model_kw: dict, train: TrainConfig, compiled: bool, device: str, warmup: int,
            steps: int) -> tuple[float, torch.nn.Module]:
    """(mean ms per training step after ``warmup`` steps, the trained model) of ``mixer`` on random
    int64 (batch_size, SEQ_LEN) batches over VOCAB tokens."""
    model = build_model("in-context-recall", mixer, VOCAB, SEQ_LEN, device=device, **model_kw)
    if compiled:
        compile_blocks(model)
    opt = build_optimizer(model, train.optimizer, 1e-3, 0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    x = torch.randint(0, VOCAB, (train.batch_size, SEQ_LEN), device=device)
    y = torch.randint(0, VOCAB, (train.batch_size, SEQ_LEN), device=device)
    for _ in range(warmup):
        train_step(model, opt, sched, x, y, train, device)
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        train_step(model, opt, sched, x, y, train, device)
    _synchronize(device)
    return (time.perf_counter() - start) / steps * 1e3, model


def write(result: dict, out: str) -> str:
    """``out``.md (a row per mixer: eager and compiled ms, their ratio) and ``out``.json."""
    rows = []
    for mixer, ms in result["ms"].items():
        eager, compiled = ms.get("eager"), ms.get("compiled")
        ratio = f"{compiled / eager:.2f}" if eager and compiled else "n/a"
        rows.append([mixer, *(f"{t:.2f}" if t else "n/a" for t in (eager, compiled)), ratio])
    lines = [f"ms per training step, {result['setup']}.", "",
             *table(["mixer", "eager ms", "compiled blocks ms", "compiled / eager"], rows)]
    return write_result_page(out, result, lines)


def main(argv: list[str] | None = None) -> None:
    """Time every mixer of --mixers eager and compiled; write OUT.md and OUT.json after each."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.mad_step", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/bench/mad_step", help="output path without extension")
    ap.add_argument("--config", default="configs/mad/family.toml",
                    help="the MAD config whose [model] and [train] are timed")
    ap.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated mixer names")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compiles, autotuning)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.steps < 1:
        ap.error(f"--warmup {args.warmup} / --steps {args.steps}: expected >= 0 and >= 1")
    mixers = args.mixers.split(",")
    try:  # a misspelt mixer or a device this machine lacks failed only after the earlier mixers' timings
        cfg = read_config(args.config)
        check_mixers(mixers, "--mixers")
        device = str(resolve_device(args.device, "--device"))
    except ValueError as exc:
        ap.error(str(exc))
    model_kw = dataclasses.asdict(cfg.model)
    setup = (f"ICR-shaped batches of {cfg.train.batch_size} x {SEQ_LEN} tokens (vocabulary {VOCAB}), {args.config}'s "
             f"model {model_kw} and optimizer {cfg.train.optimizer}, precision {cfg.train.precision}, on {device}; "
             f"mean of {args.steps} steps after {args.warmup}")
    measured = "time of one MAD training step per mixer, eager and with compiled blocks"
    result = {"meta": describe("MAD training step per mixer", measured, command_line(__spec__.name, argv)),
              "setup": setup, "ms": {}}
    for mixer in mixers:
        for mode in ("eager", "compiled"):
            ms, _ = step_ms(mixer, model_kw, cfg.train, mode == "compiled", device, args.warmup, args.steps)
            result["ms"].setdefault(mixer, {})[mode] = ms
            print(f"{mixer} {mode}: {ms:.2f} ms", flush=True)
            write(result, args.out)


if __name__ == "__main__":
    main()
