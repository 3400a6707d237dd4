"""ParallaxLM scores against direct computation from the model (tiny in-process models, CPU, fp32)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance

from eval.model import ParallaxLM
from parallax_titan.generation import SamplingParams
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer

WINDOW = 16
TEXTS = [
    "A short line.",
    "The river ran past the mill and under the stone bridge, where the children of the village "
    "gathered every summer evening to watch the swallows dive for insects above the water.",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen.",
]
PAIRS = [
    ("The cat sat on the", " mat"),
    ("Question: what colour is the sky?\nAnswer:", " blue, mostly"),
    ("", "Hello world"),
    ("The river ran past the mill and under the stone bridge, where the children of the village "
     "gathered every summer", " evening to watch"),  # context longer than the window: left-truncated
]


@pytest.fixture(scope="module")
def tokenizer():
    return PretrainTokenizer(TINY_TOKENIZER_PATH)


def tiny_model(variant: str, **changes) -> ParallaxQwen3Model:
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), n_layers=2, max_seq_len=64, **changes)
    torch.manual_seed(0)
    model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
    return model.eval()


@pytest.fixture(scope="module", params=["transformer", "parallax"])
def model(request):
    return tiny_model(request.param)


def make_lm(model, tokenizer, batch_size=8) -> ParallaxLM:
    return ParallaxLM(model, tokenizer, batch_size=batch_size, max_length=WINDOW)


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def direct_logprobs(model, inputs: list[int], targets: list[int]) -> float:
    """sum_t log p(targets[t] | inputs[:t+1]) for the last len(targets) positions of one forward."""
    with torch.no_grad():
        logits = model(torch.tensor([inputs]))[0, -len(targets):].double()
    return -float(F.cross_entropy(logits, torch.tensor(targets), reduction="sum"))


def test_rolling_equals_summed_cross_entropy(model, tokenizer):
    lm = make_lm(model, tokenizer)
    scores = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in TEXTS]), disable_tqdm=True)
    for text, score in zip(TEXTS, scores):
        tokens = tokenizer.encode(text, add_bos=False, add_eos=False)
        seq = [tokenizer.eos_id] + tokens
        # Targets in chunks of WINDOW; each chunk is predicted from the WINDOW tokens before its end.
        expected = sum(
            direct_logprobs(model, seq[max(0, end - WINDOW):end], seq[start + 1:end + 1])
            for start in range(0, len(tokens), WINDOW)
            for end in [min(start + WINDOW, len(tokens))]
        )
        assert score == pytest.approx(expected, rel=1e-5, abs=1e-4)
    long_tokens = tokenizer.encode(TEXTS[1], add_bos=False, add_eos=False)
    assert len(long_tokens) > 2 * WINDOW  # the long text needs several windows
    full_context = direct_logprobs(model, [tokenizer.eos_id] + long_tokens[:-1], long_tokens)
    assert abs(scores[1] - full_context) > 1e-2  # windows really limit the context


def test_loglikelihood_equals_direct_continuation_scores(model, tokenizer):
    lm = make_lm(model, tokenizer)
    results = lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (context, continuation), (score, _) in zip(PAIRS, results):
        if context:
            ctx = tokenizer.encode(context, add_bos=False, add_eos=False)
            whole = tokenizer.encode(context + continuation, add_bos=False, add_eos=False)
        else:
            ctx = [tokenizer.eos_id]
            whole = ctx + tokenizer.encode(continuation, add_bos=False, add_eos=False)
        cont = whole[len(ctx):]
        inputs = whole[:-1][-WINDOW:]
        assert score == pytest.approx(direct_logprobs(model, inputs, cont), rel=1e-5, abs=1e-4)
    assert len(tokenizer.encode(PAIRS[3][0], add_bos=False, add_eos=False)) > WINDOW


def greedy_tokens(model, context: list[int], steps: int) -> list[int]:
    tokens = list(context)
    for _ in range(steps):
        with torch.no_grad():
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(context):]


def test_is_greedy(model, tokenizer):
    lm = make_lm(model, tokenizer)
    context = tokenizer.encode("The cat sat on the", add_bos=False, add_eos=False)
    greedy = greedy_tokens(model, context, 3)
    other = greedy[:2] + [(greedy[2] + 1) % 4096]
    first_wrong = [(greedy[0] + 7) % 4096] + greedy[1:]
    out = lm._loglikelihood_tokens([(None, context, c) for c in (greedy, other, first_wrong)], disable_tqdm=True)
    assert [g for _, g in out] == [True, False, False]
    assert out[0][0] == pytest.approx(direct_logprobs(model, context + greedy[:2], greedy), rel=1e-5, abs=1e-4)


def test_batching_and_padding_do_not_change_scores(model, tokenizer):
    one, eight = make_lm(model, tokenizer, batch_size=1), make_lm(model, tokenizer, batch_size=8)
    pairs = requests("loglikelihood", PAIRS * 2)
    a, b = one.loglikelihood(pairs, disable_tqdm=True), eight.loglikelihood(pairs, disable_tqdm=True)
    assert [g for _, g in a] == [g for _, g in b]
    torch.testing.assert_close(torch.tensor([s for s, _ in a]), torch.tensor([s for s, _ in b]), rtol=1e-5, atol=1e-4)
    texts = requests("loglikelihood_rolling", [(t,) for t in TEXTS])
    torch.testing.assert_close(
        torch.tensor(one.loglikelihood_rolling(texts, disable_tqdm=True)),
        torch.tensor(eight.loglikelihood_rolling(texts, disable_tqdm=True)), rtol=1e-5, atol=1e-4,
    )


def recompute_generate_until(model, tokenizer, context: str, until: list[str], max_new: int, window: int) -> str:
    """The adapter's generation before the KV cache: the whole (last ``window`` tokens of the)
    sequence through the model per new token, greedy, ending at <|endoftext|>, a stop string
    (searched in the decoded text) or ``max_new`` tokens; the text cut before the first stop."""
    eot = tokenizer.eos_id
    tokens = tokenizer.encode(context, add_bos=False, add_eos=False) or [eot]
    stops = [s for s in until + [tokenizer.decode([eot])] if s]
    generated: list[int] = []
    while len(generated) < max_new:
        row = torch.tensor([(tokens + generated)[-window:]])
        with torch.no_grad():  # block-causal models: the document masks of training
            token = int(model(row, attention_masks=model.get_attention_masks(row, tokenizer))[0, -1].argmax())
        if token == eot:
            break
        generated.append(token)
        if any(s in tokenizer.decode(generated) for s in stops):
            break
    text = tokenizer.decode(generated)
    cuts = [text.index(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text


GENERATE_REQUESTS = [
    ("Once upon a time", {"until": [], "max_gen_toks": 6}),
    ("Another prompt of other length", {"max_gen_toks": 2}),
    ("", {"until": ["\n"], "max_gen_toks": 5}),
    ("The river ran past the mill and under the stone bridge, where the children",  # > WINDOW tokens
     {"until": ["zzz"], "max_gen_toks": 7}),
    ("Question: what colour is the sky?\nAnswer:", {"until": ["\n\n", "."], "max_gen_toks": 12}),
]


@pytest.mark.parametrize("variant, changes", [("transformer", {}), ("parallax", {}),
                                              ("parallax", {"attn_mask_type": "block_causal"})])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_cached_generate_until_equals_recomputing(tokenizer, variant, changes, batch_size):
    """Token for token (fp32, greedy) the recompute path's text, contexts and sequences longer than
    the window included (the window slides); an empty context is <|endoftext|>, after which a
    block-causal model starts a new document."""
    model = tiny_model(variant, **changes)
    lm = make_lm(model, tokenizer, batch_size=batch_size)
    out = lm.generate_until(requests("generate_until", GENERATE_REQUESTS), disable_tqdm=True)
    expected = [recompute_generate_until(model, tokenizer, context, kwargs.get("until", []), kwargs["max_gen_toks"],
                                         WINDOW) for context, kwargs in GENERATE_REQUESTS]
    assert out == expected
    assert len(tokenizer.encode(GENERATE_REQUESTS[3][0], add_bos=False, add_eos=False)) > WINDOW


def test_generate_until_stops_at_strings(tokenizer):
    model = tiny_model("parallax")
    lm = make_lm(model, tokenizer, batch_size=2)
    context = "Once upon a time"
    expected = greedy_tokens(model, tokenizer.encode(context, add_bos=False, add_eos=False), 6)
    assert tokenizer.eos_id not in expected
    text = tokenizer.decode(expected)
    stop = text[len(text) // 2: len(text) // 2 + 2]
    out = lm.generate_until(requests("generate_until", [
        (context, {"until": [], "max_gen_toks": 6}),
        (context, {"until": [stop], "max_gen_toks": 6}),
    ]), disable_tqdm=True)
    assert out[0] == text
    assert out[1] == text[: text.index(stop)]


def test_generate_until_samples_with_a_seed(tokenizer):
    model = tiny_model("parallax")
    sampled = [("Once upon a time", {"do_sample": True, "temperature": 1.5, "top_k": 50, "max_gen_toks": 8})] * 3
    run = lambda seed: ParallaxLM(model, tokenizer, batch_size=2, max_length=WINDOW, seed=seed).generate_until(
        requests("generate_until", sampled), disable_tqdm=True)
    assert run(5) == run(5)
    assert run(5) != run(6)
    greedy = make_lm(model, tokenizer).generate_until(
        requests("generate_until", [("Once upon a time", {"temperature": 0.0, "max_gen_toks": 8})]), disable_tqdm=True)
    assert greedy[0] == tokenizer.decode(greedy_tokens(model, tokenizer.encode("Once upon a time", add_bos=False,
                                                                               add_eos=False), 8))
    with pytest.raises(ValueError, match="unsupported generation arguments \\['num_beams'\\]"):
        make_lm(model, tokenizer).generate_until(requests("generate_until", [("x", {"num_beams": 2})]), disable_tqdm=True)


@pytest.fixture(scope="module")
def settings_lm(tokenizer) -> ParallaxLM:
    """One adapter for the tests that only read gen_kwargs (no generation)."""
    return make_lm(tiny_model("transformer"), tokenizer)


@pytest.mark.parametrize("gen_kwargs", [
    {"do_sample": True, "temperature": 0}, {"do_sample": True, "temperature": 0.0}, {"do_sample": True},
    {"do_sample": False, "temperature": 0.7}, {"do_sample": "false", "temperature": 0.7}, {"temperature": "0"}, {},
])
def test_generate_until_is_greedy_as_lm_eval_reads_gen_kwargs(settings_lm, gen_kwargs):
    """lm-eval's contract (normalize_gen_kwargs): temperature is 0 unless given, and do_sample=False or
    temperature 0 is greedy, not sampling at temperature 1."""
    sampling, _ = settings_lm._request_settings({**gen_kwargs, "max_gen_toks": 4})
    assert sampling == SamplingParams() and sampling.greedy


def test_generate_until_samples_with_the_given_settings(settings_lm):
    lm = settings_lm
    for gen_kwargs in ({"temperature": 0.7, "top_k": "5", "top_p": "0.9"}, {"do_sample": "true", "temperature": "0.7",
                                                                              "top_k": 5.0, "top_p": 0.9}):
        sampling, _ = lm._request_settings(gen_kwargs)
        assert sampling == SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=lm.seed)


@pytest.mark.parametrize("key, value", [
    ("temperature", "hot"), ("top_k", "many"), ("top_k", 2.5), ("top_k", "5.5"), ("top_p", "most"),
    ("top_p", [0.9]), ("temperature", -1.0), ("top_p", 0.0), ("top_k", -3), ("do_sample", "yes"),
])
def test_generate_until_bad_gen_kwargs_are_named(settings_lm, key, value):
    """A value that is not a number (or boolean), or out of range, names the key and the value; also
    when decoding would be greedy (do_sample=False), since the request is wrong either way."""
    lm = settings_lm
    for base in ({"do_sample": True, "temperature": 0.5}, {"do_sample": False}):
        with pytest.raises(ValueError, match=f"gen_kwargs {key}[=:].*{re.escape(str(value))}"):
            lm._request_settings({**base, key: value})


@pytest.mark.parametrize("kwargs, name", [({"batch_size": 0}, "batch_size"), ({"max_length": 65}, "max_length")])
def test_bad_arguments_are_named(tokenizer, kwargs, name):
    with pytest.raises(ValueError, match=name):
        ParallaxLM(tiny_model("transformer"), tokenizer, **kwargs)
