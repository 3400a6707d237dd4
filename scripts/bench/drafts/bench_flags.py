"""Draft bench: TMA copies issued after the last wgmma of a tile (LATE) and negation-free gradients (NONEG)."""
import json, sys, time
import torch, triton
from kernels.parallax import fused, hopper
from scripts.bench.drafts._cases import cuda_inputs, cu_from_lengths
from scripts.bench.drafts import hopper_flags as sh

NAMES = {"fwd": "_fwd_hopper_kernel", "dq": "_bwd_dq_hopper_kernel", "dkdv": "_bwd_dkdv_hopper_kernel"}
SHIPPED = {k: getattr(hopper, v) for k, v in NAMES.items()}


class Shim:
    def __init__(self, kernel, **flags):
        self.kernel, self.flags = kernel, flags

    def __getitem__(self, grid):
        return lambda *a, **kw: self.kernel[grid](*a, **{**kw, **self.flags})


def variant(late, noneg):
    return {"fwd": Shim(sh._fwd_hopper_kernel, LATE=late),
            "dq": Shim(sh._bwd_dq_hopper_kernel, LATE=late, NONEG=noneg),
            "dkdv": Shim(sh._bwd_dkdv_hopper_kernel, LATE=late, NONEG=noneg)}


VARIANTS = {"shipped": SHIPPED, "noneg": variant(False, True), "late": variant(True, False),
            "late_noneg": variant(True, True)}


def use(kernels):
    for k, v in kernels.items():
        setattr(hopper, NAMES[k], v)


def fwd_bwd(q, r, k, v, do, scale, cu=None, window=None):
    f = fused.forward(q, r, k, v, scale, cu, window)
    return f, fused.backward(do, q, r, k, v, *f, scale, cu, window)


def check(b, n, d, cu=None, window=None):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=1)
    cu_t = cu_from_lengths(cu, "cuda")
    out = {}
    for name, kern in VARIANTS.items():
        use(kern)
        a = fwd_bwd(q, r, k, v, do, d ** -0.5, cu_t, window)
        b2 = fwd_bwd(q, r, k, v, do, d ** -0.5, cu_t, window)
        use(SHIPPED)
        flat = [*a[0], *a[1]]
        out[name] = (flat, all(torch.equal(x, y) for x, y in zip(flat, [*b2[0], *b2[1]])))
    row = {"shape": [b, n, d], "docs": cu, "window": window,
           **{name: {"deterministic": det, "bitwise_vs_shipped": all(torch.equal(x, y) for x, y in zip(flat, out["shipped"][0]))}
              for name, (flat, det) in out.items()}}
    print(json.dumps(row), flush=True)
    return row


def bench(b, n, d, rounds=5):
    (q, r, k, v), do = cuda_inputs(b, n, 16, 8, d, torch.bfloat16, seed=2)
    scale = d ** -0.5
    f = fused.forward(q, r, k, v, scale)
    fwd = {name: [] for name in VARIANTS}
    bwd = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, kern in VARIANTS.items():
            use(kern)
            fwd[name].append(triton.testing.do_bench(lambda: fused.forward(q, r, k, v, scale), warmup=50, rep=200))
            bwd[name].append(triton.testing.do_bench(lambda: fused.backward(do, q, r, k, v, *f, scale), warmup=50, rep=300))
            use(SHIPPED)
    med = lambda t: sorted(t)[len(t) // 2]
    row = {"shape": [b, n, d], "forward_ms": fwd, "backward_ms": bwd,
           "forward_ratio": {k: med(t) / med(fwd["shipped"]) for k, t in fwd.items()},
           "backward_ratio": {k: med(t) / med(bwd["shipped"]) for k, t in bwd.items()}}
    print(json.dumps({"shape": row["shape"], "fwd": row["forward_ratio"], "bwd": row["backward_ratio"],
                      "shipped_ms": [med(fwd["shipped"]), med(bwd["shipped"])]}), flush=True)
    return row


if __name__ == "__main__":
    t0 = time.time()
    rows = [check(1, 2048, 128), check(1, 2048, 64), check(1, 4096, 128, cu=[1000, 2048, 1048]),
            check(2, 2048, 64, window=300), check(1, 1000, 128)]
    for shape in [(4, 4096, 128), (4, 4096, 64), (1, 16384, 128), (8, 2048, 128), (1, 16384, 64)]:
        rows.append(bench(*shape))
    print("seconds", time.time() - t0)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
