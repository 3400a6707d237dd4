"""Summarise training runs from their metrics.jsonl files into a markdown table and JSON.

    python scripts/summarize_runs.py RUN_DIR [RUN_DIR ...] --baseline NAME --out PREFIX

Throughput and MFU are averaged over logged steps after the first ``--skip`` steps (compile and
warm-up); ratios are against the baseline run from the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


def summarize(run_dir: str, skip: int) -> dict:
    """Mean tokens/s per device, MFU, peak memory and the loss curve of one run."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if "throughput(tps)" in r]
    timed = [r for r in train if r["step"] > skip] or train
    return {
        "run": os.path.basename(os.path.normpath(run_dir)),
        "tokens_per_s": statistics.mean(r["throughput(tps)"] for r in timed),
        "mfu_pct": statistics.mean(r["mfu(%)"] for r in timed),
        "peak_mem_gib": max(r["memory/max_reserved(GiB)"] for r in train),
        "loss": {r["step"]: r["loss_metrics/global_avg_loss"] for r in train},
    }


def markdown(rows: list[dict], baseline: str) -> str:
    """One table row per run: tokens/s per GPU and its ratio to ``baseline``, MFU, memory, losses."""
    base = next(r for r in rows if r["run"] == baseline)["tokens_per_s"]
    lines = ["| run | tokens/s/GPU | vs " + baseline + " | MFU % | peak mem GiB | first loss | last loss |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = sorted(r["loss"])
        lines.append(
            f"| {r['run']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base:.3f} | {r['mfu_pct']:.1f} "
            f"| {r['peak_mem_gib']:.1f} | {r['loss'][steps[0]]:.4f} | {r['loss'][steps[-1]]:.4f} |")
    return "\n".join(lines) + "\n"


def write_report(text: str, data, out: str) -> str:
    """Write ``out``.md (``text``) and ``out``.json (``data``); return ``text``."""
    with open(out + ".md", "w") as f:
        f.write(text)
    with open(out + ".json", "w") as f:
        json.dump(data, f, indent=1)
    return text


def write_summary(rows: list[dict], baseline: str, out: str) -> str:
    """Write ``out``.md (the markdown table) and ``out``.json (the rows); return the table."""
    return write_report(markdown(rows, baseline), rows, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--baseline", required=True, help="run folder name used as the ratio's 1.0")
    parser.add_argument("--skip", type=int, default=10, help="steps left out of the throughput mean")
    parser.add_argument("--out", required=True, help="writes OUT.md and OUT.json")
    args = parser.parse_args()
    rows = [summarize(r, args.skip) for r in args.runs]
    print(write_summary(rows, args.baseline, args.out))


if __name__ == "__main__":
    main()
