"""TOML keys that Parallax-Titan adds to TorchTitan's JobConfig.

TorchTitan merges same-named dataclass sections (``ConfigManager._merge_configs``), so the
sections below extend ``[training]``, ``[metrics]``, ``[optimizer]`` and ``[lr_scheduler]`` and add
``[parallax]``.
:data:`JobConfig` is the merged class that ``train.py`` parses every config with.
"""

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Literal

from torchtitan.config import ConfigManager
from torchtitan.config import JobConfig as TitanJobConfig

from eval.config import Eval
from parallax_titan.diagnostics.config import Diagnostics
from parallax_titan.optim_config import LRScheduler, Optimizer


@dataclass
class Parallax:
    """``[parallax]``: the attention mixer's switches."""

    rho_rope: bool = True
    """Apply RoPE to the probe rho (same cos/sin as q). The paper's ablation turns it off."""

    gate: Literal["none", "token", "head"] = "none"
    """Sigmoid gate on rho after its norm: one scalar per token, or one per token and head."""

    wr_init: Literal["normal", "zeros"] = "normal"
    """Init of W_R: like W_Q, or zeros (the layer then computes exactly softmax attention)."""

    attn_backend: Literal["auto", "reference", "triton"] = "auto"
    """Parallax kernel: fused Triton on CUDA and the exact PyTorch reference on CPU when auto."""

    attn_mask_type: Literal["causal", "block_causal"] = "causal"
    """causal over the packed row, or block_causal: no attention across <|endoftext|>."""

    init_from_transformer: str = ""
    """Up-training: a DCP checkpoint folder of a Transformer run (e.g. outputs/x/checkpoint/step-1000)
    loaded into a Parallax model at step 0, with W_R = 0 and rho-norm weights 1."""


@dataclass
class Model:
    """``[model]`` additions: shape overrides on top of the flavor (0 keeps the flavor's value)."""

    dim: int = 0
    """Model width d_model."""

    n_layers: int = 0
    """Number of blocks."""

    n_heads: int = 0
    """Query heads Hq (also the number of probe heads)."""

    n_kv_heads: int = 0
    """Key/value heads Hkv; Hq must be a multiple of Hkv."""

    head_dim: int = 0
    """Head dimension D."""

    hidden_dim: int = 0
    """SwiGLU FFN width."""

    vocab_size: int = 0
    """Embedding rows; must be at least the tokenizer's vocabulary."""


@dataclass
class Training:
    """``[training]`` additions."""

    data_order: Literal["sharded", "global"] = "sharded"
    """Which packed sequences a data-parallel rank trains on. "sharded" (TorchTitan's): each rank
    reads its own part of the documents, so the batches depend on the number of ranks. "global":
    every rank reads the whole token stream and keeps sequence i when
    ``(i // local_batch_size) % dp_world_size == dp_rank``, so step s trains on sequences
    ``[s*G, (s+1)*G)`` (G = local batch x DP degree x gradient accumulation) on any number of
    GPUs; each rank then tokenizes the whole stream."""


@dataclass
class Metrics:
    """``[metrics]`` additions."""

    progress_bar: bool = True
    """Show a tqdm progress bar with the loss on rank 0."""

    save_jsonl: bool = True
    """Append every logged metric to ``<job.dump_folder>/metrics.jsonl`` (rank 0), one JSON line per log."""


@dataclass
class Reliability:
    """``[reliability]``: interruptions and numerical failures."""

    save_on_sigterm: bool = True
    """On SIGTERM (as sent by schedulers before preemption), finish the step, save a full checkpoint
    and exit with code 0; rerunning the same command resumes from it."""

    stop_at_step: int = 0
    """Save a full checkpoint and exit after this step (0: never); simulates an interruption."""

    bad_data: Literal["error", "skip"] = "error"
    """Malformed local data (an empty file, a file or record without a string ``content``, invalid
    UTF-8 or JSON): stop with an error naming the file and line, or skip it and log how many
    records each file lost."""

    nonfinite: Literal["skip", "stop", "off"] = "skip"
    """Non-finite loss or gradient: skip the optimizer step, or save and stop; the report names
    the step and the first parameter whose gradient is not finite. "off" does not check."""


@dataclass
class ParallaxJobConfig:
    parallax: Parallax = field(default_factory=Parallax)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    reliability: Reliability = field(default_factory=Reliability)
    eval: Eval = field(default_factory=Eval)
    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    metrics: Metrics = field(default_factory=Metrics)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)


def _resolve_annotations(cls) -> None:
    """Replace string annotations (``from __future__ import annotations``) by the types they name,
    recursively, so TorchTitan's merge and tyro see real types."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        f.type = hints[f.name]
        if dataclasses.is_dataclass(f.type):
            _resolve_annotations(f.type)


_resolve_annotations(ParallaxJobConfig)
JobConfig = ConfigManager._merge_configs(TitanJobConfig, ParallaxJobConfig)
