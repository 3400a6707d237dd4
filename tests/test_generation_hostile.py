"""Generation fed what a careless or hostile caller hands it: token ids outside the vocabulary or
not ints at all, a stop string given as a bare string, stop criteria and arguments of the wrong
type, a temperature too small for fp32, a seed outside 64 bits, no prompts at all, a model whose
float16 activations overflow, logits of another shape, and a command line whose bad arguments must
be refused before the checkpoint is read."""

from __future__ import annotations

import os
import re

import pytest
import torch

from parallax_titan.generation import (
    Generator, Sampler, SamplingParams, StopCriteria, generate, token_ids, token_probabilities,
)
from parallax_titan.generation.sampling import NOT_FINITE
from scripts import generate as script
from tests._aten_ops import recorded_ops
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


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64, 10**30])
def test_a_seed_outside_64_bits_is_named(seed):
    """torch.Generator reads a seed as 64 bits: -1 (the "random" of other tools) silently became the
    fixed seed 2**64 - 1, and 2**64 was "Overflow when unpacking long long" once sampling began."""
    with pytest.raises(ValueError, match=rf"seed: expected an integer in \[0, 2\*\*64\) or None .*, got {seed}"):
        SamplingParams(temperature=1.0, seed=seed)


def test_the_largest_seed_is_taken(model):
    out = generate(model, [[5, 6, 7]], SamplingParams(temperature=1.0, seed=2**64 - 1), StopCriteria(max_new_tokens=2))
    assert len(out[0].tokens) == 2


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_script_refuses_a_bad_seed_before_reading_the_checkpoint(tmp_path, capsys, seed):
    """--seed 2**64 failed only after the checkpoint was loaded, with a message that named no flag."""
    missing = str(tmp_path / "no-checkpoint")
    code = script.main(["--config", CONFIG, "--checkpoint", missing, "--device", "cpu", "--prompt", "Hi",
                        "--temperature", "1", "--seed", seed])
    assert code == 2 and f"seed: expected an integer in [0, 2**64) or None (a fresh random seed), got {seed}" in \
        capsys.readouterr().err


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logits_that_are_not_finite_are_named(temperature):
    """The argmax of a NaN row was a token like any other (greedy text of garbage), and a draw failed
    inside torch.multinomial ("probability tensor contains either inf, nan ...")."""
    logits = torch.tensor([[1.0, 3.0, -2.0], [0.5, float("nan"), 0.0], [0.0, 0.0, float("inf")]])
    sampler = Sampler(SamplingParams(temperature=temperature, seed=0, repetition_penalty=1.5), 3, 3,
                      torch.device("cpu"))
    tokens = sampler(logits)
    assert tokens.tolist()[1:] == [NOT_FINITE, NOT_FINITE]
    assert sampler.seen[1:].sum() == 0  # no token of those rows counts as seen
    with pytest.raises(ValueError, match=r"logits: rows \[1, 2\] of the batch hold inf or NaN; the model overflowed"):
        token_ids(tokens)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, top_k=2, top_p=0.9, seed=1,
                                                                      repetition_penalty=1.3)])
def test_the_sampler_reads_nothing_back(params):
    """The check for non-finite logits rides on the step's one read of the tokens (`token_ids`), not
    a read of its own before the draw (a second host sync per decode step on a GPU)."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 0.5], [0.5, float("nan"), 0.0, 1.0]])
    sampler = Sampler(params, 2, 4, torch.device("cpu"))
    ops = recorded_ops(lambda: sampler(logits))
    assert ops and not [op for op in ops if op.split(".")[1] in ("_local_scalar_dense", "is_nonzero", "nonzero",
                                                                "item", "masked_select")]


def test_a_float16_model_that_overflows_is_refused_not_decoded():
    """Activations beyond float16's 65504 (here embeddings scaled up; a bfloat16-trained model run with
    --dtype float16) gave NaN logits, and greedy generation returned token 0 again and again."""
    prompt = [5, 6, 7]
    models = {dtype: tiny_model("transformer", dtype=dtype) for dtype in (torch.float32, torch.float16)}
    with torch.no_grad():
        for model in models.values():
            model.tok_embeddings.weight.mul_(1e4)  # still finite in float16 (at most 1875)
    assert len(generate(models[torch.float32], [prompt], stopping=StopCriteria(max_new_tokens=3))[0].tokens) == 3
    with pytest.raises(ValueError, match=r"float16 holds at most 65504: run it in bfloat16 or float32"):
        generate(models[torch.float16], [prompt], stopping=StopCriteria(max_new_tokens=3))


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True])
def test_generate_refuses_a_batch_size_that_is_not_a_positive_count(model, batch_size):
    """0 meant "all prompts at once" (as None does), -1 failed deeper in the decode session."""
    with pytest.raises(ValueError, match=f"batch_size: expected a positive integer or None .*got {batch_size!r}"):
        generate(model, [[1, 2, 3]], batch_size=batch_size)


@pytest.mark.parametrize("prompt, match", [
    ([5, 6.7], r"prompts\[1\]: token id 6.7 at position 1 is a float; expected an int"),
    ([True, 6], r"prompts\[1\]: token id True at position 0 is a bool; expected an int"),
    ([[5, 6]], r"prompts\[1\]: token id \[5, 6\] at position 0 is a list; expected an int"),
    ("hello", r"prompts\[1\]: expected a sequence of token ids, got str 'hello' \(a prompt is a list of int ids"),
    (7, r"prompts\[1\]: expected a sequence of token ids, got int 7"),
    (torch.tensor([5.0, 6.0]), r"prompts\[1\]: a tensor prompt must be 1-D of an integer dtype, got torch.float32"),
    (torch.tensor([[5, 6]]), r"prompts\[1\]: a tensor prompt must be 1-D of an integer dtype, got torch.int64 of "
                             r"shape \(1, 2\)"),
])
def test_prompts_that_are_not_token_ids_are_named(model, prompt, match):
    """A float id was truncated (6.7 ran as token 6) and True ran as token 1 without a word; text was
    split into characters (then int('h') failed), a flat list of ids failed with "'int' object is not
    iterable"."""
    generator = Generator(model, batch_size=2, capacity=8)
    with pytest.raises(ValueError, match=match):
        generator.generate([[5, 6], prompt], stopping=StopCriteria(max_new_tokens=2))


def test_session_prefill_names_ids_outside_the_vocabulary(model):
    """DecodeSession.prefill fed them to the embedding: an IndexError on CPU, a device-side assert on
    CUDA (the process ends); the cache is left as it was."""
    from parallax_titan.generation import DecodeSession

    session = DecodeSession(model, batch=2, capacity=8)
    with pytest.raises(ValueError, match=r"prompts\[1\]: token id -1 at position 1 is outside the model's "
                                         r"vocabulary of 4096"):
        session.prefill([[5, 6], [7, -1]])
    assert not session.cache.k.any() and session.lengths == [0, 0]


def test_session_step_refuses_tokens_on_another_device(model):
    """Tokens on another device than the model's (meta here) were run without a word."""
    from parallax_titan.generation import DecodeSession

    session = DecodeSession(model, batch=2, capacity=8)
    session.prefill([[5, 6], [7]])
    with pytest.raises(ValueError, match=r"tokens: expected int64 of shape \(2,\) on cpu, got torch.int64 \(2,\) on "
                                         "meta"):
        session.step(torch.tensor([1, 2], device="meta"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(stop_token_ids=(1.5,)), r"stop_token_ids: expected ints, got \(1.5,\)"),
    (dict(stop_token_ids=True), "stop_token_ids: expected a sequence, got bool True"),
    (dict(stop=[1, 2]), r"stop: expected strings, got \(1, 2\)"),
    (dict(stop=None), "stop: expected a sequence, got NoneType None"),
])
def test_stop_criteria_of_the_wrong_type_are_named(kwargs, match):
    """A float stop id was truncated (1.5 stopped at token 1), True meant token 1, int stop strings
    failed in the text search after the prefill, stop=None with "'NoneType' object is not iterable"."""
    with pytest.raises(ValueError, match=match):
        StopCriteria(**kwargs)


@pytest.mark.parametrize("document_end", [4096, -1, 2.0])
def test_a_document_end_outside_the_vocabulary_is_named(document_end):
    """An end-of-document id the model never emits: no document would ever end, silently."""
    with pytest.raises(ValueError, match=rf"document_end: expected a token id in \[0, 4096\) or None, got "
                                         rf"{document_end!r}"):
        Generator(tiny_model("transformer", n_layers=1), batch_size=1, capacity=8, document_end=document_end)


@pytest.mark.parametrize("kwargs, match", [
    (dict(sampling={"temperature": 1.0}), "sampling: expected a SamplingParams, got dict"),
    (dict(decode="tokenizer"), "decode: expected a callable or None, got str"),
    (dict(on_text="print"), "on_text: expected a callable or None, got str"),
])
def test_generate_refuses_arguments_of_the_wrong_type_before_the_prefill(model, monkeypatch, kwargs, match):
    """Each was first used after the prefill (an AttributeError on sampling.greedy, "'str' object is not
    callable")."""
    generator = Generator(model, batch_size=1, capacity=8)
    monkeypatch.setattr(generator.session, "prefill", lambda *a, **k: pytest.fail("prefilled"))
    with pytest.raises(ValueError, match=match):
        generator.generate([[5, 6]], **kwargs)


@pytest.mark.parametrize("logits", [torch.zeros(4), torch.zeros(3, 4), torch.zeros(2, 5),
                                    torch.zeros(2, 4, dtype=torch.int64)])
def test_sampler_refuses_logits_of_another_shape(logits):
    """(3, 4) logits for a sampler of 2 rows failed deep in the penalty, and (4,) with an IndexError."""
    sampler = Sampler(SamplingParams(temperature=1.0, repetition_penalty=1.2, seed=0), 2, 4, torch.device("cpu"))
    with pytest.raises(ValueError, match=rf"Sampler: logits must be a floating tensor of shape \(2, 4\), got "
                                         rf"{logits.dtype} \({', '.join(map(str, logits.shape))},?\)"):
        sampler(logits)


def test_sampler_observe_refuses_ids_outside_the_vocabulary():
    """A negative id marked a token from the end of the vocabulary as seen (penalised it) without a word."""
    sampler = Sampler(SamplingParams(repetition_penalty=1.2), 2, 4, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"Sampler.observe: tokens of row 1 must lie in \[0, 4\), got \[-1\]"):
        sampler.observe(1, [2, -1])
    assert not sampler.seen.any()


@pytest.mark.parametrize("seen", [torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 4)])
def test_token_probabilities_refuses_seen_of_another_shape_or_dtype(seen):
    with pytest.raises(ValueError, match=r"token_probabilities: seen must be bool of the logits' shape \(2, 4\)"):
        token_probabilities(torch.zeros(2, 4), SamplingParams(temperature=1.0, repetition_penalty=1.2), seen)


@pytest.mark.parametrize("prompts, match", [
    ([5, 6, 7], r"prompts\[0\]: expected a sequence of token ids, got int 5"),
    (None, "prompts: expected a sequence of prompts .*, got NoneType"),
    ((p for p in [[5, 6]]), "prompts: expected a sequence of prompts .*, got generator"),
])
def test_generate_names_prompts_that_are_not_lists_of_ids(model, prompts, match):
    """A flat list of ids failed with "object of type 'int' has no len()" while sizing the cache, None
    with "object of type 'NoneType' has no len()"."""
    with pytest.raises(ValueError, match=match):
        generate(model, prompts, stopping=StopCriteria(max_new_tokens=2))
    with pytest.raises(ValueError, match=match):
        Generator(model, batch_size=1, capacity=8).generate(prompts, stopping=StopCriteria(max_new_tokens=2))


def test_generate_names_max_new_tokens_beyond_the_rope_table(model):
    """generate() sizes the cache itself: the default max_new_tokens = 128 after a 3-token prompt on a
    model of 64 positions was refused as "capacity: 131 positions exceed ...", a value never passed."""
    with pytest.raises(ValueError, match=r"max_new_tokens: prompts\[1\] \(3 tokens\) plus max_new_tokens = 128 need "
                                         r"131 positions, more than the model's RoPE table of 64 .*capacity=64"):
        generate(model, [[5], [5, 6, 7]])
    out = generate(model, [[5], [5, 6, 7]], capacity=64)  # the way out the message names
    assert [c.finish_reason for c in out] == ["capacity", "capacity"] and len(out[1].tokens) == 62


@pytest.mark.parametrize("stop_token_ids", [(4096,), (3, -1)])
def test_stop_token_ids_outside_the_vocabulary_are_named(model, monkeypatch, stop_token_ids):
    """An end token the model never emits: the row ran to max_new_tokens without a word (an eos id of
    another tokenizer)."""
    generator = Generator(model, batch_size=1, capacity=8)
    monkeypatch.setattr(generator.session, "prefill", lambda *a, **k: pytest.fail("prefilled"))
    stopping = [StopCriteria(max_new_tokens=2), StopCriteria(max_new_tokens=2, stop_token_ids=stop_token_ids)]
    bad = [t for t in stop_token_ids if not 0 <= t < 4096]
    with pytest.raises(ValueError, match=re.escape(f"stopping[1]: stop_token_ids {bad} are outside the model's "
                                                   "vocabulary of 4096 (expected 0 to 4095)")):
        generator.generate([[5, 6], [7]], stopping=stopping)


@pytest.mark.parametrize("penalty", [1e-39, 1e-300])
def test_a_tiny_repetition_penalty_draws_the_seen_token_not_nan(penalty):
    """A seen positive logit divided by a penalty below ~1e-37 overflowed fp32 to inf, the softmax gave
    NaN and torch.multinomial raised in the middle of generation (a traceback from the script)."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 2.5], [0.5, 0.5, -1.0, 0.0]])
    sampler = Sampler(SamplingParams(temperature=1.0, repetition_penalty=penalty, seed=0), 2, 4, torch.device("cpu"))
    sampler.observe(0, [2, 3])  # 2.5 -> the largest finite logit: token 3 is certain
    sampler.observe(1, [0, 1])  # ties of 0 and 1 at the largest: either, never 2 or 3
    probs = token_probabilities(logits, sampler.params, sampler.seen)
    assert torch.equal(probs, torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.0, 0.0]]))
    assert token_ids(sampler(logits))[0] == 3


def test_session_prefill_names_no_prompts(model):
    """DecodeSession.prefill([]) failed with "max() arg is an empty sequence"."""
    from parallax_titan.generation import DecodeSession

    with pytest.raises(ValueError, match="prompts: expected at least one prompt, got none"):
        DecodeSession(model, batch=2, capacity=8).prefill([])


@pytest.mark.parametrize("rows", [torch.tensor([0, 0]), [0.0, 1.0], [True, False]])
def test_session_prefill_names_rows_that_are_not_distinct_ints(model, rows):
    """A tensor of rows [0, 0] passed the distinctness check (tensors hash by identity): both prompts
    went to row 0 without a word; float rows failed inside index_copy_, bools ran as rows 0 and 1."""
    from parallax_titan.generation import DecodeSession

    session = DecodeSession(model, batch=2, capacity=8)
    with pytest.raises(ValueError, match=r"rows: expected 2 distinct int rows in \[0, 2\), got"):
        session.prefill([[5, 6], [7]], rows=rows)
    assert session.lengths == [0, 0]


def test_session_prefill_takes_rows_as_a_tensor(model):
    from parallax_titan.generation import DecodeSession

    session = DecodeSession(model, batch=2, capacity=8)
    session.prefill([[5, 6], [7]], rows=torch.tensor([1, 0]))
    assert session.lengths == [1, 2]


@pytest.mark.parametrize("row", [-1, 2, 1.0])
def test_sampler_observe_names_a_row_outside_the_batch(row):
    """Row -1 marked the tokens of the last row as seen (penalised them) without a word."""
    sampler = Sampler(SamplingParams(repetition_penalty=1.2), 2, 4, torch.device("cpu"))
    with pytest.raises(ValueError, match=rf"Sampler.observe: row must be an int in \[0, 2\), got {row!r}"):
        sampler.observe(row, [1])
    assert not sampler.seen.any()


def test_on_text_without_decode_is_refused_before_the_prefill(model, monkeypatch):
    """on_text receives decoded text: without decode it would never be called, and a caller streaming
    the completions would see nothing and no error."""
    generator = Generator(model, batch_size=1, capacity=8)
    monkeypatch.setattr(generator.session, "prefill", lambda *a, **k: pytest.fail("prefilled"))
    with pytest.raises(ValueError, match=r"on_text: streaming text needs decode \(token ids -> text\), got decode "
                                         "None"):
        generator.generate([[5, 6]], on_text=lambda index, text: None)
    with pytest.raises(ValueError, match="on_text: streaming text needs decode"):
        generate(model, [[5, 6]], stopping=StopCriteria(max_new_tokens=2), on_text=print)


@pytest.mark.parametrize("flag, value", [("--top-k", "40"), ("--top-p", "0.9")])
def test_script_refuses_sampling_options_that_greedy_decoding_ignores(tmp_path, capsys, flag, value):
    """--top-p 0.9 (or --top-k) without --temperature decodes greedily (temperature 0 is the default),
    which would ignore the option without a word; with a temperature it is taken."""
    missing = str(tmp_path / "no-checkpoint")
    code = script.main(["--config", CONFIG, "--checkpoint", missing, "--device", "cpu", "--prompt", "Hi", flag, value,
                        "--max-new-tokens", "4"])
    assert code == 2 and f"{flag}: {value} has no effect with --temperature 0" in capsys.readouterr().err
    code = script.main(["--config", CONFIG, "--checkpoint", missing, "--device", "cpu", "--prompt", "Hi", flag, value,
                        "--max-new-tokens", "4", "--temperature", "0.7"])
    assert code == 2 and "is not a directory" in capsys.readouterr().err  # taken: the missing folder is next
