"""Optimizer step time for the Parallax 0.6B parameter set, as ratios to AdamW and to fwd+bwd.

Reproduce (one H200), writing docs/bench/optimizers.md and .json:
    python -m scripts.bench.optimizers --out docs/bench/optimizers
The forward+backward baseline is a 16 x 4096 token batch run as 4 micro-batches of 4 x 4096
(gradient accumulation; same FLOPs, fits memory), bf16 parameters, chunk-free cross entropy.
It measures ParallaxQwen3Model (parallax_titan.model) with softmax attention (TorchTitan's
Qwen3 attention, SDPA) and with Parallax attention; ratios use the Parallax model when it ran,
else the softmax one. Which one was used is recorded in the output.

``--profile DIR`` also profiles one step of each optimizer after its timed steps (torch.profiler) and
writes DIR/<row>_trace.json and DIR/<row>.md, the trace's summary (``scripts.bench.trace_summary``:
GPU time per group and kernel, the launching ops, what the host was inside while the GPU idled):
    python -m scripts.bench.optimizers --only muon_polar_express --no-fwd-bwd --profile outputs/opt_profile
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from optimizers.timing import build_optimizer, step_times
from parallax_titan.spec import BASE_FLAVORS, variant_args
from scripts.bench import trace_summary
from scripts.bench.results import command_line, describe, positive_int, table, write_result_page, write_results

SP2 = {"attn": (2, 1e-4), "mlp": (2, 1e-4)}
# row name -> (optimizers.timing name, options)
CONFIGS = {
    "adamw": ("adamw", {}),
    "muon_polar_express": ("muon", {}),
    "muon_newton_schulz": ("muon", {"orthogonalizer": "newton_schulz"}),
    "muon_polar_express_sp2": ("muon", {"spectral": SP2}),
    "adamw_sp2": ("adamw", {"spectral": SP2}),
    "normuon": ("normuon", {}),
    "aurora": ("aurora", {}),
    "soap": ("soap", {}),
}


def model_args(flavor: str, mixer: str):
    """Model args of the Parallax (``mixer`` "parallax") or Transformer model of ``flavor``."""
    return variant_args("parallax" if mixer == "parallax" else "transformer", BASE_FLAVORS[flavor])


def build_model(args, device, dtype):
    """ParallaxQwen3Model of ``args``, initialised on ``device``, in ``dtype``."""
    from parallax_titan.model import ParallaxQwen3Model

    with torch.device(device):
        model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device(device))
    return model.to(dtype)


def sync(device):
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def time_fn(fn, device, warmup, iters):
    """Median wall seconds of ``fn()`` over ``iters`` calls after ``warmup`` calls, synchronised."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_step(opt, prefix: str, command: str, top: int = 25) -> str:
    """Profile one ``opt.step()`` (CPU ops, and CUDA kernels on a GPU); write the Chrome trace to
    ``prefix``_trace.json and its summary to ``prefix``.md; return the summary's markdown."""
    from torch.profiler import ProfilerActivity, profile

    cuda = next(p for g in opt.param_groups for p in g["params"]).is_cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        opt.step()
        if cuda:
            torch.cuda.synchronize()
    path = f"{prefix}_trace.json"
    prof.export_chrome_trace(path)
    body = trace_summary.summary_of(trace_summary.load(path), top)
    meta = describe("Where one optimizer step's time goes", f"one profiled step of {os.path.basename(prefix)} "
                    f"after the timed ones; the trace: {path}", command)
    return write_results(prefix, meta, body)


def bench_optimizer(model, row: str, warmup: int, iters: int, profile_dir: str | None = None,
                    command: str = "") -> float:
    """Median seconds of one step of the optimizer of CONFIGS[row] on ``model``'s parameters with
    random gradients (SOAP's median includes its basis refresh once per refresh period); with
    ``profile_dir``, one more step profiled into it (``profile_step``)."""
    name, options = CONFIGS[row]
    opt = build_optimizer(model, name, **options)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    try:
        seconds = statistics.median(step_times(opt, warmup, iters))
        if profile_dir:
            os.makedirs(profile_dir, exist_ok=True)
            profile_step(opt, os.path.join(profile_dir, row), command)
        return seconds
    finally:
        for p in model.parameters():
            p.grad = None
        del opt


def bench_fwd_bwd(args, device, micro, seq, accum, warmup, iters):
    """Median seconds of forward+backward of ``accum`` micro-batches of ``micro`` x ``seq`` random
    tokens through a bf16 model of ``args``."""
    model = build_model(args, device, torch.bfloat16)
    tokens = torch.randint(0, args.vocab_size, (micro, seq), device=device)

    def step():
        for _ in range(accum):
            logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
            loss.backward()
        model.zero_grad(set_to_none=True)

    return time_fn(step, device, warmup, iters)


MODELS = {"parallax": "ParallaxQwen3Model (Parallax attention)",
          "softmax": "ParallaxQwen3Model mixer=softmax (TorchTitan Qwen3 attention, SDPA)"}


def bench_optimizers(result, args, device):
    """Time every optimizer of CONFIGS on the fp32 parameter set into ``result["opt_step_s"]``,
    writing the page after each."""
    # fp32 master weights, as FSDP keeps them
    model = build_model(model_args(args.flavor, "parallax"), device, torch.float32)
    result["n_params"] = sum(p.numel() for p in model.parameters())
    result["matrix_shapes_per_layer"] = {n.split("layers.0.")[1]: list(p.shape) for n, p in model.named_parameters()
                                         if n.startswith("layers.0.") and p.ndim == 2}
    for row in args.only or CONFIGS:
        result["opt_step_s"][row] = bench_optimizer(model, row, 2, args.iters, args.profile,
                                                    result["meta"]["command"])
        print(row, result["opt_step_s"][row], flush=True)
        write(result, args.out)
        if device == "cuda":
            torch.cuda.empty_cache()


def bench_baselines(result, args, device):
    """Time forward+backward of the softmax and the Parallax model into ``result["fwd_bwd_s"]`` (a
    failure goes to ``result["fwd_bwd_error"]``), writing the page after each."""
    result["fwd_bwd_batch"] = (f"{args.micro * args.accum} x {args.seq} as {args.accum} micro-batches of "
                               f"{args.micro} x {args.seq}")
    for mixer in ("softmax", "parallax"):  # the quick, known-good SDPA baseline first
        try:
            t = bench_fwd_bwd(model_args(args.flavor, mixer), device, args.micro, args.seq, args.accum, 1,
                              max(2, args.iters // 2))
            result.setdefault("fwd_bwd_s", {})[mixer] = t
            print("fwd_bwd", mixer, t, flush=True)
        except Exception as e:  # record the failure and fall back to the other attention
            result.setdefault("fwd_bwd_error", {})[mixer] = f"{type(e).__name__}: {str(e)[:300]}"
            print("fwd_bwd", mixer, "failed:", e, flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
        write(result, args.out)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write OUT.md and OUT.json."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.optimizers", description=__doc__.split("\n")[0])
    ap.add_argument("--flavor", default="0.6B", choices=sorted(BASE_FLAVORS))
    ap.add_argument("--micro", type=positive_int, default=4)
    ap.add_argument("--accum", type=positive_int, default=4)
    ap.add_argument("--seq", type=positive_int, default=4096)
    ap.add_argument("--iters", type=positive_int, default=5)
    ap.add_argument("--out", default="docs/bench/optimizers", help="output path without extension")
    ap.add_argument("--only", type=lambda text: text.split(","), default=None,
                    help=f"comma-separated rows of {list(CONFIGS)} (default: all)")
    ap.add_argument("--no-fwd-bwd", action="store_true", help="skip the forward+backward baselines")
    ap.add_argument("--profile", metavar="DIR", help="also profile one step of each optimizer into DIR")
    args = ap.parse_args(argv)
    unknown = [row for row in args.only or () if row not in CONFIGS]
    if unknown:
        ap.error(f"--only: unknown rows {unknown}; expected names from {list(CONFIGS)}")
    if args.profile and os.path.exists(args.profile) and not os.path.isdir(args.profile):
        ap.error(f"--profile {args.profile!r} is a file; expected a folder (made if missing) for the traces")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    measured = (f"optimizer step time (median of {args.iters}, after 2 warm-up steps) on the Parallax {args.flavor} "
                "parameter set, and forward+backward time of the model, bf16, chunk-free cross entropy")
    result = {"meta": describe("Optimizer step benchmark", measured, command_line(__spec__.name, argv)),
              "flavor": args.flavor, "opt_step_s": {}}
    bench_optimizers(result, args, device)
    if not args.no_fwd_bwd:
        bench_baselines(result, args, device)


def write(result, out):
    """Fill in ``result``'s ratios and write ``out``.md and ``out``.json from it."""
    base = result["opt_step_s"].get("adamw")
    fb = result.get("fwd_bwd_s", {})
    ref_name = "parallax" if "parallax" in fb else ("softmax" if "softmax" in fb else None)
    result["fwd_bwd_model"] = MODELS.get(ref_name, "not measured")
    result["ratios"] = {
        name: {"vs_adamw": t / base if base else None, "vs_fwd_bwd": t / fb[ref_name] if ref_name else None}
        for name, t in result["opt_step_s"].items()
    }

    def fmt(x):
        return f"{x:.3f}" if x is not None else "n/a"

    lines = [f"Parameter set: Parallax {result['flavor']} ({result['n_params']:,} parameters, fp32)."]
    if ref_name:
        lines.append(f"Forward+backward baseline: {result['fwd_bwd_model']}, {result['fwd_bwd_batch']}, bf16.")
    lines.append("")
    lines += table(["optimizer step", "time (ms)", "/ AdamW step", "/ fwd+bwd"],
                   ((name, f"{t * 1e3:.1f}", fmt(result["ratios"][name]["vs_adamw"]),
                     fmt(result["ratios"][name]["vs_fwd_bwd"])) for name, t in result["opt_step_s"].items()))
    lines += [f"\nfwd+bwd ({mixer}): {t * 1e3:.1f} ms" for mixer, t in fb.items()]
    lines += [f"\nfwd+bwd ({mixer}) failed: {err}" for mixer, err in result.get("fwd_bwd_error", {}).items()]
    write_result_page(out, result, lines)


if __name__ == "__main__":
    main()
