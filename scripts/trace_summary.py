"""Where a training step's GPU time goes: sum a PyTorch profiler (Chrome) trace's kernels by group.

TorchTitan writes one trace per rank with ``--profiling.enable_profiling`` (at
``<dump_folder>/<save_traces_folder>/iteration_<N>/rank<R>_trace.json``); this prints the GPU
kernel time per group (attention forward/backward, matmuls, optimizer, communication, other),
the heaviest kernels, and the CPU ops that launched the most GPU time (kernels link to their op
through the trace's "External id"), as markdown, and optionally writes it to a file.

    python scripts/trace_summary.py outputs/run/profile_traces/iteration_20/rank0_trace.json \
        [--top 25] [--out summary.md]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

# first matching pattern names the group; checked against the lower-cased kernel name
GROUPS = [
    ("attention backward", r"bwd|bprop|dot_do_o|backward.*attn|attn.*backward|dkdv|_bwd_dq"),
    ("attention forward", r"_fwd_kernel|flash|fmha|cudnn.*attn|sdpa|attention"),
    ("communication", r"nccl"),
    ("matmul", r"gemm|sm90_xmma|cutlass|wgmma|nvjet|matmul|_mm_"),
    ("optimizer / foreach", r"foreach|multi_tensor|adam"),
    ("copy / cast", r"copy|cast|convert"),
]


def kernel_events(trace: dict) -> list[dict]:
    """GPU kernel events ('cat' == 'kernel') with 'name' and 'dur' (microseconds)."""
    return [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]


def group_of(name: str) -> str:
    low = name.lower()
    return next((group for group, pattern in GROUPS if re.search(pattern, low)), "other (elementwise, norms, loss)")


def launching_ops(trace: dict) -> dict[int, str]:
    """External id -> name of the CPU op (e.g. aten::mul, an Inductor kernel call) with that id."""
    return {e["args"]["External id"]: e["name"] for e in trace.get("traceEvents", [])
            if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}


def summarize(events: list[dict], top: int, ops: dict[int, str] | None = None) -> str:
    """Markdown: time per group (ms, share), the `top` kernels by total time and, given the
    External id -> CPU op map, the `top` launching ops by the GPU time of their kernels."""
    by_group, by_name, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for e in events:
        by_group[group_of(e["name"])] += e["dur"]
        by_name[e["name"]] += e["dur"]
        count[e["name"]] += 1
    total = sum(by_group.values()) or 1.0
    lines = [f"GPU kernel time in the trace: {total / 1e3:.2f} ms over {len(events)} kernels", "",
             "| group | ms | share |", "|---|---|---|"]
    for group, us in sorted(by_group.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {group} | {us / 1e3:.2f} | {100 * us / total:.1f}% |")
    lines += ["", "| kernel | calls | ms | share |", "|---|---|---|---|"]
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| `{name[:160]}` | {count[name]} | {us / 1e3:.2f} | {100 * us / total:.1f}% |")
    if ops:
        by_op, op_count = defaultdict(float), defaultdict(int)
        for e in events:
            op = ops.get(e.get("args", {}).get("External id"), "(no CPU op)")
            by_op[op] += e["dur"]
            op_count[op] += 1
        lines += ["", "| launching CPU op | kernels | ms | share |", "|---|---|---|---|"]
        for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"| `{op[:160]}` | {op_count[op]} | {us / 1e3:.2f} | {100 * us / total:.1f}% |")
    return "\n".join(lines) + "\n"


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="Chrome trace JSON (optionally .gz) from torch.profiler")
    parser.add_argument("--top", type=int, default=25, help="how many kernels to list")
    parser.add_argument("--out", help="also write the markdown here")
    args = parser.parse_args()
    trace = load(args.trace)
    text = summarize(kernel_events(trace), args.top, launching_ops(trace))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
