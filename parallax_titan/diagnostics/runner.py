"""The diagnostics pass: a separate no-grad forward of a fixed held-out batch every ``freq`` steps.

The trainer calls :meth:`DiagnosticsRunner.maybe_run` after each step. When the step is not a
diagnostics step (or diagnostics are off) it returns at once: the training step, its outputs and
its speed are those of a run without the feature. On a diagnostics step the model's ordinary
forward runs on the held-out batch with temporary pre-hooks on the attention modules
(:mod:`.capture`); the spectral metrics read the weights (:mod:`.weights`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torchtitan.tools.logging import logger

from parallax_titan.data import record_policy
from parallax_titan.diagnostics.attention import causal_document_mask, layer_statistics
from parallax_titan.diagnostics.batch import heldout_tokens, resolve_dataset
from parallax_titan.diagnostics.capture import attention_hooks, gate_openings, project_qrkv
from parallax_titan.config import ConfigError
from parallax_titan.config.diagnostics import Diagnostics
from parallax_titan.diagnostics.spectral import mean_pairwise_cka
from parallax_titan.diagnostics.weights import spectral_diagnostics

LogFn = Callable[[dict, int], None]
FigureFn = Callable[[str, object, int], None]


@dataclass
class DiagnosticsResult:
    """One diagnostics pass. ``attention[layer][metric]``, ``spectral[layer][matrix][metric]``,
    ``spectra[layer][matrix]`` ((R,) float64 sigma_i / sigma_1) and ``cost`` in seconds."""

    attention: dict[int, dict[str, float]] = field(default_factory=dict)
    spectral: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    spectra: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)

    def scalars(self) -> dict[str, float]:
        """Flat ``diag/...`` tags: per layer (``diag/layer_03/cor``, ``diag/layer_03/W_QK/stable_rank``),
        averaged over layers (``diag/mean/...``) and the cost (``diag/cost/...``). NaN values are left out."""
        out = {}
        per_layer = {i: dict(stats) for i, stats in self.attention.items()}
        for layer, matrices in self.spectral.items():
            for matrix, metrics in matrices.items():
                for name, value in metrics.items():
                    per_layer.setdefault(layer, {})[f"{matrix}/{name}"] = value
        for layer, stats in per_layer.items():
            out.update({f"diag/layer_{layer:02d}/{k}": v for k, v in stats.items()})
        names = sorted({k for stats in per_layer.values() for k in stats})
        for name in names:
            values = torch.tensor([s[name] for s in per_layer.values() if name in s], dtype=torch.float64)
            out[f"diag/mean/{name}"] = float(values.nanmean())
        out.update({f"diag/cost/{k}": v for k, v in self.cost.items()})
        return {k: v for k, v in out.items() if v == v}

    def depth(self, metric: str) -> list[float]:
        """An attention metric by layer (NaN where a layer lacks it)."""
        return [self.attention[i].get(metric, float("nan")) for i in sorted(self.attention)]

    def spectral_depth(self, matrix: str, metric: str) -> list[float]:
        """A spectral metric of one matrix type by layer (NaN where a layer lacks it)."""
        return [self.spectral[i].get(matrix, {}).get(metric, float("nan")) for i in sorted(self.spectral)]


def _model_device(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters())
    local = getattr(param, "to_local", None)
    return (local() if local is not None else param).device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def collect_attention(model: torch.nn.Module, tokens: torch.Tensor, tokenizer, config: Diagnostics) -> dict[int, dict[str, float]]:
    """Per-layer attention statistics of ``model`` on ``tokens`` (batch, seq) through its own forward.

    Masks follow the forward: causal, plus document boundaries (at the tokenizer's eos) when the
    model takes document masks (:meth:`get_attention_masks` returns some), plus the layer's sliding
    window (``parallax.window``). Adds ``gate`` (mean sigmoid gate) for gated Parallax layers and
    ``cka_v`` (cross-head linear CKA of V outputs on the real inputs).
    """
    masks = model.get_attention_masks(input_batch=tokens, tokenizer=tokenizer)  # None when causal
    eos_id = None if masks is None else tokenizer.eos_id
    results: dict[int, dict[str, float]] = {}

    def on_layer(layer, module, x, rope_cache, positions):
        q, r, k, v = project_qrkv(module, x, rope_cache, positions)
        # ParallaxAttention.window: None or W; softmax layers have none
        mask = causal_document_mask(tokens, eos_id, getattr(module, "window", None))
        stats = layer_statistics(q, r, k, v, mask, scale=module.scaling, max_queries=config.max_queries,
                                 ridge=config.corr_ridge)
        gate = gate_openings(module, x)
        if gate is not None:
            stats["gate"] = float(gate.float().mean())
        if v.shape[2] > 1:
            flat = v.reshape(-1, v.shape[2], v.shape[3])
            pick = torch.linspace(0, flat.shape[0] - 1, min(config.cka_tokens, flat.shape[0]), device=v.device)
            stats["cka_v"] = mean_pairwise_cka(flat[pick.round().long()].transpose(0, 1))
        results[layer] = stats

    # force_eager: hooks inside torch.compile'd blocks would otherwise be traced into them.
    with torch.no_grad(), torch.compiler.set_stance("force_eager"), attention_hooks(model, on_layer):
        model(tokens, attention_masks=masks)
    return results


def collect(model: torch.nn.Module, tokens: torch.Tensor, tokenizer, config: Diagnostics,
            spectral: bool = True) -> DiagnosticsResult:
    """A whole diagnostics pass (attention statistics, and spectral metrics when ``spectral``)."""
    device = _model_device(model)
    result = DiagnosticsResult()
    _sync(device)
    start = time.perf_counter()
    result.attention = collect_attention(model, tokens.to(device), tokenizer, config)
    _sync(device)
    result.cost["attention_s"] = time.perf_counter() - start
    if spectral:
        start = time.perf_counter()
        result.spectral, result.spectra = spectral_diagnostics(model, config.top_k, config.cka_tokens)
        _sync(device)
        result.cost["spectral_s"] = time.perf_counter() - start
    result.cost["total_s"] = sum(result.cost.values())
    return result


class DiagnosticsRunner:
    """Runs :func:`collect` on a fixed held-out batch every ``config.freq`` steps and logs it."""

    def __init__(self, config: Diagnostics, tokens: torch.Tensor | None, tokenizer):
        self.config, self.tokens, self.tokenizer = config, tokens, tokenizer

    @classmethod
    def from_config(cls, job_config, tokenizer) -> "DiagnosticsRunner":
        """When ``job_config.diagnostics`` is enabled, build the held-out batch once. ConfigError
        (train.py's exit code 2) when the dataset cannot give it: unknown, unreadable under the
        job's bad-data policy, or shorter than ``batch_size * seq_len`` tokens."""
        config = job_config.diagnostics
        if not config.enable:
            return cls(config, None, tokenizer)
        seq_len = config.seq_len or job_config.training.seq_len
        try:
            name, path = resolve_dataset(job_config, config)
            tokens = heldout_tokens(name, path, tokenizer, config.batch_size, seq_len, record_policy(job_config))
        except ValueError as exc:  # a bad [diagnostics] setting, not a failure of the trainer
            raise ConfigError(f"invalid config:\n  {exc}") from None
        return cls(config, tokens, tokenizer)

    def should_run(self, step: int) -> bool:
        return self.config.enable and step % self.config.freq == 0

    def maybe_run(self, step: int, model_parts: list[torch.nn.Module], log: LogFn,
                  log_figure: FigureFn | None = None) -> dict | None:
        """On a diagnostics step, run the pass on every rank (the forward is collective under FSDP),
        log its ``diag/...`` scalars with ``log(dict, step)`` and, if ``log_figure(tag, figure,
        step)`` is given, its depth-profile figures. Returns the scalars, or None on other steps."""
        if not self.should_run(step):
            return None
        if len(model_parts) != 1:
            raise ValueError(f"diagnostics: {len(model_parts)} model parts; pipeline parallelism is not supported")
        spectral = self.config.spectral and (not self.config.spectral_freq or step % self.config.spectral_freq == 0)
        result = collect(model_parts[0], self.tokens, self.tokenizer, self.config, spectral=spectral)
        scalars = result.scalars()
        log(scalars, step)
        if log_figure is not None and self.config.figures:
            from parallax_titan.diagnostics.plots import training_figures

            for tag, figure in training_figures(result, step).items():
                log_figure(tag, figure, step)
        logger.info(f"diagnostics at step {step}: {len(result.attention)} layers, "
                    f"{result.cost['total_s']:.2f} s (attention {result.cost['attention_s']:.2f} s)")
        return scalars


def tensorboard_figure_logger(metric_logger) -> FigureFn | None:
    """A ``log_figure`` callable writing to the TensorBoard writers inside TorchTitan's metric logger
    (``metrics_processor.logger``), or None where it has none (ranks other than the logging one)."""
    loggers = getattr(metric_logger, "_loggers", [metric_logger])
    writers = [lg.writer for lg in loggers if hasattr(getattr(lg, "writer", None), "add_figure")]
    if not writers:
        return None

    def log_figure(tag: str, figure, step: int) -> None:
        for writer in writers:
            writer.add_figure(tag, figure, step, close=False)

    return log_figure
