"""GPU time per kernel of a decode step (``python -m scripts.bench.decode --kernel-times``): the split
kernel and the merge kernel of a ``TritonDecodePlan`` call, from the PyTorch profiler over eager calls.

Under CUDA-graph replay a split step's two kernels overlap (programmatic dependent launch), and the
benchmark table sees their sum less the overlap; this mode says what the step is made of.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from kernels.parallax import decode_fused
from scripts.bench.decode_timing import HKV, HQ, make_sets
from scripts.bench.results import table

KERNELS = {"_decode_split_kernel": "split kernel", "_merge_kernel": "merge kernel"}  # others: "other"
SHAPES = [(128, 1, 4096), (128, 1, 16384), (128, 8, 4096), (64, 1, 4096), (64, 1, 16384), (64, 8, 4096)]
MEASURED = ("GPU time per kernel of one Parallax decode step (a TritonDecodePlan call at the shipped launch "
            "configuration), bf16, Hq=16, Hkv=8, one input set: device time of each kernel under the PyTorch "
            "profiler, summed over 50 eager calls (after 20 untimed) and divided by 50, with and without "
            "programmatic dependent launch (PDL); us per call")


def kernel_us(events, calls: int) -> dict[str, float]:
    """Device microseconds per call of each kernel group (``KERNELS``' names, else "other") in the
    profiler ``events`` (objects with ``name``, ``device_type`` and ``device_time``, in us) of
    ``calls`` calls."""
    total = defaultdict(float)
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[KERNELS.get(event.name, "other")] += event.device_time / calls
    return dict(total)


def profile_plan(dim: int, batch: int, length: int, pdl: bool, calls: int = 50) -> dict:
    """One row: the plan's split count and ``kernel_us`` of ``calls`` eager calls at (dim, batch, length)."""
    q, r, k, v = make_sets(batch, length, dim, 1)[0]
    plan = decode_fused.TritonDecodePlan(batch, HQ, HKV, dim, length, q.dtype, q.device, scale=dim**-0.5,
                                         pdl=None if pdl else False)  # None: the plan's own PDL rule
    for _ in range(20):
        plan(q, r, k, v)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            plan(q, r, k, v)
        torch.cuda.synchronize()
    return {"D": dim, "B": batch, "L": length, "splits": plan.num_splits, "pdl": plan.pdl,
            "us": kernel_us(prof.events(), calls)}


def run(shapes=SHAPES, calls: int = 50) -> list[dict]:
    """``profile_plan`` rows at ``shapes`` ((D, B, L) each), without PDL and, where the device has it
    and the plan splits, with it."""
    rows = []
    for dim, batch, length in shapes:
        rows.append(profile_plan(dim, batch, length, False, calls))
        if rows[-1]["splits"] > 1 and decode_fused.pdl_supported(torch.device("cuda")):
            rows.append(profile_plan(dim, batch, length, True, calls))
    return rows


def markdown(rows: list[dict]) -> str:
    """The page body: one line per row, a column per kernel group, and their sum."""
    groups = [g for g in (*KERNELS.values(), "other") if any(g in row["us"] for row in rows)]
    lines = table(["D", "B", "L", "splits", "PDL", *(f"{g} us" for g in groups), "sum us"],
                  ([row["D"], row["B"], row["L"], row["splits"], "on" if row["pdl"] else "off",
                    *(f"{row['us'].get(g, 0.0):.2f}" for g in groups), f"{sum(row['us'].values()):.2f}"]
                   for row in rows))
    return "\n".join(lines) + ("\n\nWith PDL a kernel's time includes its wait for the kernel before it "
                               "(it starts early), so the kernels of a PDL row overlap and their sum "
                               "overstates the step.\n")
