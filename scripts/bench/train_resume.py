"""The training benchmark's resume check (``python -m scripts.bench.train VARIANT --resume K``): a run
stopped at step K and rerun with the same command (which resumes from its checkpoint) against one
straight run, loss by loss."""

from __future__ import annotations

import argparse
import os

from scripts.bench.results import describe, write_results
from scripts.bench.summarize_runs import compare_losses, largest_differences, loss_table, summarize
from scripts.bench.train_launch import bench_run, one_gpu_env


def resume_check(args: argparse.Namespace) -> int:
    """``--resume K``: one straight run, one stopped at step K and rerun (resuming); writes
    OUT/resume.{md,json}; the exit status (1 unless every step after K was compared)."""
    variant, k = args.variants[0], args.resume
    base = args.name_prefix + variant
    common = ("--metrics.log_freq", "1", "--checkpoint.enable", "--checkpoint.interval", str(10 * args.steps),
              "--reliability.stop_at_step", str(k))
    straight = bench_run(args, variant, f"{base}_straight", 1, "--metrics.log_freq", "1", env=one_gpu_env())
    stopped = bench_run(args, variant, f"{base}_resumed", 1, *common, env=one_gpu_env())
    resumed = stopped and bench_run(args, variant, f"{base}_resumed", 1, *common, env=one_gpu_env(), fresh=False)
    if not (straight and resumed):
        return 1
    report = resume_report(summarize(straight, 0)["loss"], summarize(resumed, 0)["loss"], k)
    meta = describe(f"Resume: {variant} stopped at step {k} and rerun vs one straight run",
                    f"training loss per step after step {k} of {args.steps}, on one GPU", args.command)
    print(write_results(os.path.join(args.out, "resume"), meta, resume_markdown(report), report))
    return 0 if report["steps_compared"] == args.steps - k else 1


def resume_report(straight: dict[int, float], resumed: dict[int, float], k: int) -> dict:
    """Losses (step -> loss) of the straight and the stopped-at-K-and-resumed run: the steps after K
    side by side, how many are bit-identical, the largest absolute and relative difference."""
    steps = sorted(s for s in set(straight) & set(resumed) if s > k)
    rows = compare_losses({"straight": straight, "resumed": resumed}, steps)
    return {"stopped_at": k, "steps_compared": len(rows), "identical": sum(r["abs_diff"] == 0 for r in rows),
            **largest_differences(rows), "losses": rows}


def resume_markdown(report: dict) -> str:
    """The body of the resume page: the summary line and the loss table."""
    if not report["losses"]:
        return f"The rerun logged no step after the stop at step {report['stopped_at']}.\n"
    summary = (f"{report['steps_compared']} steps after the stop compared: {report['identical']} bit-identical, "
               f"max absolute difference {report['max_abs_diff']:.3g}, max relative {report['max_rel_diff']:.3g}.")
    return summary + "\n\n" + loss_table(report["losses"], {"straight": "loss straight", "resumed": "loss resumed"})
