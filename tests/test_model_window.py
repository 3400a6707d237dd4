"""Sliding-window Parallax (``[parallax] window``): the model's logits against a dense fp64 Parallax
with a banded mask (SPEC sections 1 and 1b), alone and with packed documents, and the key's path from
the TOML to the attention modules."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from parallax_titan.config import ConfigError, load_config
from parallax_titan.model import ParallaxQwen3Model, document_boundaries
from parallax_titan.spec import BASE_FLAVORS, model_args_for, register_all, variant_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")
VOCAB, L = 101, 14
register_all()


def build(window: int, seed: int = 0) -> ParallaxQwen3Model:
    args = dataclasses.replace(variant_args("parallax", BASE_FLAVORS["debug"]), dim=64, n_layers=2, n_heads=4,
                               n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=VOCAB, max_seq_len=32,
                               window=window)
    torch.manual_seed(seed)
    model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
    return model.to(torch.float64).eval()


def banded_parallax(q, r, k, v, scale, allowed):
    """SPEC 1 densely: o_i = sum_j p_ij (1 - t_ij + tbar_i) v_j over the keys ``allowed`` (B, L, L)
    lets query i read; q, r (B, L, Hq, D), k, v (B, L, Hkv, D)."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = scale * torch.einsum("bihd,bjhd->bhij", q, k)
    t = torch.einsum("bihd,bjhd->bhij", r, k)
    p = torch.softmax(s.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
    tbar = (p * t).sum(-1, keepdim=True)
    return torch.einsum("bhij,bjhd->bihd", p * (1 - t + tbar), v)


def band(batch: int, n: int, window: int) -> torch.Tensor:
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return ((j <= i) & (j > i - window)).expand(batch, n, n)


def reference_logits(model, tokens, allowed):
    """The model's forward with Parallax attention computed densely on the ``allowed`` keys."""
    h = model.tok_embeddings(tokens)
    for block in model.layers.values():
        attn = block.attention
        q, r, k, v = attn.project(block.attention_norm(h), model.rope_cache, None)
        h = h + attn.wo(banded_parallax(q, r, k, v, attn.scaling, allowed).flatten(-2))
        h = h + block.feed_forward(block.ffn_norm(h))
    return model.output(model.norm(h))


@pytest.mark.parametrize("window", [1, 4, L])
def test_windowed_model_matches_the_banded_reference(window):
    model = build(window)
    tokens = torch.randint(0, VOCAB, (2, L))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference_logits(model, tokens, band(2, L, window)),
                                   rtol=1e-10, atol=1e-10)


def test_a_window_changes_the_logits_and_none_is_full_causal():
    tokens = torch.randint(0, VOCAB, (1, L))
    full, windowed = build(0), build(4)
    with torch.no_grad():
        assert (full(tokens) - windowed(tokens)).abs().max() > 1e-4
        torch.testing.assert_close(full(tokens), reference_logits(full, tokens, band(1, L, L)), rtol=1e-10,
                                   atol=1e-10)
    assert full.layers["0"].attention.window is None and windowed.layers["0"].attention.window == 4


def test_window_within_packed_documents():
    eos = 0
    model = build(3)
    tokens = torch.randint(1, VOCAB, (2, L))
    tokens[0, 5], tokens[1, 9] = eos, eos
    doc = torch.cat([torch.zeros_like(tokens[:, :1]), (tokens[:, :-1] == eos).long()], 1).cumsum(1)
    allowed = band(2, L, 3) & (doc[:, :, None] == doc[:, None, :])
    with torch.no_grad():
        out = model(tokens, attention_masks=document_boundaries(tokens, eos))
        torch.testing.assert_close(out, reference_logits(model, tokens, allowed), rtol=1e-10, atol=1e-10)


def test_toml_window_reaches_the_attention():
    config = load_config(["--job.config_file", DEMO, "--parallax.window", "5"], check_data=False)
    args = model_args_for(config)
    with torch.device("meta"):
        model = ParallaxQwen3Model(args)
    assert args.window == 5 and all(b.attention.window == 5 for b in model.layers.values())


@pytest.mark.parametrize("overrides,message", [
    (["--parallax.window", "-1"], "parallax.window: expected an int >= 0 (0 = full causal attention), got -1"),
    (["--model.name", "transformer", "--parallax.window", "8"],
     "parallax.window: a sliding window needs Parallax attention"),
    (["--model.name", "affine_la", "--parallax.window", "8"], "got window = 8 with model.name 'affine_la'"),
])
def test_bad_windows_are_refused_by_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", DEMO, *overrides], check_data=False)
    assert message in str(info.value)
