"""MAD scores from run records: best per setting over the optimiser sweep, mean per task.

As mad-lab's ``analysis.compute_model_mad_scores``: the best run over (lr, weight decay) of each
setting by test accuracy, then the mean over the task's settings. Writes ``results.json`` (scores
and every run), ``table.md`` and, when the harder sweep ran, ``hard_sweep.png``. The paper's
Table 1 numbers are means over all of MAD's settings of a task, so the table shows them beside
ours only where ours averages the same settings (all of them); elsewhere it says why not.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

from eval.mad.grid import task_settings
from eval.mad.tasks import SHORT, TASKS
from parallax_titan.atomic import replacing, write_json, write_text

# Parallax paper, Table 1(a): MAD accuracy, Muon, two blocks at width 128 (SPEC.md section 4).
PAPER = {
    "attention": {"CMP": 0.342, "ICR": 0.803, "FCR": 0.268, "NCR": 0.861, "MEM": 0.807, "SC": 0.950, "avg": 0.672},
    "parallax": {"CMP": 0.332, "ICR": 0.951, "FCR": 0.356, "NCR": 0.937, "MEM": 0.733, "SC": 0.988, "avg": 0.716},
}


RECORD_KEYS = ("task", "setting", "mixer", "lr", "weight_decay", "test_acc")  # what scoring a run reads


def run_key(record: dict) -> tuple:
    """(setting label, mixer, lr, weight decay): what identifies one run of a grid."""
    return record["setting"], record["mixer"], float(record["lr"]), float(record["weight_decay"])


def load_runs(path: str) -> list[dict]:
    """Records of a runs.jsonl file (a partial last line, left by a killed write, is skipped);
    ValueError naming the file and line for a line that is not a run record."""
    with open(path) as f:
        text = f.read()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return [_record(line, path, number) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _record(line: str, path: str, number: int) -> dict:
    """One line of a runs.jsonl file as a run record; ValueError when it is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        record = None
    if not (isinstance(record, dict) and all(k in record for k in RECORD_KEYS) and record["task"] in TASKS):
        raise ValueError(f"{path}: line {number} = {line[:80]!r}: expected a run record, a JSON object with "
                         f"{list(RECORD_KEYS)} and a task from {TASKS}")
    return record


def best_per_setting(runs: list[dict]) -> dict:
    """{(mixer, task, setting): best run record by test accuracy (a NaN counts as 0)}."""
    best = {}
    for r in runs:
        key = (r["mixer"], r["task"], r["setting"])
        acc = r["test_acc"] if r["test_acc"] == r["test_acc"] else 0.0
        if key not in best or acc > best[key]["test_acc"]:
            best[key] = {**r, "test_acc": acc}
    return best


def task_scores(best: dict, key: str = "test_acc") -> dict:
    """{mixer: {short task: (mean of the best runs' ``key``, number of settings)}, plus "avg" over tasks}."""
    per = defaultdict(lambda: defaultdict(list))
    for (mixer, task, _), r in best.items():
        per[mixer][SHORT[task]].append(r.get(key, float("nan")))
    scores = {}
    for mixer, tasks in per.items():
        scores[mixer] = {t: (sum(v) / len(v), len(v)) for t, v in tasks.items()}
        means = [m for m, _ in scores[mixer].values()]
        scores[mixer]["avg"] = (sum(means) / len(means), len(means))
    return scores


MAD_SETTINGS = {SHORT[t]: len(task_settings(t, "mad")) for t in TASKS}  # 66 in all


def same_settings_as_paper(scores: dict, mixer: str, task: str) -> bool:
    """Whether ``scores[mixer][task]`` averages all of MAD's settings, as the paper's number does."""
    if task == "avg":
        return all(same_settings_as_paper(scores, mixer, t) for t in MAD_SETTINGS)
    return scores[mixer].get(task, (0, 0))[1] == MAD_SETTINGS[task]


def finished_in_grid(runs: list[dict], planned: set[tuple]) -> set[tuple]:
    """The :func:`run_key` of each of ``runs`` that the grid ``planned``."""
    return {run_key(r) for r in runs} & planned


def unfinished_sweeps(runs: list[dict], planned: set[tuple]) -> dict:
    """{(mixer, setting): (finished, planned)} of the grid's settings whose lr / weight-decay sweep
    has some but not all of its ``planned`` runs (:func:`run_key`) finished."""
    finished = finished_in_grid(runs, planned)
    counts = defaultdict(lambda: [0, 0])
    for key in planned:
        counts[key[1], key[0]][1] += 1
    for key in finished:
        counts[key[1], key[0]][0] += 1
    return {pair: tuple(n) for pair, n in counts.items() if 0 < n[0] < n[1]}


def markdown(scores: dict, best: dict, title: str, note: str = "", micro: dict | None = None,
             runs_line: str = "", unfinished: dict | None = None) -> str:
    """The task table (ours, micro beside it, the paper's where comparable) and the per-setting table;
    ``unfinished`` (:func:`unfinished_sweeps`) marks the best runs of sweeps not yet finished."""
    unfinished = unfinished or {}
    mixers = sorted(scores)
    micro = micro or {}
    order = [SHORT[t] for t in TASKS if any(SHORT[t] in scores[m] for m in mixers)] + ["avg"]
    head = []
    for m in mixers:
        head += [f"{m} (ours)", f"{m} micro"] + ([f"{m} (paper)"] if m in PAPER else [])
    lines = [f"# {title}", "", note, "", runs_line, "", "| task | " + " | ".join(head) + " |",
             "|---|" + "---|" * len(head)]
    for t in order:
        cells = []
        for m in mixers:
            mean, n = scores[m].get(t, (float("nan"), 0))
            cells += [f"{mean:.3f} (n={n})", f"{micro.get(m, {}).get(t, (float('nan'), 0))[0]:.3f}"]
            if m in PAPER:
                comparable = t in PAPER[m] and same_settings_as_paper(scores, m, t)
                cells.append(f"{PAPER[m][t]:.3f}" if comparable else "n/a")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines += ["", "Ours: MAD's score, mad-lab's test accuracy (torchmetrics macro MulticlassAccuracy per test "
              "batch of 128 sequences, averaged over batches) of the best run over lr and weight decay per "
              "setting, then the mean over the n settings of the task (avg: over tasks). micro: the plain "
              "fraction of correct scored tokens of the same best runs. Paper (seed 001 Table 1a): means over "
              f"all of MAD's settings ({', '.join(f'{t} {n}' for t, n in MAD_SETTINGS.items())}; 66 in all), "
              "shown only where ours averages the same settings; n/a: ours covers fewer, not comparable.", "",
              "## Best run per setting (MAD score, micro; lr, weight decay)", "",
              *(["k of n runs: the best of a sweep over lr and weight decay that has not finished yet.", ""]
                if unfinished else []),
              "| setting | " + " | ".join(mixers) + " |", "|---|" + "---|" * len(mixers)]
    settings = sorted({(task, s) for (_, task, s) in best}, key=lambda k: (TASKS.index(k[0]), k[1]))
    for task, s in settings:
        cells = []
        for m in mixers:
            r = best.get((m, task, s))
            sweep = "; {} of {} runs".format(*unfinished[m, s]) if (m, s) in unfinished else ""
            cells.append(f"{r['test_acc']:.3f}, {r.get('test_acc_micro', float('nan')):.3f} "
                         f"(lr {r['lr']:g}, wd {r['weight_decay']:g}{sweep})" if r else "-")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _difficulty_label(params: dict) -> str:
    label = f"V={params['vocab_size']}\nL={params['seq_len']}"
    if params.get("num_tokens_to_copy"):
        label += f"\ncopy={params['num_tokens_to_copy']}"
    return label


def plot_hard(best: dict, path: str, title: str = "") -> None:
    """Accuracy vs difficulty, one panel per task, one line per mixer, legend above (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if any(k[1] == t for k in best)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for mixer in sorted({k[0] for k in best}):
            rows = sorted((r for k, r in best.items() if k[0] == mixer and k[1] == task),
                          key=lambda r: (r["params"]["seq_len"], r["params"]["vocab_size"]))
            if rows:
                ax.plot(range(len(rows)), [r["test_acc"] for r in rows], marker="o", label=mixer)
                ax.set_xticks(range(len(rows)), [_difficulty_label(r["params"]) for r in rows], fontsize=8)
        ax.set_title(SHORT[task] + " (harder sweep)")
        ax.set_xlabel("difficulty (vocabulary V, context L)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (best over lr)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(labels), frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    with replacing(path) as temporary:
        fig.savefig(temporary, dpi=120, format="png")  # the temporary name has no .png to infer it from
    plt.close(fig)


def runs_line(runs: list[dict], planned: set[tuple] | None = None, mixers=None) -> str:
    """The table's line on how much of the grid finished: the runs whose :func:`run_key` is
    ``planned`` (the grid's, of its ``mixers``; all runs when None) against their number, and the
    runs outside the grid (other mixers, settings, lrs or weight decays) read from the same folder."""
    if planned is None:
        return f"Runs finished: {len(runs)}."
    line = f"Runs finished: {len(finished_in_grid(runs, planned))} of {len(planned)} planned"
    line += f" ({', '.join(mixers)})" if mixers is not None else ""
    outside = sum(run_key(r) not in planned for r in runs)
    return line + (f"; the table also reads {outside} runs outside this grid (other mixers, settings, learning "
                   "rates or weight decays) from the same folder." if outside else ".")


def write_report(runs: list[dict], out_dir: str, title: str, note: str = "", config: dict | None = None,
                 planned: set[tuple] | None = None, mixers=None) -> dict:
    """Write results.json, table.md (and hard_sweep.png for a harder sweep), each whole
    (:mod:`parallax_titan.atomic`; results.json strict JSON: a diverged run's NaN as null); returns the scores.

    ``planned``: the :func:`run_key` of every run of the grid (of its ``mixers``), for the "runs
    finished" line."""
    best = best_per_setting(runs)
    scores = task_scores(best)
    micro = task_scores(best, "test_acc_micro")
    unfinished = unfinished_sweeps(runs, planned) if planned is not None else {}
    write_text(os.path.join(out_dir, "table.md"), markdown(scores, best, title, note, micro,
                                                           runs_line(runs, planned, mixers), unfinished))
    finished = len(runs) if planned is None else len(finished_in_grid(runs, planned))
    summary = {"config": config, "runs_finished": finished, "runs_planned": None if planned is None else len(planned),
               "runs_read": len(runs),
               "scores": {m: {t: {"mean": v[0], "n": v[1], "micro": micro[m][t][0]} for t, v in s.items()}
                          for m, s in scores.items()},
               "paper": PAPER, "best": [r for r in best.values()], "runs": runs}
    write_json(os.path.join(out_dir, "results.json"), summary, indent=1)
    if config and config.get("sweep") == "hard":
        plot_hard(best, os.path.join(out_dir, "hard_sweep.png"), title)
    return scores
