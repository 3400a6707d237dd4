"""Figures of diagnostics results (matplotlib's object API: no pyplot state, no display needed).

Every function takes ``runs``: an ordered mapping label -> :class:`DiagnosticsResult`, and
returns a :class:`matplotlib.figure.Figure`.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

ATTENTION_LABELS = {
    "cor": "COR = ||Σ_KV ρ|| / ||v̄||",
    "cpa": "CPA = ||Σ_KV ρ|| / (||ρ|| ||Σ_KV||₂)",
    "corr": "KV correlation ||Corr||_F",
    "probe_norm": "probe norm ||ρ||",
    "w_min": "min w_ij (score range)",
    "w_max": "max w_ij (score range)",
    "sink_p": "softmax sink p_i,first",
    "sink_w": "Parallax sink w²_first / Σ_j w²",
    "entropy": "attention entropy H_i (nats)",
    "gate": "gate opening σ(w_g·x)",
    "cka_v": "cross-head CKA of V (real inputs)",
}
MATRIX_ORDER = ("W_Q", "W_K", "W_V", "W_O", "W_R", "W_QK", "W_OV", "W_RK", "W_1", "W_2", "W_3")
PER_HEAD_ORDER = ("W_Q_h", "W_K_h", "W_V_h", "W_O_h", "W_R_h", "W_QK", "W_OV", "W_RK")
SPECTRAL_LABELS = {"stable_rank": "stable rank", "erank": "eRank", "energy_erank": "output-energy eRank",
                   "top_k_energy": "top-k energy", "spectral_entropy": "normalised spectral entropy"}


def _axes_grid(n: int, cols: int, width: float = 4.2, height: float = 3.2):
    rows = (n + cols - 1) // cols
    fig = Figure(figsize=(width * min(n, cols), height * rows), layout="constrained")
    axes = fig.subplots(rows, min(n, cols), squeeze=False).flatten()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def depth_panels(runs: dict, metrics: list[str], title: str, cols: int = 2) -> Figure:
    """One panel per attention metric: value by layer, one line per run."""
    fig, axes = _axes_grid(len(metrics), cols)
    for ax, metric in zip(axes, metrics):
        for label, result in runs.items():
            values = np.array(result.depth(metric), dtype=float)
            if np.isfinite(values).any():
                ax.plot(sorted(result.attention), values, marker="o", ms=3, label=label)
        ax.set_title(ATTENTION_LABELS.get(metric, metric), fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not defined for these models", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title)
    return fig


def spectral_depth_figure(runs: dict, metric: str, matrices=PER_HEAD_ORDER, cols: int = 4) -> Figure:
    """One panel per matrix type: a spectral metric by layer, one line per run."""
    present = [m for m in matrices if any(m in layer for r in runs.values() for layer in r.spectral.values())]
    fig, axes = _axes_grid(len(present), cols, width=3.4, height=2.8)
    for ax, matrix in zip(axes, present):
        for label, result in runs.items():
            values = np.array(result.spectral_depth(matrix, metric), dtype=float)
            if np.isfinite(values).any():
                ax.plot(sorted(result.spectral), values, marker="o", ms=3, label=label)
        ax.set_title(matrix, fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(SPECTRAL_LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{SPECTRAL_LABELS.get(metric, metric)} by depth (per-head types averaged over heads)")
    return fig


def spectra_figure(runs: dict, matrices=MATRIX_ORDER, cols: int = 4) -> Figure:
    """Normalised singular-value spectra sigma_i / sigma_1 against i / R: median over layers
    (line) and 25-75% band, one colour per run, one panel per matrix type. A layer without a
    spectrum (NaN: a zero matrix) is left out, as from the layer means of the tables."""
    present = [m for m in matrices if any(m in layer for r in runs.values() for layer in r.spectra.values())]
    fig, axes = _axes_grid(len(present), cols, width=3.4, height=2.8)
    colors = [f"C{i}" for i in range(len(runs))]
    for ax, matrix in zip(axes, present):
        for color, (label, result) in zip(colors, runs.items()):
            curves = [layer[matrix].cpu().numpy() for layer in result.spectra.values()
                      if matrix in layer and not layer[matrix].isnan().all()]
            if not curves:
                continue
            stack = np.stack(curves)
            x = (np.arange(stack.shape[1]) + 1) / stack.shape[1]
            lo, mid, hi = np.percentile(stack, [25, 50, 75], axis=0)
            ax.plot(x, mid, color=color, label=label)
            ax.fill_between(x, np.maximum(lo, 1e-12), np.maximum(hi, 1e-12), color=color, alpha=0.25)
        ax.set_yscale("log")
        ax.set_title(matrix, fontsize=10)
        ax.set_xlabel("mode index i / R")
        ax.set_ylabel(r"$\sigma_i / \sigma_1$")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle("Normalised singular-value spectra (median over layers, band 25-75%)")
    return fig


def cka_figure(runs: dict) -> Figure:
    """Cross-head linear CKA of V outputs by layer: fixed Gaussian inputs and real inputs."""
    fig, axes = _axes_grid(2, 2)
    for label, result in runs.items():
        layers = sorted(result.spectral)
        fixed = [result.spectral[i].get("cka", {}).get("v_fixed", np.nan) for i in layers]
        axes[0].plot(layers, fixed, marker="o", ms=3, label=label)
        axes[1].plot(sorted(result.attention), result.depth("cka_v"), marker="o", ms=3, label=label)
    for ax, title in zip(axes, ("fixed Gaussian inputs", "real inputs (held-out batch)")):
        ax.set_title(f"cross-head CKA of V outputs, {title}", fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylabel("mean pairwise linear CKA")
        ax.set_ylim(0, 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def training_figures(result, step: int) -> dict[str, Figure]:
    """TensorBoard depth profiles of one pass: ``diag/depth/<metric>`` per attention metric and
    ``diag/depth/stable_rank`` / ``diag/depth/erank`` (one line per per-head matrix type)."""
    figures = {}
    layers = sorted(result.attention)
    metrics = sorted({k for stats in result.attention.values() for k in stats})
    for metric in metrics:
        fig = Figure(figsize=(5, 3.4), layout="constrained")
        ax = fig.subplots()
        ax.plot(layers, result.depth(metric), marker="o")
        ax.set(xlabel="layer", ylabel=metric, title=f"{ATTENTION_LABELS.get(metric, metric)}, step {step}")
        ax.grid(alpha=0.3)
        figures[f"diag/depth/{metric}"] = fig
    for metric in ("stable_rank", "erank") if result.spectral else ():
        fig = Figure(figsize=(5.5, 3.6), layout="constrained")
        ax = fig.subplots()
        for matrix in PER_HEAD_ORDER:
            values = result.spectral_depth(matrix, metric)
            if np.isfinite(values).any():
                ax.plot(sorted(result.spectral), values, marker="o", ms=3, label=matrix)
        ax.set(xlabel="layer", ylabel=SPECTRAL_LABELS[metric], title=f"{SPECTRAL_LABELS[metric]} per head, step {step}")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        figures[f"diag/depth/{metric}"] = fig
    return figures
