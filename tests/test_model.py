"""The model family: sizes, the softmax limit (zero probe), up-training, probe switches, document masks,
and the transformer variant against TorchTitan's own Qwen3."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from parallax_titan.mixers import FLA_MIXERS
from parallax_titan.model import ParallaxQwen3Model, document_boundaries
from parallax_titan.spec import BASE_FLAVORS, VARIANTS, dagger_hidden_dim, variant_args


def build(variant: str, flavor: str = "debug", dtype=torch.float64, seed: int = 0, **overrides):
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS[flavor]), **overrides)
    torch.manual_seed(seed)
    model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
    return model.to(dtype).eval()


def n_params(variant: str, flavor: str) -> int:
    with torch.device("meta"):
        model = ParallaxQwen3Model(variant_args(variant, BASE_FLAVORS[flavor]))
    return sum(p.numel() for p in model.parameters())


# SPEC.md section 2: (d_model, FFN, layers, Hq, Hkv, D, vocab, tied embeddings)
SPEC_SIZES = {"0.6B": (1024, 3072, 28, 16, 8, 128, 151936, True),
              "1.7B": (2048, 6144, 28, 16, 8, 128, 151936, False)}


def closed_form_params(size: str, variant: str) -> int:
    """Parameters of a Qwen3 model from SPEC.md section 2's shapes: per layer W_Q, W_K, W_V, W_O,
    q/k RMSNorm, SwiGLU (3 matrices), two block norms; Parallax adds W_R and the rho RMSNorm;
    Transformer-dagger has 24 query heads, Parallax-dagger D = 64 and FFN 4480 (0.6B, SPEC; 1.7B,
    by the same rule: 6144 + ceil(2048 * 128 * 64 / 2 / (3 * 2048)) = 7510, up to a multiple of 64)."""
    d, ffn, layers, hq, hkv, dh, vocab, tied = SPEC_SIZES[size]
    if variant == "transformer_dagger":
        hq = 24
    if variant == "parallax_dagger":
        dh, ffn = 64, {"0.6B": 4480, "1.7B": 7552}[size]
    probe = variant.startswith("parallax")
    attn = d * dh * (2 * hq + 2 * hkv) + 2 * dh + probe * (d * hq * dh + dh)
    per_layer = attn + 3 * d * ffn + 2 * d
    return layers * per_layer + d + vocab * d * (1 if tied else 2)


@pytest.mark.parametrize("flavor", ["0.6B", "1.7B"])
def test_control_parameter_counts_match_parallax(flavor):
    """Transformer-dagger matches Parallax's parameters up to the rho norms (layers x D); Parallax-dagger
    is within 1% (0.56% at 0.6B, 0.34% at 1.7B: the FFN width rounds up to a multiple of 64)."""
    for variant in ("transformer", "parallax", "transformer_dagger", "parallax_dagger"):
        assert n_params(variant, flavor) == closed_form_params(flavor, variant), variant
    parallax = n_params("parallax", flavor)
    assert parallax - n_params("transformer_dagger", flavor) == 28 * 128  # the rho-norm weights
    gap = (n_params("parallax_dagger", flavor) - parallax) / parallax
    assert 0 < gap < {"0.6B": 0.0057, "1.7B": 0.0035}[flavor]
    assert n_params("transformer", flavor) < parallax


@pytest.mark.parametrize("flavor", ["0.6B", "1.7B"])
def test_parallax_dagger_attention_flops_equal_the_transformers(flavor):
    """Attention FLOPs per token (fwd + bwd = 3 x 2 per multiply-add, causality ignored as TorchTitan
    does): softmax has two products of length D per score pair (q.k, p.v), Parallax four (q.k,
    rho.k, p.v, (p t).v); Parallax-dagger halves D, so 4 x 64 = 2 x 128."""
    seq = 4096
    attention = {}
    for variant, products in (("transformer", 2), ("parallax", 4), ("parallax_dagger", 4)):
        args = variant_args(variant, BASE_FLAVORS[flavor])
        with torch.device("meta"):
            model = ParallaxQwen3Model(args)
        _, flops = args.get_nparams_and_flops(model, seq)
        dense = sum(p.numel() for name, p in model.named_parameters() if "embedding" not in name)
        attention[variant] = flops - 6 * dense
        assert attention[variant] == 6 * args.n_layers * args.n_heads * seq * products * args.head_dim
    assert attention["parallax_dagger"] == attention["transformer"] == attention["parallax"] // 2


def test_sizes_follow_spec():
    assert dagger_hidden_dim(BASE_FLAVORS["0.6B"]) == 4480
    args = variant_args("parallax", BASE_FLAVORS["0.6B"])
    assert (args.dim, args.hidden_dim, args.n_layers, args.n_heads, args.n_kv_heads, args.head_dim) == (
        1024, 3072, 28, 16, 8, 128)
    assert args.enable_weight_tying and not BASE_FLAVORS["1.7B"].enable_weight_tying
    assert variant_args("transformer_dagger", BASE_FLAVORS["0.6B"]).n_heads == 24
    # 0.6B Parallax: ~0.6B without the (tied) embedding counted twice.
    assert 0.6e9 < n_params("parallax", "0.6B") < 0.7e9


def copy_shared_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    missing = dst.load_state_dict(src.state_dict(), strict=False).missing_keys
    assert missing and all(".wr." in k or ".r_norm." in k or ".gate." in k for k in missing), missing


@pytest.mark.parametrize("gate", ["none", "token", "head"])
def test_zero_probe_gives_transformer_logits(gate):
    transformer = build("transformer")
    parallax = build("parallax", probe_init="zero", gate=gate, seed=1)
    copy_shared_weights(transformer, parallax)
    tokens = torch.randint(0, 4096, (2, 37))
    torch.testing.assert_close(parallax(tokens), transformer(tokens), rtol=1e-10, atol=1e-10)


def test_nonzero_probe_changes_logits():
    transformer = build("transformer")
    parallax = build("parallax")
    copy_shared_weights(transformer, parallax)
    tokens = torch.randint(0, 4096, (1, 16))
    assert (parallax(tokens) - transformer(tokens)).abs().max() > 1e-3


def test_probe_projection_switches():
    model = build("parallax", gate="head")
    attn = model.layers["0"].attention
    x = torch.randn(2, 9, 256, dtype=torch.float64)
    rope = model.rope_cache
    torch.nn.init.zeros_(attn.gate.weight)  # sigmoid(0) = 1/2 on every head
    _, r_gated, _, _ = attn.project(x, rope, None)
    attn.gate = None
    _, r_plain, _, _ = attn.project(x, rope, None)
    torch.testing.assert_close(r_gated, 0.5 * r_plain)
    attn.rho_rope = False
    _, r_no_rope, _, _ = attn.project(x, rope, None)
    expected = attn.r_norm(attn.wr(x).view(2, 9, -1, attn.head_dim))
    torch.testing.assert_close(r_no_rope, expected)
    assert not torch.allclose(r_no_rope, r_plain)


def test_document_boundaries_from_eos():
    tokens = torch.tensor([[5, 7, 0, 3, 4], [0, 1, 2, 0, 9]])
    assert document_boundaries(tokens, eos_id=0).cu_seqlens.tolist() == [0, 3, 5, 6, 9, 10]


def test_block_causal_isolates_documents():
    model = build("parallax")
    eos = 11
    tokens = torch.randint(12, 4096, (2, 24))
    tokens[:, 9] = eos
    other = tokens.clone()
    other[:, :9] = torch.randint(12, 4096, (2, 9))
    masks_a = document_boundaries(tokens, eos)
    masks_b = document_boundaries(other, eos)
    out_a, out_b = model(tokens, attention_masks=masks_a), model(other, attention_masks=masks_b)
    torch.testing.assert_close(out_a[:, 10:], out_b[:, 10:], rtol=1e-10, atol=1e-10)
    assert (model(tokens)[:, 10:] - out_a[:, 10:]).abs().max() > 1e-6  # plain causal differs


def test_every_variant_builds_and_runs():
    tokens = torch.randint(0, 4096, (1, 8))
    for variant in VARIANTS:
        if variant in FLA_MIXERS:  # fla's Triton kernels need CUDA: tests/test_mixers_fla.py
            continue
        logits = build(variant, dtype=torch.float32)(tokens)
        assert logits.shape == (1, 8, 4096) and torch.isfinite(logits).all()



@pytest.mark.parametrize("tied", [True, False])
def test_transformer_is_torchtitans_qwen3(tied):
    """Built as the trainer builds it (meta, to_empty, init_weights under a seed), the transformer
    variant has TorchTitan's own Qwen3Model's weights, names and logits, bit for bit."""
    from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
    from torchtitan.models.qwen3.model.model import Qwen3Model

    args = dataclasses.replace(variant_args("transformer", BASE_FLAVORS["debug"]), n_layers=2, max_seq_len=32,
                               enable_weight_tying=tied)
    reference_args = Qwen3ModelArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Qwen3ModelArgs)})
    models = []
    for cls, model_args in ((ParallaxQwen3Model, args), (Qwen3Model, reference_args)):
        torch.manual_seed(3)
        with torch.device("meta"):
            model = cls(model_args)
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights()
        models.append(model.eval())
    ours, reference = (m.state_dict() for m in models)
    assert list(ours) == list(reference)
    assert all(torch.equal(ours[k], reference[k]) for k in ours)
    tokens = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(models[0](tokens), models[1](tokens))
