"""Draft bench: the column pass over paired key tiles (two warpgroups, one producer warp) against the shipped one."""
import json, sys, time
import torch, triton
from kernels.parallax import fused, hopper
from scripts.bench.drafts._cases import cuda_inputs, cu_from_lengths
from scripts.bench.drafts import column_kernels as scratch_ws

SHIPPED = hopper._bwd_dkdv_hopper_kernel


class Pair:
    def __init__(self, kir=False, stages=None, maxnreg=168, regs=240):
        self.kir, self.stages, self.maxnreg, self.regs = kir, stages, maxnreg, regs

    def __getitem__(self, grid):
        def launch(*args, **kw):
            kw = {**kw, "KEYS_IN_REGISTERS": self.kir, "CONSUMER_REGS": self.regs, "maxnreg": self.maxnreg}
            if self.stages:
                kw["STAGES"] = self.stages
            g = (triton.cdiv(args[10], 2 * kw["BN"]) * args[13],)
            return scratch_ws._bwd_dkdv_pair_kernel[g](*args, **kw)
        return launch


def variants(d):
    v = {"shipped": SHIPPED, "pair_s3": Pair(), "pair_s4": Pair(stages=4)}
    if d == 128:
        v["pair_s3_kregs"] = Pair(kir=True)
    return v


def run(kern, *a):
    hopper._bwd_dkdv_hopper_kernel = kern
    try:
        return fused.backward(*a)
    finally:
        hopper._bwd_dkdv_hopper_kernel = SHIPPED


def check(b, n, d, cu=None, window=None):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=1)
    cu_t = cu_from_lengths(cu, "cuda")
    scale = d ** -0.5
    f = fused.forward(q, r, k, v, scale, cu_t, window)
    args = (do, q, r, k, v, *f, scale, cu_t, window)
    ref = run(SHIPPED, *args)
    row = {"shape": [b, n, d], "docs": cu, "window": window}
    for name, kern in variants(d).items():
        a, b2 = run(kern, *args), run(kern, *args)
        row[name] = {"deterministic": all(torch.equal(x, y) for x, y in zip(a, b2)),
                     "bitwise_vs_shipped": all(torch.equal(x, y) for x, y in zip(a, ref)),
                     "max_abs_diff": [(x.float() - y.float()).abs().max().item() for x, y in zip(a[2:], ref[2:])]}
    print(json.dumps(row), flush=True)
    return row


def bench(b, n, d, rounds=5):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=2)
    scale = d ** -0.5
    f = fused.forward(q, r, k, v, scale)
    vs = variants(d)
    bwd = {name: [] for name in vs}
    for _ in range(rounds):
        for name, kern in vs.items():
            hopper._bwd_dkdv_hopper_kernel = kern
            try:
                bwd[name].append(triton.testing.do_bench(lambda: fused.backward(do, q, r, k, v, *f, scale), warmup=50, rep=300))
            finally:
                hopper._bwd_dkdv_hopper_kernel = SHIPPED
    med = lambda t: sorted(t)[len(t) // 2]
    row = {"shape": [b, n, d], "backward_ms": bwd, "backward_ratio": {k: med(t) / med(bwd["shipped"]) for k, t in bwd.items()}}
    print(json.dumps({"shape": row["shape"], "bwd": row["backward_ratio"], "shipped_ms": med(bwd["shipped"])}), flush=True)
    return row


if __name__ == "__main__":
    t0 = time.time()
    rows = [check(1, 2048, 128), check(1, 2048, 64), check(1, 4096, 128, cu=[1000, 2048, 1048]),
            check(1, 4096, 64, cu=[100, 3000, 996]), check(2, 2048, 128, window=300), check(2, 2048, 64, window=200),
            check(1, 1000, 128), check(1, 900, 64)]
    for shape in [(4, 4096, 128), (4, 4096, 64), (1, 16384, 128), (8, 2048, 128), (1, 16384, 64)]:
        rows.append(bench(*shape))
    print("seconds", time.time() - t0)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
