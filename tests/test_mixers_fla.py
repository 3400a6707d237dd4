"""The flash-linear-attention baseline mixers in our Qwen3 block (parallax_titan/mixers.py).

CPU tests cover what runs without a GPU (fla's Triton kernels do not: no CPU driver, and the
Triton interpreter fails inside fla's chunked delta-rule kernel): construction, sizes, init,
routing, the missing-fla error, the Hopper + triton check (needs neither fla nor a GPU). ``gpu``
tests compare with fla's own layer, check causality and packed documents, and train 1 vs 2 ranks
with FSDP2 through the trainer.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import pytest
import torch

from optimizers.routing import RoutingConfig, build_param_groups
from parallax_titan import mixers
from parallax_titan.mixers import (FLA_INSTALL, FLA_MIXERS, VARLEN_MIXERS, fla_hopper_blocker, fla_missing,
                                   fla_settings)
from parallax_titan.model import DocumentBoundaries, ParallaxQwen3Model
from tests._train_runs import losses, train
from parallax_titan.spec import BASE_FLAVORS, variant_args

MIXERS = list(FLA_MIXERS)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's kernels need CUDA")


@pytest.fixture(scope="module")
def fla_layers():
    return pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed")


def build_meta(mixer: str, flavor: str = "debug", **overrides) -> ParallaxQwen3Model:
    args = dataclasses.replace(variant_args(mixer, BASE_FLAVORS[flavor]), **overrides)
    with torch.device("meta"):
        return ParallaxQwen3Model(args)


def build(mixer: str, device: str, seed: int = 0, **overrides) -> ParallaxQwen3Model:
    """An initialised debug-size model, built on meta and materialised as TorchTitan does."""
    model = build_meta(mixer, **overrides)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device(device))
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_missing_fla_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla.layers", None)  # import of fla.layers now raises ImportError
    message = fla_missing("kda")
    assert message.startswith("model.name = 'kda' needs flash-linear-attention: ") and FLA_INSTALL in message
    assert fla_missing("parallax") is None and fla_missing("softmax") is None
    from parallax_titan.config import Model

    section = Model(name="gated_deltanet", flavor="0.6B", hf_assets_path="parallax_titan/assets/tokenizer/tiny")
    assert section.validate() == [fla_missing("gated_deltanet")]
    with pytest.raises(ImportError, match="pip install flash-linear-attention==0.6.0"):
        build_meta("mesa_net")


HOPPER = dict(mixer="gated_deltanet", cuda=True, capability=(9, 0), triton="3.6.0", tilelang=False, nvcc=True,
              env={})


@pytest.mark.parametrize("case, expected", [
    pytest.param({}, ["model.name = 'gated_deltanet'", "triton 3.6.0", "NVIDIA H200", "chunk_bwd_dqkwg", "#640",
                      "tilelang is not installed", "scripts/gpu_wheels.sh --tilelang", "triton to >= 3.7.1"],
                 id="h200-triton3.6.0-no-tilelang"),
    pytest.param({"triton": "3.4.0"}, ["triton 3.4.0"], id="triton3.4.0"),
    pytest.param({"triton": "3.7.0+git1234"}, ["triton 3.7.0+git1234"], id="triton3.7.0-local"),
    pytest.param({"tilelang": True}, None, id="tilelang"),
    pytest.param({"tilelang": True, "nvcc": False}, ["finds no nvcc"], id="tilelang-no-nvcc"),
    pytest.param({"tilelang": True, "env": {"FLA_TILELANG": "0"}}, ["switched off"], id="tilelang-off"),
    pytest.param({"triton": "3.7.1"}, None, id="triton3.7.1"),
    pytest.param({"triton": "3.8.0"}, None, id="triton3.8.0"),
    pytest.param({"triton": "3.3.1"}, None, id="triton3.3.1"),
    pytest.param({"triton": None}, None, id="no-triton"),
    pytest.param({"capability": (8, 0)}, None, id="ampere"),
    pytest.param({"capability": (10, 0)}, None, id="blackwell"),
    pytest.param({"cuda": False}, None, id="no-cuda"),
    pytest.param({"mixer": "kda"}, None, id="kda"),
    pytest.param({"mixer": "mesa_net"}, None, id="mesa_net"),
    pytest.param({"mixer": "parallax"}, None, id="parallax"),
])
def test_hopper_blocker_refuses_gated_deltanet_backward_fla_would_refuse(monkeypatch, case, expected):
    """No GPU, Triton nor fla needed: every probe fla_hopper_blocker makes is patched."""
    c = {**HOPPER, **case}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: c["cuda"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: c["capability"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(mixers, "_triton_version", lambda: c["triton"])
    monkeypatch.setattr(mixers, "_tilelang_found", lambda: c["tilelang"])
    monkeypatch.setattr(mixers, "_nvcc_found", lambda: c["nvcc"])
    for name in ("FLA_TILELANG", "FLA_DISABLE_BACKEND_DISPATCH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in c["env"].items():
        monkeypatch.setenv(name, value)
    message = fla_hopper_blocker(c["mixer"])
    if expected is None:
        assert message is None
    else:
        assert message is not None and all(part in message for part in expected), message


def test_triton_versions_compare_without_packaging(monkeypatch):
    monkeypatch.setitem(sys.modules, "packaging.version", None)  # import now raises ImportError
    key = mixers._version_key
    assert key("3.4.0") <= key("3.6.0+git1") < key("3.7.1") <= key("3.7.1") < key("3.10.0")
    assert not key("3.4.0") <= key("3.3.1")


@pytest.mark.parametrize("mixer", MIXERS)
def test_0_6b_parameter_count_within_2_percent_of_transformer(fla_layers, mixer):
    transformer = n_params(build_meta("transformer", "0.6B"))
    assert abs(n_params(build_meta(mixer, "0.6B")) - transformer) / transformer < 0.02


def test_settings_follow_fla_recommendations(fla_layers):
    base = BASE_FLAVORS["0.6B"]
    shape = (base.dim, base.head_dim, base.n_heads, base.n_kv_heads)
    gdn = fla_settings("gated_deltanet", *shape)
    assert gdn["num_heads"] * gdn["head_dim"] == 0.75 * base.dim and gdn["expand_v"] == 2  # fla's GDN rule
    model = build_meta("kda", "0.6B")
    layer = model.layers["3"].attention.layer
    assert isinstance(layer, fla_layers.KimiDeltaAttention) and layer.layer_idx == 3
    assert (layer.num_heads, layer.head_dim, layer.conv_size) == (11, 128, 4)
    assert type(build_meta("mamba2").layers["0"].attention.layer) is fla_layers.Mamba2
    with pytest.raises(ValueError, match="'lstm' is not an fla mixer"):
        fla_settings("lstm", *shape)


def test_init_weights_follow_fla_and_torchtitan(fla_layers):
    model = build("gated_deltanet", "cpu")
    block = model.layers["1"]
    layer = block.attention.layer
    a = layer.A_log.exp()
    dt = torch.nn.functional.softplus(layer.dt_bias)
    assert ((a > 0) & (a <= 16)).all() and ((dt >= 1e-4 - 1e-7) & (dt <= 0.1 + 1e-6)).all()
    assert a.std() > 0.5  # drawn, not a constant left over from an empty tensor
    bound = 1 / math.sqrt(layer.conv_size)
    for conv in (layer.q_conv1d, layer.k_conv1d, layer.v_conv1d):
        assert conv.weight.abs().max() <= bound and conv.weight.std() > bound / 4
    assert torch.equal(layer.o_norm.weight, torch.ones_like(layer.o_norm.weight))
    assert layer.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert layer.o_proj.weight.std().item() == pytest.approx(block.weight_init_std, rel=0.1)
    assert layer.a_proj.weight.std().item() == pytest.approx(0.02, rel=0.2)


@pytest.mark.parametrize("mixer", MIXERS)
def test_routing_sends_fla_extras_to_adam(fla_layers, mixer):
    model = build_meta(mixer)
    groups = build_param_groups(model, RoutingConfig())
    algo = {id(p): g["algo"] for g in groups for p in g["params"]}
    name = {id(p): g["name"] for g in groups for p in g["params"]}
    assert len(algo) == len(list(model.parameters()))
    for fqn, p in model.layers["0"].attention.named_parameters(prefix="layers.0.attention"):
        leaf = fqn.split(".")[-2] if fqn.endswith((".weight", ".bias")) else fqn.split(".")[-1]
        if fqn.endswith(".bias"):  # Linear and conv biases
            expected = ("bias", "adamw")
        elif "conv1d" in fqn:
            expected = ("conv", "adamw")
        elif leaf in ("A_log", "dt_bias", "D", "lambda_params"):
            expected = ("ssm", "adamw")
        elif "norm" in fqn:
            expected = ("norm", "adamw")
        elif leaf in ("a_proj", "b_proj") or ".f_proj." in fqn:
            expected = ("gate", "adamw")
        else:  # q/k/v/o/g projections, Mamba2 in/out projections: matrices for Muon
            expected = ("other", "muon")
        assert (name[id(p)], algo[id(p)]) == expected, fqn


def test_cpu_forward_names_the_device(fla_layers):
    mixer = build_meta("kda").layers["0"].attention
    with pytest.raises(RuntimeError, match="mixer 'kda': fla's Triton kernels need a CUDA device; got input on cpu"):
        mixer(torch.zeros(1, 4, 256), None)


# ----------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mixer", MIXERS)
def test_gpu_block_matches_fla_layer(fla_layers, mixer):
    model = build(mixer, "cuda")
    ours = model.layers["1"].attention
    theirs = getattr(fla_layers, FLA_MIXERS[mixer])(**ours.kwargs).cuda()
    theirs.load_state_dict(ours.layer.state_dict())
    x = torch.randn(2, 100, model.model_args.dim, device="cuda")
    # The first call autotunes fla's kernels (some write their outputs in place while being timed),
    # so both layers are compared after a warm-up call. fla's own run-to-run spread (split
    # reductions, atomics) bounds how close two runs of the same weights can be; a wiring error
    # (other weights, a missing gate, RoPE applied) moves the output by O(1).
    theirs(x)
    with torch.no_grad():
        first, second = theirs(x)[0], theirs(x)[0]
        got = ours(x, model.rope_cache)
    spread = (first - second).abs().max().item()
    err = (got - second).abs().max().item()
    scale = second.abs().max().item()
    assert err <= max(4 * spread, 1e-6 * scale), (
        f"{mixer}: |ours - fla| = {err:.3g}, fla run-to-run {spread:.3g}, |fla| max {scale:.3g}")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mixer", MIXERS)
def test_gpu_block_backward_gives_finite_gradients_to_every_parameter(fla_layers, mixer):
    model = build(mixer, "cuda")
    logits = model(torch.randint(0, 4096, (2, 64), device="cuda"))
    blocked = fla_hopper_blocker(mixer)
    if blocked:  # config validation refuses this run; fla must refuse its backward the same way
        with pytest.raises(RuntimeError, match="chunk_bwd_dqkwg"):
            logits.float().square().mean().backward()
        return
    logits.float().square().mean().backward()
    assert torch.isfinite(logits).all()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not missing and not bad, f"no gradient: {missing}; non-finite gradient: {bad}"


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mixer", MIXERS)
def test_gpu_no_position_reads_a_later_position(fla_layers, mixer):
    model = build(mixer, "cuda").eval()
    tokens = torch.randint(0, 4096, (2, 96), device="cuda")
    changed = tokens.clone()
    changed[:, 50:] = torch.randint(0, 4096, (2, 46), device="cuda")
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :50], b[:, :50], rtol=1e-5, atol=1e-5)
    assert (a[:, 50:] - b[:, 50:]).abs().max() > 1e-3


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mixer", VARLEN_MIXERS)
def test_gpu_block_causal_isolates_documents(fla_layers, mixer):
    model = build(mixer, "cuda").eval()
    tokens = torch.randint(12, 4096, (2, 80), device="cuda")
    other = tokens.clone()
    other[:, :30] = torch.randint(12, 4096, (2, 30), device="cuda")
    ends = torch.tensor([0, 30, 80, 110, 160], dtype=torch.int32, device="cuda")  # eos after position 29
    masks = DocumentBoundaries(ends)
    with torch.no_grad():
        a, b = model(tokens, attention_masks=masks), model(other, attention_masks=masks)
        plain = model(tokens)
    torch.testing.assert_close(a[:, 30:], b[:, 30:], rtol=1e-5, atol=1e-5)
    assert (plain[:, 30:] - a[:, 30:]).abs().max() > 1e-3


def _train(nproc: int, dump: str, *extra: str) -> dict[int, float]:
    # GDN where fla can train it here; else Mamba2 (fla's layer on its PyTorch path)
    mixer = "mamba2" if fla_hopper_blocker("gated_deltanet") else "gated_deltanet"
    # global data order: 2 ranks x 2 sequences take the 1-rank run's 4 sequences of each step
    train(dump, "--model.name", mixer, "--training.steps", "4", "--training.data_order", "global",
          "--training.local_batch_size", str(4 // nproc), "--training.dataset", "default_corpus", *extra,
          nproc=nproc)
    return losses(dump)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_two_rank_fsdp_step_matches_one_rank(fla_layers, tmp_path):
    """The whole parallelize path (FSDP2, full AC, Muon routing, DTensor init) on one fla mixer."""
    seed = str(tmp_path / "seed")
    _train(1, seed, "--training.steps", "1", "--checkpoint.create_seed_checkpoint")
    common = ("--checkpoint.initial_load_path", os.path.join(seed, "checkpoint", "step-0"),
              "--activation_checkpoint.mode", "full", "--optimizer.name", "Muon", "--optimizer.lr", "5e-3")
    one = _train(1, str(tmp_path / "one"), *common)
    two = _train(2, str(tmp_path / "two"), *common)
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=2e-3), (one, two)
    assert one[4] < one[1]
