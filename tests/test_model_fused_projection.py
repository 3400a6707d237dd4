"""The attention's input projections as one matmul (``model.fused_linear``): the same q, r, k, v and
gradients as separate projections, one matmul where every projection is a plain ``nn.Linear``,
separate ones once a projection is converted (float8's ``Float8Linear`` is an ``nn.Linear``
subclass), unchanged parameter names, and a compiled block without graph breaks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from parallax_titan.model import ParallaxAttention, ParallaxQwen3Model, SoftmaxAttention, apply_rope
from parallax_titan.spec import BASE_FLAVORS, variant_args

B, T = 2, 7
CASES = [("parallax", {}), ("parallax", {"gate": "head"}), ("parallax", {"gate": "token", "rho_rope": False}),
         ("transformer", {})]
IDS = ["parallax", "parallax-gate-head", "parallax-gate-token-no-rho-rope", "transformer"]


def build(variant: str, dtype=torch.float64, **overrides) -> ParallaxQwen3Model:
    """A 2-layer debug-size model with every parameter moved off its init (norm weights not all 1)."""
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), n_layers=2, max_seq_len=32, **overrides)
    torch.manual_seed(0)
    model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype)


def separate_projections(attn, x, rope):
    """The projections written out one matmul each: q, (r,) k, v after norms, gate and RoPE."""
    shape = (*x.shape[:2], -1, attn.head_dim)
    q = attn.q_norm(F.linear(x, attn.wq.weight).view(shape))
    k = attn.k_norm(F.linear(x, attn.wk.weight).view(shape))
    v = F.linear(x, attn.wv.weight).view(shape)
    q, k = apply_rope(q, rope, None), apply_rope(k, rope, None)
    if isinstance(attn, SoftmaxAttention):
        return q, k, v
    r = attn.r_norm(F.linear(x, attn.wr.weight).view(shape))
    if attn.gate is not None:
        r = r * torch.sigmoid(F.linear(x, attn.gate.weight)).unsqueeze(-1)
    if attn.rho_rope:
        r = apply_rope(r, rope, None)
    return q, r, k, v


def outputs_and_grads(fn, attn, x, rope):
    """fn's outputs and the gradients of a fixed random projection of them w.r.t. x and every
    parameter of the attention module but the output projection."""
    outs = fn(attn, x, rope)
    generator = torch.Generator().manual_seed(5)
    loss = sum((o * torch.randn(o.shape, generator=generator, dtype=o.dtype)).sum() for o in outs)
    params = [p for name, p in sorted(attn.named_parameters()) if not name.startswith("wo.")]
    return outs, torch.autograd.grad(loss, [*params, x])


def project(attn, x, rope):
    return attn.project(x, rope, None)


class MatmulCounter(TorchDispatchMode):
    """Counts the aten matmuls (mm, addmm, bmm) run inside the block."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


class ConvertedLinear(nn.Linear):
    """Stands for a converted projection (torchao's Float8Linear subclasses nn.Linear)."""


def convert(linear: nn.Linear) -> ConvertedLinear:
    converted = ConvertedLinear(linear.in_features, linear.out_features, bias=False, dtype=linear.weight.dtype)
    converted.weight = linear.weight
    return converted


def attention_and_input(variant, overrides):
    model = build(variant, **overrides)
    attn = model.layers["0"].attention
    assert isinstance(attn, SoftmaxAttention if variant == "transformer" else ParallaxAttention)
    x = torch.randn(B, T, model.model_args.dim, dtype=torch.float64, requires_grad=True)
    return attn, x, model.rope_cache


@pytest.mark.parametrize(("variant", "overrides"), CASES, ids=IDS)
def test_fused_projection_equals_separate_matmuls(variant, overrides):
    attn, x, rope = attention_and_input(variant, overrides)
    fused, fused_grads = outputs_and_grads(project, attn, x, rope)
    reference, reference_grads = outputs_and_grads(separate_projections, attn, x, rope)
    assert len(fused) == len(reference)
    for got, want in zip(fused, reference):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for got, want in zip(fused_grads, reference_grads):
        assert got is not None and want.abs().max() > 0
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("variant", "overrides"), CASES, ids=IDS)
def test_one_matmul_and_separate_ones_after_a_conversion(variant, overrides):
    attn, x, rope = attention_and_input(variant, overrides)
    with torch.no_grad(), MatmulCounter() as counter:
        fused = attn.project(x, rope, None)
    assert counter.count == 1
    names = ["wq", "wk", "wv"] + ([] if variant == "transformer" else ["wr"])
    n_linears = len(names) + (getattr(attn, "gate", None) is not None)
    setattr(attn, names[-1], convert(getattr(attn, names[-1])))
    with torch.no_grad(), MatmulCounter() as counter:
        separate = attn.project(x, rope, None)
    assert counter.count == n_linears
    for got, want in zip(separate, fused):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_hook_on_a_projection_sees_its_call():
    attn, x, rope = attention_and_input("parallax", {})
    calls = []
    handle = attn.wr.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    with torch.no_grad():
        attn.project(x, rope, None)
    handle.remove()
    assert calls == [(B, T, attn.wr.out_features)]


def test_float8_converted_projections_keep_their_float8_matmuls():
    """TorchTitan's float8 converter (torchao, emulated here) swaps the linears after the model is
    built: the projections then run through Float8Linear, with its rounding, not one full-precision
    matmul."""
    float8 = pytest.importorskip("torchao.float8")
    model = build("parallax", dtype=torch.float32, gate="head")
    multiple_of_16 = lambda m, fqn: m.in_features % 16 == 0 and m.out_features % 16 == 0  # noqa: E731
    float8.convert_to_float8_training(model, config=float8.Float8LinearConfig(emulate=True),
                                      module_filter_fn=multiple_of_16)
    attn = model.layers["0"].attention
    assert type(attn.wv) is not nn.Linear and type(attn.gate) is nn.Linear  # the 8-row gate stays as it was
    x = torch.randn(B, T, model.model_args.dim)
    shape = (B, T, -1, attn.head_dim)
    with torch.no_grad():
        _, _, _, v = attn.project(x, model.rope_cache, None)
        torch.testing.assert_close(v, attn.wv(x).view(shape), rtol=0, atol=0)
        assert (v - F.linear(x, attn.wv.weight).view(shape)).abs().max() > 1e-4

# Layer 0 of the debug-size Parallax model with a per-head gate, in state-dict order.
EXPECTED_LAYER_0 = {
    "layers.0.attention.q_norm.weight": (32,),
    "layers.0.attention.k_norm.weight": (32,),
    "layers.0.attention.wq.weight": (256, 256),
    "layers.0.attention.wk.weight": (128, 256),
    "layers.0.attention.wv.weight": (128, 256),
    "layers.0.attention.wo.weight": (256, 256),
    "layers.0.attention.wr.weight": (256, 256),
    "layers.0.attention.r_norm.weight": (32,),
    "layers.0.attention.gate.weight": (8, 256),
    "layers.0.feed_forward.w1.weight": (768, 256),
    "layers.0.feed_forward.w2.weight": (256, 768),
    "layers.0.feed_forward.w3.weight": (768, 256),
    "layers.0.attention_norm.weight": (256,),
    "layers.0.ffn_norm.weight": (256,),
}


def test_state_dict_names_are_unchanged():
    model = build("parallax", gate="head")
    model(torch.randint(0, 4096, (1, 8))).sum().backward()  # a forward and backward add nothing
    state = model.state_dict()
    layer_0 = {k: tuple(v.shape) for k, v in state.items() if k.startswith("layers.0.")}
    assert list(layer_0.items()) == list(EXPECTED_LAYER_0.items())
    assert [k for k, _ in model.named_parameters() if k.startswith("layers.0.")] == list(EXPECTED_LAYER_0)


@pytest.mark.parametrize("gate", ["none", "head"])
def test_compiled_block_matches_eager(gate):
    """TorchTitan compiles each block with fullgraph=True; the fused projection traces into it (one
    linear for all the input projections) and gives the eager block's output and gradients."""
    model = build("parallax", dtype=torch.float32, gate=gate)
    block = model.layers["0"]
    x = torch.randn(B, T, model.model_args.dim, requires_grad=True)
    eager = block(x, model.rope_cache)
    eager_grads = torch.autograd.grad(eager.square().sum(), [x, *block.parameters()])
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(x, model.rope_cache)
    compiled_grads = torch.autograd.grad(compiled.square().sum(), [x, *block.parameters()])
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    linears = []

    def count_linears(gm, example_inputs):
        linears.append(sum(node.target in (torch._C._nn.linear, F.linear) for node in gm.graph.nodes))
        return gm.forward

    attn = block.attention
    torch.compile(attn.project, fullgraph=True, backend=count_linears)(x.detach(), model.rope_cache, None)
    assert linears == [1]
