"""Benchmark Parallax decode (one query vs a KV cache) against softmax decode and published kernels.

Contenders, timed side by side in one process on one GPU:
  * softmax decode through torch SDPA, cuDNN and flash backends, q of length 1
    with enable_gqa ("gqa"), and the same math with each kv head's G query
    heads packed as G query rows ("packed"); the ratio baseline is the fastest
    cuDNN variant;
  * PyPI parallax-kernel 0.1.1 (``parallax.triton.parallax_decode``) and
    fla-core 0.6.0 (``fla.ops.parallax.decode.parallax_decode_one_step``),
    benchmark-only wheels;
  * ours, ``kernels.parallax_decode`` (Triton split-KV), and on Hopper the same kernels launched
    without programmatic dependent launch ("ours-no-pdl"; the default uses it where the plan
    splits), to give PDL's share in the same run.

Timing: CUDA-graph replay of many calls (launch gaps out of the numbers),
rotating over enough input sets to exceed 3x the L2 cache, median of replays.
Bandwidth = bytes of K + V read / time. ``--calls N --inputs same`` times instead N calls on one
input set replayed from one graph (a cache that fits in L2 is then read from it after the first
call), and ``--shapes`` picks the shapes (DIMxBATCHxLENGTH).

    python -m scripts.bench.decode --check --sweep --out docs/bench/attention_decode
    python -m scripts.bench.decode --calls 10 --inputs same --shapes 128x1x4096 128x8x4096 64x1x16384
    python -m scripts.bench.decode --host-cost --out docs/bench/decode_host_cost
    python -m scripts.bench.decode --kernel-times --out docs/bench/decode_kernel_times

Writes OUT.md (the benchmark table) and OUT.json (everything measured). --host-cost measures
instead the host time per eager call (DecodePlan, the public API with and without its checks,
CUDA-graph replay; scripts/bench/decode_host.py), --kernel-times the GPU time of the split and
merge kernels of one step (scripts/bench/decode_kernels.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels import parallax_decode
from kernels.parallax import decode_fused, tuning
from scripts.bench import decode_host, decode_kernels
from scripts.bench.decode_timing import HKV, copy_bandwidth, kv_bytes, log, make_sets, n_sets_for, time_us
from scripts.bench.decode_tuning import SWEEP_SHAPES, check, sweep
from scripts.bench.results import command_line, describe, positive_int, table, write_results

BATCHES = (1, 32, 128)
LENGTHS = (4096, 16384, 32768)
DIMS = (128, 64)


# ---------------------------------------------------------------- contenders
def load_competitors():
    """fla first: parallax-kernel is the one that can poison the CUDA context."""
    comps = {}
    try:
        from fla.ops.parallax.decode import parallax_decode_one_step

        comps["fla"] = lambda q, r, k, v: parallax_decode_one_step(q, r, k, v)
    except Exception as exc:  # benchmark-only wheel: report, don't die
        log(f"fla unavailable: {exc!r}")
    try:
        from parallax.triton import parallax_decode as pk_decode

        comps["parallax-kernel"] = lambda q, r, k, v: pk_decode(q, r, k, v)
    except Exception as exc:  # benchmark-only wheel: report, don't die
        log(f"parallax-kernel unavailable: {exc!r}")
    return comps


def sdpa_fn(backend, packed):
    """Softmax decode through torch SDPA with ``backend``: with enable_gqa, or (``packed``) each kv
    head's query heads as rows of one query block; fn(q, r, k, v) -> out, r unused."""
    def run(q, r, k, v):
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)
        with sdpa_kernel([backend]):
            if packed:  # (B, 1, Hq, D) -> (B, Hkv, G, D): G query rows per kv head
                b, _, hq, d = q.shape
                return F.scaled_dot_product_attention(q.view(b, HKV, hq // HKV, d), kt, vt)
            return F.scaled_dot_product_attention(q.transpose(1, 2), kt, vt, enable_gqa=True)

    return run


def contenders():
    """name -> fn(q, r, k, v) -> out of every contender importable here."""
    fns = {"ours": lambda q, r, k, v: parallax_decode(q, r, k, v)}
    if decode_fused.pdl_supported(torch.device("cuda")):
        fns["ours-no-pdl"] = lambda q, r, k, v: decode_fused.parallax_decode_triton(
            q, r, k, v, None, q.shape[-1] ** -0.5, pdl=False)
    fns.update({
        "cudnn-gqa": sdpa_fn(SDPBackend.CUDNN_ATTENTION, False),
        "cudnn-packed": sdpa_fn(SDPBackend.CUDNN_ATTENTION, True),
        "flash-gqa": sdpa_fn(SDPBackend.FLASH_ATTENTION, False),
        "flash-packed": sdpa_fn(SDPBackend.FLASH_ATTENTION, True),
    })
    fns.update(load_competitors())
    return fns


# ---------------------------------------------------------------- benchmark
def bench_shape(fns, dim, batch, length, calls=24, inputs="rotate"):
    """Every contender at one shape: the row (shape, ``us`` per contender, the cuDNN baseline,
    ratios to it, TB/s of K + V read). ``calls`` per graph (at least); ``inputs`` "rotate" (sets
    beyond the L2 cache) or "same" (one set)."""
    nb = kv_bytes(batch, length, dim)
    sets = make_sets(batch, length, dim, n_sets_for(nb) if inputs == "rotate" else 1)
    row = dict(D=dim, B=batch, L=length, kv_bytes=nb, n_sets=len(sets), calls=calls, us={})
    for name, fn in fns.items():
        if name == "parallax-kernel" and batch * length * HKV * dim >= 2**31:
            log(f"{name} skipped at D={dim} B={batch} L={length}: its int32 cache offsets overflow "
                "(illegal address seen on H200, which poisons the CUDA context)")
            continue
        try:
            row["us"][name] = time_us(fn, sets, min_calls=calls)
        except Exception as exc:
            log(f"{name} failed at D={dim} B={batch} L={length}: {repr(exc)[:300]}")
    cudnn = [row["us"][n] for n in ("cudnn-gqa", "cudnn-packed") if n in row["us"]]
    row["baseline_us"] = min(cudnn) if cudnn else None
    row["ratio"] = {n: t / row["baseline_us"] for n, t in row["us"].items()} if cudnn else {}
    row["tbps"] = {n: nb / t / 1e6 for n, t in row["us"].items()}
    return row


def bench(fns, shapes=None, calls=24, inputs="rotate"):
    """``bench_shape`` rows over ``shapes`` ((dim, batch, length) triples; default DIMS x BATCHES x
    LENGTHS)."""
    shapes = shapes or [(d, b, n) for d in DIMS for b in BATCHES for n in LENGTHS]
    rows = []
    for dim, batch, length in shapes:
        rows.append(bench_shape(fns, dim, batch, length, calls, inputs))
        log("bench", json.dumps(rows[-1]))
        torch.cuda.empty_cache()  # the next shape's input sets need the memory
    return rows


MEASURED = ("latency of one decode step (one query token vs a KV cache of length L), bf16, Hq=16, Hkv=8: "
            "microseconds per call under CUDA-graph replay (median; inputs rotated beyond the L2 cache unless the "
            "command says --inputs same); ratios against the fastest cuDNN softmax variant; TB/s = bytes of K + V "
            "read / time")


def markdown(rows, copy_tbps):
    """The body of the results page: the copy ceiling and one table row per ``bench`` row."""
    names = ["cudnn-gqa", "cudnn-packed", "flash-gqa", "flash-packed", "parallax-kernel", "fla", "ours-no-pdl", "ours"]
    ratios = ("ours", "ours-no-pdl", "parallax-kernel", "fla")

    def cells(row):
        us = [f"{row['us'][n]:.1f}" if n in row["us"] else "-" for n in names]
        ratio = [f"{row['ratio'][n]:.2f}" if n in row["ratio"] else "-" for n in ratios]
        tb = f"{row['tbps']['ours']:.2f}" if "ours" in row["tbps"] else "-"
        return [row["D"], row["B"], row["L"], *us, tb, *ratio]

    columns = ["D", "B", "L", *(f"{n} us" for n in names), "ours TB/s", "ours / cuDNN", "no PDL / cuDNN",
               "pk / cuDNN", "fla / cuDNN"]
    ceiling = f"Device-to-device copy ceiling {copy_tbps:.2f} TB/s (read + write)."
    return "\n".join([ceiling, "", *table(columns, map(cells, rows))]) + "\n"


def batch_by_length(text: str) -> tuple[int, int]:
    """``"BATCHxLENGTH"`` (e.g. "32x16384") as (batch, length)."""
    try:
        batch, length = (int(x) for x in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BATCHxLENGTH, e.g. 32x16384") from None
    return batch, length


def decode_shape(text: str) -> tuple[int, int, int]:
    """``"DIMxBATCHxLENGTH"`` (e.g. "128x8x4096") as (dim, batch, length), dim 64 or 128."""
    try:
        dim, batch, length = (int(x) for x in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected DIMxBATCHxLENGTH, e.g. 128x8x4096") from None
    if dim not in DIMS or batch < 1 or length < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected DIM in {DIMS}, BATCH >= 1, LENGTH >= 1")
    return dim, batch, length


def parser() -> argparse.ArgumentParser:
    """The command line: checks, sweep and benchmark table, or the --host-cost mode."""
    p = argparse.ArgumentParser(prog="python -m scripts.bench.decode", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="correctness vs fp64 and competitors first")
    p.add_argument("--sweep", action="store_true", help="tuning sweep of our launch configuration")
    p.add_argument("--sweep-shapes", nargs="+", type=batch_by_length, default=SWEEP_SHAPES, metavar="BxL",
                   help="BATCHxLENGTH shapes of the sweep (default: %(default)s)")
    p.add_argument("--no-bench", action="store_true", help="skip the full benchmark table")
    p.add_argument("--shapes", nargs="+", type=decode_shape, metavar="DxBxL",
                   help="shapes of the table (default: every D in %s x B in %s x L in %s)" % (DIMS, BATCHES, LENGTHS))
    p.add_argument("--calls", type=positive_int, default=24, help="calls per CUDA graph, at least (default 24)")
    p.add_argument("--inputs", choices=("rotate", "same"), default="rotate",
                   help="rotate over input sets beyond 3x the L2 cache (default), or one set for every call")
    p.add_argument("--host-cost", action="store_true",
                   help="only measure the host time per eager call (B1 L4096 D128) and write its page")
    p.add_argument("--kernel-times", action="store_true",
                   help="only measure the GPU time of each kernel of a decode step (the --shapes, default "
                        "the speed goal's split shapes) under the profiler and write its page")
    p.add_argument("--out", help="output path without extension (default: docs/bench/attention_decode, "
                                 "docs/bench/decode_host_cost with --host-cost, docs/bench/decode_kernel_times "
                                 "with --kernel-times)")
    return p


def host_cost(out: str, command: str) -> str:
    """Measure ``decode_host.run`` and write its page ``out``.md (and .json); return the markdown."""
    meta = describe("Parallax decode: host time per eager call", decode_host.MEASURED, command)
    times = decode_host.run()
    return write_results(out, meta, decode_host.markdown(times),
                         {"shape": decode_host.SHAPE, "goal_us": decode_host.GOAL_US, "times": times})


def kernel_times(out: str, command: str, shapes) -> str:
    """Measure ``decode_kernels.run`` at ``shapes`` and write its page ``out``.md (and .json); return the markdown."""
    meta = describe("Parallax decode: GPU time per kernel", decode_kernels.MEASURED, command)
    rows = decode_kernels.run(shapes or decode_kernels.SHAPES)
    return write_results(out, meta, decode_kernels.markdown(rows), {"rows": rows})


def main(argv: list[str] | None = None) -> None:
    """Run the checks, sweep and benchmark the command line asks for; write OUT.json (and OUT.md)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("scripts.bench.decode needs a CUDA GPU")
    command = command_line(__spec__.name, argv)
    if args.host_cost:
        log(host_cost(args.out or "docs/bench/decode_host_cost", command))
        return
    if args.kernel_times:
        log(kernel_times(args.out or "docs/bench/decode_kernel_times", command, args.shapes))
        return
    fns = contenders()
    meta = describe("Parallax decode benchmark", MEASURED, command)
    result = {"configs": {str(k): v for k, v in tuning.DECODE_CONFIGS.items()},
              "many_groups_configs": {str(k): v for k, v in tuning.DECODE_MANY_GROUPS_CONFIGS.items()},
              "min_chunk": tuning.DECODE_MIN_CHUNK, "copy_tbps": copy_bandwidth()}
    log("meta", meta, result)
    t0 = time.time()
    if args.check:
        result["check"] = check(fns)
        log(f"check done {time.time() - t0:.0f}s")
    if args.sweep:
        result["sweep"] = sweep(args.sweep_shapes, args.calls, args.inputs)
        log(f"sweep done {time.time() - t0:.0f}s")
    if not args.no_bench:
        result["bench"] = bench(fns, args.shapes, args.calls, args.inputs)
    body = (markdown(result["bench"], result["copy_tbps"]) if "bench" in result
            else "No benchmark table (--no-bench); the check and sweep rows are in the JSON.\n")
    log(write_results(args.out or "docs/bench/attention_decode", meta, body, result))
    log(f"done {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
