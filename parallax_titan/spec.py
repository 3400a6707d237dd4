"""Model variants and sizes, registered as TorchTitan train specs.

``[model] name`` picks the variant, ``[model] flavor`` the size (SPEC.md section 2):

================== ============================================================
transformer        Qwen3 with softmax attention (TorchTitan's own attention)
transformer_dagger softmax attention with 1.5x query heads (matches W_R's parameters)
parallax           Qwen3 with Parallax attention
parallax_dagger    Parallax with half the head dim and a wider FFN (matches FLOPs and parameters)
gated_deltanet     Gated DeltaNet from flash-linear-attention (optional dependency)
kda                Kimi Delta Attention from flash-linear-attention
mamba2             Mamba2 from flash-linear-attention (MAD baseline)
mesa_net           MesaNet from flash-linear-attention (MAD baseline)
exact_lla          exact local-linear attention, the parent of Parallax (MAD and small models)
value_averaging    Value Averaging: o_i = mean of v_j, j <= i (the family's zero probe)
affine_la          Affine Linear Attention: Parallax with uniform weights (learned probe)
affine_mesanet     Affine MesaNet: uniform-weight exact LLA (solved probe)
================== ============================================================

The fla mixers keep the Qwen3 block (norms, MLP, embeddings) and size their heads to the
attention they replace (``parallax_titan.mixers.fla_settings``; docs/mixers.md). The family
mixers (``parallax_titan.mixers.FAMILY_MIXERS``; docs/models.md) keep the attention's heads and
projection shapes.
"""

from __future__ import annotations

import copy
import dataclasses
import math

from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec

from parallax_titan.hf_adapter import ParallaxStateDictAdapter
from parallax_titan.mixers import FAMILY_MIXERS, FLA_MIXERS
from parallax_titan.model import ParallaxModelArgs, ParallaxQwen3Model

VARIANTS = ("transformer", "transformer_dagger", "parallax", "parallax_dagger", *FLA_MIXERS, *FAMILY_MIXERS)

BASE_FLAVORS = {
    "debug": ParallaxModelArgs(
        vocab_size=4096, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32,
        hidden_dim=768, max_seq_len=512, enable_weight_tying=True,
    ),
    "0.6B": ParallaxModelArgs(
        vocab_size=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
        hidden_dim=3072, max_seq_len=4096, enable_weight_tying=True,
    ),
    "1.7B": ParallaxModelArgs(
        vocab_size=151936, dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
        hidden_dim=6144, max_seq_len=4096, enable_weight_tying=False,
    ),
}


def dagger_hidden_dim(base: ParallaxModelArgs, multiple_of: int = 64) -> int:
    """FFN width that returns the attention parameters saved by halving the head dim.

    Halving D halves W_Q, W_K, W_V, W_O and W_R; the saved count goes to the three FFN
    matrices, rounded up to ``multiple_of`` (0.6B: 3072 -> 4480, as in the paper).
    """
    attn = base.dim * base.head_dim * (3 * base.n_heads + 2 * base.n_kv_heads)
    extra = math.ceil(attn / 2 / (3 * base.dim))
    return multiple_of * math.ceil((base.hidden_dim + extra) / multiple_of)


def variant_args(variant: str, base: ParallaxModelArgs) -> ParallaxModelArgs:
    """The model arguments of ``variant`` at the size given by ``base``."""
    if variant == "transformer":
        return dataclasses.replace(base, mixer="softmax")
    if variant == "transformer_dagger":
        return dataclasses.replace(base, mixer="softmax", n_heads=base.n_heads * 3 // 2)
    if variant == "parallax":
        return dataclasses.replace(base, mixer="parallax")
    if variant == "parallax_dagger":
        return dataclasses.replace(
            base, mixer="parallax", head_dim=base.head_dim // 2, hidden_dim=dagger_hidden_dim(base)
        )
    if variant in FLA_MIXERS or variant in FAMILY_MIXERS:
        return dataclasses.replace(base, mixer=variant)
    raise ValueError(f"model.name: unknown variant {variant!r}; expected one of {VARIANTS}")


def model_args_for(job_config) -> ParallaxModelArgs:
    """The model arguments the trainer builds for ``job_config``: variant, flavor, then the
    config's overrides (``[model]`` shape keys, ``[parallax]`` switches, ``training.seq_len``).
    ``model.name`` and ``model.flavor`` must be valid (config validation checks them first)."""
    args = copy.deepcopy(variant_args(job_config.model.name, BASE_FLAVORS[job_config.model.flavor]))
    args.update_from_config(job_config)
    return args


def build_train_spec(variant: str) -> TrainSpec:
    """The TorchTitan train spec of one variant, with every flavor and the Hugging Face adapter
    (``checkpoint.last_save_in_hf``)."""
    from parallax_titan.data import build_dataloader, build_validator
    from parallax_titan.metrics import build_metrics_processor
    from parallax_titan.optim_builder import build_lr_schedulers, build_optimizers
    from parallax_titan.parallelize import parallelize_parallax
    from parallax_titan.tokenizer import build_tokenizer

    return TrainSpec(
        model_cls=ParallaxQwen3Model,
        model_args={name: variant_args(variant, base) for name, base in BASE_FLAVORS.items()},
        parallelize_fn=parallelize_parallax,
        pipelining_fn=None,
        build_optimizers_fn=build_optimizers,
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_dataloader,
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=build_validator,
        build_metrics_processor_fn=build_metrics_processor,
        state_dict_adapter=ParallaxStateDictAdapter,
    )


def register_all() -> None:
    """Register every variant with TorchTitan (idempotent)."""
    for variant in VARIANTS:
        try:
            register_train_spec(variant, build_train_spec(variant))
        except ValueError:  # already registered by an earlier import
            pass
