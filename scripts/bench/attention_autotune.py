"""Check the forward autotuner's choice against interleaved timings of its candidates, on one GPU.

Per shape (bf16, causal, Hq16/Hkv8): every forward config of ``CANDIDATES`` (the shipped tiles in both
program orders) as an explicit config, timed interleaved (``interleaved_ms``: rounds that each run
every candidate in turn), back to back and with the L2 cache flushed before each call as
``triton.testing.do_bench`` does; then triton's autotuner over the same list in its order and
reversed (fresh tuners, no disk cache): what it picked and its own timings; the same candidates timed
one after another by ``triton.testing.do_bench`` outside the autotuner (``sequential_ms``: does the
disagreement come from timing one candidate at a time, or from the autotuner's own path?); then
``tuning.SHIPPED``'s autotuned choice. A candidate the autotuner prefers but the interleaved timings
do not is a candidate to drop.

    python -m scripts.bench.attention_autotune --out docs/bench/attention_autotune
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Callable

import torch

from kernels.parallax import fused, tuning
from scripts.bench.attention import SHAPES, make_inputs
from scripts.bench.results import command_line, describe, positive_int, table, write_results

CANDIDATES = tuning.both_orders([(128, 64, 8, 3), (64, 64, 4, 3)], TMA=True)
L2_FLUSH_BYTES = 256 << 20  # as triton.testing.do_bench's cache flush


def label(config) -> str:
    """A forward config as the rows name it: "128x64 w8 s3 global" (or "head-major")."""
    kw = config.kwargs
    order = "global" if kw.get("GLOBAL_ORDER") else "head-major"
    return f"{kw['BM']}x{kw['BN']} w{config.num_warps} s{config.num_stages} {order}"


def interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int, iters: int,
                   timer: Callable[[Callable[[], object], int], float]) -> dict[str, float]:
    """{name: median over ``rounds`` of ``timer(fn, iters)``}, the candidates run in turn within each
    round so that clock and temperature drift reach all of them alike. ``timer(fn, iters)``: ms per
    call of ``iters`` calls."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timer(fn, iters))
    return {name: statistics.median(ts) for name, ts in times.items()}


def back_to_back(fn, iters: int) -> float:
    """ms per call of ``iters`` calls of ``fn`` between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


_flush_buffer: list = []  # one per process, allocated at the first flushed timing


def do_bench_ms(fn, iters: int) -> float:
    """triton.testing.do_bench's median ms per call of ``fn`` (10 ms of warm-up, 60 ms of calls: it
    picks the count, so ``iters`` is unused), as an ``interleaved_ms`` timer."""
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=60)


def flushed(fn, iters: int) -> float:
    """Median ms of ``iters`` calls of ``fn``, each timed alone after the L2 cache is overwritten."""
    if not _flush_buffer:
        _flush_buffer.append(torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda"))
    pairs = []
    for _ in range(iters):
        _flush_buffer[0].zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


def sequential_ms(fns: dict[str, Callable[[], object]], bench: Callable | None = None) -> dict[str, float]:
    """{name: ``bench(fn)``}, one candidate after another, as an autotuner times them; ``bench``
    defaults to triton.testing.do_bench's median (its default warm-up and repetitions, L2 flushed)."""
    if bench is None:
        import triton

        bench = lambda fn: triton.testing.do_bench(fn, return_mode="median")  # noqa: E731
    return {name: bench(fn) for name, fn in fns.items()}


def autotuned(configs, tensors, scale) -> tuple[str, dict[str, float]]:
    """Triton's autotuner over ``configs`` (in that order, a fresh tuner, no disk cache) on the forward
    of ``tensors``: (label of its pick, {label: its timing in ms})."""
    import triton

    tuner = triton.autotune(configs=list(configs), key=tuning.TUNE_KEY)(fused._fwd_kernel)
    tuning._tuners[tuning.tuner_key("fwd", configs)] = tuner  # in place of select's, which caches on disk
    with tuning.candidates(fwd=list(configs)), torch.no_grad():
        fused.forward(*tensors, scale)
    torch.cuda.synchronize()
    timings = {label(c): t[0] if isinstance(t, (list, tuple)) else t for c, t in tuner.configs_timings.items()}
    return label(next(iter(tuner.cache.values()))), timings


def shipped_choice(tensors, scale) -> str:
    """Label of the config ``tuning.SHIPPED["fwd"]``'s autotuner runs at this shape (the Triton forward,
    not the Hopper kernel that runs in its place on sm_90)."""
    with torch.no_grad():
        fused.forward(*tensors, scale, hopper=False)
    torch.cuda.synchronize()
    tuner = tuning.autotuner("fwd")
    if tuner is None:  # below SMALL_WORK: the first candidate, untimed
        return label(tuning.SHIPPED["fwd"][0])
    return label(tuner.best_config)


def measure(shape, rounds: int) -> dict:
    """One shape's row: interleaved ms of each candidate (back to back, flushed), do_bench's ms of each
    in turn, the autotuner's picks and timings in list order and reversed, and the shipped list's
    choice."""
    tensors = make_inputs(*shape)
    scale = shape[-1] ** -0.5
    fns = {label(c): (lambda c=c: fused.forward(*tensors, scale, config=c)) for c in CANDIDATES}
    with torch.no_grad():
        for fn in fns.values():
            fn()  # compile outside the timing
        plain = interleaved_ms(fns, rounds, 10, back_to_back)
        cold = interleaved_ms(fns, max(rounds // 2, 1), 5, flushed)
        one_at_a_time = sequential_ms(fns)
    in_order, reversed_ = autotuned(CANDIDATES, tensors, scale), autotuned(CANDIDATES[::-1], tensors, scale)
    return {"shape": dict(zip("B L Hq Hkv D".split(), shape)), "back_to_back_ms": plain, "flushed_ms": cold,
            "sequential_do_bench_ms": one_at_a_time,
            "autotuner": {"list order": in_order, "reversed": reversed_},
            "shipped_choice": shipped_choice(tensors, scale)}


MEASURED = ("forward time of each candidate config as an explicit config (fused.forward(..., config=)), timed "
            "interleaved (median over rounds; back to back: 10 calls between two CUDA events; flushed: each call "
            "alone after a 256 MiB write) and by triton.testing.do_bench one candidate after another, beside "
            "triton's autotuner over the same candidates in list order and reversed (its pick and its own "
            "timings, do_bench median), bf16, causal, Hq16/Hkv8")


def report_markdown(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        s = r["shape"]
        lines.append(f"\nB{s['B']} L{s['L']} D{s['D']}: shipped list runs **{r['shipped_choice']}**\n")
        picks = {way: pick for way, (pick, _) in r["autotuner"].items()}
        cells = [(name, f"{r['back_to_back_ms'][name]:.4f}", f"{r['flushed_ms'][name]:.4f}",
                  f"{r['sequential_do_bench_ms'][name]:.4f}",
                  *(f"{r['autotuner'][way][1].get(name, float('nan')):.4f}" + (" (pick)" if picks[way] == name else "")
                    for way in ("list order", "reversed")))
                 for name in r["back_to_back_ms"]]
        lines += table(["config", "interleaved, back to back ms", "interleaved, flushed ms", "do_bench, in turn ms",
                        "autotuner, list order ms", "autotuner, reversed ms"], cells)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Measure every shape of scripts.bench.attention's SHAPES (or ``--shapes``), write the page and JSON."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.attention_autotune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/bench/attention_autotune", help="output path without extension")
    parser.add_argument("--shapes", type=int, nargs="+", default=list(range(len(SHAPES))),
                        choices=range(len(SHAPES)), help="indices into scripts.bench.attention.SHAPES")
    parser.add_argument("--rounds", type=positive_int, default=15, help="rounds of the interleaved timing (default 15)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("scripts.bench.attention_autotune needs a CUDA GPU")
    rows = [measure(SHAPES[i], args.rounds) for i in args.shapes]
    meta = describe("Forward autotuning against interleaved timings", MEASURED, command_line(__spec__.name, argv))
    print(write_results(args.out, meta, report_markdown(rows), {"rows": rows}))


if __name__ == "__main__":
    main()
