"""TOML keys that Parallax-Titan adds to TorchTitan's JobConfig.

TorchTitan merges same-named dataclass sections (``ConfigManager._merge_configs``), so the
sections below extend ``[metrics]``, ``[optimizer]`` and ``[lr_scheduler]`` and add ``[parallax]``.
:data:`JobConfig` is the merged class that ``train.py`` parses every config with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torchtitan.config import ConfigManager
from torchtitan.config import JobConfig as TitanJobConfig

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
class Metrics:
    """``[metrics]`` additions."""

    progress_bar: bool = True
    """Show a tqdm progress bar with the loss on rank 0."""


@dataclass
class ParallaxJobConfig:
    parallax: Parallax = field(default_factory=Parallax)
    metrics: Metrics = field(default_factory=Metrics)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)


JobConfig = ConfigManager._merge_configs(TitanJobConfig, ParallaxJobConfig)
