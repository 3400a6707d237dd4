"""Summarise training runs from their metrics.jsonl files into a markdown table and JSON.

    python -m scripts.bench.summarize_runs RUN_DIR [RUN_DIR ...] --baseline NAME --out PREFIX

Throughput and MFU are averaged over logged steps after the first ``--skip`` steps (compile and
warm-up); ratios are against the baseline run from the same invocation. Writes PREFIX.md and
PREFIX.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from scripts.bench.results import command_line, describe, table, write_results

LOSS = "loss_metrics/global_avg_loss"


def summarize(run_dir: str, skip: int) -> dict:
    """One run's ``run`` (folder name), mean ``tokens_per_s`` per device and ``mfu_pct`` over the
    steps after ``skip`` (all steps when none is later), ``peak_mem_gib`` and ``loss`` (step -> loss)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if "throughput(tps)" in r]
    timed = [r for r in train if r["step"] > skip] or train
    return {
        "run": os.path.basename(os.path.normpath(run_dir)),
        "tokens_per_s": statistics.mean(r["throughput(tps)"] for r in timed),
        "mfu_pct": statistics.mean(r["mfu(%)"] for r in timed),
        "peak_mem_gib": max(r["memory/max_reserved(GiB)"] for r in train),
        "loss": {r["step"]: r[LOSS] for r in train},
    }


def round_ratios(rounds: list[list[dict | None]], variants: list[str]) -> list[dict]:
    """Per variant, its tokens/s over the first variant's in each round (``rounds``: per round, the rows
    of ``summarize`` in the order of ``variants``, None for a run that logged no step; a round without
    its baseline gives no ratio): ``{"variant", "ratios", "median", "min", "max"}`` (None without a ratio)."""
    out = []
    for i, variant in enumerate(variants):
        ratios = [row[i]["tokens_per_s"] / row[0]["tokens_per_s"] for row in rounds if row[0] and row[i]]
        out.append({"variant": variant, "ratios": ratios, "median": statistics.median(ratios) if ratios else None,
                    "min": min(ratios, default=None), "max": max(ratios, default=None)})
    return out


def round_ratios_markdown(spread: list[dict], baseline: str) -> str:
    """A table of ``round_ratios``: each variant's ratio to ``baseline`` per round, their median and range."""
    def cells(r):
        if not r["ratios"]:
            return [r["variant"], "-", "-", "-"]
        return [r["variant"], ", ".join(f"{x:.3f}" for x in r["ratios"]), f"{r['median']:.3f}",
                f"{r['min']:.3f}-{r['max']:.3f}"]

    columns = ["variant", f"vs {baseline}, per round (runs in turn)", "median", "range"]
    return "\n".join(table(columns, map(cells, spread))) + "\n"


def markdown(rows: list[dict], baseline: str) -> str:
    """One table row per run (rows of ``summarize``): tokens/s per GPU and its ratio to the run named
    ``baseline``, MFU, peak memory, first and last loss; with GPU telemetry in any row (its ``gpu``,
    ``gpu_telemetry.summarize``) the median SM clock and power and the share of samples at the power cap."""
    base = next(r for r in rows if r["run"] == baseline)["tokens_per_s"]
    telemetry = any(r.get("gpu") for r in rows)

    def cells(r):
        steps = sorted(r["loss"])
        row = [r["run"], f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s'] / base:.3f}", f"{r['mfu_pct']:.1f}",
               f"{r['peak_mem_gib']:.1f}", f"{r['loss'][steps[0]]:.4f}", f"{r['loss'][steps[-1]]:.4f}"]
        if telemetry:
            gpu = r.get("gpu")
            row += ([f"{gpu['sm_mhz']:.0f}", f"{gpu['power_w']:.0f} / {gpu['limit_w']:.0f}",
                     f"{100 * gpu['power_capped']:.0f}"] if gpu else ["", "", ""])
        return row

    columns = ["run", "tokens/s/GPU", f"vs {baseline}", "MFU %", "peak mem GiB", "first loss", "last loss"]
    if telemetry:
        columns += ["SM MHz", "power / limit W", "at power cap %"]
    return "\n".join(table(columns, map(cells, rows))) + "\n"


def compare_losses(curves: dict[str, dict[int, float]], steps: list[int]) -> list[dict]:
    """Two named loss curves (name -> {step: loss}; the first is the reference) side by side: per
    step of ``steps``, both losses under their names, the absolute difference and the difference
    relative to the reference."""
    (a, first), (b, second) = curves.items()
    return [{"step": s, a: first[s], b: second[s], "abs_diff": abs(second[s] - first[s]),
             "rel_diff": abs(second[s] - first[s]) / abs(first[s])} for s in steps]


def largest_differences(rows: list[dict]) -> dict:
    """``max_abs_diff`` and ``max_rel_diff`` over ``compare_losses`` rows (None when there are none)."""
    return {"max_abs_diff": max((r["abs_diff"] for r in rows), default=None),
            "max_rel_diff": max((r["rel_diff"] for r in rows), default=None)}


def loss_table(rows: list[dict], columns: dict[str, str]) -> str:
    """``compare_losses`` rows as a markdown table; ``columns`` maps the two curve names to column titles."""
    (a, title_a), (b, title_b) = columns.items()
    cells = ((r["step"], f"{r[a]:.6f}", f"{r[b]:.6f}", f"{r['abs_diff']:.3g}", f"{r['rel_diff']:.3g}") for r in rows)
    return "\n".join(table(["step", title_a, title_b, "abs diff", "rel diff"], cells)) + "\n"


def check_runs(parser: argparse.ArgumentParser, runs: list[str], baseline: str) -> None:
    """argparse error unless every run folder holds a metrics.jsonl and ``baseline`` names one of them
    (the ratios' 1.0; another name was a StopIteration traceback)."""
    missing = [run for run in runs if not os.path.isfile(os.path.join(run, "metrics.jsonl"))]
    if missing:
        parser.error(f"runs: {missing} hold no metrics.jsonl; expected run folders (job.dump_folder) of train.py")
    names = [os.path.basename(os.path.normpath(run)) for run in runs]
    if baseline not in names:
        parser.error(f"--baseline {baseline!r} is none of the runs; expected one of {names}")


def main(argv: list[str] | None = None) -> None:
    """Summarise the run folders on the command line into OUT.md and OUT.json."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--baseline", required=True, help="run folder name used as the ratio's 1.0")
    parser.add_argument("--skip", type=int, default=10, help="steps left out of the throughput mean")
    parser.add_argument("--out", required=True, help="writes OUT.md and OUT.json")
    args = parser.parse_args(argv)
    check_runs(parser, args.runs, args.baseline)
    rows = [summarize(r, args.skip) for r in args.runs]
    meta = describe("Training runs", f"tokens/s per GPU, MFU and peak memory from the metrics.jsonl of "
                    f"{len(rows)} runs (means over the steps after {args.skip}), ratios against {args.baseline}",
                    command_line(__spec__.name, argv))
    print(write_results(args.out, meta, markdown(rows, args.baseline), {"runs": rows}))


if __name__ == "__main__":
    main()
