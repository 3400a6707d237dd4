"""The paper's Table 3 layout: LMB ppl, Wiki ppl, LMB acc, eight accuracies, their average.

Metrics per task are SPEC.md section 4's; accuracies are shown in percent, perplexities as is.
The average is over the nine accuracy columns (LMB acc included), as in the paper. A row scored
on part of a task's documents (lm-eval's ``limit``) is marked ``†`` and a note says how many.
"""

from __future__ import annotations

import math

# (header, task, lm-eval metric, is an accuracy), in the paper's column order.
COLUMNS = (
    ("LMB. ppl", "lambada_openai", "perplexity", False),
    ("Wiki ppl", "wikitext", "word_perplexity", False),
    ("LMB. acc", "lambada_openai", "acc", True),
    ("BoolQ", "boolq", "acc", True),
    ("HSwag", "hellaswag", "acc_norm", True),
    ("PIQA", "piqa", "acc", True),
    ("ARC-e", "arc_easy", "acc", True),
    ("ARC-c", "arc_challenge", "acc_norm", True),
    ("Wino.", "winogrande", "acc", True),
    ("OBQA", "openbookqa", "acc_norm", True),
    ("SciQ", "sciq", "acc", True),
)
N_ACCURACIES = sum(1 for c in COLUMNS if c[3])


def metric(results: dict, task: str, name: str) -> float | None:
    """``results["results"][task]["<name>,none"]`` from lm-eval's output, or None when absent."""
    value = results.get("results", {}).get(task, {}).get(f"{name},none")
    return None if value is None else float(value)


def row_values(results: dict) -> tuple[list[float | None], float | None, int]:
    """Column values (accuracies in percent), the average accuracy and how many it averages."""
    values = []
    for _, task, name, is_acc in COLUMNS:
        value = metric(results, task, name)
        values.append(None if value is None else (100.0 * value if is_acc else value))
    accs = [v for v, c in zip(values, COLUMNS) if c[3] and v is not None]
    return values, (sum(accs) / len(accs) if accs else None), len(accs)


def cut_tasks(results: dict) -> list[str]:
    """``"<task> <scored> of <documents>"`` for each table task scored on part of its documents
    (lm-eval's ``n-samples``: ``effective`` < ``original`` under a ``limit``)."""
    samples = results.get("n-samples", {})
    tasks = dict.fromkeys(c[1] for c in COLUMNS)
    return [f"{t} {samples[t]['effective']} of {samples[t]['original']}" for t in tasks
            if t in samples and samples[t].get("effective", 0) < samples[t].get("original", 0)]


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.2f}"


def markdown_table(rows: list[tuple[str, dict]]) -> str:
    """``[(row name, lm-eval results dict)]`` -> a markdown table in the paper's column order."""
    header = ["Model", *(c[0] for c in COLUMNS), "Avg."]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    partial, cut = False, []
    for name, results in rows:
        values, average, count = row_values(results)
        avg = _fmt(average)
        if average is not None and count < N_ACCURACIES:
            avg, partial = avg + "*", True
        if cut_tasks(results):  # a limited run must not pass for a full-set score
            cut.append(f"{name}: {', '.join(cut_tasks(results))}")
            name += "†"
        lines.append("| " + " | ".join([name, *map(_fmt, values), avg]) + " |")
    if partial:
        lines.append("")
        lines.append(f"\\* average over the accuracy columns present (not all {N_ACCURACIES} tasks were run)")
    if cut:
        lines.append("")
        lines.append("† scored on part of each task's documents (lm-eval limit), not comparable to full-set "
                     "scores: " + "; ".join(cut))
    return "\n".join(lines) + "\n"
