"""The training benchmark's scaling check (``python -m scripts.bench.train VARIANT --scaling N``): one
global batch on 1 GPU with gradient accumulation N and on N GPUs, from one seed checkpoint, compared
loss by loss and in tokens/s per GPU."""

from __future__ import annotations

import argparse
import os

from scripts.bench.results import describe, write_results
from scripts.bench.summarize_runs import compare_losses, largest_differences, loss_table, markdown, summarize
from scripts.bench.train_launch import bench_run, one_gpu_env

EFFICIENCY_GOAL = 0.90


def seed_checkpoint(args: argparse.Namespace, variant: str, base: str) -> str | None:
    """Write the seed checkpoint every scaling run starts from; its ``step-0`` folder, or None."""
    bench_run(args, variant, f"{base}_seed", 1, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
              "--checkpoint.last_save_model_only", env=one_gpu_env())
    step0 = os.path.join(args.out, f"{base}_seed", "checkpoint", "step-0")
    if os.path.isdir(step0):
        return step0
    print(f"no seed checkpoint at {step0}; see {os.path.join(args.out, base)}_seed.log")
    return None


def from_seed(seed: str, global_batch: int) -> tuple[str, ...]:
    """Overrides of a scaling run: the global data order and batch, every step logged, the seed loaded."""
    return ("--training.data_order", "global", "--training.global_batch_size", str(global_batch),
            "--metrics.log_freq", "1", "--checkpoint.enable", "--checkpoint.load_only",
            "--checkpoint.initial_load_path", seed)


def scaling(args: argparse.Namespace) -> int:
    """``--scaling N``: seed checkpoint, then the 1-GPU (accumulation N) and N-GPU runs of one global
    batch, and a 1-GPU run without accumulation (the same work per GPU as each of the N); writes
    OUT/scaling.{md,json}; the exit status."""
    n, variant = args.scaling, args.variants[0]
    base = args.name_prefix + variant
    seed = seed_checkpoint(args, variant, base)
    if seed is None:
        return 1
    batch = args.local_batch * n
    single = bench_run(args, variant, f"{base}_1gpu_accum{n}", 1, *from_seed(seed, batch), env=one_gpu_env())
    multi = bench_run(args, variant, f"{base}_{n}gpu", n, *from_seed(seed, batch))
    plain = bench_run(args, variant, f"{base}_1gpu", 1, *from_seed(seed, args.local_batch), env=one_gpu_env())
    if not (single and multi and plain):
        return 1
    skip = args.steps // 2
    report = scaling_report(summarize(single, skip), summarize(multi, skip), n, summarize(plain, skip))
    meta = describe(f"Scaling: {variant}, 1 GPU with gradient accumulation {n} vs {n} GPUs",
                    f"loss per step and tokens/s per GPU (mean over the steps after {skip}) of one global batch "
                    f"of {batch} x seq_len, {args.steps} steps from one seed checkpoint",
                    args.command)
    print(write_scaling(report, meta, os.path.join(args.out, "scaling")))
    return 0


def scaling_report(single: dict, multi: dict, n: int, plain: dict | None = None) -> dict:
    """Compare the 1-GPU and N-GPU runs (rows of ``summarize``): losses step by step, their largest
    absolute and relative difference, and tokens/s per GPU of N GPUs over 1 GPU: against the 1-GPU
    run of the same global batch (``single``, accumulation N: one optimizer step per N micro-batches)
    and, given ``plain`` (1 GPU, no accumulation), against the same work per GPU, which isolates the
    cost of communication."""
    steps = sorted(set(single["loss"]) & set(multi["loss"]))
    rows = compare_losses({"loss_1gpu": single["loss"], "loss_ngpu": multi["loss"]}, steps)
    return {
        "gpus": n,
        "runs": [single, multi] + ([plain] if plain else []),
        "losses": rows,
        **largest_differences(rows),
        "per_gpu_efficiency": multi["tokens_per_s"] / single["tokens_per_s"],
        "per_gpu_efficiency_same_work": multi["tokens_per_s"] / plain["tokens_per_s"] if plain else None,
        "goal": EFFICIENCY_GOAL,
    }


def scaling_markdown(report: dict) -> str:
    """The body of the scaling page: efficiency, the throughput table, the loss table."""
    n, (single, multi) = report["gpus"], report["runs"][:2]
    verdict = "meets" if report["per_gpu_efficiency"] >= report["goal"] else "misses"
    same_work = report.get("per_gpu_efficiency_same_work")
    lines = [
        f"{single['run']} (1 GPU, gradient accumulation {n}) vs {multi['run']} ({n} GPUs).", "",
        f"Per-GPU efficiency (tokens/s per GPU, {n} GPUs over 1): **{report['per_gpu_efficiency']:.3f}** "
        f"({verdict} the goal {report['goal']:.2f}).", "",
    ]
    if same_work is not None:
        lines += [f"Against 1 GPU without accumulation (the same work per GPU, one optimizer step per "
                  f"micro-batch): **{same_work:.3f}**.", ""]
    lines += [
        f"Loss difference over {len(report['losses'])} steps: max absolute {report['max_abs_diff']:.3g}, "
        f"max relative {report['max_rel_diff']:.3g}.", "",
        markdown(report["runs"], single["run"]),
        loss_table(report["losses"], {"loss_1gpu": "loss 1 GPU", "loss_ngpu": f"loss {n} GPUs"}),
    ]
    return "\n".join(lines)


def write_scaling(report: dict, meta: dict, out: str) -> str:
    """Write ``out``.md (``meta``'s header, then ``scaling_markdown``) and ``out``.json; return the markdown."""
    return write_results(out, meta, scaling_markdown(report), report)
