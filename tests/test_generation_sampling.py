"""Sampling (parallax_titan.generation.sampling) against a float64 reference written from the
definitions, draws against their distribution, seeds; streaming text and stop strings."""

from __future__ import annotations

import math

import pytest
import torch

from parallax_titan.generation import Sampler, SamplingParams, TextStream, cut_at_stop, token_probabilities


def reference_probabilities(logits: list[float], seen: set[int], params: SamplingParams) -> list[float]:
    """One row, float64, from the definitions: penalty, temperature, top-k, nucleus, renormalise."""
    penalty = params.repetition_penalty
    values = [(x / penalty if x > 0 else x * penalty) if i in seen else x for i, x in enumerate(logits)]
    values = [x / params.temperature for x in values]
    order = sorted(range(len(values)), key=lambda i: -values[i])
    kept = order[: params.top_k] if params.top_k else order
    top = max(values[i] for i in kept)
    weights = {i: math.exp(values[i] - top) for i in kept}
    total = sum(weights.values())
    nucleus, mass = [], 0.0
    for i in kept:  # most likely first: keep while the tokens before hold less than top_p
        if mass >= params.top_p:
            break
        nucleus.append(i)
        mass += weights[i] / total
    norm = sum(weights[i] for i in nucleus)
    return [weights[i] / norm if i in nucleus else 0.0 for i in range(len(values))]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(temperature=0.9, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=10, top_p=0.5),
    SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.3),
    SamplingParams(temperature=2.0, top_k=1),
])
def test_probabilities_follow_the_definitions(params):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=generator) * 3
    seen = torch.rand(4, 50, generator=generator) < 0.3
    probs = token_probabilities(logits, params, seen)
    for row in range(4):
        expected = reference_probabilities(logits[row].tolist(), set(torch.nonzero(seen[row]).flatten().tolist()), params)
        torch.testing.assert_close(probs[row].double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    if params.top_k:
        assert int((probs > 0).sum(-1).max()) <= params.top_k


def test_draws_follow_the_distribution():
    """20000 rows with the same logits: each token's frequency within 4.5 standard deviations."""
    params = SamplingParams(temperature=0.8, top_k=4, seed=3)
    logits = torch.tensor([[2.0, 1.5, 0.3, 0.2, -1.0, 3.0]]).expand(20000, 6)
    tokens = Sampler(params, 20000, 6, torch.device("cpu"))(logits)
    expected = torch.tensor(reference_probabilities(logits[0].tolist(), set(), params), dtype=torch.float64)
    counts = torch.bincount(tokens, minlength=6).double() / 20000
    sigma = (expected * (1 - expected) / 20000).sqrt()
    assert bool(((counts - expected).abs() <= 4.5 * sigma + 1e-12).all()), (counts, expected)
    assert counts[4] == 0 and counts[3] == 0  # outside the top 4


def test_seed_repeats_the_draws():
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(1))
    draw = lambda seed: [Sampler(SamplingParams(temperature=1.0, seed=seed), 8, 100, torch.device("cpu"))(logits)
                         for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(draw(7), draw(7)))
    assert not all(torch.equal(a, b) for a, b in zip(draw(7), draw(8)))


def test_greedy_is_the_argmax_of_the_penalised_logits():
    logits = torch.tensor([[2.0, 1.5, -0.5, -0.2]])
    assert Sampler(SamplingParams(), 1, 4, torch.device("cpu"))(logits).tolist() == [0]
    sampler = Sampler(SamplingParams(repetition_penalty=2.0), 1, 4, torch.device("cpu"))
    sampler.observe(0, [0])  # 2.0 -> 1.0, below 1.5
    assert sampler(logits).tolist() == [1]
    assert sampler(logits).tolist() == [0]  # 0 and 1 seen now: 1.0, 0.75, -0.5, -0.2
    sampler.observe(0, [0, 1, 2])  # a new sequence: 1.0, 0.75, -1.0, -0.2
    logits = torch.tensor([[2.0, 1.5, -0.5, 0.9]])
    assert sampler(logits).tolist() == [0]
    sampler.observe(0, [2])  # only token 2 seen: the other logits are their own again
    assert sampler(torch.tensor([[1.0, 1.5, 2.8, 0.9]])).tolist() == [1]


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("temperature", math.inf), ("top_k", -1),
                                          ("top_k", 2.5), ("top_p", 0.0), ("top_p", 1.5),
                                          ("repetition_penalty", 0.0), ("seed", "x")])
def test_bad_parameters_are_named(field, value):
    with pytest.raises(ValueError, match=f"{field}: expected"):
        SamplingParams(**{field: value})


def test_penalty_needs_the_seen_tokens():
    with pytest.raises(ValueError, match="repetition_penalty"):
        token_probabilities(torch.zeros(1, 3), SamplingParams(temperature=1.0, repetition_penalty=1.2))
    with pytest.raises(ValueError, match="greedy"):
        token_probabilities(torch.zeros(1, 3), SamplingParams())


# ------------------------------------------------------------------------------ text
PIECES = {1: "Hel", 2: "lo", 3: " wo", 4: "rld", 5: "\n\n", 6: "Q:", 7: "\ufffd"}


def decode(tokens):
    text = "".join(PIECES[t] for t in tokens)
    return text.replace("\ufffd\ufffd", "é")  # two halves of one character


def test_stream_hands_out_settled_text_and_cuts_at_the_stop():
    stream = TextStream(decode, stops=["\n\nQ:"])
    pieces = [stream.add(t) for t in (1, 2, 3, 4, 5)]
    # the last len("\n\nQ:") - 1 = 3 characters could start the stop string: held back
    assert not stream.stopped and "".join(pieces) == "Hello worl"
    assert stream.add(6) == "d" and stream.stopped and stream.text == "Hello world"


def test_stream_holds_back_half_characters():
    stream = TextStream(decode)
    assert stream.add(1) == "Hel"
    assert stream.add(7) == ""  # the first half of "é"
    assert stream.add(7) == "é"
    assert stream.flush() == ""


def test_cut_at_stop_takes_the_first():
    assert cut_at_stop("a b c d", ["c", " b"]) == ("a", True)
    assert cut_at_stop("abc", ["", "x"]) == ("abc", False)


def test_a_bare_stop_string_is_one_stop_string_in_the_text_helpers():
    """A bare string is one stop string: iterated, cut_at_stop(text, "###") and TextStream(decode,
    "\\n\\n") would cut the text at the first "#" or the first newline."""
    assert cut_at_stop("a#b###c", "###") == ("a#b", True)
    stream = TextStream(lambda ids: "".join(chr(i) for i in ids), stops="\n\n")
    assert "".join(stream.add(ord(c)) for c in "ab\ncd\n\nef") == "ab\ncd" and stream.stopped
    with pytest.raises(ValueError, match=r"stops: expected strings, got \[3\]"):
        cut_at_stop("abc", [3])
    with pytest.raises(ValueError, match="stops: expected strings, got None"):
        TextStream(decode, stops=None)
