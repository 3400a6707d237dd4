"""Time the fused backward's kernels one by one on a GPU: the row pass (dq, drho) and the column pass
(dk, dv) as one kernel or as a dk kernel plus a dv kernel, each over explicit tile configs, and check
that every variant writes the combined kernel's dk and dv.

    python scripts/bench_backward_parts.py --out /tmp/backward_parts.json
    python scripts/bench_backward_parts.py --configs "dk=32,128,8,2;64,128,8,2" --shapes 0

Writes one JSON record per (shape, part, config): ms (triton do_bench median) and, for the column
variants, the largest difference from the combined kernel's dk / dv.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels.parallax import fused  # noqa: E402
from scripts.bench_attention import SHAPES, make_inputs  # noqa: E402

DEFAULT_CONFIGS = {  # part -> "BM,BN,warps,stages" tiles (global program order)
    "both": ["32,128,8,2", "16,128,4,3"],
    "dk": ["32,128,8,2", "64,128,8,2", "32,128,8,3", "64,64,4,3", "16,128,4,3"],
    "dv": ["32,128,8,2", "64,128,8,2", "32,128,8,3", "64,64,4,3", "128,64,8,2"],
}
PARTS = {"both": (True, True), "dk": (True, False), "dv": (False, True)}


def parse_configs(text):
    configs = {part: list(tiles) for part, tiles in DEFAULT_CONFIGS.items()}
    for item in filter(None, text.split(" ")):
        part, tiles = item.split("=", 1)
        configs[part] = tiles.split(";")
    return configs


def column_pass(part, tile, q, r, k, v, do, tbar, lse, tau, beta, scale):
    """Launch the column pass for one part with one tile config; returns (dk, dv) (None where not written)."""
    bm, bn, warps, stages = (int(x) for x in tile.split(","))
    total, n, hq, docs, doce, meta, qk_scale, tune, _ = fused._common(q, k, scale, None)
    want_dk, want_dv = PARTS[part]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    grid = (triton.cdiv(total, bn) * k.shape[2],)
    fused._bwd_dkdv_kernel[grid](q, r, k, v, do, tbar, lse, tau, beta, dk, dv, docs, doce, total, n, hq,
                                 k.shape[2], q.stride(1), q.stride(2), k.stride(1), k.stride(2), scale, qk_scale,
                                 *tune, **meta, BM=bm, BN=bn, GLOBAL_ORDER=True, WANT_DK=want_dk,
                                 WANT_DV=want_dv, num_warps=warps, num_stages=stages)
    return (dk if want_dk else None), (dv if want_dv else None)


def run_shape(shape, configs):
    b, n, hq, hkv, d = shape
    q, r, k, v = make_inputs(b, n, hq, hkv, d)
    do = torch.randn_like(q)
    scale = d ** -0.5
    o, vbar, tbar, lse = fused.forward(q, r, k, v, scale)
    full = lambda: fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale)  # noqa: E731
    _, _, dk_ref, dv_ref = full()  # autotunes the shipped lists first
    tau, beta = torch.empty_like(tbar), torch.empty_like(tbar)
    records = [{"shape": shape, "part": "backward_shipped", "ms": triton.testing.do_bench(full, return_mode="median")}]
    # tau, beta as the row pass writes them (tau = dO.o, beta = dO.vbar, per head and token)
    tau.copy_((do.float() * o.float()).sum(-1).permute(2, 0, 1).reshape(hq, -1))
    beta.copy_((do.float() * vbar.float()).sum(-1).permute(2, 0, 1).reshape(hq, -1))
    for part, tiles in configs.items():
        for tile in tiles:
            rec = {"shape": shape, "part": part, "tile": tile}
            try:
                call = lambda: column_pass(part, tile, q, r, k, v, do, tbar, lse, tau, beta, scale)  # noqa: E731,B023
                dk, dv = call()
                if dk is not None:
                    rec["dk_max_diff"] = (dk.float() - dk_ref.float()).abs().max().item()
                if dv is not None:
                    rec["dv_max_diff"] = (dv.float() - dv_ref.float()).abs().max().item()
                rec["ms"] = triton.testing.do_bench(call, return_mode="median")
            except Exception as exc:  # a config that does not compile or fit is reported, not fatal
                rec["error"] = repr(exc)[:300]
            print(json.dumps(rec), flush=True)
            records.append(rec)
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="backward_parts.json")
    parser.add_argument("--shapes", type=int, nargs="+", default=list(range(len(SHAPES))))
    parser.add_argument("--configs", default="", help='space-separated "part=BM,BN,warps,stages;..." overrides')
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_backward_parts.py needs a CUDA GPU")
    configs = parse_configs(args.configs)
    records = [rec for i in args.shapes for rec in run_shape(SHAPES[i], configs)]
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "records": records}, indent=1))


if __name__ == "__main__":
    main()
