"""Sweep the launch configs of the Hopper kernels (kernels/parallax/hopper.py) on one sm_90 GPU.

Per head dim at B4 L4096 Hq16 Hkv8, bf16, causal: the backward (``fused.backward`` called directly on
one forward's outputs) with the Triton passes, then with the Hopper kernels under each candidate of
each pass (``tuning.HopperConfig``: tiles, warps, ring stages; the other pass at its shipped config),
then the fastest candidate of each pass together, all in one run, beside cuDNN softmax's forward +
backward and our forward. Then the shipped configs and that pair against the Triton passes at B1
L16384 and B8 L2048. A config joins ``tuning.HOPPER_CONFIGS`` when it wins.

``--column`` times the column pass's configs in ``COLUMN_CANDIDATES`` (k in registers or in shared
memory, ring stages) against each other at D=128, interleaved, at the three shapes; ``--row`` the row
pass's in ``ROW_CANDIDATES`` (statistics in shared memory or in registers) the same way.
``--pingpong`` times the warp-specialised kernels (the paired forward, the column pass) with their
two consumers taking turns (``HopperConfig.pingpong``) against the shipped configs, interleaved, at
the three shapes, with whether their outputs are the shipped configs' bits. ``--forward`` sweeps the
forward instead: at B4 L4096 and B1 L16384, the Triton forward (autotuned)
and the Hopper forward under each candidate of ``FORWARD_CANDIDATES``, timed interleaved (rounds
that each run every candidate in turn, 10 calls back to back between two CUDA events; medians).

    python -m scripts.bench.attention_hopper --out docs/bench/attention_hopper
    python -m scripts.bench.attention_hopper --forward --out docs/bench/attention_hopper_forward_sweep
    python -m scripts.bench.attention_hopper --column --out docs/bench/attention_hopper_column
    python -m scripts.bench.attention_hopper --row --out docs/bench/attention_hopper_row
    python -m scripts.bench.attention_hopper --pingpong --out docs/bench/attention_hopper_pingpong
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from kernels.parallax import fused, tuning
from kernels.parallax.tuning import HopperConfig
from scripts.bench.attention import make_inputs
from scripts.bench.attention_loops import cudnn_ms
from scripts.bench.results import command_line, describe, table, write_results

# (BM, BN, num_warps, stages[, register cap, k in registers, statistics in shared]) candidates per pass and
# head dim
CANDIDATES = {
    "dq": {128: [HopperConfig(*c) for c in [(64, 32, 4, 2), (64, 32, 4, 3), (128, 32, 8, 2), (128, 32, 8, 3),
                                          (64, 64, 4, 2), (128, 64, 8, 2)]]
           + [HopperConfig(64, 64, 4, 2, stats_in_shared=True)],
           64: [HopperConfig(*c) for c in [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3),
                                         (64, 32, 4, 4), (128, 32, 8, 2)]]},
    "dkdv": {128: [HopperConfig(*c) for c in [(32, 64, 4, 2), (32, 64, 4, 3), (32, 64, 4, 4),
                                            (32, 64, 4, 3, None, True), (32, 64, 4, 2, None, True)]],
             64: [HopperConfig(*c) for c in [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (32, 64, 4, 3),
                                           (32, 64, 4, 4)]] + [HopperConfig(64, 64, 4, 3, pingpong=True)]},
}
# (BM, BN, num_warps, stages[, register cap]) candidates of the forward per head dim; paired: two
# consumer warpgroups over adjacent query tiles and a producer warp
FORWARD_CANDIDATES = {
    128: [HopperConfig(*c) for c in [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 2)]]
    + [HopperConfig(64, 64, 4, s, paired=True) for s in (2, 3)],
    64: [HopperConfig(*c) for c in [(64, 64, 4, 3), (64, 64, 4, 3, 168), (64, 64, 4, 4, 168), (64, 32, 4, 4)]]
    + [HopperConfig(64, 64, 4, 3, paired=True)],
}
FORWARD_SHAPES = [(4, 4096, 16, 8), (1, 16384, 16, 8)]
# Column pass configs ``--column`` times against each other (D=128): k in registers or not, ring stages
COLUMN_CANDIDATES = [HopperConfig(32, 64, 4, 3, None, True), HopperConfig(32, 64, 4, 3),
                     HopperConfig(32, 64, 4, 2, None, True)]
# Row pass configs ``--row`` times against each other (D=128), the shipped first: three of its statistics
# in shared memory, or all in registers
ROW_CANDIDATES = [HopperConfig(64, 64, 4, 2, stats_in_shared=True), HopperConfig(64, 64, 4, 2)]
COMPARED = {"dkdv": COLUMN_CANDIDATES, "dq": ROW_CANDIDATES}
SWEEP_SHAPE = (4, 4096, 16, 8)  # B, L, Hq, Hkv
OTHER_SHAPES = [(1, 16384, 16, 8), (8, 2048, 16, 8)]


def label(config: HopperConfig) -> str:
    """A config as the sweep's rows name it: "32x64 w4 s3" (BM x BN, warps, ring stages; " r168" with a
    register cap, " k in registers" with the column pass's k held there, " paired" for the forward over
    paired query tiles, " stats in shared" for the row pass's statistics read from shared memory,
    " pingpong" for consumers taking turns)."""
    cap = "" if config.maxnreg is None else f" r{config.maxnreg}"
    keys = " k in registers" if config.keys_in_registers else ""
    paired = " paired" if config.paired else ""
    stats = " stats in shared" if config.stats_in_shared else ""
    turns = " pingpong" if config.pingpong else ""
    return f"{config.bm}x{config.bn} w{config.warps} s{config.stages}{cap}{keys}{paired}{stats}{turns}"


@contextlib.contextmanager
def configs(d: int, pair: dict):
    """Within the block the Hopper passes run ``pair`` ({"dq": config, "dkdv": config}) at head dim d."""
    with contextlib.ExitStack() as stack:
        for name, config in pair.items():
            stack.enter_context(tuning.hopper_config(name, d, config))
        yield


def backward_problem(shape: tuple, d: int):
    """A backward to time on random bf16 inputs of ``shape`` (B, L, Hq, Hkv) and head dim d, and its
    baselines: (run() -> (dq, dr, dk, dv), forward ms, cuDNN softmax forward + backward ms)."""
    import triton

    q, r, k, v = make_inputs(*shape, d)
    do = torch.randn_like(q)
    scale = q.shape[-1] ** -0.5
    saved = fused.forward(q, r, k, v, scale)
    forward_ms = triton.testing.do_bench(lambda: fused.forward(q, r, k, v, scale), warmup=25, rep=100)
    return lambda: fused.backward(do, q, r, k, v, *saved, scale), forward_ms, cudnn_ms(q, k, v, do)


def timer(shape: tuple, d: int):
    """(forward ms, cuDNN softmax forward + backward ms, backward(hopper: bool) -> ms) of
    ``backward_problem(shape, d)``."""
    import triton

    step, forward_ms, cudnn = backward_problem(shape, d)

    def backward_ms(hopper: bool) -> float:
        with tuning.hopper_kernels(hopper):
            step()  # compile (and autotune the Triton passes) outside the timing
            torch.cuda.synchronize()
            return triton.testing.do_bench(step, warmup=25, rep=100)

    return forward_ms, cudnn, backward_ms


def row(shape, d, what, ms, forward_ms, cudnn, triton_ms):
    return {"B": shape[0], "L": shape[1], "D": d, "backward": what, "ms": ms, "vs_triton": ms / triton_ms,
            "fwd_bwd_vs_cudnn": (forward_ms + ms) / cudnn}


def sweep(d: int) -> tuple[list[dict], dict]:
    """Rows of the sweep at SWEEP_SHAPE and head dim d (the Triton passes, every candidate, the fastest
    pair) and that pair ({"dq": config, "dkdv": config})."""
    forward_ms, cudnn, backward_ms = timer(SWEEP_SHAPE, d)
    triton_ms = backward_ms(False)
    rows = [row(SWEEP_SHAPE, d, "triton passes", triton_ms, forward_ms, cudnn, triton_ms)]
    best = {}
    for name in ("dkdv", "dq"):
        timed = []
        for config in CANDIDATES[name][d]:
            with configs(d, {name: config}):
                timed.append((backward_ms(True), config))
            rows.append(row(SWEEP_SHAPE, d, f"hopper, {name} {label(config)}", timed[-1][0], forward_ms, cudnn,
                            triton_ms))
        best[name] = min(timed)[1]
    with configs(d, best):
        rows.append(row(SWEEP_SHAPE, d, f"hopper, fastest pair: {pair_label(best)}", backward_ms(True), forward_ms,
                        cudnn, triton_ms))
    return rows, best


def pair_label(pair: dict) -> str:
    return f"dq {label(pair['dq'])} + dkdv {label(pair['dkdv'])}"


def elsewhere(d: int, best: dict) -> list[dict]:
    """The shipped configs and the sweep's fastest pair ``best`` against the Triton passes at OTHER_SHAPES."""
    rows = []
    for shape in OTHER_SHAPES:
        forward_ms, cudnn, backward_ms = timer(shape, d)
        triton_ms = backward_ms(False)
        rows.append(row(shape, d, "triton passes", triton_ms, forward_ms, cudnn, triton_ms))
        rows.append(row(shape, d, "hopper, shipped", backward_ms(True), forward_ms, cudnn, triton_ms))
        with configs(d, best):
            rows.append(row(shape, d, f"hopper, fastest pair: {pair_label(best)}", backward_ms(True), forward_ms,
                            cudnn, triton_ms))
    return rows


def forward_sweep(d: int, rounds: int = 15) -> list[dict]:
    """Rows per shape of FORWARD_SHAPES at head dim d: the Triton forward and the Hopper forward under
    each of FORWARD_CANDIDATES[d], timed interleaved (ms per call, and against the Triton forward)."""
    from scripts.bench.attention_autotune import back_to_back, interleaved_ms

    rows = []
    for shape in FORWARD_SHAPES:
        q, r, k, v = make_inputs(*shape, d)
        scale = d ** -0.5
        fns = {"triton": lambda: fused.forward(q, r, k, v, scale, hopper=False)}
        for config in FORWARD_CANDIDATES[d]:
            fns[f"hopper {label(config)}"] = lambda config=config: _forward_with(config, q, r, k, v, scale)
        with torch.no_grad():
            for fn in fns.values():
                fn()  # compile (and autotune the Triton forward) outside the timing
            ms = interleaved_ms(fns, rounds, 10, back_to_back)
        rows += [{"B": shape[0], "L": shape[1], "D": d, "forward": name, "ms": t, "vs_triton": t / ms["triton"]}
                 for name, t in ms.items()]
    return rows


def _forward_with(config: HopperConfig, q, r, k, v, scale):
    with tuning.hopper_config("fwd", q.shape[-1], config):
        return fused.forward(q, r, k, v, scale)


def pass_comparison(name: str, d: int = 128, rounds: int = 7) -> list[dict]:
    """Rows per shape of SWEEP_SHAPE and OTHER_SHAPES: the backward with pass ``name`` ("dkdv" or "dq")
    under each of its COMPARED candidates (the other pass at its shipped config), timed interleaved
    (``rounds`` rounds, each a do_bench median per candidate), whether its gradients are the first
    candidate's bits, and forward + backward against cuDNN softmax's forward + backward."""
    from scripts.bench.attention_autotune import do_bench_ms, interleaved_ms

    candidates = COMPARED[name]
    rows = []
    for shape in [SWEEP_SHAPE, *OTHER_SHAPES]:
        step, forward_ms, cudnn = backward_problem(shape, d)
        fns = {label(c): lambda c=c: _under(d, {name: c}, step) for c in candidates}
        grads = {tag: fn() for tag, fn in fns.items()}  # compiles outside the timing
        first = grads[label(candidates[0])]
        ms = interleaved_ms(fns, rounds, 1, do_bench_ms)
        rows += [{"B": shape[0], "L": shape[1], "D": d, "pass": name, "config": tag, "backward_ms": t,
                  "fwd_bwd_vs_cudnn": (forward_ms + t) / cudnn, "forward_ms": forward_ms, "cudnn_ms": cudnn,
                  "same_bits": all(torch.equal(a, b) for a, b in zip(grads[tag], first))}
                 for tag, t in ms.items()]
    return rows


def pingpong_candidates(name: str, d: int) -> list[HopperConfig]:
    """Configs of kernel ``name`` ("fwd" or "dkdv") that ``--pingpong`` compares at head dim d, the shipped
    first: the forward paired (where it ships unpaired) and paired with turns; the column pass with turns."""
    shipped = tuning.HOPPER_CONFIGS[name][d]
    if name == "dkdv" or shipped.paired:
        return [shipped, shipped._replace(pingpong=True)]
    paired = shipped._replace(paired=True, maxnreg=None)
    return [shipped, paired, paired._replace(pingpong=True)]


def pingpong_comparison(d: int = 128, rounds: int = 7) -> list[dict]:
    """Rows per shape of SWEEP_SHAPE and OTHER_SHAPES: the forward under each ``pingpong_candidates("fwd",
    d)`` config (10 calls back to back per timing) and the backward with the column pass under each of
    ``pingpong_candidates("dkdv", d)`` (do_bench medians), timed interleaved over ``rounds`` rounds;
    ms, the ratio to the shipped config, and whether the outputs are the shipped config's bits."""
    from scripts.bench.attention_autotune import back_to_back, do_bench_ms, interleaved_ms

    rows = []
    for shape in [SWEEP_SHAPE, *OTHER_SHAPES]:
        q, r, k, v = make_inputs(*shape, d)
        step, _, _ = backward_problem(shape, d)
        problems = {"fwd": (lambda: fused.forward(q, r, k, v, d ** -0.5), back_to_back, 10),
                    "dkdv": (step, do_bench_ms, 1)}
        for name, (run, timer_fn, iters) in problems.items():
            candidates = pingpong_candidates(name, d)
            fns = {label(c): lambda c=c: _under(d, {name: c}, run) for c in candidates}
            with torch.no_grad():
                outputs = {tag: fn() for tag, fn in fns.items()}  # compiles outside the timing
                ms = interleaved_ms(fns, rounds, iters, timer_fn)
            first = label(candidates[0])
            rows += [{"B": shape[0], "L": shape[1], "D": d, "kernel": name, "config": tag, "ms": t,
                      "vs_shipped": t / ms[first],
                      "same_bits": all(torch.equal(a, b) for a, b in zip(outputs[tag], outputs[first]))}
                     for tag, t in ms.items()]
    return rows


def pingpong_report_markdown(rows: list[dict]) -> str:
    cells = ((r["B"], r["L"], r["D"], r["kernel"], r["config"], f"{r['ms']:.4f}", f"{r['vs_shipped']:.3f}",
              "yes" if r["same_bits"] else "no") for r in rows)
    return "\n".join(table(["B", "L", "D", "kernel", "config", "ms", "/ shipped", "the shipped config's bits"],
                           cells)) + "\n"


PINGPONG_MEASURED = ("time of the forward (fused.forward under no_grad, 10 calls back to back between two CUDA "
                     "events) and of the backward (fused.backward after one forward, a triton.testing.do_bench "
                     "median) with the paired forward or the column pass under the shipped config and with its two "
                     "consumers taking turns (ping-pong), bf16, causal, Hq16/Hkv8, timed interleaved: 7 rounds, "
                     "the median of the rounds; whether the outputs (o, vbar, tbar, lse; dq, drho, dk, dv) are the "
                     "shipped config's bits")


def _under(d: int, pair: dict, step):
    """step() with the Hopper passes at ``pair``'s configs (``configs``)."""
    with configs(d, pair):
        return step()


def comparison_report_markdown(rows: list[dict]) -> str:
    cells = ((r["B"], r["L"], r["D"], r["pass"], r["config"], f"{r['backward_ms']:.3f}",
              f"{r['fwd_bwd_vs_cudnn']:.2f}", "yes" if r["same_bits"] else "no") for r in rows)
    return "\n".join(table(["B", "L", "D", "pass", "config", "backward ms", "fwd+bwd / cuDNN",
                            "gradients: the first row's bits"], cells)) + "\n"


COMPARISON_MEASURED = ("backward time (fused.backward after one forward, bf16, causal, Hq16/Hkv8) with one pass "
                       "(dkdv: the column pass, dq: the row pass) under each candidate config, the other at its "
                       "shipped config, timed interleaved: 7 rounds, each a triton.testing.do_bench median per "
                       "candidate, the median of the rounds; forward + backward against cuDNN softmax's forward + "
                       "backward of the same run")
COMPARISON_TITLES = {"dkdv": "Column pass on Hopper: k in registers",
                     "dq": "Row pass on Hopper: statistics in shared memory"}


def forward_report_markdown(rows: list[dict]) -> str:
    cells = ((r["B"], r["L"], r["D"], r["forward"], f"{r['ms']:.4f}", f"{r['vs_triton']:.3f}") for r in rows)
    return "\n".join(table(["B", "L", "D", "forward", "ms", "/ Triton forward"], cells)) + "\n"


FORWARD_MEASURED = ("forward time (fused.forward, bf16, causal, Hq16/Hkv8, under no_grad) of the Triton kernel "
                    "(autotuned over tuning.SHIPPED) and of the Hopper kernel under each candidate config, timed "
                    "interleaved: rounds that each run every candidate in turn, 10 calls back to back between two "
                    "CUDA events, median over 15 rounds")


MEASURED = ("backward time (fused.backward called directly after one forward, triton.testing.do_bench median, "
            "bf16, causal, Hq16/Hkv8) with the Triton passes and with the Hopper kernels under each candidate "
            "config (the other pass at its shipped config) and the fastest of each pass together; forward + "
            "backward against cuDNN softmax's forward + backward of the same run (our forward: the Hopper kernel)")


def report_markdown(rows: list[dict]) -> str:
    cells = ((r["B"], r["L"], r["D"], r["backward"], f"{r['ms']:.3f}", f"{r['vs_triton']:.3f}",
              f"{r['fwd_bwd_vs_cudnn']:.2f}") for r in rows)
    return "\n".join(table(["B", "L", "D", "backward", "ms", "/ Triton passes", "fwd+bwd / cuDNN"], cells)) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run the sweep, write its page and JSON (``--out``), print the page."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.attention_hopper", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output path without extension (default docs/bench/attention_hopper, with "
                                       "--forward docs/bench/attention_hopper_forward_sweep, with --column "
                                       "docs/bench/attention_hopper_column, with --row "
                                       "docs/bench/attention_hopper_row, with --pingpong "
                                       "docs/bench/attention_hopper_pingpong)")
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 64], choices=[128, 64], help="head dims")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--forward", action="store_true", help="sweep the forward's configs instead")
    mode.add_argument("--column", action="store_true",
                      help="time the column pass's COLUMN_CANDIDATES against each other, interleaved (D=128)")
    mode.add_argument("--row", action="store_true",
                      help="time the row pass's ROW_CANDIDATES against each other, interleaved (D=128)")
    mode.add_argument("--pingpong", action="store_true",
                      help="time the paired forward and the column pass with consumers taking turns against the "
                           "shipped configs, interleaved (--dims)")
    args = parser.parse_args(argv)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        raise SystemExit("scripts.bench.attention_hopper needs an sm_90 GPU (H100, H200)")
    if args.pingpong:
        rows = [row for d in args.dims for row in pingpong_comparison(d)]
        meta = describe("Ping-pong consumers on Hopper", PINGPONG_MEASURED, command_line(__spec__.name, argv))
        print(write_results(args.out or "docs/bench/attention_hopper_pingpong", meta, pingpong_report_markdown(rows),
                            {"rows": rows}))
        return
    if args.column or args.row:
        name, page = ("dkdv", "column") if args.column else ("dq", "row")
        rows = pass_comparison(name)
        meta = describe(COMPARISON_TITLES[name], COMPARISON_MEASURED, command_line(__spec__.name, argv))
        print(write_results(args.out or f"docs/bench/attention_hopper_{page}", meta, comparison_report_markdown(rows),
                            {"rows": rows}))
        return
    if args.forward:
        rows = [row for d in args.dims for row in forward_sweep(d)]
        meta = describe("Forward on Hopper: launch config sweep", FORWARD_MEASURED, command_line(__spec__.name, argv))
        print(write_results(args.out or "docs/bench/attention_hopper_forward_sweep", meta,
                            forward_report_markdown(rows), {"rows": rows}))
        return
    rows = []
    for d in args.dims:
        swept, best = sweep(d)
        rows += swept + elsewhere(d, best)
    meta = describe("Backward on Hopper: launch config sweep", MEASURED, command_line(__spec__.name, argv))
    print(write_results(args.out or "docs/bench/attention_hopper", meta, report_markdown(rows), {"rows": rows}))


if __name__ == "__main__":
    main()
