"""Generation fed what a careless or hostile caller hands it: token ids outside the vocabulary,
a stop string given as a bare string, a temperature too small for fp32, no prompts at all, and a
command line whose bad arguments must be refused before the checkpoint is read."""

from __future__ import annotations

import os

import pytest
import torch

from parallax_titan.generation import Generator, SamplingParams, StopCriteria, generate, token_probabilities
from scripts import generate as script
from tests._generation_models import recompute_greedy, tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "test_cpu_2rank.toml")


@pytest.fixture(scope="module")
def model():
    return tiny_model("transformer")


@pytest.mark.parametrize("bad", [4096, -1, 10**6])
def test_prompt_ids_outside_the_vocabulary_are_named(model, bad):
    """An id >= vocab_size (a prompt from another tokenizer) or < 0 was an IndexError from the
    embedding on CPU, a device-side assert on CUDA."""
    generator = Generator(model, batch_size=2, capacity=8)
    with pytest.raises(ValueError, match=rf"prompts\[1\]: token id {bad} at position 1 is outside the model's "
                                         r"vocabulary of 4096 \(expected 0 to 4095\)"):
        generator.generate([[5, 6], [7, bad, 8]], stopping=StopCriteria(max_new_tokens=2))


def test_prompt_as_a_tensor_is_taken(model):
    """A 1-d tensor prompt is a sequence of ids; ``not prompt`` raised on it."""
    generator = Generator(model, batch_size=1, capacity=8)
    out = generator.generate([torch.tensor([5, 6, 7])], stopping=StopCriteria(max_new_tokens=3))
    assert out[0].tokens == recompute_greedy(model, [5, 6, 7], 3)


def test_a_bare_stop_string_is_one_stop_string():
    """``stop="###"`` became the stop strings ('#', '#', '#'): any '#' ended the text."""
    assert StopCriteria(stop="###").stop == ("###",)
    assert StopCriteria(stop_token_ids=7).stop_token_ids == (7,)
    assert StopCriteria(stop=["a", "b"], stop_token_ids=[1, 2]) == StopCriteria(stop=("a", "b"), stop_token_ids=(1, 2))


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 1e-300])
def test_a_tiny_temperature_is_the_argmax_not_nan(temperature):
    """logits / 1e-45 overflowed to inf in fp32 and the softmax gave NaN (a RuntimeError from
    torch.multinomial in the middle of generation)."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 2.5], [0.5, 0.5, -1.0, 0.0]])
    probs = token_probabilities(logits, SamplingParams(temperature=temperature))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]]))


def test_a_tiny_temperature_generates_the_greedy_tokens(model):
    prompt = [5, 6, 7]
    out = generate(model, [prompt], SamplingParams(temperature=1e-300, seed=0), StopCriteria(max_new_tokens=4))
    assert out[0].tokens == recompute_greedy(model, prompt, 4)


def test_no_prompts_give_no_completions(model):
    """``generate(model, [])`` raised "max() arg is an empty sequence"."""
    assert generate(model, []) == []


@pytest.mark.parametrize("flag, value, message", [
    ("--max-new-tokens", "0", "max_new_tokens: expected a positive integer, got 0"),
    ("--max-new-tokens", "-5", "max_new_tokens: expected a positive integer, got -5"),
    ("--max-new-tokens", "40", "pass --max-length"),
])
def test_script_refuses_bad_lengths_before_reading_the_checkpoint(tmp_path, capsys, flag, value, message):
    """These were reported only after the checkpoint was verified and loaded (minutes for a large
    model); a folder that is no checkpoint shows which check comes first (it exits 4)."""
    missing = str(tmp_path / "no-checkpoint")
    code = script.main(["--config", CONFIG, "--checkpoint", missing, "--device", "cpu", "--prompt", "Hi", flag, value])
    assert code == 2 and message in capsys.readouterr().err
