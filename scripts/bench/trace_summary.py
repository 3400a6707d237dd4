"""Where a training step's GPU time goes: sum a PyTorch profiler (Chrome) trace's kernels by group.

TorchTitan writes one trace per rank with ``--profiling.enable_profiling`` (at
``<dump_folder>/<save_traces_folder>/iteration_<N>/rank<R>_trace.json``); this prints the GPU
kernel time per group (attention forward/backward, matmuls, optimizer, communication, other),
the heaviest kernels, the CPU ops that launched the most GPU time (kernels link to their op
through the trace's "External id") and the timeline: the span from the first kernel's start to the
last kernel's end, the time no kernel runs (GPU idle: host-bound or waiting), and the communication
time no other kernel overlaps (exposed communication), and what the host was inside while the GPU
idled (the outermost and innermost host events, on the thread that launches the kernels, at the
middle of each idle gap) and the idle time per tenth of the span, as markdown (after the results
header), optionally written to OUT.md.

    python -m scripts.bench.trace_summary outputs/run/profile_traces/iteration_20/rank0_trace.json \
        [--top 25] [--out summary]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter, defaultdict

from scripts.bench.results import command_line, describe, header, positive_int, table, write_results

# first matching pattern names the group; checked against the lower-cased kernel name
GROUPS = [
    ("attention backward", r"bwd|bprop|dot_do_o|backward.*attn|attn.*backward|dkdv|_bwd_dq"),
    ("attention forward", r"_fwd_kernel|_fwd_hopper_kernel|_fwd_paired_kernel|flash|fmha|cudnn.*attn|sdpa|attention"),
    ("communication", r"nccl"),
    ("matmul", r"gemm|sm90_xmma|cutlass|wgmma|nvjet|matmul|_mm_|symmetric_product"),
    ("optimizer / foreach", r"foreach|multi_tensor|adam"),
    # Inductor's fused pointwise/reduction kernels name the ops they fuse, often `_to_copy` (a dtype
    # cast folded into a norm or the loss): they are compute, not copies
    ("other (elementwise, norms, loss)", r"^triton_(poi|red|per)_"),
    ("copy / cast", r"copy|cast|convert|memcpy|memset"),
]
# The stream's memcpy and memset (e.g. the copy of baddbmm's input into its output) occupy the GPU
# between kernels like a kernel does: counted as GPU work, not idle time.
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def kernel_events(trace: dict) -> list[dict]:
    """GPU work events (``GPU_WORK``: kernels, memcpy, memset) with 'name' and 'dur' (microseconds)."""
    return [e for e in trace.get("traceEvents", []) if e.get("cat") in GPU_WORK and "dur" in e]


def group_of(name: str) -> str:
    """The group (GROUPS) of a kernel name; unmatched names count as elementwise work."""
    low = name.lower()
    return next((group for group, pattern in GROUPS if re.search(pattern, low)), "other (elementwise, norms, loss)")


def launching_ops(trace: dict) -> dict[int, str]:
    """External id -> name of the CPU op (e.g. aten::mul, an Inductor kernel call) with that id."""
    return {e["args"]["External id"]: e["name"] for e in trace.get("traceEvents", [])
            if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted cover of (start, end) intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def timeline(events: list[dict]) -> dict[str, float]:
    """Microseconds: ``span`` (first kernel start to last kernel end), ``busy`` (some kernel runs),
    ``idle`` (span - busy), ``communication`` (some NCCL kernel runs) and ``exposed_communication``
    (an NCCL kernel runs and no other kernel does: communication the step waits for)."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events]
    comm = _union([s for s, e in zip(spans, events) if group_of(e["name"]) == "communication"])
    compute = _union([s for s, e in zip(spans, events) if group_of(e["name"]) != "communication"])
    busy = _union(spans)
    span = (busy[-1][1] - busy[0][0]) if busy else 0.0
    overlap = _length(_union(comm + compute)) if comm else 0.0
    exposed = overlap - _length(compute) if comm else 0.0
    return {"span": span, "busy": _length(busy), "idle": span - _length(busy),
            "communication": _length(comm), "exposed_communication": exposed}


HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "python_function")


def _busy_gaps(events: list[dict], min_gap: float) -> list[tuple[float, float]]:
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in events])
    return [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= min_gap]


def idle_by_tenth(events: list[dict]) -> list[float]:
    """GPU idle microseconds in each tenth of the span, in order: where in the step the GPU waited (a
    training step runs forward, backward, optimizer)."""
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in events])
    if not busy:
        return [0.0] * 10
    first, width = busy[0][0], (busy[-1][1] - busy[0][0]) / 10
    out = [0.0] * 10
    for start, end in ((a[1], b[0]) for a, b in zip(busy, busy[1:])):
        for i in range(10):
            lo, hi = first + i * width, first + (i + 1) * width
            out[i] += max(0.0, min(end, hi) - max(start, lo))
    return out


def idle_causes(trace: dict, events: list[dict], min_gap: float = 10.0) -> dict[str, float]:
    """GPU idle microseconds per "outermost > innermost" host event running at the middle of each
    idle gap of at least ``min_gap`` us, on the thread that launched the most kernels. A
    ``cudaStreamSynchronize``-like innermost event means a host sync; "(none)" means Python between ops."""
    host = [e for e in trace.get("traceEvents", []) if e.get("cat") in HOST_CATS and "dur" in e]
    launches = Counter(e.get("tid") for e in host if e["cat"] == "cuda_runtime" and "Launch" in e["name"])
    if not launches:
        return {}
    tid = launches.most_common(1)[0][0]
    host = sorted((e for e in host if e.get("tid") == tid), key=lambda e: (e["ts"], -e["dur"]))
    out: dict[str, float] = defaultdict(float)
    stack: list[dict] = []
    k = 0
    for start, end in _busy_gaps(events, min_gap):
        mid = (start + end) / 2
        while k < len(host) and host[k]["ts"] <= mid:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= host[k]["ts"]:
                stack.pop()
            stack.append(host[k])
            k += 1
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= mid:
            stack.pop()
        live = [e for e in stack if e["ts"] + e["dur"] > mid]
        outer = next((e["name"] for e in live if not e["name"].startswith("ProfilerStep")), "(none)")
        inner = live[-1]["name"] if live else "(none)"
        out[f"{outer} > {inner}" if inner != outer else outer] += end - start
    return dict(out)


def _largest(totals: dict[str, float], top: int | None = None) -> list[tuple[str, float]]:
    """The ``top`` (all when None) entries of ``totals`` with the largest values, largest first."""
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


def _ms_share(us: float, total: float) -> tuple[str, str]:
    return f"{us / 1e3:.2f}", f"{100 * us / total:.1f}%"


def _op_table(events: list[dict], ops: dict[int, str], top: int, total: float) -> list[str]:
    """The ``top`` launching CPU ops by the GPU time of their kernels, as a markdown table."""
    by_op, op_count = defaultdict(float), defaultdict(int)
    for e in events:
        op = ops.get(e.get("args", {}).get("External id"), "(no CPU op)")
        by_op[op] += e["dur"]
        op_count[op] += 1
    return table(["launching CPU op", "kernels", "ms", "share"],
                 ((f"`{op[:160]}`", op_count[op], *_ms_share(us, total)) for op, us in _largest(by_op, top)))


def summarize(events: list[dict], top: int, ops: dict[int, str] | None = None,
              idle: dict[str, float] | None = None) -> str:
    """Markdown: time per group (ms, share), the timeline, the `top` kernels by total time and, given
    the External id -> CPU op map, the `top` launching ops by the GPU time of their kernels, and given
    ``idle_causes``, the `top` host events the GPU idled under."""
    by_group, by_name, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for e in events:
        by_group[group_of(e["name"])] += e["dur"]
        by_name[e["name"]] += e["dur"]
        count[e["name"]] += 1
    total = sum(by_group.values()) or 1.0
    times = timeline(events)
    copies = sum(e.get("cat") in ("gpu_memcpy", "gpu_memset") for e in events)
    lines = [f"GPU kernel time in the trace: {total / 1e3:.2f} ms over {len(events) - copies} kernels"
             + (f" and {copies} memcpy / memset" if copies else ""), ""]
    lines += table(["group", "ms", "share"], ((group, *_ms_share(us, total)) for group, us in _largest(by_group)))
    lines += ["", *table(["timeline", "ms", "share of span"],
                         ((key.replace("_", " "), *_ms_share(times[key], times["span"] or 1.0))
                          for key in ("span", "busy", "idle", "communication", "exposed_communication")))]
    lines += ["", *table(["idle ms per tenth of the span", *(f"{i + 1}" for i in range(10))],
                         [["", *(f"{us / 1e3:.2f}" for us in idle_by_tenth(events))]])]
    kernels = ((f"`{name[:160]}`", count[name], *_ms_share(us, total)) for name, us in _largest(by_name, top))
    lines += ["", *table(["kernel", "calls", "ms", "share"], kernels)]
    if ops:
        lines += ["", *_op_table(events, ops, top, total)]
    if idle:
        lines += ["", *table(["host inside (outermost > innermost) while the GPU idled", "ms"],
                             ((f"`{where[:160]}`", f"{us / 1e3:.2f}") for where, us in _largest(idle, top)))]
    return "\n".join(lines) + "\n"


def summary_of(trace: dict, top: int = 25) -> str:
    """``summarize`` of a loaded trace with its launching ops and idle causes: the markdown body."""
    events = kernel_events(trace)
    return summarize(events, top, launching_ops(trace), idle_causes(trace, events))


def load(path: str) -> dict:
    """The Chrome trace at ``path`` (JSON, or gzipped JSON when it ends in .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def recorded_on(trace: dict) -> str:
    """The GPU names the trace's ``deviceProperties`` list (the machine that recorded it), or "unknown"."""
    names = [d["name"] for d in trace.get("deviceProperties", []) if "name" in d]
    return ", ".join(dict.fromkeys(names)) or "unknown"


def main(argv: list[str] | None = None) -> None:
    """Print the summary of the trace on the command line (and write it to OUT.md)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.trace_summary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="Chrome trace JSON (optionally .gz) from torch.profiler")
    parser.add_argument("--top", type=positive_int, default=25, help="how many kernels to list")
    parser.add_argument("--out", help="also write the markdown to OUT.md")
    args = parser.parse_args(argv)
    try:
        trace = load(args.trace)
    except (OSError, EOFError, ValueError) as exc:  # missing, a folder, cut short, not JSON
        parser.error(f"trace: {args.trace!r} cannot be read ({exc}); expected a Chrome trace JSON (.json or .json.gz) "
                     "from torch.profiler")
    body = summary_of(trace, args.top)
    meta = describe("Where the GPU time of a profiled step goes",
                    f"GPU kernel time per group, timeline and idle causes in the profiler trace {args.trace} "
                    f"(recorded on {recorded_on(trace)}; the versions below are the summarising machine's)",
                    command_line(__spec__.name, argv))
    print(write_results(args.out, meta, body) if args.out else header(meta) + body)


if __name__ == "__main__":
    main()
