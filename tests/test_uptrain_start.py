"""Up-training starts smoothly: one optimizer step after converting a Transformer moves the converted
model's logits away from the Transformer's (after the same step) by about the lr, not by O(1).

The conversion sets the rho-norm weights to 0 and keeps W_R at its normal initialisation, so the
probe rho = g * RMSNorm(W_R x) is exactly 0 at step 0 and grows with g, which Adam moves by its lr
(the paper's lr 5e-3 times the norm multiplier 0.015) per step. The former conversion (W_R = 0,
g = 1) was also exactly softmax at step 0, but the first Muon step gives W_R entries of about
1e-3, and RMSNorm (eps 1e-6) rescales W_R x to unit RMS: a full-strength probe after one step,
which moves the logits by O(1). On this debug model the gap after one step is of order 1e-3
(below the lr, 5e-3) with the conversion, and of order 10 with the former one (the last test).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed.checkpoint as dcp

from optimizers import MuonAdamW, RoutingConfig, build_param_groups
from parallax_titan.checkpointing import save_checksummed
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args
from parallax_titan.uptrain import load_transformer_weights

LR = 5e-3  # SPEC.md section 3, Muon recipe
NORM_LR = LR * 0.015


def model_of(variant: str, seed: int) -> ParallaxQwen3Model:
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), n_layers=2, max_seq_len=64,
                               attn_backend="reference")
    torch.manual_seed(seed)
    model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
    return model


def paper_muon(model) -> MuonAdamW:
    """The paper's Muon recipe (SPEC.md section 3) with plain MuonAdamW routing."""
    cfg = RoutingConfig(use_muon=True, lr=LR, weight_decay=0.1, lr_multipliers={"embed": 0.3, "norm": 0.015},
                        adam={"betas": (0.8, 0.95), "eps": 1e-7}, muon={"momentum": 0.95, "nesterov": True})
    return MuonAdamW(build_param_groups(model, cfg), lr=LR)


def one_step(model, tokens) -> torch.Tensor:
    """Take one optimizer step on next-token loss over ``tokens``; the logits afterwards."""
    opt = paper_muon(model)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    with torch.no_grad():
        return model(tokens[:, :-1])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("transformer") / "step-0"
    save_checksummed(model_of("transformer", seed=0).state_dict(), str(path))
    return str(path)


def converted(checkpoint: str) -> ParallaxQwen3Model:
    parallax = model_of("parallax", seed=1)
    load_transformer_weights(parallax, checkpoint)
    return parallax


def transformer_from(checkpoint: str) -> ParallaxQwen3Model:
    model = model_of("transformer", seed=2)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
    model.load_state_dict(state)
    return model


TOKENS = torch.randint(0, 4096, (4, 65), generator=torch.Generator().manual_seed(3))


def test_converted_model_starts_as_the_transformer_with_a_live_probe(checkpoint):
    parallax, transformer = converted(checkpoint).double(), transformer_from(checkpoint).double()
    with torch.no_grad():  # exact up to the two attention paths' fp64 rounding
        torch.testing.assert_close(parallax(TOKENS[:, :-1]), transformer(TOKENS[:, :-1]), rtol=1e-10, atol=1e-10)
    for name, module in parallax.named_modules():
        if name.endswith("attention.r_norm"):
            assert float(module.weight.abs().max()) == 0
        if name.endswith("attention.wr"):  # W_R as W_Q (std 0.02), so the norm weight gets a gradient
            assert 0.01 < float(module.weight.std()) < 0.03


def test_one_step_moves_the_logits_by_about_the_lr(checkpoint):
    """Parallax and the Transformer take the same step from the same weights; the difference of
    their logits is what the probe adds, of the size of the rho-norm weight after one step (NORM_LR
per entry)."""
    after_parallax = one_step(converted(checkpoint), TOKENS)
    after_transformer = one_step(transformer_from(checkpoint), TOKENS)
    gap = (after_parallax - after_transformer).abs().max().item()
    assert 0 < gap < LR, gap  # not exactly zero: the probe is learning


def test_former_conversion_jumps_after_one_step(checkpoint):
    """W_R = 0 and rho-norm weights 1 (the former conversion): the same step moves the logits by O(1)."""
    parallax = converted(checkpoint)
    with torch.no_grad():
        for name, module in parallax.named_modules():
            if name.endswith("attention.wr"):
                module.weight.zero_()
            if name.endswith("attention.r_norm"):
                module.weight.fill_(1.0)
    gap = (one_step(parallax, TOKENS) - one_step(transformer_from(checkpoint), TOKENS)).abs().max().item()
    assert gap > 100 * LR, gap
