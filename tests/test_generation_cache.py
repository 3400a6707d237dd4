"""KV-cache inference (parallax_titan.generation, ParallaxQwen3Model.forward_cached) against the
training forward run on the whole sequence, for every attention variant, with ragged batches."""

from __future__ import annotations

import pytest
import torch

from kernels import DecodePlan
from parallax_titan.generation import DecodeSession, KVCache
from parallax_titan.model import Attention, SoftmaxAttention
from tests._generation_models import ATTENTION_CASES, full_logits, tiny_model

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [3, 4, 5, 6, 7, 8, 9, 10, 11]]  # ragged: cache_seqlens differ per row


def run_session(session, prompts, steps, pick=lambda logits: logits.argmax(-1)):
    """Prefill, then ``steps`` decode steps feeding ``pick(logits)``; returns every step's logits
    (n, vocab) and the sequences."""
    sequences = [list(p) for p in prompts]
    logits = session.prefill(prompts)
    seen = [logits]
    for _ in range(steps):
        tokens = pick(logits)
        for seq, token in zip(sequences, tokens.tolist()):
            seq.append(token)
        logits = session.step(tokens).clone()
        seen.append(logits)
    return seen, sequences


@pytest.mark.parametrize("variant, changes", ATTENTION_CASES)
def test_cached_logits_equal_the_full_forward(variant, changes):
    """fp64: prefill and 6 decode steps give the next-token logits of the whole sequence's forward."""
    model = tiny_model(variant, dtype=torch.float64, **changes)
    session = DecodeSession(model, batch=3, capacity=20)
    steps, sequences = run_session(session, PROMPTS, 6)
    for step, logits in enumerate(steps):
        for row, seq in enumerate(sequences):
            expected = full_logits(model, seq[: len(PROMPTS[row]) + step])
            torch.testing.assert_close(logits[row].double(), expected, rtol=1e-9, atol=1e-9)
    assert session.lengths == [len(p) + 6 for p in PROMPTS]
    assert session.cache.seqlens.tolist() == session.lengths


@pytest.mark.parametrize("variant", ["transformer", "parallax"])
def test_fp32_cache_agrees_with_the_forward(variant):
    model = tiny_model(variant)
    steps, sequences = run_session(DecodeSession(model, batch=3, capacity=16), PROMPTS, 4)
    for row, seq in enumerate(sequences):
        torch.testing.assert_close(steps[-1][row], full_logits(model, seq), rtol=1e-4, atol=1e-4)


def test_the_cache_holds_the_first_layers_keys_and_values():
    """Layout (n_layers, batch, capacity, Hkv, D): after a prefill, row i slot p of layer 0 holds
    the k and v (after norm and RoPE) the training path forms at position p."""
    model = tiny_model("parallax", dtype=torch.float64)
    session = DecodeSession(model, batch=3, capacity=12)
    session.prefill(PROMPTS)
    args = model.model_args
    assert session.cache.k.shape == (args.n_layers, 3, 12, args.n_kv_heads, args.head_dim)
    block = model.layers["0"]
    for row, prompt in enumerate(PROMPTS):
        x = block.attention_norm(model.tok_embeddings(torch.tensor([prompt])))
        _, _, k, v = block.attention.project(x, model.rope_cache, None)
        torch.testing.assert_close(session.cache.k[0, row, : len(prompt)], k[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(session.cache.v[0, row, : len(prompt)], v[0], rtol=1e-12, atol=1e-12)
    assert isinstance(session.cache.plan, DecodePlan) and session.cache.plan.backend == "reference"


def test_prefill_of_one_row_leaves_the_others():
    model = tiny_model("parallax", dtype=torch.float64)
    session = DecodeSession(model, batch=3, capacity=20)
    _, sequences = run_session(session, PROMPTS, 2)
    sequences[1] = [40, 41, 42, 43]
    logits = session.prefill([sequences[1]], rows=[1])
    torch.testing.assert_close(logits[0].double(), full_logits(model, sequences[1]), rtol=1e-9, atol=1e-9)
    tokens = torch.tensor([17, 18, 19])
    logits = session.step(tokens).double()
    for row, seq in enumerate(sequences):
        torch.testing.assert_close(logits[row], full_logits(model, seq + [17 + row]), rtol=1e-9, atol=1e-9)
    assert session.lengths == [len(PROMPTS[0]) + 3, 5, len(PROMPTS[2]) + 3]


def test_softmax_training_forward_is_torchtitans():
    """The transformer variants' module adds the cached path only: forward is TorchTitan's."""
    assert SoftmaxAttention.forward is Attention.forward
    model = tiny_model("transformer")
    tokens = torch.randint(0, 4096, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens)
        for block in model.layers.values():
            block.attention.__class__ = Attention
        assert torch.equal(model(tokens), ours)


def test_bad_sizes_and_inputs_are_named():
    model = tiny_model("parallax", max_seq_len=32)
    with pytest.raises(ValueError, match="capacity: 33 positions exceed the model's RoPE table of 32"):
        KVCache(model, 2, 33)
    with pytest.raises(ValueError, match="batch"):
        KVCache(model, 0, 8)
    session = DecodeSession(model, batch=2, capacity=8)
    with pytest.raises(ValueError, match="prompts: a prompt of 9 tokens"):
        session.prefill([[1] * 9, [2]])
    with pytest.raises(ValueError, match=r"prompts\[0\]: empty; expected at least one token"):
        session.prefill([[], [2]])
    with pytest.raises(ValueError, match="rows"):
        session.prefill([[1], [2]], rows=[0, 0])
    with pytest.raises(ValueError, match=r"tokens: expected int64 of shape \(2,\)"):
        session.step(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="graph: CUDA-graph decoding needs"):
        DecodeSession(model, batch=2, capacity=8, graph=True)


def test_fla_mixer_on_cpu_is_refused_clearly():
    pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed")
    model = tiny_model("gated_deltanet")
    with pytest.raises(RuntimeError, match="'gated_deltanet'.*need a CUDA device"):
        DecodeSession(model, batch=1, capacity=8)


# ---------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", ["transformer", "parallax", "parallax_dagger"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("graph", [False, True])
def test_cuda_cache_agrees_with_the_forward(variant, dtype, graph):
    model = tiny_model(variant, dtype=dtype, device="cuda", n_layers=4, max_seq_len=512)
    prompts = [list(range(3, 200)), list(range(7, 90)), list(range(300, 301))]
    session = DecodeSession(model, batch=3, capacity=256, graph=graph)
    steps, sequences = run_session(session, prompts, 8)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for step in (0, 8):
        for row, seq in enumerate(sequences):
            expected = full_logits(model, seq[: len(prompts[row]) + step]).float()
            assert (steps[step][row].float() - expected).abs().max() <= tol * expected.abs().max(), (step, row)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_steps_equal_eager_steps_bit_for_bit():
    model = tiny_model("parallax", dtype=torch.bfloat16, device="cuda", n_layers=4, max_seq_len=512)
    prompts = [list(range(3, 130)), list(range(9, 40))]
    eager, _ = run_session(DecodeSession(model, batch=2, capacity=200), prompts, 6)
    graphed, _ = run_session(DecodeSession(model, batch=2, capacity=200, graph=True), prompts, 6)
    for a, b in zip(eager, graphed):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mixer", ["gated_deltanet", "kda", "mamba2", "mesa_net"])
def test_fla_recurrent_state_agrees_with_the_forward(mixer):
    pytest.importorskip("fla.layers", reason="flash-linear-attention is not installed")
    model = tiny_model(mixer, dtype=torch.bfloat16, device="cuda", n_layers=2, head_dim=64, max_seq_len=512)
    prompts = [list(range(3, 100)), list(range(5, 30))]
    steps, sequences = run_session(DecodeSession(model, batch=2, capacity=256), prompts, 6)
    for step in (0, 6):
        for row, seq in enumerate(sequences):
            expected = full_logits(model, seq[: len(prompts[row]) + step]).float()
            assert (steps[step][row].float() - expected).abs().max() <= 3e-2 * expected.abs().max(), (mixer, step, row)
