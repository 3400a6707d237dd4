"""Host (CPU) time per call of the training step's custom ops, one GPU, bf16, 0.6B Parallax shapes.

A compiled training step calls ``parallax_titan::attention_fwd`` / ``attention_bwd`` and
``parallax_titan::split_norm_rope`` / ``split_norm_rope_bwd`` once per layer; their Python paths
(argument checks, allocations, TMA descriptors, Triton's launch) run on the host while the GPU works
through what is queued. Each row here is the mean wall time of a call on the host, measured while
the GPU is held busy (``torch.cuda._sleep``) so that launches only queue: the op through the
dispatcher, then the layers beneath it. The last section is ``cProfile``'s top functions (by
cumulative time) of the attention forward op: where its host time goes.

    python -m scripts.bench.op_host_cost --out docs/bench/op_host_cost
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

from scripts.bench.results import (add_batch_arguments, command_line, describe, positive_int, require_cuda, table,
                                   write_result_page)

SLEEP_CYCLES = 4_000_000_000  # about 2 s of GPU time: the timed calls only queue their kernels


def host_us(fn, calls: int) -> float:
    """Mean host microseconds of ``fn()`` over ``calls`` calls, after 3 warm-up calls, with the GPU
    busy so that each call returns once its kernels are queued."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _inputs(batch: int, seq_len: int):
    """0.6B Parallax's attention inputs and projection (heads of 128), bf16 on the GPU."""
    from kernels.projection.api import rope_angles
    from parallax_titan.spec import BASE_FLAVORS, variant_args
    from scripts.bench.projection import inputs

    args = variant_args("parallax", BASE_FLAVORS["0.6B"])
    hq, hkv, d = args.n_heads, args.n_kv_heads, args.head_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, r, do = (torch.randn(batch, seq_len, hq, d, device="cuda", generator=gen).bfloat16() for _ in range(3))
    k, v = (torch.randn(batch, seq_len, hkv, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    y, weights, table_, grads = inputs(batch, seq_len, hq, hkv, d, args.rope_theta)
    projection = (y, hq, hkv, *weights, args.norm_eps, rope_angles(table_, seq_len, y.dtype), True)
    return (q, r, k, v, d ** -0.5), do, projection, grads


def calls_to_time(batch: int, seq_len: int) -> dict:
    """Label -> zero-argument callable of each measured path."""
    from kernels.parallax import fused, hopper, ops as attention_ops
    from kernels.projection import fused as projection_fused, ops as projection_ops

    (q, r, k, v, scale), do, proj, grads = _inputs(batch, seq_len)
    saved = fused.forward(q, r, k, v, scale)
    total, hq, hkv, d = q.shape[0] * q.shape[1], q.shape[2], k.shape[2], q.shape[3]
    strides = {"q": hq * d, "k": hkv * d, "v": hkv * d}
    outputs = (torch.empty_like(q), torch.empty_like(q), fused.stats_buffer(q), fused.stats_buffer(q))
    rows = [(q, hq * d), (r, hq * d), (k, hkv * d), (v, hkv * d)]
    y, _, _, w_q, w_k, w_rho, eps, angles, _ = proj
    return {
        "attention_fwd (custom op)": lambda: attention_ops.attention_fwd(q, r, k, v, scale, None, None, True),
        "  fused.forward": lambda: fused.forward(q, r, k, v, scale),
        "    fused.hopper_unusable": lambda: fused.hopper_unusable(q, total, rows, "fwd", scale=scale),
        "    hopper.forward (descriptors + launch)": lambda: hopper.forward(
            q, r, k, v, outputs, q, strides=strides, total=total, seq_len=q.shape[1], window=total,
            qk_scale=scale * 1.4426950408889634, varlen=False),
        "      4 TMA descriptors": lambda: hopper._query_key_descriptors(q, r, k, v, strides, total, 128, 128),
        "    4 output allocations": lambda: (torch.empty_like(q), torch.empty_like(q), fused.stats_buffer(q),
                                             fused.stats_buffer(q)),
        "attention_bwd (custom op)": lambda: attention_ops.attention_bwd(do, q, r, k, v, *saved, scale, None, None,
                                                                         True),
        "  fused.backward": lambda: fused.backward(do, q, r, k, v, *saved, scale),
        "split_norm_rope (custom op)": lambda: projection_ops.split_norm_rope_op(*proj),
        "  projection fused.forward": lambda: projection_fused.forward(y, hq, hkv, (w_q, w_k, w_rho), eps, angles,
                                                                       True),
        "split_norm_rope_bwd (custom op)": lambda: projection_ops.split_norm_rope_bwd(*grads, *proj),
        "  projection fused.backward": lambda: projection_fused.backward(grads, y, hq, hkv, (w_q, w_k, w_rho), eps,
                                                                         angles, True),
    }


def profile_text(fn, calls: int, top: int = 20) -> str:
    """cProfile's ``top`` functions by cumulative time over ``calls`` calls of ``fn`` (GPU held busy)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.op_host_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/bench/op_host_cost", help="output path without extension")
    ap.add_argument("--calls", type=positive_int, default=40, help="timed calls per path (default 40)")
    add_batch_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> None:
    """Time every path, profile the attention forward op, write OUT.md and OUT.json."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    require_cuda(__spec__.name)
    fns = calls_to_time(args.batch, args.seq_len)
    rows = {label: host_us(fn, args.calls) for label, fn in fns.items()}
    profile = profile_text(fns["attention_fwd (custom op)"], args.calls)
    measured = ("host wall time per call of the training step's custom ops and the layers beneath them (mean of "
                f"{args.calls} calls with the GPU held busy), 0.6B Parallax shapes, local batch {args.batch} x "
                f"{args.seq_len}, bf16; cProfile of the attention forward op")
    result = {"meta": describe("Host time of the training step's custom ops", measured,
                               command_line(__spec__.name, argv)), "host_us": rows, "cprofile": profile}
    lines = [*table(["path (indented: called by the row above)", "host us per call"],
                    ((f"`{label.strip()}`" if label == label.lstrip() else
                      "&nbsp;" * (len(label) - len(label.lstrip())) + f"`{label.strip()}`", f"{us:.1f}")
                     for label, us in rows.items())),
             "", "cProfile of `attention_fwd (custom op)` (cumulative time):", "", "```", profile.strip(), "```"]
    print(write_result_page(args.out, result, lines))


if __name__ == "__main__":
    main()
