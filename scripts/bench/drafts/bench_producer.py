"""Draft bench: the warp-specialized column pass against the shipped one (backward through fused.backward)."""

import json
import sys
import time

import torch
import triton

from kernels.parallax import fused, hopper
from kernels.parallax.naive import parallax_attention_naive
from scripts.bench.drafts._cases import cu_from_lengths, cuda_inputs
from scripts.bench.drafts import column_kernels as scratch_ws

SHIPPED = hopper._bwd_dkdv_hopper_kernel


class WS:
    def __init__(self, lean, kir=False, maxnreg=128):
        self.lean, self.kir, self.maxnreg = lean, kir, maxnreg

    def __getitem__(self, grid):
        def launch(*args, **kw):
            kw = {**kw, "KEYS_IN_REGISTERS": self.kir, "LEAN": self.lean, "maxnreg": self.maxnreg}
            return scratch_ws._bwd_dkdv_ws_kernel[grid](*args, **kw)
        return launch


class SmemK:
    def __getitem__(self, grid):
        def launch(*args, **kw):
            return SHIPPED[grid](*args, **{**kw, "KEYS_IN_REGISTERS": False})
        return launch


VARIANTS = {"shipped": SHIPPED, "shipped_smem_k": SmemK(), "ws": WS(False), "ws_lean": WS(True)}


def run(kern, do, q, r, k, v, fwd, scale, cu=None, window=None):
    hopper._bwd_dkdv_hopper_kernel = kern
    try:
        return fused.backward(do, q, r, k, v, *fwd, scale, cu, window)
    finally:
        hopper._bwd_dkdv_hopper_kernel = SHIPPED


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(b, n, d, cu=None, window=None, ref=False):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=1)
    scale = d ** -0.5
    cu_t = cu_from_lengths(cu, "cuda")
    fwd = fused.forward(q, r, k, v, scale, cu_t, window)
    outs = {name: run(kern, do, q, r, k, v, fwd, scale, cu_t, window) for name, kern in VARIANTS.items()}
    again = {name: run(kern, do, q, r, k, v, fwd, scale, cu_t, window) for name, kern in VARIANTS.items()}
    row = {"shape": [b, n, d], "docs": cu, "window": window}
    for name, out in outs.items():
        row[name] = {"deterministic": all(torch.equal(x, y) for x, y in zip(out[2:], again[name][2:])),
                     "bitwise_vs_shipped": all(torch.equal(x, y) for x, y in zip(out[2:], outs["shipped"][2:])),
                     "rel_vs_shipped": [rel(x, y) for x, y in zip(out[2:], outs["shipped"][2:])]}
    if ref and window is None:
        x64 = [t.double().requires_grad_() for t in (q, r, k, v)]
        o = parallax_attention_naive(*x64, scale=scale, causal=True, cu_seqlens=cu_t)
        o.backward(do.double())
        for name, out in outs.items():
            row[name]["rel_vs_fp64_dk_dv"] = [rel(out[2], x64[2].grad), rel(out[3], x64[3].grad)]
    print(json.dumps(row), flush=True)
    return row


def bench(b, n, d, rounds=3):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=2)
    scale = d ** -0.5
    fwd = fused.forward(q, r, k, v, scale)
    times = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, kern in VARIANTS.items():
            hopper._bwd_dkdv_hopper_kernel = kern
            try:
                times[name].append(triton.testing.do_bench(lambda: fused.backward(do, q, r, k, v, *fwd, scale),
                                                           warmup=50, rep=300))
            finally:
                hopper._bwd_dkdv_hopper_kernel = SHIPPED
    row = {"shape": [b, n, d], "backward_ms": times,
           "median_ratio_vs_shipped": {name: sorted(t)[len(t) // 2] / sorted(times["shipped"])[1] for name, t in times.items()}}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    t0 = time.time()
    rows = [check(1, 2048, 128, ref=True), check(1, 2048, 64, ref=True),
            check(1, 4096, 128, cu=[1000, 2048, 1048]), check(1, 4096, 64, cu=[1000, 2048, 1048]),
            check(2, 2048, 128, window=300), check(1, 1000, 128)]
    for shape in [(4, 4096, 128), (4, 4096, 64), (1, 16384, 128), (8, 2048, 128), (1, 16384, 64)]:
        rows.append(bench(*shape))
    print("seconds", time.time() - t0)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
