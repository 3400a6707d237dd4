"""Inputs and timing of the decode benchmark (``scripts.bench.decode``): KV-cache input sets rotated
beyond the L2 cache, CUDA-graph replay timing, and the device's copy bandwidth."""

from __future__ import annotations

import math
import statistics

import torch

HQ, HKV = 16, 8
DTYPE = torch.bfloat16


def log(*args):
    """Print at once (the benchmark runs for minutes; its output is read while it runs)."""
    print(*args, flush=True)


def make_sets(batch, length, dim, n_sets, rho=0.5, hq=HQ, hkv=HKV):
    """``n_sets`` random CUDA input sets (q, r of shape (batch, 1, hq, dim), r scaled by
    rho / sqrt(dim); k, v of shape (batch, length, hkv, dim)), all DTYPE."""
    sets = []
    for _ in range(n_sets):
        q = torch.randn(batch, 1, hq, dim, device="cuda", dtype=DTYPE)
        r = torch.randn(batch, 1, hq, dim, device="cuda", dtype=DTYPE) * (rho / math.sqrt(dim))
        k = torch.randn(batch, length, hkv, dim, device="cuda", dtype=DTYPE)
        v = torch.randn(batch, length, hkv, dim, device="cuda", dtype=DTYPE)
        sets.append((q, r, k, v))
    return sets


def kv_bytes(batch, length, dim):
    """Bytes of one input set's K and V (HKV heads, DTYPE)."""
    return 2 * batch * length * HKV * dim * torch.finfo(DTYPE).bits // 8


def n_sets_for(nbytes):
    """How many input sets of ``nbytes`` each exceed three times the L2 cache (1 to 64)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(64, math.ceil(3 * l2 / nbytes)))


def time_us(fn, sets, min_calls=24, replays=7):
    """Median microseconds per call: graph replay of >= min_calls calls over the sets."""
    calls = [lambda s=s: fn(*s) for s in sets]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    rounds = max(1, math.ceil(min_calls / len(calls)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for c in calls:
                c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / (rounds * len(calls)))
    del graph
    return statistics.median(times)


def copy_bandwidth():
    """Device-to-device copy, bytes read + written per second (the HBM ceiling)."""
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = time_us(lambda a, b: b.copy_(a), [(x, y)], min_calls=10)
    del x, y
    return 2 * 2 * 1024**3 / t / 1e6
