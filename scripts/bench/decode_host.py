"""Host time per eager decode call (``python -m scripts.bench.decode --host-cost``): a ``DecodePlan``
call against the public ``parallax_decode`` with and without its checks, and a CUDA-graph replay.

A decode step at batch 1 runs its kernel in microseconds, so the Python and launch work on the host
sets the step's time when the calls are not captured in a graph. Each call is timed on the host
while the GPU work queues behind it (no sync inside a round).
"""

from __future__ import annotations

import statistics
import time

import torch

from kernels import DecodePlan, parallax_decode
from scripts.bench.decode_timing import make_sets
from scripts.bench.results import table

SHAPE = dict(batch=1, length=4096, dim=128)
GOAL_US = 30.0  # the lean eager paths (a plan call, the API with check_seqlens=False)
CALLS = {  # the call as code (q, r, k, v, lens, out, plan, graph as in decode_calls) -> what it does
    "plan(q, r, k, v, lens, out=out)": "DecodePlan call into a preallocated output: tensors checked against the "
                                       "plan, one kernel launch",
    "plan(q, r, k, v, lens)": "DecodePlan call, output allocated",
    "parallax_decode(q, r, k, v, cache_seqlens=lens, check_seqlens=False)": "public API: inputs validated, cached "
                                                                           "plan, cache_seqlens values not read",
    "parallax_decode(q, r, k, v)": "public API without cache_seqlens (every sequence at length L)",
    "parallax_decode(q, r, k, v, cache_seqlens=lens)": "public API reading the min and max of cache_seqlens on the "
                                                       "host (a sync)",
    "graph.replay()": "replay of a CUDA graph holding one DecodePlan call",
}
LEAN = tuple(CALLS)[:3]  # the plan calls and the API with check_seqlens=False


def host_us_per_call(fns, calls=200, rounds=15, sync=None, clock=time.perf_counter) -> dict:
    """Host microseconds per call of each function in ``fns`` (name -> fn()): each function is called
    once untimed (compiles, builds cached plans), then ``rounds`` rounds in which every function in
    turn is called ``calls`` times back to back (interleaved, so drift of a shared host hits all).
    ``sync`` (default ``torch.cuda.synchronize``) runs before each timed block, so a block starts
    with an empty queue. Returns name -> {"median_us", "min_us", "rounds_us" (one value per round)}."""
    sync = sync or torch.cuda.synchronize
    for fn in fns.values():
        fn()
    per_round = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync()
            start = clock()
            for _ in range(calls):
                fn()
            per_round[name].append((clock() - start) / calls * 1e6)
    sync()
    return {name: {"median_us": statistics.median(us), "min_us": min(us), "rounds_us": us}
            for name, us in per_round.items()}


def decode_calls(batch, length, dim) -> dict:
    """The functions ``CALLS`` names, on one bf16 CUDA input set (q, r (batch, 1, HQ, dim), caches
    (batch, length, HKV, dim), cache_seqlens int32 all ``length``); the graph holds one plan call."""
    q, r, k, v = make_sets(batch, length, dim, 1)[0]
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    plan = DecodePlan.like(q, k)
    out = torch.empty_like(q)
    plan(q, r, k, v, lens, out=out)  # compiles the kernel before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(q, r, k, v, lens, out=out)
    fns = [lambda: plan(q, r, k, v, lens, out=out), lambda: plan(q, r, k, v, lens),
           lambda: parallax_decode(q, r, k, v, cache_seqlens=lens, check_seqlens=False),
           lambda: parallax_decode(q, r, k, v), lambda: parallax_decode(q, r, k, v, cache_seqlens=lens),
           graph.replay]
    return dict(zip(CALLS, fns))


def run(calls=200, rounds=15) -> dict:
    """``host_us_per_call`` of ``decode_calls`` at SHAPE on the current CUDA device."""
    return host_us_per_call(decode_calls(**SHAPE), calls=calls, rounds=rounds)


MEASURED = ("host time per eager call of Parallax decode (one query token against a KV cache), "
            "B1, L=4096, Hq16/Hkv8, D128, bf16, cache_seqlens int32 where passed: DecodePlan calls, "
            "kernels.parallax_decode with and without its checks, and a CUDA-graph replay of one plan call; "
            "wall time of 200 calls enqueued back to back divided by 200, median over 15 rounds in which "
            "the calls take turns.")


def markdown(times: dict) -> str:
    """The body of the host-cost page: one row per ``CALLS`` entry measured (median us per call),
    then the goal for the lean paths (the first three rows) and whether they all met it."""
    rows = ((f"`{name}`", what, f"{times[name]['median_us']:.1f}") for name, what in CALLS.items() if name in times)
    lines = table(["call", "what one call does", "host us per call"], rows)
    met = all(times[name]["median_us"] <= GOAL_US for name in LEAN if name in times)
    lines += ["", f"Goal for the lean eager paths (the two plan calls and the API with check_seqlens=False): at most "
              f"{GOAL_US:.0f} us per call; {'met' if met else 'not met'}."]
    return "\n".join(lines) + "\n"
