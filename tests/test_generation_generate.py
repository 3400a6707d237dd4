"""Generator / generate: greedy tokens equal recomputing the whole sequence per token (fp32, CPU),
batches, end tokens, stop strings, streaming, a full cache, seeds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parallax_titan.generation import Generator, SamplingParams, StopCriteria, generate
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer
from tests._generation_models import recompute_greedy, tiny_model

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [3, 4, 5, 6, 7, 8, 9, 10, 11], [100], [7, 7, 7, 7]]


@pytest.fixture(scope="module")
def tokenizer():
    return PretrainTokenizer(TINY_TOKENIZER_PATH)


@pytest.mark.parametrize("variant", ["transformer", "parallax"])
def test_greedy_tokens_equal_recomputing_per_token(variant):
    """5 ragged prompts in batches of 2 (the last batch has an idle row)."""
    model = tiny_model(variant)
    out = Generator(model, batch_size=2, capacity=24).generate(PROMPTS, stopping=StopCriteria(max_new_tokens=8))
    for prompt, completion in zip(PROMPTS, out):
        assert completion.tokens == recompute_greedy(model, prompt, 8)
        assert completion.finish_reason == "length" and completion.text is None


def test_stop_token_ends_a_row_without_it():
    model = tiny_model("parallax")
    free = generate(model, PROMPTS[:2], stopping=StopCriteria(max_new_tokens=8))
    tokens = free[0].tokens
    first_new = next(i for i in range(1, 8) if tokens[i] not in tokens[:i])
    stop = tokens[first_new]
    out = generate(model, PROMPTS[:2], stopping=StopCriteria(max_new_tokens=8, stop_token_ids=(stop,)))
    assert out[0].tokens == tokens[:first_new] and out[0].finish_reason == "stop_token"
    cut = free[1].tokens.index(stop) if stop in free[1].tokens else 8
    assert out[1].tokens == free[1].tokens[:cut]


def test_stop_strings_cut_the_text_and_stream_it(tokenizer):
    model = tiny_model("parallax")
    prompt = tokenizer.encode("Once upon a time", add_bos=False, add_eos=False)
    free = generate(model, [prompt], stopping=StopCriteria(max_new_tokens=10), decode=tokenizer.decode)[0]
    assert free.text == tokenizer.decode(free.tokens)
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 2]
    pieces = []
    out = generate(model, [prompt], stopping=StopCriteria(max_new_tokens=10, stop=(stop,)), decode=tokenizer.decode,
                   on_text=lambda index, text: pieces.append((index, text)))[0]
    assert out.finish_reason == "stop" and out.text == free.text[: free.text.index(stop)]
    assert "".join(text for _, text in pieces) == out.text and {i for i, _ in pieces} <= {0}
    assert out.tokens == free.tokens[: len(out.tokens)] and tokenizer.decode(out.tokens).startswith(out.text + stop)


def test_per_prompt_stopping():
    model = tiny_model("transformer")
    out = generate(model, PROMPTS[:3], stopping=[StopCriteria(max_new_tokens=n) for n in (1, 5, 3)])
    assert [len(c.tokens) for c in out] == [1, 5, 3]
    assert out[1].tokens == recompute_greedy(model, PROMPTS[1], 5)


def test_full_cache_stops_or_slides():
    """capacity 8: "stop" ends a row when its next token cannot be cached; "slide" continues on
    the last 8 tokens, as recomputing an 8-token window per token does."""
    model = tiny_model("parallax")
    generator = Generator(model, batch_size=2, capacity=8)
    prompts = [PROMPTS[2][:6], PROMPTS[1]]
    stopped = generator.generate(prompts, stopping=StopCriteria(max_new_tokens=10))
    assert [len(c.tokens) for c in stopped] == [3, 7] and {c.finish_reason for c in stopped} == {"capacity"}
    slid = generator.generate(prompts + [PROMPTS[2]], stopping=StopCriteria(max_new_tokens=10), overflow="slide")
    for prompt, completion in zip(prompts + [PROMPTS[2]], slid):
        assert completion.tokens == recompute_greedy(model, prompt, 10, window=8)
    assert stopped[0].tokens == slid[0].tokens[:3]
    with pytest.raises(ValueError, match=r"prompts\[0\]: 9 tokens exceed the capacity of 8"):
        generator.generate([PROMPTS[2]])


def test_block_causal_model_starts_a_new_document_after_the_end_token():
    """A token after ``document_end`` sees only its own document, as the training masks say: the
    greedy tokens equal recomputing with document masks, in a prompt and in generated text."""
    model = tiny_model("parallax", attn_mask_type="block_causal")
    end = 9
    ends = lambda tokens: SimpleNamespace(eos_id=end)
    prompts = [[5, 6, 9, 7, 8], [9], [3, 4, 9]]

    def recompute(prompt, steps):
        tokens = list(prompt)
        for _ in range(steps):
            row = torch.tensor([tokens])
            with torch.no_grad():
                tokens.append(int(model(row, attention_masks=model.get_attention_masks(row, ends(row)))[0, -1].argmax()))
        return tokens[len(prompt):]

    out = Generator(model, batch_size=3, capacity=12, document_end=end).generate(
        prompts, stopping=StopCriteria(max_new_tokens=6))
    assert [c.tokens for c in out] == [recompute(p, 6) for p in prompts]
    with pytest.raises(ValueError, match="document_end"):
        Generator(model, batch_size=1, capacity=8)


def test_seeded_sampling_repeats():
    model = tiny_model("parallax")
    params = SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.1, seed=11)
    run = lambda p: [c.tokens for c in generate(model, PROMPTS, p, StopCriteria(max_new_tokens=6), batch_size=2)]
    assert run(params) == run(params)
    assert run(params) != run(SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.1, seed=12))


def test_bad_requests_are_named():
    generator = Generator(tiny_model("transformer"), batch_size=2, capacity=8)
    with pytest.raises(ValueError, match=r"prompts\[1\]: empty"):
        generator.generate([[1], []])
    with pytest.raises(ValueError, match="stop strings need decode"):
        generator.generate([[1]], stopping=StopCriteria(stop=("x",)))
    with pytest.raises(ValueError, match="overflow"):
        generator.generate([[1]], overflow="wrap")
    with pytest.raises(ValueError, match="stopping: expected one StopCriteria or 2"):
        generator.generate([[1], [2]], stopping=[StopCriteria()])
    with pytest.raises(ValueError, match="max_new_tokens"):
        StopCriteria(max_new_tokens=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", ["transformer", "parallax"])
def test_cuda_graph_generation_equals_eager(variant):
    model = tiny_model(variant, dtype=torch.bfloat16, device="cuda", n_layers=4, max_seq_len=512)
    prompts = [list(range(3, 100)), list(range(9, 40)), [5]]
    stopping = StopCriteria(max_new_tokens=20)
    eager = Generator(model, batch_size=2, capacity=160).generate(prompts, stopping=stopping)
    graphed = Generator(model, batch_size=2, capacity=160, graph=True).generate(prompts, stopping=stopping)
    assert [c.tokens for c in eager] == [c.tokens for c in graphed]
