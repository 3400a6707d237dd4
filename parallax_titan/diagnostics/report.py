"""The analysis report of ``scripts/analyze.py``: checkpoints -> markdown, PNG figures, JSON.

:func:`load_checkpoint_model` rebuilds a model from a TOML config and a DCP checkpoint folder
written by the trainer (flattened model keys, as :mod:`parallax_titan.uptrain` reads them), its
files checked against its checksum manifest first and the model settings its ``settings.json``
records compared with the config's;
:func:`write_report` writes ``report.md`` with its figures beside it.
"""

from __future__ import annotations

import copy
import math
import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from parallax_titan.atomic import finite_or_null, replacing, write_json, write_text
from parallax_titan.checkpoint_files import (
    describe, saved_shapes, state_shapes, verify_before_load, weight_mismatches)
from parallax_titan.diagnostics import plots
from parallax_titan.diagnostics.runner import DiagnosticsResult
from parallax_titan.resume_rules import check_model_settings

TABLE_COLUMNS = ("W_Q_h", "W_K_h", "W_V_h", "W_O_h", "W_R_h", "W_QK", "W_OV", "W_RK")
FULL_COLUMNS = ("W_Q", "W_K", "W_V", "W_O", "W_R", "W_1", "W_2", "W_3")
ATTENTION_COLUMNS = ("cor", "cpa", "corr", "probe_norm", "w_min", "w_max", "sink_p", "sink_w", "entropy", "gate", "cka_v")


def match_checkpoint(job_config, keys: dict[str, tuple[int, ...]]) -> None:
    """Set ``model.name`` and ``parallax.gate`` of ``job_config`` to what the checkpoint holds
    (W_R present or not; gate width), so one TOML serves a Parallax and a Transformer run."""
    has_probe = any(".attention.wr." in k for k in keys)
    name = job_config.model.name
    if has_probe and name.startswith("transformer"):
        job_config.model.name = name.replace("transformer", "parallax", 1)
    elif not has_probe and name.startswith("parallax"):
        job_config.model.name = name.replace("parallax", "transformer", 1)
    gates = [shape for k, shape in keys.items() if k.endswith(".attention.gate.weight")]
    job_config.parallax.gate = "none" if not gates else ("token" if gates[0][0] == 1 else "head")


def load_checkpoint_model(job_config, checkpoint_dir: str, verify: bool = True, *, who: str = "--checkpoint",
                          off_switch: str = "--no-verify") -> torch.nn.Module:
    """Build the model of ``job_config`` (matched to the checkpoint) in float32 on CPU and load
    the checkpoint's weights. ``verify``: first check the folder's files against its checksum
    manifest (:func:`parallax_titan.checkpoint_files.verify_before_load`: CheckpointError naming
    ``who``, the file and ``off_switch``). Raises ValueError naming the checkpoint when it holds
    another model, and naming ``who`` and the key when its ``settings.json`` records a [parallax]
    switch or model argument with another value than the config
    (:func:`parallax_titan.resume_rules.check_model_settings`, as the evaluation loaders)."""
    from torchtitan.protocols.train_spec import get_train_spec

    from parallax_titan.spec import register_all

    verify_before_load(checkpoint_dir, who, off_switch, verify)
    try:
        keys = saved_shapes(checkpoint_dir)
    except ValueError as exc:
        raise ValueError(f"{who} {exc}") from None
    job_config = copy.deepcopy(job_config)
    match_checkpoint(job_config, keys)
    register_all()
    spec = get_train_spec(job_config.model.name)
    args = copy.deepcopy(spec.model_args[job_config.model.flavor])
    args.update_from_config(job_config)
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights()
    state = get_model_state_dict(model)
    mismatches = weight_mismatches(keys, state_shapes(state))
    if mismatches:
        raise ValueError(f"{who} {checkpoint_dir!r} holds another model than "
                         f"{job_config.model.name}/{job_config.model.flavor}: {describe(mismatches)}; wrong config?")
    check_model_settings(checkpoint_dir, args, who)
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_model_state_dict(model, state)
    model.eval()
    return model


def _fmt(value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def _mean_over_layers(result: DiagnosticsResult, matrix: str, metric: str) -> float:
    values = [v for v in result.spectral_depth(matrix, metric) if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def rank_table(runs: dict, metric: str, columns=TABLE_COLUMNS) -> str:
    """Markdown table: one row per run, one column per matrix type, ``metric`` averaged over heads
    and layers (the layout of the Parallax paper's Table 4)."""
    header = "| run | " + " | ".join(c.removesuffix("_h") for c in columns) + " |"
    lines = [header, "|---" * (len(columns) + 1) + "|"]
    for label, result in runs.items():
        lines.append(f"| {label} | " + " | ".join(_fmt(_mean_over_layers(result, c, metric)) for c in columns) + " |")
    return "\n".join(lines)


def attention_table(label: str, result: DiagnosticsResult) -> str:
    """Markdown table of one run's attention statistics, one row per layer."""
    columns = [c for c in ATTENTION_COLUMNS if any(c in s for s in result.attention.values())]
    lines = [f"**{label}**", "", "| layer | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for layer in sorted(result.attention):
        stats = result.attention[layer]
        lines.append(f"| {layer} | " + " | ".join(_fmt(stats.get(c, float("nan"))) for c in columns) + " |")
    return "\n".join(lines)


FIGURES = {
    "probe_collapse.png": ("Probe collapse by depth", ["cor", "cpa", "corr", "probe_norm"]),
    "scores_sinks.png": ("Score range and attention sinks by depth", ["w_min", "w_max", "sink_p", "sink_w"]),
    "entropy_gate.png": ("Attention entropy and gate openings by depth", ["entropy", "gate"]),
}


SPECTRAL_FIGURES = ("stable_rank_depth.png", "erank_depth.png", "spectra.png", "cka.png")
REPORT_FILES = ("report.md", "results.json", *FIGURES, *SPECTRAL_FIGURES)
"""Every file :func:`write_report` writes: an ``--out`` holding others is not a report folder."""


def report_owned(name: str) -> bool:
    """Whether ``name`` is a file :func:`write_report` writes (for ``check_output_folder``), or the
    temporary file of one (``.<name>.partial-<pid>``, :func:`parallax_titan.atomic.replacing`) that a
    killed run left behind."""
    own, partial, pid = name.removeprefix(".").partition(".partial-")
    return name in REPORT_FILES or (name.startswith(".") and own in REPORT_FILES and bool(partial) and pid.isdigit())


def save_figures(runs: dict, out_dir: str) -> list[str]:
    """Write every report figure into ``out_dir``, each whole (:func:`parallax_titan.atomic.replacing`);
    returns their file names."""
    figures = {name: plots.depth_panels(runs, metrics, title) for name, (title, metrics) in FIGURES.items()}
    rank, erank, spectra, cka = SPECTRAL_FIGURES
    figures[rank] = plots.spectral_depth_figure(runs, "stable_rank")
    figures[erank] = plots.spectral_depth_figure(runs, "erank")
    figures[spectra] = plots.spectra_figure(runs)
    figures[cka] = plots.cka_figure(runs)
    for name, figure in figures.items():
        with replacing(os.path.join(out_dir, name)) as temporary:
            figure.savefig(temporary, dpi=110, format="png")  # the temporary name has no .png to infer it from
    return list(figures)


def result_to_json(result: DiagnosticsResult) -> dict:
    """``result`` as strict JSON values (a NaN or inf metric becomes null)."""
    return finite_or_null({
        "attention": result.attention, "spectral": result.spectral, "cost": result.cost,
        "spectra": {layer: {k: v.tolist() for k, v in mats.items()} for layer, mats in result.spectra.items()},
    })


def write_report(runs: dict, sources: dict, out_dir: str, settings: dict, command: str) -> str:
    """Write ``report.md``, its PNG figures and ``results.json`` into ``out_dir``, each whole
    (:mod:`parallax_titan.atomic`: a killed or failed run leaves the earlier file or the new one),
    ``report.md`` last.

    runs: label -> DiagnosticsResult; sources: label -> (checkpoint folder, model name/flavor);
    settings: held-out batch and diagnostics settings shown in the report. Returns the report path.
    """
    os.makedirs(out_dir, exist_ok=True)
    save_figures(runs, out_dir)
    write_json(os.path.join(out_dir, "results.json"), {label: result_to_json(r) for label, r in runs.items()})
    md = ["# Diagnostics report", "", f"Command: `{command}`", "", "| run | checkpoint | model |", "|---|---|---|"]
    md += [f"| {label} | `{path}` | {model} |" for label, (path, model) in sources.items()]
    md += ["", "Held-out batch and settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()), "",
           "Definitions: SPEC.md sections 1 and 3; `docs/diagnostics.md` explains each quantity.", ""]
    md += ["## Probe collapse", "", "![probe collapse](probe_collapse.png)", "",
           "## Score range and attention sinks", "", "![score range and sinks](scores_sinks.png)", "",
           "## Entropy and gate", "", "![entropy](entropy_gate.png)", "", "Per layer:", ""]
    for label, result in runs.items():
        md += [attention_table(label, result), ""]
    md += ["## Stable rank and eRank (layout of the Parallax paper's Table 4)", "",
           "Per head (circuits W_QK = W_Q W_K^T, W_OV = W_O W_V, W_RK = W_R W_K^T built per head), "
           "averaged over heads and layers.", "", "Stable rank:", "", rank_table(runs, "stable_rank"), "",
           "eRank:", "", rank_table(runs, "erank"), "",
           "Full matrices (projections and MLP W_1 gate, W_2 down, W_3 up), averaged over layers:", "",
           "Stable rank:", "", rank_table(runs, "stable_rank", FULL_COLUMNS), "", "eRank:", "",
           rank_table(runs, "erank", FULL_COLUMNS), "", "Output-energy eRank (per head):", "",
           rank_table(runs, "energy_erank"), "",
           "![stable rank by depth](stable_rank_depth.png)", "", "![eRank by depth](erank_depth.png)", "",
           "## Normalised singular-value spectra", "", "![spectra](spectra.png)", "",
           "## Cross-head CKA of V outputs", "", "![cka](cka.png)", "", "## Cost", "",
           "| run | attention pass (s) | spectral metrics (s) |", "|---|---|---|"]
    md += [f"| {label} | {r.cost.get('attention_s', 0):.2f} | {r.cost.get('spectral_s', 0):.2f} |" for label, r in runs.items()]
    path = os.path.join(out_dir, "report.md")
    write_text(path, "\n".join(md) + "\n")
    return path
