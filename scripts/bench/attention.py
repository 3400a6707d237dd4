"""Benchmark Parallax attention (training: forward, forward+backward) against softmax SDPA and
the published Parallax kernels, all in one run on one GPU, bf16.

Methods: torch SDPA with the cuDNN and flash backends (softmax baselines), ours
(kernels.parallax_attention, Triton), PyPI parallax-kernel 0.1.1 (``parallax.parallax_func``)
and fla-core 0.6.0 (``fla.ops.parallax.parallel_parallax``) when importable (benchmark-only
wheels, never dependencies). Times are medians of triton.testing.do_bench, measured twice;
ratios are against cuDNN softmax at the same shape (and, for D=64, at D=128) from this run.

    python scripts/bench_attention.py --out docs/bench/attention_train [--sweep]

--sweep autotunes our kernels over a wider config list and records every config's time.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [  # (B, L, Hq, Hkv, D)
    (4, 4096, 16, 8, 128),
    (4, 4096, 16, 8, 64),
    (1, 16384, 16, 8, 128),
    (1, 16384, 16, 8, 64),
]
MATMULS = {"fwd": 4, "fwd_bwd": 15}  # Parallax (causal) matmuls of size L x L x D per head: fwd 4, bwd 11


def sweep_configs():
    """name of an autotuned kernel in fused -> (its JIT kernel, the wider candidate list of the sweep):
    tile shapes around the short lists' winners, each in both program orders."""
    from kernels.parallax import fused

    both = fused._both_orders
    return {
        "_FWD_TUNED": (fused._fwd_kernel, both([(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (128, 128, 8, 2)])),
        "_DQ_TUNED": (fused._bwd_dq_kernel, both([(128, 32, 8, 3), (64, 64, 4, 4), (64, 32, 4, 4), (64, 64, 4, 2)])),
        "_DKDV_TUNED": (fused._bwd_dkdv_kernel,
                        both([(64, 64, 4, 1), (64, 64, 4, 2), (32, 128, 8, 1), (32, 128, 8, 2), (32, 64, 4, 1),
                              (64, 32, 4, 2)], ROWS=True)
                        + both([(32, 64, 4, 3), (32, 128, 8, 2), (32, 128, 8, 3), (16, 128, 4, 3)])),
    }


def install_sweep():
    """Replace our autotuned kernels by ones over the sweep's wider lists (for choosing the short lists)."""
    from kernels.parallax import fused

    for name, (kernel, configs) in sweep_configs().items():
        setattr(fused, name, fused._autotuned(kernel, configs))


def tuning_report():
    """Best config and all timings per autotune key, for each of our autotuned kernels."""
    from kernels.parallax import fused

    out = {}
    for name in ("_FWD_TUNED", "_DQ_TUNED", "_DKDV_TUNED"):
        tuner = getattr(fused, name)
        out[name] = {str(key): str(cfg) for key, cfg in tuner.cache.items()}
        timings = getattr(tuner, "configs_timings", None) or {}
        out[name + "_last_timings_ms"] = {str(c): (t[0] if isinstance(t, (list, tuple)) else t)
                                          for c, t in timings.items()}
    return out


def make_inputs(b, n, hq, hkv, d, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, r = (torch.randn(b, n, hq, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    r = r / math.sqrt(d)
    return q, r, k, v


def methods(competitors=True):
    """name -> (input layout: 'blhd', 'bhld' or 'bhld_mha' (kv heads expanded), fn(q, r, k, v) -> out)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import parallax_attention

    def sdpa(backend):
        def fn(q, r, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return fn

    table = {
        "softmax_cudnn": ("bhld_mha", sdpa(SDPBackend.CUDNN_ATTENTION)),
        "softmax_flash": ("bhld_mha", sdpa(SDPBackend.FLASH_ATTENTION)),
        "parallax_ours": ("blhd", lambda q, r, k, v: parallax_attention(q, r, k, v)),
    }
    if not competitors:
        return table
    try:
        from parallax import parallax_func

        table["parallax_kernel_0.1.1"] = ("bhld", lambda q, r, k, v: parallax_func(q, r, k, v))
    except Exception as exc:  # benchmark-only competitor; absent is reported, not fatal
        print(f"parallax-kernel unavailable: {exc!r}")
    try:
        from fla.ops.parallax import parallel_parallax

        table["fla_0.6.0"] = ("blhd", lambda q, r, k, v: parallel_parallax(q, r, k, v))
    except Exception as exc:
        print(f"fla unavailable: {exc!r}")
    return table


def to_layout(tensors, layout, group):
    q, r, k, v = tensors
    if layout == "blhd":
        return [x.clone() for x in (q, r, k, v)]
    if layout == "bhld_mha":  # softmax baselines: kv heads expanded outside the timed region
        k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    return [x.transpose(1, 2).contiguous() for x in (q, r, k, v)]


def bench_one(fn, inputs, layout, mode):
    import triton

    leaves = [x.detach().requires_grad_(mode == "fwd_bwd") for x in inputs]
    if mode == "fwd":
        def step():
            with torch.no_grad():
                fn(*leaves)
    else:
        out = fn(*leaves)
        grad = torch.randn_like(out)

        def step():
            fn(*leaves).backward(grad)
    step()
    torch.cuda.synchronize()
    times = [triton.testing.do_bench(step, warmup=50, rep=300, grad_to_none=leaves, return_mode="median")
             for _ in range(2)]
    return {"ms": min(times), "ms_runs": times}


def agreement(table, tensors, group):
    """Relative difference of each Parallax implementation's output vs ours (independent codes)."""
    ours = table["parallax_ours"][1](*tensors).float()
    res = {}
    for name, (layout, fn) in table.items():
        if name.startswith("parallax") and name != "parallax_ours":
            out = fn(*to_layout(tensors, layout, group))
            out = out.transpose(1, 2) if layout.startswith("bhld") else out
            res[name] = ((out.float() - ours).norm() / ours.norm()).item()
    return res


def run(args):
    if args.sweep:
        install_sweep()
    table = methods(args.competitors)
    if args.methods:
        table = {name: table[name] for name in args.methods.split(",") if name in table}
    results = []
    for shape in [SHAPES[i] for i in args.shapes]:
        b, n, hq, hkv, d = shape
        tensors = make_inputs(*shape)
        entry = {"shape": dict(B=b, L=n, Hq=hq, Hkv=hkv, D=d), "agreement_vs_ours": agreement(table, tensors, hq // hkv)}
        for name, (layout, fn) in table.items():
            inputs = to_layout(tensors, layout, hq // hkv)
            for mode in ("fwd", "fwd_bwd"):
                try:
                    entry[f"{name}/{mode}"] = bench_one(fn, inputs, layout, mode)
                except Exception as exc:
                    entry[f"{name}/{mode}"] = {"error": repr(exc)[:300]}
                print(shape, name, mode, entry[f"{name}/{mode}"], flush=True)
        flops = b * hq * d * n * (n + 1)  # 2 * D * (causal pairs) per matmul
        for mode, mm in MATMULS.items():
            ms = entry.get(f"parallax_ours/{mode}", {}).get("ms")
            if ms:
                entry[f"parallax_ours/{mode}"]["tflops"] = mm * flops / ms / 1e9
        entry["tuning"] = tuning_report()  # the last autotune key of each kernel is this shape's
        results.append(entry)
    return results


def ratios(results):
    """ms / cuDNN-softmax ms (same B, L; D as stated) for every method and mode."""
    by_shape = {(e["shape"]["B"], e["shape"]["L"], e["shape"]["D"]): e for e in results}
    rows = []
    for e in results:
        s = e["shape"]
        for key, val in e.items():
            if "/" not in key or "ms" not in val:
                continue
            name, mode = key.split("/")
            base_same = e.get(f"softmax_cudnn/{mode}", {}).get("ms")
            base128 = by_shape.get((s["B"], s["L"], 128), {}).get(f"softmax_cudnn/{mode}", {}).get("ms")
            rows.append({**s, "method": name, "mode": mode, "ms": val["ms"],
                         "vs_cudnn_same_D": val["ms"] / base_same if base_same else None,
                         "vs_cudnn_D128": val["ms"] / base128 if base128 else None})
    return rows


def write(results, rows, tuning, out, argv):
    meta = {"command": "python " + " ".join(argv), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "python": platform.python_version(), "dtype": "bfloat16", "causal": True,
            "timing": "triton.testing.do_bench median, 2 runs, min reported; fwd under no_grad"}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".json").write_text(json.dumps({"meta": meta, "results": results, "ratios": rows,
                                               "tuning": tuning}, indent=1))
    lines = [f"# Parallax attention training benchmark ({meta['device']})", "",
             f"`{meta['command']}`  torch {meta['torch']}, triton {meta['triton']}, bf16, causal. "
             "Softmax baselines expand KV heads to Hq before timing.", "",
             "| B | L | Hq/Hkv | D | method | mode | ms | / cuDNN same D | / cuDNN D128 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {r['B']} | {r['L']} | {r['Hq']}/{r['Hkv']} | {r['D']} | {r['method']} | {r['mode']} "
                     f"| {r['ms']:.3f} | {f(r['vs_cudnn_same_D'])} | {f(r['vs_cudnn_D128'])} |")
    compared = [e for e in results if e["agreement_vs_ours"]]  # other Parallax kernels were run
    if compared:
        lines += ["", "Output agreement (relative L2 difference vs ours, bf16):", ""]
    for e in compared:
        lines.append(f"- {e['shape']}: " + ", ".join(f"{k} {v:.1e}" for k, v in e["agreement_vs_ours"].items()))
    Path(out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/bench/attention_train", help="output path without extension")
    parser.add_argument("--sweep", action="store_true", help="autotune over a wider config list")
    parser.add_argument("--competitors", action=argparse.BooleanOptionalAction, default=True,
                        help="also time parallax-kernel and fla (their first-call autotuning takes minutes)")
    parser.add_argument("--methods", default="", help="comma-separated subset of the methods (default: all)")
    parser.add_argument("--shapes", type=int, nargs="+", default=list(range(len(SHAPES))),
                        help="indices into SHAPES (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention.py needs a CUDA GPU")
    results = run(args)
    write(results, ratios(results), tuning_report(), args.out, sys.argv)


if __name__ == "__main__":
    main()
