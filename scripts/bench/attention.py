"""Benchmark Parallax attention (training: forward, forward+backward) against softmax SDPA and
the published Parallax kernels, all in one run on one GPU, bf16.

Methods: torch SDPA with the cuDNN and flash backends (softmax baselines), ours
(kernels.parallax_attention: Triton, with the Gluon Hopper kernels on sm_90; ``parallax_ours_triton``
keeps the Triton kernels, forward and backward), PyPI parallax-kernel 0.1.1 (``parallax.parallax_func``)
and fla-core 0.6.0 (``fla.ops.parallax.parallel_parallax``) when importable (benchmark-only
wheels, never dependencies). Times are medians of triton.testing.do_bench, measured twice;
ratios are against cuDNN softmax at the same shape (and, for D=64, at D=128) from this run. The
training table's page and JSON are rewritten after each timing, marked partial until the run ends,
so a run stopped by a time limit keeps the timings it took.

    python -m scripts.bench.attention --out docs/bench/attention_train [--sweep]
    python -m scripts.bench.attention --window 1024,4096 [--window-len 16384]
    python -m scripts.bench.attention --affine-la [--affine-shape 4,4096,16,16,128]

--sweep autotunes our kernels over the wider lists tuning.SWEEP (instead of tuning.SHIPPED) and
records every config's time. --window times sliding-window attention against full causal attention
(kernels.parallax.benchmark.time_window_vs_causal); --affine-la times the family's fused Affine
Linear Attention beside fla's chunked linear attention (kernels.family.bench.time_affine_la).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys

import torch
import torch.nn.functional as F

from kernels.parallax import tuning
from scripts.bench import attention_variants as variants
from scripts.bench.results import command_line, describe, table, write_results

SHAPES = [  # (B, L, Hq, Hkv, D)
    (4, 4096, 16, 8, 128),
    (4, 4096, 16, 8, 64),
    (1, 16384, 16, 8, 128),
    (1, 16384, 16, 8, 64),
]
COMPETITORS = ("parallax_kernel_0.1.1", "fla_0.6.0")  # timed when importable and --competitors
METHODS = ("softmax_cudnn", "softmax_flash", "parallax_ours", "parallax_ours_triton", *COMPETITORS)
MATMULS = {"fwd": 4, "fwd_bwd": 15}  # Parallax (causal) matmuls of size L x L x D per head: fwd 4, bwd 11


def make_inputs(b, n, hq, hkv, d, seed=0):
    """Random bf16 CUDA q, r (B, L, Hq, D; r scaled by 1/sqrt(D)) and k, v (B, L, Hkv, D)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, r = (torch.randn(b, n, hq, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    r = r / math.sqrt(d)
    return q, r, k, v


def _triton_kernels(fn):
    """``fn`` timed with the Triton kernels instead of the Hopper ones: ``bench_one`` enters its
    ``context`` around the whole timed step (the backward runs after ``fn`` returns)."""
    def wrapped(*args):
        return fn(*args)

    wrapped.context = lambda: tuning.hopper_kernels(False)
    return wrapped


def methods(competitors=True):
    """name (of :data:`METHODS`) -> (input layout: 'blhd', 'bhld' or 'bhld_mha' (kv heads expanded),
    fn(q, r, k, v) -> out)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import parallax_attention

    def sdpa(backend):
        def fn(q, r, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return fn

    impls = {
        "softmax_cudnn": ("bhld_mha", sdpa(SDPBackend.CUDNN_ATTENTION)),
        "softmax_flash": ("bhld_mha", sdpa(SDPBackend.FLASH_ATTENTION)),
        "parallax_ours": ("blhd", lambda q, r, k, v: parallax_attention(q, r, k, v)),
        "parallax_ours_triton": ("blhd", _triton_kernels(lambda q, r, k, v: parallax_attention(q, r, k, v))),
    }
    if not competitors:
        return impls
    try:
        from parallax import parallax_func

        impls["parallax_kernel_0.1.1"] = ("bhld", lambda q, r, k, v: parallax_func(q, r, k, v))
    except Exception as exc:  # benchmark-only competitor; absent is reported, not fatal
        print(f"parallax-kernel unavailable: {exc!r}")
    try:
        from fla.ops.parallax import parallel_parallax

        impls["fla_0.6.0"] = ("blhd", lambda q, r, k, v: parallel_parallax(q, r, k, v))
    except Exception as exc:
        print(f"fla unavailable: {exc!r}")
    return impls


def to_layout(tensors, layout, group):
    """Copies of (q, r, k, v) in ``layout`` (see ``methods``); ``group`` = Hq / Hkv."""
    q, r, k, v = tensors
    if layout == "blhd":
        return [x.clone() for x in (q, r, k, v)]
    if layout == "bhld_mha":  # softmax baselines: kv heads expanded outside the timed region
        k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    return [x.transpose(1, 2).contiguous() for x in (q, r, k, v)]


def bench_one(fn, inputs, mode):
    """Milliseconds of ``fn(*inputs)`` (mode "fwd", under no_grad) or of it and its backward
    ("fwd_bwd"): {"ms": the lower of two do_bench medians, "ms_runs": both}."""
    with getattr(fn, "context", contextlib.nullcontext)():
        return _bench_steps(fn, inputs, mode)


def _bench_steps(fn, inputs, mode):
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


def agreement(impls, tensors, group):
    """Relative difference of each Parallax implementation's output vs ours (independent codes)."""
    ours = impls["parallax_ours"][1](*tensors).float()
    res = {}
    for name, (layout, fn) in impls.items():
        if name.startswith("parallax") and not name.startswith("parallax_ours"):
            out = fn(*to_layout(tensors, layout, group))
            out = out.transpose(1, 2) if layout.startswith("bhld") else out
            res[name] = ((out.float() - ours).norm() / ours.norm()).item()
    return res


def bench_shape(impls, shape, on_timing=None):
    """Every method of ``impls`` at ``shape`` (B, L, Hq, Hkv, D), both modes: the result entry
    (shape, agreement, "<method>/<mode>" timings or errors, our TFLOP/s, the autotuner's choices).
    ``on_timing(entry)``, if given, is called with the entry so far after each timing."""
    b, n, hq, hkv, d = shape
    tensors = make_inputs(*shape)
    entry = {"shape": dict(B=b, L=n, Hq=hq, Hkv=hkv, D=d), "agreement_vs_ours": agreement(impls, tensors, hq // hkv)}
    for name, (layout, fn) in impls.items():
        inputs = to_layout(tensors, layout, hq // hkv)
        for mode in ("fwd", "fwd_bwd"):
            try:
                entry[f"{name}/{mode}"] = bench_one(fn, inputs, mode)
            except Exception as exc:
                entry[f"{name}/{mode}"] = {"error": repr(exc)[:300]}
            print(shape, name, mode, entry[f"{name}/{mode}"], flush=True)
            if on_timing is not None:
                on_timing(entry)
    flops = b * hq * d * n * (n + 1)  # 2 * D * (causal pairs) per matmul
    for mode, mm in MATMULS.items():
        ms = entry.get(f"parallax_ours/{mode}", {}).get("ms")
        if ms:
            entry[f"parallax_ours/{mode}"]["tflops"] = mm * flops / ms / 1e9
    entry["tuning"] = tuning.autotune_report()  # the last autotune key of each kernel is this shape's
    return entry


def method_list(text: str) -> list[str]:
    """``--methods``: comma-separated names of :data:`METHODS` (argparse type); a misspelt one was
    dropped without a word, and the page lacked its rows."""
    names = list(dict.fromkeys(text.split(",")))
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown {unknown}; expected comma-separated names from "
                                         f"{list(METHODS)}")
    return names


def run(args, on_timing=None):
    """The result entries (``bench_shape``) of the shapes and methods the command line selects;
    SystemExit naming ``--methods`` when one of them cannot run here (a competitor not importable).
    ``on_timing(entries)``, if given, is called with the entries so far after each timing."""
    impls = methods(args.competitors)
    if args.methods:
        missing = [name for name in args.methods if name not in impls]
        if missing:
            raise SystemExit(f"--methods: {missing} cannot run here (not importable, see above); expected "
                             f"names from {list(impls)}")
        impls = {name: impls[name] for name in args.methods}
    results = []
    for i in args.shapes:
        progress = None if on_timing is None else (lambda entry: on_timing([*results, entry]))
        results.append(bench_shape(impls, SHAPES[i], progress))
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


MEASURED = ("forward and forward+backward time of causal attention, bf16: torch SDPA softmax (cuDNN, flash "
            "backends; KV heads expanded to Hq outside the timed region), ours (kernels.parallax_attention; "
            "parallax_ours_triton: the same with the Triton kernels instead of the Hopper ones, forward and "
            "backward) and, when importable, parallax-kernel 0.1.1 and fla 0.6.0; triton.testing.do_bench median, "
            "2 runs, the lower reported; fwd under no_grad; ratios against cuDNN softmax at the same shape (and at "
            "D=128)")


def report_markdown(results: list[dict], rows: list[dict]) -> str:
    """The body of the results page: one table row per ``ratios`` row, then, when other Parallax kernels
    ran beside ours, their output agreement with ours."""
    def f(x):
        return "" if x is None else f"{x:.2f}"

    cells = ((r["B"], r["L"], f"{r['Hq']}/{r['Hkv']}", r["D"], r["method"], r["mode"], f"{r['ms']:.3f}",
              f(r["vs_cudnn_same_D"]), f(r["vs_cudnn_D128"])) for r in rows)
    lines = table(["B", "L", "Hq/Hkv", "D", "method", "mode", "ms", "/ cuDNN same D", "/ cuDNN D128"], cells)
    compared = [e for e in results if e["agreement_vs_ours"]]  # other Parallax kernels were run
    if compared:
        lines += ["", "Output agreement (relative L2 difference vs ours, bf16):", ""]
    for e in compared:
        lines.append(f"- {e['shape']}: " + ", ".join(f"{k} {v:.1e}" for k, v in e["agreement_vs_ours"].items()))
    return "\n".join(lines) + "\n"


PARTIAL = ("Partial: the page is rewritten after each timing, and this run stopped (or had not finished) "
           "after the rows below.\n\n")


def write(results: list[dict], rows: list[dict], tuning_choices: dict, out: str, command: str,
          partial: bool = False) -> str:
    """Write ``out``.md (header and ``report_markdown``) and ``out``.json (results, ratios, the
    autotuners' choices); return the markdown. ``partial``: the timings so far of a run still going
    (the page says so, the JSON has ``"partial": true``), so that a run stopped by a time limit (a
    competitor's autotune takes minutes) keeps what it measured."""
    meta = describe("Parallax attention training benchmark", MEASURED, command)
    data = {"results": results, "ratios": rows, "tuning": tuning_choices}
    return write_results(out, meta, (PARTIAL if partial else "") + report_markdown(results, rows),
                         {**data, "partial": True} if partial else data)


def parser() -> argparse.ArgumentParser:
    """The command line: the training table (default), or one of the modes --window and --affine-la."""
    p = argparse.ArgumentParser(prog="python -m scripts.bench.attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="output path without extension (default: docs/bench/attention_train, "
                                 "attention_window with --window, affine_la with --affine-la)")
    p.add_argument("--sweep", action="store_true", help="autotune over tuning.SWEEP instead of tuning.SHIPPED")
    p.add_argument("--competitors", action=argparse.BooleanOptionalAction, default=True,
                   help="also time parallax-kernel and fla (their first-call autotuning takes minutes)")
    p.add_argument("--methods", type=method_list, default=None,
                   help=f"comma-separated subset of {','.join(METHODS)} (default: all)")
    p.add_argument("--shapes", type=int, nargs="+", default=list(range(len(SHAPES))), choices=range(len(SHAPES)),
                   help="indices into SHAPES (default: all)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--window", type=variants.window_list, metavar="W[,W...]",
                      help="time sliding windows W against full causal attention (B1 Hq16/Hkv8 D128) instead")
    mode.add_argument("--affine-la", action="store_true",
                      help="time the fused Affine Linear Attention beside fla's linear attention instead")
    p.add_argument("--window-len", type=variants.sequence_length, default=16384, help="sequence length of --window (default 16384)")
    p.add_argument("--affine-shape", type=variants.affine_shape, default=(4, 4096, 16, 16, 128), metavar="B,L,Hq,Hkv,D",
                   help="shape of --affine-la (default 4,4096,16,16,128)")
    return p


def check_modes(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse error for options the chosen mode would ignore: --methods names a competitor under
    --no-competitors, or --methods / --shapes go with --window or --affine-la (their own shapes)."""
    if args.methods and not args.competitors and set(args.methods) & set(COMPETITORS):
        p.error(f"--methods {','.join(args.methods)} with --no-competitors: "
                f"{sorted(set(args.methods) & set(COMPETITORS))} would not run")
    mode = "--window" if args.window else "--affine-la" if args.affine_la else None
    if mode and (args.methods or args.shapes != list(range(len(SHAPES)))):
        p.error(f"--methods and --shapes select the training table's rows; {mode} times its own shapes "
                "(they would be ignored)")


def run_mode(args: argparse.Namespace, command: str) -> str:
    """Run the mode ``args`` selects (``parser``), under ``tuning.SWEEP`` with --sweep; write its page
    (``command`` reproduces it) and return the markdown."""
    with tuning.candidates(**tuning.SWEEP) if args.sweep else contextlib.nullcontext():
        if args.window:
            rows = variants.run_window(args.window_len, args.window)
            return variants.write_window(rows, args.window_len, args.out or "docs/bench/attention_window", command)
        if args.affine_la:
            return variants.write_affine(variants.run_affine(args.affine_shape), args.out or "docs/bench/affine_la",
                                         command)
        out = args.out or "docs/bench/attention_train"

        def page(results, partial=False):
            return write(results, ratios(results), tuning.autotune_report(), out, command, partial)

        return page(run(args, lambda so_far: page(so_far, partial=True)))


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark the command line asks for and print its results page."""
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    check_modes(p, args)
    if not torch.cuda.is_available():
        raise SystemExit("scripts.bench.attention needs a CUDA GPU")
    print(run_mode(args, command_line(__spec__.name, argv)))


if __name__ == "__main__":
    main()
