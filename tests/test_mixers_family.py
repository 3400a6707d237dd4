"""The Parallax family in the attention slot: whole-model logits against fp64 references written from
SPEC sections 1 and 1b (tests/_family_reference.py), the attention's projection shapes and names,
optimizer routing, causality, and the refusals (packed documents, exact LLA's cost bound)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from optimizers import build_param_groups
from parallax_titan.config import Optimizer
from parallax_titan.mixers import FAMILY_MIXERS
from parallax_titan.model import ParallaxQwen3Model, apply_rope, document_boundaries
from parallax_titan.optim_builder import routing_config
from parallax_titan.spec import BASE_FLAVORS, VARIANTS, variant_args
from tests import _family_reference as ref

FAMILY = ("exact_lla", "value_averaging", "affine_la", "affine_mesanet")
DIM, HQ, HKV, D, VOCAB = 64, 4, 2, 16, 97  # GQA: two query heads per kv head
# The ridge lambda per head is softplus(param) + 0.25 and starts at 1 (fla's MesaNet's bound and start).
FLOOR, LAMBDA_AT_INIT = 0.25, 1.0


def family_args(variant: str, **overrides):
    small = dict(dim=DIM, n_layers=2, n_heads=HQ, n_kv_heads=HKV, head_dim=D, hidden_dim=96, vocab_size=VOCAB,
                 max_seq_len=32)
    return dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), **{**small, **overrides})


def build(variant: str, seed: int = 0, **overrides) -> ParallaxQwen3Model:
    """fp64 model with every parameter moved off its init (random per-head lambdas, norm weights)."""
    torch.manual_seed(seed)
    model = ParallaxQwen3Model(family_args(variant, **overrides))
    with torch.no_grad():
        model.init_weights()
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.to(torch.float64).eval()


def heads(linear, x):
    return linear(x).unflatten(-1, (-1, D))


def lam(module):
    return torch.nn.functional.softplus(module.lambda_params) + FLOOR


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def exact_lla_ref(m, x, rope):
    q = apply_rope(m.q_norm(heads(m.wq, x)), rope, None)
    k = apply_rope(m.k_norm(heads(m.wk, x)), rope, None)
    return ref.lla_parent(q, k, heads(m.wv, x), lam(m), scale=1 / math.sqrt(D))


def value_averaging_ref(m, x, rope):
    v = heads(m.wv, x)
    return ref.value_averaging(torch.empty(*v.shape[:2], HQ, D, dtype=v.dtype), v, v)


def affine_la_ref(m, x, rope):
    return ref.affine_linear_attention(m.r_norm(heads(m.wr, x)), m.k_norm(heads(m.wk, x)), heads(m.wv, x))


def affine_mesanet_ref(m, x, rope):
    return ref.affine_mesanet(unit(heads(m.wq, x)), unit(heads(m.wk, x)), heads(m.wv, x), lam(m))


REFERENCES = {"exact_lla": exact_lla_ref, "value_averaging": value_averaging_ref, "affine_la": affine_la_ref,
              "affine_mesanet": affine_mesanet_ref}


def reference_logits(model, tokens, mixer_ref):
    """The model's forward with each attention slot computed by ``mixer_ref`` (the block's norms and
    MLP, the embeddings and the head are the model's own)."""
    h = model.tok_embeddings(tokens)
    for block in model.layers.values():
        out = mixer_ref(block.attention, block.attention_norm(h), model.rope_cache)
        h = h + block.attention.wo(out.flatten(-2))
        h = h + block.feed_forward(block.ffn_norm(h))
    return model.output(model.norm(h))


def test_family_variants_are_registered():
    assert set(FAMILY) <= set(VARIANTS) and set(FAMILY) == set(FAMILY_MIXERS)


@pytest.mark.parametrize("variant", FAMILY)
def test_model_logits_match_the_fp64_reference(variant):
    model = build(variant)
    tokens = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        expected = reference_logits(model, tokens, REFERENCES[variant])
        torch.testing.assert_close(model(tokens), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variant", FAMILY)
def test_every_parameter_gets_a_finite_gradient(variant):
    model = build(variant)
    model(torch.randint(0, VOCAB, (2, 9))).logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []


@pytest.mark.parametrize("variant", FAMILY)
def test_no_position_reads_a_later_one(variant):
    model = build(variant)
    tokens = torch.randint(0, VOCAB, (1, 12))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=1e-12, atol=1e-12)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-6


def attention_slot_params(variant: str) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        module = ParallaxQwen3Model(family_args(variant)).layers["0"].attention
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def test_projections_have_the_attentions_shapes():
    """W_Q (or W_R in its place), W_K, W_V, W_O as the softmax attention's; per-head lambdas (Hq,);
    head norms (D,)."""
    q, kv, o = (HQ * D, DIM), (HKV * D, DIM), (DIM, HQ * D)
    assert attention_slot_params("transformer") == {"wq.weight": q, "wk.weight": kv, "wv.weight": kv,
                                                    "wo.weight": o, "q_norm.weight": (D,), "k_norm.weight": (D,)}
    assert attention_slot_params("exact_lla") == {"wq.weight": q, "wk.weight": kv, "wv.weight": kv, "wo.weight": o,
                                                  "q_norm.weight": (D,), "k_norm.weight": (D,), "lambda_params": (HQ,)}
    assert attention_slot_params("affine_la") == {"wr.weight": q, "wk.weight": kv, "wv.weight": kv, "wo.weight": o,
                                                  "r_norm.weight": (D,), "k_norm.weight": (D,)}
    assert attention_slot_params("affine_mesanet") == {"wq.weight": q, "wk.weight": kv, "wv.weight": kv,
                                                       "wo.weight": o, "lambda_params": (HQ,)}
    assert attention_slot_params("value_averaging") == {"wv.weight": kv, "wo.weight": o}


@pytest.mark.parametrize("variant", ["exact_lla", "affine_mesanet"])
def test_ridge_lambda_starts_at_one(variant):
    torch.manual_seed(0)
    model = ParallaxQwen3Model(family_args(variant))
    with torch.no_grad():
        model.init_weights()
    for block in model.layers.values():
        torch.testing.assert_close(lam(block.attention), torch.full((HQ,), LAMBDA_AT_INIT))


# Muon recipe's categories of the attention slot's parameters (optimizers/routing.py's default rules).
CATEGORIES = {"wq": "attn_q", "wr": "attn_r", "wk": "attn_k", "wv": "attn_v", "wo": "attn_o",
              "q_norm": "norm", "k_norm": "norm", "r_norm": "norm", "lambda_params": "ssm"}  # like fla's ridge


@pytest.mark.parametrize("variant", FAMILY)
def test_routing_sends_matrices_to_muon_and_vectors_to_adam(variant):
    with torch.device("meta"):
        model = ParallaxQwen3Model(family_args(variant))
    config = Optimizer(name="Muon", lr=5e-3, weight_decay=0.1)
    groups = build_param_groups(model, routing_config(config, model))
    group_of = {id(p): g for g in groups for p in g["params"]}
    for name, p in model.layers["1"].attention.named_parameters():
        group = group_of[id(p)]
        assert group["algo"] == ("muon" if p.ndim == 2 else "adamw"), name
        assert group["name"] == CATEGORIES[name.split(".")[0]], name


@pytest.mark.parametrize("variant", FAMILY)
def test_packed_documents_are_refused_by_name(variant):
    model = build(variant)
    tokens = torch.randint(1, VOCAB, (1, 8))
    tokens[0, 3] = 0
    with pytest.raises(ValueError, match=f"block_causal.*{variant}"):
        model(tokens, attention_masks=document_boundaries(tokens, eos_id=0))


def test_exact_lla_forward_is_bounded_by_its_cost():
    """B * Hq * L * (L * D^2 + D^3) multiply-adds per layer: 1 * 4 * 9 * (9 * 256 + 4096) above 2e5."""
    model = build("exact_lla", lla_max_cost=200_000)
    with pytest.raises(ValueError, match="max_cost"):
        model(torch.randint(0, VOCAB, (1, 9)))
    assert torch.isfinite(build("exact_lla", lla_max_cost=None)(torch.randint(0, VOCAB, (1, 9)))).all()


@pytest.mark.parametrize("variant", FAMILY)
def test_blocks_compile_without_graph_breaks(variant):
    """TorchTitan compiles each block with fullgraph=True (a graph break is an error); the family
    mixers compile inside it and give the eager block's output and gradients."""
    model = build(variant).float()
    block = model.layers["0"]
    x = torch.randn(2, 9, DIM, requires_grad=True)
    eager = block(x, model.rope_cache)
    (grad,) = torch.autograd.grad(eager.square().sum(), x)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(x, model.rope_cache)
    (compiled_grad,) = torch.autograd.grad(compiled.square().sum(), x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_grad, grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", FAMILY)
def test_bf16_block_runs_when_norms_come_back_in_fp32(variant, monkeypatch):
    """CUDA autocast computes F.normalize (its fp32 op list) in fp32 while the projections give bf16:
    every family mixer hands its kernel one dtype and returns the block's dtype. Emulated on the CPU,
    whose autocast keeps bf16, by an F.normalize that returns fp32."""
    import parallax_titan.mixers as mixers

    normalize = torch.nn.functional.normalize
    monkeypatch.setattr(mixers.F, "normalize", lambda x, *a, **kw: normalize(x.float(), *a, **kw))
    model = build(variant).to(torch.bfloat16)
    x = torch.randn(1, 9, DIM, dtype=torch.bfloat16)
    out = model.layers["0"](x, model.rope_cache)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def cuda_model(variant: str, backend: str = "auto", head_dim: int = 32) -> ParallaxQwen3Model:
    torch.manual_seed(0)
    args = family_args(variant, head_dim=head_dim, attn_backend=backend, max_seq_len=256)
    with torch.device("cuda"):
        model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
    return model


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FAMILY)
def test_gpu_compiled_blocks_match_eager(variant):
    """Inductor on CUDA, as the trainer compiles, in fp32: the compiled model is as close to the
    fp64 model as the eager fp32 one is (within 3x its error, or 1e-5 relative; on the CPU both
    errors are about 2e-7). Against fp64 rather than against each other, so that a different but
    equally exact summation order passes and a wrong compiled graph does not."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = cuda_model(variant)
    tokens = torch.randint(0, VOCAB, (2, 200), device="cuda")
    with torch.no_grad():
        exact = cuda_model(variant).double()(tokens)
        eager = model(tokens)
    for name, block in model.layers.items():
        model.layers[name] = torch.compile(block, fullgraph=True)
    compiled = model(tokens)
    err_eager, err_compiled = (float((x.double() - exact).norm() / exact.norm()) for x in (eager, compiled))
    assert err_compiled <= max(3 * err_eager, 1e-5), (err_compiled, err_eager)
    compiled.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.gpu
def test_gpu_affine_la_fused_kernel_matches_the_reference_in_the_model():
    """The fused Triton Affine LA (head_dim 32) against the chunked PyTorch form, same weights: logits
    and the weights' gradients in fp32."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    fused, reference = cuda_model("affine_la", "triton"), cuda_model("affine_la", "reference")
    tokens = torch.randint(0, VOCAB, (2, 200), device="cuda")
    out_fused, out_ref = fused(tokens), reference(tokens)
    torch.testing.assert_close(out_fused, out_ref, rtol=1e-3, atol=1e-3)
    out_fused.logsumexp(-1).mean().backward()
    out_ref.logsumexp(-1).mean().backward()
    for (name, a), b in zip(fused.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-2, atol=1e-4, msg=name)
