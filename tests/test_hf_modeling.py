"""Hugging Face remote code for Parallax exports (eval/hf_modeling): transformers loads the exported
folder with trust_remote_code and computes our logits (fp32, 1e-5), generate() gives the same
tokens with and without its cache, and lm-eval's own hf backend scores like our adapter."""

from __future__ import annotations

import filecmp
import json
import os
from types import SimpleNamespace

import pytest
import torch

import kernels
from eval import hf_modeling
from eval.hf_format import export_hf
from eval.hf_modeling.configuration_parallax import ParallaxQwen3Config
from eval.hf_modeling.modeling_parallax import attention_allowed, parallax_reference
from parallax_titan.hf_adapter import ParallaxStateDictAdapter
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer
from tests._generation_models import recompute_greedy, tiny_model

transformers = pytest.importorskip("transformers")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "lm_eval")
EOS = 7  # end of document for the block-causal tests (any id of the 4096-token vocabulary)
CASES = [
    ("parallax", {}),
    ("parallax", {"gate": "head", "rho_rope": False}),
    ("parallax", {"gate": "token", "enable_weight_tying": False}),
    ("parallax_dagger", {}),
]


def export_and_load(model, folder, **kwargs):
    export_hf(model, str(folder), **kwargs)
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True,
                                                             dtype=torch.float32).eval()


def random_tokens(batch, length, seed=1):
    return torch.randint(8, 4096, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant, changes", CASES)
def test_loaded_model_gives_our_logits(tmp_path, variant, changes):
    ours = tiny_model(variant, seed=0, **changes)
    hf = export_and_load(ours, tmp_path)
    assert type(hf).__name__ == "ParallaxQwen3ForCausalLM"
    tokens = random_tokens(2, 24)
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), rtol=1e-5, atol=1e-5)
    expected = set(ParallaxStateDictAdapter(ours.model_args).to_hf(ours.state_dict()))
    assert set(hf.state_dict()) == expected | {"lm_head.weight"}  # tied: lm_head is the embedding
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == ours.model_args.enable_weight_tying


@pytest.mark.parametrize("variant, changes", CASES[:2])
def test_generate_with_and_without_the_cache(tmp_path, variant, changes):
    ours = tiny_model(variant, seed=0, **changes)
    hf = export_and_load(ours, tmp_path)
    prompt = random_tokens(2, 6)
    kwargs = dict(max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0)
    cached = hf.generate(prompt, use_cache=True, **kwargs)
    assert torch.equal(cached, hf.generate(prompt, use_cache=False, **kwargs))
    assert torch.equal(cached, hf.generate(prompt, cache_implementation="static", **kwargs))
    for row in range(2):
        assert cached[row, 6:].tolist() == recompute_greedy(ours, prompt[row].tolist(), 10)


def test_left_padded_batch_generates_as_single_rows(tmp_path):
    hf = export_and_load(tiny_model("parallax", seed=2), tmp_path)
    prompts = [random_tokens(1, 9, seed=3)[0], random_tokens(1, 4, seed=4)[0]]
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, 9 - len(prompt):], mask[row, 9 - len(prompt):] = prompt, 1
    both = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for row, prompt in enumerate(prompts):
        alone = hf.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert both[row, 9:].tolist() == alone[0, len(prompt):].tolist()


def test_block_causal_documents_as_in_training(tmp_path):
    """attn_mask_type = "block_causal": no attention across the end-of-document token, in the
    forward and in generate with the cache."""
    ours = tiny_model("parallax", seed=0, attn_mask_type="block_causal")
    hf = export_and_load(ours, tmp_path, eos_id=EOS)
    tokens = random_tokens(2, 20)
    tokens[0, 5], tokens[0, 12], tokens[1, 15] = EOS, EOS, EOS
    with torch.no_grad():
        masks = ours.get_attention_masks(tokens, SimpleNamespace(eos_id=EOS))
        expected = ours(tokens, attention_masks=masks)
        torch.testing.assert_close(hf(tokens).logits, expected, rtol=1e-5, atol=1e-5)
        assert (hf(tokens).logits - ours(tokens)).abs().max() > 1e-2  # the documents matter
    prompt = tokens[:, :16]
    kwargs = dict(max_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0,
                  eos_token_id=None)
    assert torch.equal(hf.generate(prompt, use_cache=True, **kwargs), hf.generate(prompt, use_cache=False, **kwargs))


def test_reference_attention_against_the_kernels_reference():
    """fp64: the modeling file's masked reference equals kernels.parallax_attention (causal, GQA),
    and a left-padded row equals the same row unpadded."""
    gen = torch.Generator().manual_seed(0)
    q, r = (torch.randn(2, 9, 4, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, 9, 2, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    expected = kernels.parallax_attention(q, r, k, v, backend="reference")
    heads = lambda x: x.transpose(1, 2)
    allowed = attention_allowed(2, 9, 0, None, None, q.device)
    out = parallax_reference(heads(q), heads(r), heads(k), heads(v), allowed, 16**-0.5)
    torch.testing.assert_close(heads(out), expected, rtol=1e-12, atol=1e-12)
    pad = lambda x: torch.cat([torch.zeros_like(x[:, :3]), x], dim=1)
    mask = torch.cat([torch.zeros(2, 3), torch.ones(2, 9)], dim=1)
    padded = parallax_reference(*(heads(pad(x)) for x in (q, r, k, v)), attention_allowed(2, 12, 0, mask, None, "cpu"),
                                16**-0.5)
    torch.testing.assert_close(heads(padded)[:, 3:], expected, rtol=1e-12, atol=1e-12)


def test_export_writes_the_remote_code(tmp_path):
    export_hf(tiny_model("parallax"), str(tmp_path / "p"))
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["auto_map"] == hf_modeling.AUTO_MAP and config["model_type"] == ParallaxQwen3Config.model_type
    for name in hf_modeling.REMOTE_CODE_FILES:
        assert filecmp.cmp(tmp_path / "p" / name, os.path.join(hf_modeling.FOLDER, name), shallow=False)
    export_hf(tiny_model("transformer"), str(tmp_path / "t"))
    assert "auto_map" not in json.loads((tmp_path / "t" / "config.json").read_text())
    assert not set(hf_modeling.REMOTE_CODE_FILES) & set(os.listdir(tmp_path / "t"))


@pytest.mark.parametrize("key, value, name", [("parallax", {"gate": "all"}, "parallax.gate"),
                                              ("parallax", {"attn_mask_type": "x"}, "parallax.attn_mask_type"),
                                              ("num_key_value_heads", 3, "num_attention_heads")])
def test_config_names_bad_values(key, value, name):
    with pytest.raises(ValueError, match=name):
        ParallaxQwen3Config(**{key: value})


def test_lm_eval_hf_backend_scores_like_our_adapter(tmp_path):
    """The exported folder through lm-eval's own ``hf`` model gives our adapter's numbers on the
    offline fixtures (log-likelihood, multiple choice, rolling perplexity)."""
    pytest.importorskip("accelerate", reason="lm-eval's hf backend imports accelerate")
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the GPU machines' environment)")
    from lm_eval.models.huggingface import HFLM

    from eval.lm_eval import evaluate
    from eval.model import ParallaxLM

    tokenizer = PretrainTokenizer(TINY_TOKENIZER_PATH)
    model = tiny_model("parallax", seed=0)
    export_hf(model, str(tmp_path), tokenizer_dir=TINY_TOKENIZER_PATH, eos_id=tokenizer.eos_id)
    tasks = ["lambada_openai", "piqa", "wikitext"]
    ours = evaluate(ParallaxLM(model, tokenizer, batch_size=4, max_length=32), tasks, data_dir=FIXTURES,
                    bootstrap_iters=0)["results"]
    hf = HFLM(pretrained=str(tmp_path), trust_remote_code=True, dtype="float32", device="cpu", batch_size=4,
              max_length=32)
    theirs = evaluate(hf, tasks, data_dir=FIXTURES, bootstrap_iters=0)["results"]
    metrics = {"lambada_openai": ("perplexity,none", "acc,none"), "piqa": ("acc,none", "acc_norm,none"),
               "wikitext": ("word_perplexity,none", "byte_perplexity,none")}
    for task, names in metrics.items():
        for name in names:
            assert theirs[task][name] == pytest.approx(ours[task][name], rel=1e-5), (task, name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_kernels_on_cuda(tmp_path):
    """With CUDA and Triton the loaded model runs Parallax-Titan's kernels: logits close to ours,
    generate() with the cache equals without it (fp32)."""
    ours = tiny_model("parallax", seed=0, device="cuda", max_seq_len=256)
    export_hf(ours, str(tmp_path))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), trust_remote_code=True,
                                                           dtype=torch.float32).cuda().eval()
    tokens = random_tokens(2, 100).cuda()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), rtol=1e-4, atol=1e-4)
    kwargs = dict(max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(tokens), pad_token_id=0)
    assert torch.equal(hf.generate(tokens, use_cache=True, **kwargs), hf.generate(tokens, use_cache=False, **kwargs))


@pytest.mark.parametrize("kwargs, message", [
    ({"parallax": {"rho_rop": False}}, r"parallax: unknown keys \['rho_rop'\]"),
    ({"parallax": {"rho_rope": "false"}}, r"parallax.rho_rope: expected true or false, got 'false'"),
    ({"parallax": {"attn_mask_type": "block_causal"}}, r"eos_token_id: .*must be one token id; got None"),
    ({"parallax": {"attn_mask_type": "block_causal"}, "eos_token_id": [7, 8]}, r"one token id; got \[7, 8\]"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, r"rope_scaling: rope type 'linear'"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, r"rope_parameters: rope type 'yarn'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
     r"rope_parameters: rope_theta = 10000.0 disagrees with rope_theta = 1000000.0"),
])
def test_config_refuses_what_the_modeling_code_would_not_compute(kwargs, message):
    """These were taken and then ignored (a misspelt parallax key, RoPE scaling: other logits than
    the config says) or misread ("false" is true); a block-causal config without one end-of-document
    id loaded and every forward failed inside torch.where."""
    with pytest.raises(ValueError, match=message):
        ParallaxQwen3Config(**kwargs)


GATED = {"rho_rope": False, "gate": "token", "attn_mask_type": "causal"}
BAD_BLOCKS = {  # id: (a parallax assigned after construction, the error)
    "key_missing": ({"rho_rope": True, "gate": "head"},
                    r"^parallax: missing keys \['attn_mask_type'\] in \{'rho_rope': True, 'gate': 'head'\}; expected "
                    r"every key of \['attn_mask_type', 'gate', 'rho_rope'\]"),
    "key_unknown": ({**GATED, "window": 4}, r"^parallax: unknown keys \['window'\]; expected \['attn_mask_type'"),
    "not_a_dict": (None, r"^parallax: expected a dict with keys \['attn_mask_type', 'gate', 'rho_rope'\], got None"),
    "rho_rope_text": ({**GATED, "rho_rope": "false"}, r"^parallax.rho_rope: expected true or false, got 'false'"),
    "gate_unknown": ({**GATED, "gate": "all"}, r"^parallax.gate: expected one of \('none', 'token', 'head'\), got 'all'"),
    "mask_unknown": ({**GATED, "attn_mask_type": "doc"}, r"^parallax.attn_mask_type: expected one of .*, got 'doc'"),
    "block_causal_without_eos": ({**GATED, "attn_mask_type": "block_causal"},
                                 r"^eos_token_id: parallax.attn_mask_type = 'block_causal' .* one token id; got None"),
}


@pytest.mark.parametrize("block, message", list(BAD_BLOCKS.values()), ids=list(BAD_BLOCKS))
def test_parallax_assigned_after_construction_is_checked(block, message):
    """``config.parallax = {...}`` (and transformers' ``config.update``) was stored unchecked, so a
    model built from the config computed another model than it says (a key left out, "false" read
    as true) or failed in its forward; now refused as at construction, the old block kept."""
    config = ParallaxQwen3Config(parallax={"rho_rope": False, "gate": "token"})
    for assign in (lambda: setattr(config, "parallax", block), lambda: config.update({"parallax": block})):
        with pytest.raises(ValueError, match=message):
            assign()
        assert config.parallax == GATED and config.to_dict()["parallax"] == GATED


def test_parallax_assigned_after_construction_builds_that_model(tmp_path):
    """A config of the defaults given a gated block without RoPE on the probe builds the model of
    that block: the export's weights load into it whole and it gives our model's logits; the config
    keeps its own copy of the block (a change to the assigned dict afterwards is not taken), and
    deepcopy, to_dict/from_dict and save_pretrained/from_pretrained keep the block."""
    import copy

    from eval.hf_modeling.modeling_parallax import ParallaxQwen3ForCausalLM

    ours = tiny_model("parallax", seed=0, gate="token", rho_rope=False)
    hf = export_and_load(ours, tmp_path / "export")
    config = ParallaxQwen3Config.from_dict({**hf.config.to_dict(), "parallax": {"rho_rope": True, "gate": "none",
                                                                               "attn_mask_type": "causal"}})
    block = dict(GATED)
    config.parallax = block
    block["gate"] = "none"
    config.save_pretrained(str(tmp_path / "saved"))
    copies = [config, copy.deepcopy(config), ParallaxQwen3Config.from_dict(config.to_dict()),
              ParallaxQwen3Config.from_pretrained(str(tmp_path / "saved"))]
    tokens = random_tokens(2, 16)
    for built in copies:
        assert built.parallax == GATED
        model = ParallaxQwen3ForCausalLM(built).eval()
        model.load_state_dict(hf.state_dict())  # strict: the token gate's weights are there, no more
        with torch.no_grad():
            torch.testing.assert_close(model(tokens).logits, ours(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key, value, message", [
    ("attn_mask_type", "blockcausal", r"parallax.attn_mask_type: expected one of \('causal', 'block_causal'\), got "
                                      r"'blockcausal'"),
    ("gate", "token", r"config.parallax.gate = 'token', but this model was built with 'none' \(its layers hold it\)"),
    ("rho_rope", False, r"config.parallax.rho_rope = False, but this model was built with True"),
])
def test_parallax_edited_in_place_is_checked_at_the_next_forward(key, value, message):
    """An edit inside the block (``config.parallax[key] = ...``, which no assignment check sees) stops
    the next forward, by name: a misspelt mask type would have run causal, a gate or rho_rope other than
    the built layers' would have been ignored. A valid new mask type takes effect."""
    from eval.hf_modeling.modeling_parallax import ParallaxQwen3ForCausalLM

    config = ParallaxQwen3Config(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, eos_token_id=EOS)
    model = ParallaxQwen3ForCausalLM(config).eval()
    tokens = random_tokens(1, 12)
    tokens[0, 4] = EOS
    with torch.no_grad():
        causal = model(tokens).logits
        config.parallax["attn_mask_type"] = "block_causal"
        documents = model(tokens).logits
        assert torch.equal(documents[:, :5], causal[:, :5]) and not torch.allclose(documents[:, 5:], causal[:, 5:])
        config.parallax["attn_mask_type"] = "causal"
        config.parallax[key] = value
        with pytest.raises(ValueError, match=message):
            model(tokens)


def test_block_causal_export_with_a_list_of_end_tokens_is_refused_at_loading(tmp_path):
    export_hf(tiny_model("parallax", seed=0, attn_mask_type="block_causal"), str(tmp_path), eos_id=EOS)
    config = json.loads((tmp_path / "config.json").read_text())
    config["eos_token_id"] = [EOS, EOS + 1]  # as Qwen's instruct configs list them
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"eos_token_id: parallax.attn_mask_type = 'block_causal' ends a document"):
        transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), trust_remote_code=True)
