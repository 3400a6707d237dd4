"""Draft bench: the forward and the row pass over paired query tiles (``row_kernels``) against the
shipped kernels, in one process: bitwise agreement, determinism and fp64 error at nine shapes, then
forward and backward time ratios (median of five interleaved rounds) at five.

    python -m scripts.bench.drafts.bench_pairs OUT.json
"""

import contextlib
import json
import sys
import time

import torch
import triton

from kernels.parallax import fused, hopper, tuning
from kernels.parallax.naive import parallax_attention_naive
from scripts.bench.drafts import row_kernels as scratch_pair
from scripts.bench.drafts._cases import cu_from_lengths, cuda_inputs

HC = tuning.HopperConfig
NAMES = {"fwd": "_fwd_hopper_kernel", "dq": "_bwd_dq_hopper_kernel", "dkdv": "_bwd_dkdv_hopper_kernel"}
SHIPPED = {k: getattr(hopper, v) for k, v in NAMES.items()}


PAIR_REGISTERS = {"CONSUMER_REGS": 240, "maxnreg": 168}  # two consumer warpgroups and a producer warp per SM


class PairShim:
    def __init__(self, kernel, t_idx, h_idx, tile, **extra):
        self.kernel, self.t_idx, self.h_idx, self.tile, self.extra = kernel, t_idx, h_idx, tile, extra

    def __getitem__(self, grid):
        def launch(*args, **kw):
            kw = {**kw, **PAIR_REGISTERS, **self.extra}
            g = (triton.cdiv(args[self.t_idx], 2 * kw[self.tile]) * args[self.h_idx],)
            return self.kernel[g](*args, **kw)
        return launch


FWD = PairShim(scratch_pair._fwd_pair_kernel, 9, 11, "BM")
DQ = PairShim(scratch_pair._bwd_dq_pair_kernel, 13, 15, "BM")


def variants(d):
    """name -> {kernel name: (kernel, config or None)}; the column pass is the shipped one in all."""
    v = {"shipped": {}, "fwd_pair": {"fwd": (FWD, HC(64, 64, 4, 2 if d == 128 else 3))}}
    if d == 128:
        v["dq_pair_64x32_s2"] = {"dq": (DQ, HC(64, 32, 4, 2))}
        v["dq_pair_64x32_s4"] = {"dq": (DQ, HC(64, 32, 4, 4))}
    else:
        v["dq_pair_64x32_s4"] = {"dq": (DQ, HC(64, 32, 4, 4))}
        v["dq_pair_64x64_s3"] = {"dq": (DQ, HC(64, 64, 4, 3))}
    return v


@contextlib.contextmanager
def use(variant, d):
    with contextlib.ExitStack() as stack:
        for name, (kernel, config) in variant.items():
            if config is not None:
                stack.enter_context(tuning.hopper_config(name, d, config))
            setattr(hopper, NAMES[name], kernel)
        try:
            yield
        finally:
            for name in NAMES:
                setattr(hopper, NAMES[name], SHIPPED[name])


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(b, n, d, cu=None, window=None, ref=False):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=1)
    cu_t = cu_from_lengths(cu, "cuda")
    scale = d ** -0.5
    outs = {}
    for name, var in variants(d).items():
        runs = []
        for _ in range(2):
            with use(var, d):
                f = fused.forward(q, r, k, v, scale, cu_t, window)
                g = fused.backward(do, q, r, k, v, *f, scale, cu_t, window)
            runs.append([*f, *g])
        outs[name] = runs
    row = {"shape": [b, n, d], "docs": cu, "window": window}
    base = outs["shipped"][0]
    grads64 = None
    if ref:
        x64 = [t.double().requires_grad_() for t in (q, r, k, v)]
        o = parallax_attention_naive(*x64, scale=scale, causal=True, cu_seqlens=cu_t)
        o.backward(do.double())
        grads64 = [o.detach()] + [t.grad for t in x64]
    for name, (a, a2) in outs.items():
        row[name] = {"deterministic": all(torch.equal(x, y) for x, y in zip(a, a2)),
                     "bitwise": [torch.equal(x, y) for x, y in zip(a, base)],
                     "rel_vs_shipped": [rel(x, y) for x, y in zip(a, base)]}
        if grads64 is not None:  # o, dq, dr, dk, dv
            row[name]["rel_vs_fp64"] = [rel(a[0], grads64[0])] + [rel(x, y) for x, y in zip(a[4:], grads64[1:])]
    print(json.dumps(row), flush=True)
    return row


def bench(b, n, d, rounds=5):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=2)
    scale = d ** -0.5
    f = fused.forward(q, r, k, v, scale)
    vs = variants(d)
    fwd = {name: [] for name in vs}
    bwd = {name: [] for name in vs}
    for _ in range(rounds):
        for name, var in vs.items():
            with use(var, d):
                if name in ("shipped", "fwd_pair"):
                    fwd[name].append(triton.testing.do_bench(lambda: fused.forward(q, r, k, v, scale), warmup=50, rep=200))
                if name != "fwd_pair":
                    bwd[name].append(triton.testing.do_bench(lambda: fused.backward(do, q, r, k, v, *f, scale), warmup=50, rep=300))
    med = lambda t: sorted(t)[len(t) // 2]
    row = {"shape": [b, n, d], "forward_ms": fwd, "backward_ms": bwd,
           "forward_ratio": {k: med(t) / med(fwd["shipped"]) for k, t in fwd.items() if t},
           "backward_ratio": {k: med(t) / med(bwd["shipped"]) for k, t in bwd.items() if t}}
    print(json.dumps({"shape": row["shape"], "fwd": row["forward_ratio"], "bwd": row["backward_ratio"],
                      "shipped_ms": [med(fwd["shipped"]), med(bwd["shipped"])]}), flush=True)
    return row


if __name__ == "__main__":
    t0 = time.time()
    rows = [check(1, 2048, 128, ref=True), check(1, 2048, 64, ref=True), check(1, 4096, 128, cu=[1000, 2048, 1048]),
            check(1, 4096, 64, cu=[100, 3000, 996]), check(2, 2048, 128, window=300), check(2, 2048, 64, window=200),
            check(1, 1000, 128), check(1, 900, 64), check(1, 1040, 128)]
    for shape in [(4, 4096, 128), (4, 4096, 64), (1, 16384, 128), (8, 2048, 128), (1, 16384, 64)]:
        rows.append(bench(*shape))
    print("seconds", time.time() - t0)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
