"""Document masks: the model says when it wants them, the trainer builds them for every batch."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from parallax_titan.model import DocumentBoundaries, ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args
from parallax_titan.trainer import ParallaxTrainer

EOS = 0
# Two rows of 6 tokens; documents end after each EOS and at every row end.
TOKENS = torch.tensor([[5, 7, 0, 3, 0, 4], [1, 2, 3, 0, 9, 8]])
STARTS = [0, 3, 5, 6, 10, 12]


def model_of(variant: str, mask_type: str) -> ParallaxQwen3Model:
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), n_layers=1, attn_mask_type=mask_type)
    with torch.device("meta"):
        return ParallaxQwen3Model(args)


@pytest.mark.parametrize("variant, mask_type, wanted", [
    ("parallax", "block_causal", True), ("parallax_dagger", "block_causal", True), ("kda", "block_causal", True),
    ("parallax", "causal", False), ("transformer", "causal", False), ("gated_deltanet", "causal", False),
])
def test_model_asks_for_document_masks_only_when_block_causal(variant, mask_type, wanted):
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), attn_mask_type=mask_type)
    assert args.needs_document_masks is wanted


@pytest.mark.parametrize("mask_type", ["block_causal", "causal"])
def test_get_attention_masks(mask_type):
    masks = model_of("parallax", mask_type).get_attention_masks(TOKENS, SimpleNamespace(eos_id=EOS))
    if mask_type == "causal":
        assert masks is None
    else:
        assert isinstance(masks, DocumentBoundaries) and masks.cu_seqlens.tolist() == STARTS
        assert masks.cu_seqlens.dtype == torch.int32


def bare_trainer(model: ParallaxQwen3Model) -> ParallaxTrainer:
    """A trainer with only what batch preparation reads (no process group, data or optimizer)."""
    trainer = ParallaxTrainer.__new__(ParallaxTrainer)
    trainer.model_args = model.model_args
    trainer.model_parts = [model]
    trainer.tokenizer = SimpleNamespace(eos_id=EOS)
    trainer.parallel_dims = SimpleNamespace(cp_enabled=False)
    return trainer


@pytest.mark.parametrize("variant, mask_type", [("parallax", "block_causal"), ("parallax", "causal"),
                                                ("transformer", "causal")])
def test_trainer_passes_document_boundaries_to_the_forward(variant, mask_type):
    trainer = bare_trainer(model_of(variant, mask_type))
    labels = torch.zeros_like(TOKENS)
    inputs, _, _, kwargs = trainer.post_dataloading_process({"input": TOKENS}, labels)
    assert inputs is TOKENS
    if mask_type == "causal":
        assert kwargs.get("attention_masks") is None
    else:
        assert kwargs["attention_masks"].cu_seqlens.tolist() == STARTS
