"""The exported Parallax model under every way transformers and lm-eval call it, against our own
model's forward on each row alone and unpadded, in fp64 (1e-10): left and right padding, the
position ids transformers passes (RoPE on q, k and rho), the KV cache (generate, step by step with
each cache format, a static cache, a cache cut back, beam search reordering it), labels, hidden
states, dtypes, and config.json edits that would compute something else, refused. generate's decode
steps read no tensor back to the host.

RoPE is relative, so a wrong absolute position changes the logits only through the fp32 cos/sin
table: about 1e-7, far above the tolerance, so these tests see a position that does not follow the
real tokens."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from eval.hf_format import export_hf
from parallax_titan.generation import StopCriteria, generate
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer
from tests._generation_models import tiny_model

transformers = pytest.importorskip("transformers")
from transformers import LogitsProcessor, LogitsProcessorList  # noqa: E402
from transformers.cache_utils import StaticCache  # noqa: E402

from eval.hf_modeling.modeling_parallax import CACHE_FIELD  # noqa: E402


def returned_cache(out):
    """The cache a forward returned: transformers 5.24 names the output field ``cache``, 5.17
    ``past_key_values`` (the modeling writes the installed version's name)."""
    return getattr(out, CACHE_FIELD)

EOS = 7  # end of document (tokens are drawn from 8..4095, so only where a test puts it)
TOL = dict(rtol=0.0, atol=1e-10)
CASES = [
    ("parallax", {}),
    ("parallax", {"gate": "head", "rho_rope": False}),
    ("parallax", {"gate": "token", "enable_weight_tying": False}),
    ("parallax_dagger", {}),
]
LENGTHS = [9, 5, 12]  # the rows of the padded batches


def to_fp64(model):
    rope = model.rope_cache  # fp32, as the loaders keep it (the HF code computes cos/sin in fp32 too)
    model.to(torch.float64)
    model.rope_cache = rope
    return model


def load(folder, **kwargs):
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, **kwargs).eval()


def fp64_pair(folder, variant="parallax", **changes):
    """(ours, the export loaded by transformers), both fp64: exported in fp32, loaded, then
    ``model.to(torch.float64)``."""
    ours = tiny_model(variant, seed=0, **changes)
    export_hf(ours, str(folder), eos_id=EOS)
    return to_fp64(ours), load(folder, dtype=torch.float32).to(torch.float64)


@torch.no_grad()
def ours_alone(ours, row, positions=None):
    """Our model's logits (T, vocab) of one unpadded row (T,), with training's document masks."""
    tokens = row[None]
    masks = ours.get_attention_masks(tokens, SimpleNamespace(eos_id=EOS))
    return ours(tokens, attention_masks=masks, positions=positions)[0]


def random_rows(lengths=LENGTHS, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(8, 4096, (n,), generator=gen) for n in lengths]


def padded(rows, side, pad=None):
    """(ids, mask, slices): rows padded to the longest on ``side`` with random tokens (``pad``: that
    token), so that a padded key read anywhere changes the result; slices: each row's tokens."""
    width = max(len(r) for r in rows)
    ids = torch.randint(8, 4096, (len(rows), width), generator=torch.Generator().manual_seed(99))
    if pad is not None:
        ids.fill_(pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    slices = []
    for i, row in enumerate(rows):
        cols = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, cols], mask[i, cols] = row, 1
        slices.append(cols)
    return ids, mask, slices


def generate_positions(mask):
    """The position ids transformers' generate builds from a 2-D mask (padding at 0)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


# ------------------------------------------------------------------------------ padding, positions
@pytest.mark.parametrize("variant, changes", CASES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_give_each_row_alone(tmp_path, variant, changes, side):
    """Left padding (generate, lm-eval's generate_until) and right padding (lm-eval's
    loglikelihood batches): each row's logits at its tokens are those of the row alone, with the
    model's own positions and with generate's position_ids."""
    ours, hf = fp64_pair(tmp_path, variant, **changes)
    rows = random_rows()
    ids, mask, slices = padded(rows, side)
    with torch.no_grad():
        for positions in (None, generate_positions(mask)):
            logits = hf(ids, attention_mask=mask, position_ids=positions).logits
            for i, (row, cols) in enumerate(zip(rows, slices)):
                torch.testing.assert_close(logits[i, cols], ours_alone(ours, row), **TOL)


@pytest.mark.parametrize("pad", [EOS, None])
def test_padded_block_causal_rows_give_each_row_alone(tmp_path, pad):
    """Block-causal documents with padding: pads that are the end-of-document token (tokenizers
    often pad with it) or any token, and an end of document inside a row."""
    ours, hf = fp64_pair(tmp_path, attn_mask_type="block_causal")
    rows = random_rows()
    rows[0][4] = rows[2][2] = EOS
    for side in ("left", "right"):
        ids, mask, slices = padded(rows, side, pad)
        with torch.no_grad():
            logits = hf(ids, attention_mask=mask).logits
        for i, (row, cols) in enumerate(zip(rows, slices)):
            torch.testing.assert_close(logits[i, cols], ours_alone(ours, row), **TOL)


@pytest.mark.parametrize("variant, changes", [("parallax", {}), ("parallax", {"gate": "head"})])
def test_position_ids_are_used_for_q_k_and_rho(tmp_path, variant, changes):
    """Given position_ids (here each row shifted by its own offset) are the positions of RoPE on q,
    k and (rho_rope) rho: the logits are our model's with those positions, not with 0..T-1."""
    ours, hf = fp64_pair(tmp_path, variant, **changes)
    rows = random_rows([10, 10])
    positions = torch.arange(10)[None] + torch.tensor([[5], [17]])
    with torch.no_grad():
        logits = hf(torch.stack(rows), position_ids=positions).logits
    for i, row in enumerate(rows):
        expected = ours_alone(ours, row, positions[i : i + 1])
        torch.testing.assert_close(logits[i], expected, **TOL)
        assert (expected - ours_alone(ours, row)).abs().max() > 1e-9  # the positions are seen


def test_packed_position_ids_are_separate_sequences(tmp_path):
    """transformers' reading of position_ids without an attention mask or a cache (padding-free
    fine-tuning): a row of sequences packed one after another, each from position 0, is each
    sequence alone."""
    ours, hf = fp64_pair(tmp_path)
    rows = random_rows([6, 4, 5])
    positions = torch.cat([torch.arange(len(r)) for r in rows])[None]
    with torch.no_grad():
        logits = hf(torch.cat(rows)[None], position_ids=positions, use_cache=False).logits[0]
    start = 0
    for row in rows:
        torch.testing.assert_close(logits[start : start + len(row)], ours_alone(ours, row), **TOL)
        start += len(row)


def test_positions_past_max_position_embeddings_are_refused(tmp_path):
    """Our model's RoPE table holds max_seq_len positions (max_position_embeddings in config.json);
    a longer input is refused, also in generate, rather than computed at positions never trained.
    Padding does not count: a left-padded batch wider than that whose rows fit is computed. So is
    a config.json edited to fewer positions than the input."""
    ours = tiny_model("parallax", seed=0, max_seq_len=16)
    export_hf(ours, str(tmp_path), eos_id=EOS)
    hf = load(tmp_path, dtype=torch.float32)
    tokens = random_rows([17])[0][None]
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens[:, :16]).logits, ours(tokens[:, :16]), rtol=1e-5, atol=1e-5)
        ids, mask, _ = padded([tokens[0, :16], tokens[0, :3]], "left")  # 20 columns, positions 0..15
        ids, mask = torch.cat([ids[:, :4], ids], dim=1), torch.cat([torch.zeros_like(mask[:, :4]), mask], dim=1)
        torch.testing.assert_close(hf(ids, attention_mask=mask).logits[0, 4:], ours(tokens[:, :16])[0],
                                   rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="position 16 is past max_position_embeddings = 16"):
            hf(tokens)
        with pytest.raises(ValueError, match="max_position_embeddings = 16"):
            hf.generate(tokens[:, :12], max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
        edited = load(edited_export(tmp_path, lambda c: c.update(max_position_embeddings=8)), dtype=torch.float32)
        with pytest.raises(ValueError, match="position 8 is past max_position_embeddings = 8"):
            edited(tokens[:, :9])


def test_given_positions_past_max_position_embeddings_are_refused(tmp_path):
    """Given position_ids are checked whatever the token count: in a forward, in a step with the
    cache handed back, and in generate, whose decode steps check them by a bound known on the host
    (the prompt's positions plus one per token): the last position 15 of a limit of 16 is computed,
    16 refused, with generate's own positions and with a caller's that start at 8."""
    ours = tiny_model("parallax", seed=0, max_seq_len=16)
    export_hf(ours, str(tmp_path), eos_id=EOS)
    hf = load(tmp_path, dtype=torch.float32)
    tokens = random_rows([12])[0][None]
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        with pytest.raises(ValueError, match="position 16 is past max_position_embeddings = 16"):
            hf(tokens[:, :4], position_ids=torch.arange(13, 17)[None])
        cache = returned_cache(hf(tokens[:, :8], use_cache=True))
        with pytest.raises(ValueError, match="position 16 is past max_position_embeddings = 16"):
            hf(tokens[:, 8:9], cache=cache, position_ids=torch.tensor([[16]]))
        for prompt, positions in ((tokens, None), (tokens[:, :4], torch.arange(8, 12)[None])):
            last = hf.generate(prompt, position_ids=positions, max_new_tokens=5, **kwargs)  # positions up to 15
            assert last.shape[1] == prompt.shape[1] + 5
            with pytest.raises(ValueError, match="position 16 is past max_position_embeddings = 16"):
                hf.generate(prompt, position_ids=positions, max_new_tokens=6, **kwargs)


HOST_READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


def host_reads_per_call(model, monkeypatch):
    """The count of tensor reads back to the host (``item``, ``int(t)``, ``bool(t)``, ...) in each
    call of ``model``, filled in as it is called."""
    counts, inside = [], [False]

    def counted(read):
        def wrapper(self, *args, **kwargs):
            if inside[0]:
                counts[-1] += 1
            return read(self, *args, **kwargs)
        return wrapper

    def enter(*_):
        counts.append(0)
        inside[0] = True

    def leave(*_):
        inside[0] = False

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave)
    return counts


@pytest.mark.parametrize("changes", [{}, {"attn_mask_type": "block_causal"}], ids=["causal", "block_causal"])
def test_generate_decode_steps_read_nothing_back(tmp_path, monkeypatch, changes):
    """generate of a left-padded batch (an attention mask and position_ids passed to every step)
    reads the prompt's positions back once, to check them against max_position_embeddings, and
    nothing in the decode steps (each one a device sync)."""
    _, hf = fp64_pair(tmp_path, **changes)
    rows = random_rows()
    rows[0][3] = EOS
    ids, mask, _ = padded(rows, "left")
    reads = host_reads_per_call(hf, monkeypatch)
    hf.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert reads == [1, 0, 0, 0, 0]


def test_generate_from_inputs_embeds_as_from_input_ids(tmp_path):
    """transformers' generate takes ``inputs_embeds`` only from a model whose
    prepare_inputs_for_generation names it: the tokens and logits of the ids' embeddings are the ids'."""
    _, hf = fp64_pair(tmp_path)
    ids, mask, _ = padded(random_rows(), "left")
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None,
                  return_dict_in_generate=True, output_logits=True)
    from_ids = hf.generate(ids, **kwargs)
    from_embeds = hf.generate(inputs_embeds=hf.get_input_embeddings()(ids), **kwargs)
    assert torch.equal(from_embeds.sequences, from_ids.sequences[:, ids.shape[1]:])
    torch.testing.assert_close(torch.stack(from_embeds.logits), torch.stack(from_ids.logits), rtol=0.0, atol=0.0)


# ------------------------------------------------------------------------------ the KV cache
@pytest.mark.parametrize("variant, changes", CASES + [("parallax", {"attn_mask_type": "block_causal"})])
def test_generate_left_padded_batch_with_and_without_the_cache(tmp_path, variant, changes):
    """Greedy generate of a left-padded batch with the dynamic cache, without a cache and with the
    static cache: every step's logits are those of the row alone (prompt and tokens so far; fp32, as
    generate returns them), and the tokens those of our own generation
    (parallax_titan.generation.generate) of each prompt."""
    ours, hf = fp64_pair(tmp_path, variant, **changes)
    rows = random_rows()
    block_causal = changes.get("attn_mask_type") == "block_causal"
    if block_causal:
        rows[0][3] = rows[2][8] = EOS
    ids, mask, _ = padded(rows, "left")
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None,
                  return_dict_in_generate=True, output_logits=True)
    runs = [hf.generate(ids, use_cache=True, **kwargs), hf.generate(ids, use_cache=False, **kwargs),
            hf.generate(ids, cache_implementation="static", **kwargs)]
    width = ids.shape[1]
    for run in runs:
        assert torch.equal(run.sequences, runs[0].sequences)
        for i, row in enumerate(rows):
            whole = ours_alone(ours, torch.cat([row, run.sequences[i, width:]]))
            steps = torch.stack([step[i] for step in run.logits])  # generate hands them out in fp32
            torch.testing.assert_close(steps, whole[len(row) - 1 : -1].float(), rtol=0.0, atol=4e-6)
    expected = generate(ours, [r.tolist() for r in rows], stopping=StopCriteria(max_new_tokens=6),
                        document_end=EOS if block_causal else None)
    assert [row[width:].tolist() for row in runs[0].sequences] == [c.tokens for c in expected]


def _legacy(cache):
    return tuple((layer.keys, layer.values) for layer in cache.layers)


@pytest.mark.parametrize("form", ["past_key_values", "cache", "legacy", "static"])
@pytest.mark.parametrize("variant, changes", [("parallax", {}), ("parallax", {"gate": "token", "rho_rope": False})])
def test_cache_passed_back_step_by_step(tmp_path, form, variant, changes):
    """A left-padded prefill, then one token per call with the cache handed back (as
    ``past_key_values``, ``cache``, transformers' legacy tuple of (key, value) per layer, or a
    ``StaticCache``) and the mask grown by one: every step's logits are those of the row alone."""
    ours, hf = fp64_pair(tmp_path, variant, **changes)
    rows = random_rows()
    ids, mask, _ = padded(rows, "left")
    steps = random_rows([4, 4, 4], seed=5)
    cache = StaticCache(config=hf.config, max_cache_len=20) if form == "static" else None
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, use_cache=True, **({"cache": cache} if cache is not None else {}))
        cache = returned_cache(out)
        for step in range(4):
            token = torch.stack([s[step] for s in steps])[:, None]
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            passed = _legacy(cache) if form == "legacy" else cache
            name = "cache" if form in ("cache", "static") else "past_key_values"
            out = hf(token, attention_mask=mask, use_cache=True, **{name: passed})
            cache = returned_cache(out)
            for i, row in enumerate(rows):
                whole = torch.cat([row, torch.stack([s[: step + 1] for s in steps])[i]])
                torch.testing.assert_close(out.logits[i, -1], ours_alone(ours, whole)[-1], **TOL)


class EosOnFirstBeam(LogitsProcessor):
    """At sequence length ``length``, the end of document gets the best score of the first beam's
    row only: beams with and without a generated end of document run on side by side."""

    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.length:
            scores = scores.clone()
            scores[0, EOS] = scores[0].max()
        return scores


@pytest.mark.parametrize("cache", [None, "static"], ids=["dynamic", "static"])
def test_beam_search_documents_follow_the_beams(tmp_path, cache):
    """Beam search reorders the cache's rows after each step (the cache's reorder_cache); the
    block-causal document starts kept per row follow them: each returned beam's logits at every
    step are those of its own sequence recomputed whole by our model (fp64), and the beams are
    those of beam search without a cache. Some beams generate an end of document and go on."""
    ours, hf = fp64_pair(tmp_path, attn_mask_type="block_causal")
    prompt = random_rows([6], seed=5)[0][None]
    kwargs = dict(num_beams=3, num_return_sequences=3, max_new_tokens=8, do_sample=False, pad_token_id=0,
                  eos_token_id=None, logits_processor=LogitsProcessorList([EosOnFirstBeam(8)]),
                  return_dict_in_generate=True, output_logits=True)
    run = hf.generate(prompt, cache_implementation=cache, **kwargs)
    generated = run.sequences[:, 6:]
    assert any(EOS in row[:-1].tolist() and row[-1] != EOS for row in generated)  # documents after a generated one
    assert torch.equal(run.sequences, hf.generate(prompt, use_cache=False, **kwargs).sequences)
    for sequence, beams in zip(run.sequences, run.beam_indices):
        steps = torch.stack([step[beam] for step, beam in zip(run.logits, beams)])  # generate's are fp32
        torch.testing.assert_close(steps, ours_alone(ours, sequence)[5:-1].float(), rtol=0.0, atol=4e-6)


def test_block_causal_cache_cut_back_reads_its_documents(tmp_path):
    """Assisted generation cuts the cache back (``crop``) after rejected candidates: an end of
    document among them must not end the document of the next token."""
    ours, hf = fp64_pair(tmp_path, attn_mask_type="block_causal")
    prompt = random_rows([8])[0]
    prompt[2] = EOS
    nxt = torch.tensor([[55]])
    with torch.no_grad():
        cache = returned_cache(hf(prompt[None], use_cache=True))
        hf(torch.tensor([[EOS, 100]]), cache=cache, use_cache=True)  # the candidates, then rejected
        cache.crop(-2)
        logits = hf(nxt, cache=cache, use_cache=True).logits[0, -1]
    torch.testing.assert_close(logits, ours_alone(ours, torch.cat([prompt, nxt[0]]))[-1], **TOL)


@pytest.mark.parametrize("operation, args, rows", [
    ("reorder_cache", (torch.tensor([1, 0]),), [1, 0]),  # beam search's, or a caller's
    ("batch_repeat_interleave", (2,), [0, 0, 1, 1]),  # contrastive search's
    ("batch_select_indices", (torch.tensor([1]),), [1]),
    ("batch_select_indices", ([1, 1, 0],), [1, 1, 0]),  # a list, as the cache's layers take it
], ids=["reorder", "repeat", "select", "select_list"])
def test_block_causal_cache_rows_changed_by_the_cache_keep_their_documents(tmp_path, operation, args, rows):
    """The cache's own row operations, whoever calls them, move the block-causal document starts
    with the rows: the next token of each row reads the documents of its own sequence. A deep copy
    of the cache changed so leaves the original's starts alone."""
    import copy

    ours, hf = fp64_pair(tmp_path, attn_mask_type="block_causal")
    prompts = torch.stack(random_rows([8, 8]))
    prompts[0, 2], prompts[1, 5] = EOS, EOS  # documents end at different places in the two rows
    nxt = torch.tensor([[55], [56], [57], [58]])[: len(rows)]  # one next token per row after the change
    with torch.no_grad():
        cache = returned_cache(hf(prompts, use_cache=True))
        before = cache.parallax_document_starts.clone()
        changed = copy.deepcopy(cache)
        getattr(changed, operation)(*args)
        assert torch.equal(cache.parallax_document_starts, before)
        logits = hf(nxt, cache=changed, use_cache=True).logits[:, -1]
    for i, row in enumerate(rows):
        whole = torch.cat([prompts[row], nxt[i]])
        torch.testing.assert_close(logits[i], ours_alone(ours, whole)[-1], **TOL)


def test_block_causal_cache_rows_changed_otherwise_are_refused(tmp_path):
    """Rows repeated past the cache's bound operations (the class's method called directly) leave
    the starts of the old rows: refused by the row count, naming the operations the starts follow."""
    _, hf = fp64_pair(tmp_path, attn_mask_type="block_causal")
    prompt = random_rows([8])[0]
    prompt[2] = EOS
    with torch.no_grad():
        cache = returned_cache(hf(prompt[None], use_cache=True))
        type(cache).batch_repeat_interleave(cache, 2)
        with pytest.raises(ValueError, match=r"document starts are kept for 1 rows, the input has 2: the cache's rows "
                                             r"were changed other than by its own \['batch_repeat_interleave'"):
            hf(torch.tensor([[55], [56]]), cache=cache, use_cache=True)


# ------------------------------------------------------------------------------ outputs, loss, dtypes
def test_labels_give_our_shifted_cross_entropy(tmp_path):
    """labels (right-padded with -100): the loss is the cross-entropy of each position's logits
    against the next token over the labelled ones; num_items_in_batch (transformers' Trainer)
    divides the sum instead; shift_labels are the shifted labels as they are."""
    ours, hf = fp64_pair(tmp_path)
    rows = random_rows()
    ids, mask, _ = padded(rows, "right")
    labels = ids.masked_fill(mask == 0, -100)
    losses = [F.cross_entropy(ours_alone(ours, row)[:-1], row[1:], reduction="sum") for row in rows]
    count = sum(len(r) - 1 for r in rows)
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, labels=labels)
        torch.testing.assert_close(out.loss, sum(losses) / count, **TOL)
        summed = hf(ids, attention_mask=mask, labels=labels, num_items_in_batch=torch.tensor(50))
        torch.testing.assert_close(summed.loss, sum(losses) / 50, **TOL)
        shifted = F.pad(labels[:, 1:], (0, 1), value=-100)
        torch.testing.assert_close(hf(ids, attention_mask=mask, shift_labels=shifted).loss, out.loss, **TOL)


def test_hidden_states_and_tuples(tmp_path):
    """output_hidden_states: the embeddings, each block's output, the last after the final norm
    (ours, read with hooks); return_dict=False (argument or config): the output's tuple;
    output_attentions: refused (no attention weights give Parallax's output)."""
    ours, hf = fp64_pair(tmp_path)
    tokens = torch.stack(random_rows([10, 10]))
    blocks = []
    hooks = [b.register_forward_hook(lambda m, i, o: blocks.append(o)) for b in ours.layers.values()]
    with torch.no_grad():
        expected = ours(tokens)
        out = hf(tokens, output_hidden_states=True)
    for h in hooks:
        h.remove()
    states = out.hidden_states
    assert len(states) == len(blocks) + 1
    torch.testing.assert_close(states[0], ours.tok_embeddings(tokens), **TOL)
    for state, block in zip(states[1:-1], blocks[:-1]):
        torch.testing.assert_close(state, block, **TOL)
    torch.testing.assert_close(states[-1], ours.norm(blocks[-1]), **TOL)
    torch.testing.assert_close(out.logits, expected, **TOL)
    with torch.no_grad():
        as_tuple = hf(tokens, labels=tokens, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[1], out.logits)
        hf.config.return_dict = False
        assert isinstance(hf(tokens), tuple)
        hf.config.return_dict = True
        with pytest.raises(ValueError, match="output_attentions"):
            hf(tokens, output_attentions=True)
    generated = hf.generate(tokens, max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None,
                            output_hidden_states=True, return_dict_in_generate=True)
    assert len(generated.hidden_states) == 2 and len(generated.hidden_states[0]) == len(blocks) + 1


def test_dtypes(tmp_path):
    """dtype=bfloat16 gives our bf16 model's logits (to bf16 rounding: the attention's sums run in
    another order); a bf16 export loads as bf16 with dtype="auto"; dtype=float64 loads the fp32
    export as fp64 (our fp64 logits)."""
    ours = tiny_model("parallax", seed=0)
    export_hf(ours, str(tmp_path / "fp32"), eos_id=EOS)
    export_hf(ours, str(tmp_path / "bf16"), eos_id=EOS, dtype=torch.bfloat16)
    tokens = torch.stack(random_rows([12, 12]))
    bf16 = load(tmp_path / "fp32", dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and load(tmp_path / "bf16", dtype="auto").dtype == torch.bfloat16
    with torch.no_grad():
        logits = bf16(tokens).logits
        assert logits.dtype == torch.bfloat16
        expected = tiny_model("parallax", seed=0, dtype=torch.bfloat16)(tokens)  # within a bf16 step of 8
        torch.testing.assert_close(logits, expected, rtol=1.6e-2, atol=1e-2)
        fp64 = load(tmp_path / "fp32", dtype=torch.float64)
        torch.testing.assert_close(fp64(tokens).logits, to_fp64(ours)(tokens), **TOL)


# ------------------------------------------------------------------------------ lm-eval
def test_lm_eval_batched_generate_until_as_our_adapter(tmp_path):
    """lm-eval's hf backend: batched generate_until (left padding, prompts of several lengths)
    gives our adapter's texts."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the GPU machines' environment)")
    pytest.importorskip("accelerate", reason="lm-eval's hf backend imports accelerate")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from eval.model import ParallaxLM

    tokenizer = PretrainTokenizer(TINY_TOKENIZER_PATH)
    model = tiny_model("parallax", seed=0)  # its greedy texts are not one token repeated
    export_hf(model, str(tmp_path), tokenizer_dir=TINY_TOKENIZER_PATH, eos_id=tokenizer.eos_id)
    prompts = [("Once upon a time", {"until": ["zzz"], "max_gen_toks": 6}),
               ("The river ran past the mill and", {"until": ["zzz"], "max_gen_toks": 6}),
               ("A", {"until": ["zzz"], "max_gen_toks": 6})]
    requests = [Instance(request_type="generate_until", doc={}, arguments=a, idx=i) for i, a in enumerate(prompts)]
    ours = ParallaxLM(model, tokenizer, batch_size=3, max_length=64).generate_until(requests, disable_tqdm=True)
    hf = HFLM(pretrained=str(tmp_path), trust_remote_code=True, dtype="float32", device="cpu", batch_size=3,
              max_length=64)
    assert hf.generate_until(requests, disable_tqdm=True) == ours


# ------------------------------------------------------------------------------ config.json edits
def edited_export(tmp_path, edit, **changes):
    folder = tmp_path / "export"
    export_hf(tiny_model("parallax", seed=0, **changes), str(folder), eos_id=EOS)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


CONFIG_EDITS = {  # id: (edit of config.json, the exported model's changes, the error)
    "sliding_window": (lambda c: c.update(sliding_window=4), {}, r"sliding_window: 4; Parallax-Qwen3 attends to the "),
    "use_sliding_window": (lambda c: c.update(use_sliding_window=True), {}, r"use_sliding_window: True"),
    "layer_types": (lambda c: c.update(layer_types=["full_attention", "sliding_attention"]), {}, r"layer_types: \["),
    "attention_chunk_size": (lambda c: c.update(attention_chunk_size=4), {}, r"attention_chunk_size: 4"),
    "rope_scaling": (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), {},
                     r"rope_scaling: rope type 'yarn'"),
    "parallax_key": (lambda c: c["parallax"].update(window=4), {}, r"parallax: unknown keys \['window'\]"),
    "gate_dropped": (lambda c: c["parallax"].update(gate="none"), {"gate": "token"},
                     r"unexpected weights \['model.layers.0.self_attn.r_gate"),
    "parallax_block_dropped": (lambda c: c.pop("parallax"), {"gate": "token"}, r"config.json: missing parallax;"),
    "parallax_block_null": (lambda c: c.update(parallax=None), {}, r"config.json: missing parallax;"),
    "parallax_block_list": (lambda c: c.update(parallax=["rho_rope"]), {}, r"parallax: expected a dict"),
    # the defaults (rho_rope true, gate none, causal) would load these and compute another model
    "rho_rope_key_dropped": (lambda c: c["parallax"].pop("rho_rope"), {"rho_rope": False},
                             r"config.json: missing parallax.rho_rope;"),
    "gate_key_dropped": (lambda c: c["parallax"].pop("gate"), {}, r"config.json: missing parallax.gate;"),
    "attn_mask_type_key_dropped": (lambda c: c["parallax"].pop("attn_mask_type"), {"attn_mask_type": "block_causal"},
                                   r"config.json: missing parallax.attn_mask_type;"),
    "gate_added": (lambda c: c["parallax"].update(gate="token"), {},
                   r"missing weights \['model.layers.0.self_attn.r_gate"),
    "fewer_layers": (lambda c: c.update(num_hidden_layers=1), {}, r"unexpected weights \['model.layers.1"),
    "more_layers": (lambda c: c.update(num_hidden_layers=3), {}, r"missing weights \['model.layers.2"),
    "untied": (lambda c: c.update(tie_word_embeddings=False), {}, r"missing weights \['lm_head.weight'\]"),
    "kv_heads": (lambda c: c.update(num_key_value_heads=3), {}, r"num_attention_heads: 8 is not a multiple"),
    # a field left out took Qwen3's default (rope_theta 1e6, rms_norm_eps 1e-6): it loaded and computed another model
    "rope_theta_dropped": (lambda c: c.pop("rope_theta"), {"rope_theta": 1e4}, r"config.json: missing rope_theta;"),
    "rms_norm_eps_dropped": (lambda c: c.pop("rms_norm_eps"), {"norm_eps": 1e-5},
                             r"config.json: missing rms_norm_eps;"),
    "max_positions_dropped": (lambda c: c.pop("max_position_embeddings"), {},
                              r"config.json: missing max_position_embeddings;"),
    # null eps took torch's own epsilon; text values failed deep in torch, or ("false") were truthy
    "rms_norm_eps_null": (lambda c: c.update(rms_norm_eps=None), {}, r"rms_norm_eps: expected a positive number, got None"),
    "heads_as_text": (lambda c: c.update(num_attention_heads="8"), {},
                      r"num_attention_heads: expected a positive integer, got '8'"),
    "rope_theta_as_text": (lambda c: c.update(rope_theta="1e6"), {}, r"rope_theta: expected a positive number, got '1e6'"),
    "tied_as_text": (lambda c: c.update(tie_word_embeddings="false"), {},
                     r"tie_word_embeddings: expected true or false, got 'false'"),
    "attention_dropout": (lambda c: c.update(attention_dropout=0.1), {}, r"attention_dropout: 0.1; Parallax-Qwen3 "
                                                                         r"computes no attention dropout"),
}


@pytest.mark.parametrize("edit, changes, message", list(CONFIG_EDITS.values()), ids=list(CONFIG_EDITS))
def test_config_edits_are_refused_at_loading(tmp_path, edit, changes, message):
    """config.json edits that would load and compute something else: a window or chunks (generate's
    cache would keep only the last keys), RoPE scaling, an unknown parallax key, a parallax key or
    block left out (its default taken), a gate, layer count or tying the weights do not have
    (transformers would initialise or drop weights with a warning)."""
    with pytest.raises(ValueError, match=message):
        load(edited_export(tmp_path, edit, **changes), dtype=torch.float32)


def test_parallax_defaults_are_for_configs_built_in_code(tmp_path):
    """ParallaxQwen3Config built in code takes the defaults for the parallax keys it leaves out (a new
    model), and save_pretrained writes them all, so that it loads again; a config read from a file
    (from_pretrained, from_json_file, from_dict) must give them all. A parallax keyword of
    from_pretrained replaces the block, checked as the block is."""
    config_class = type(load(edited_export(tmp_path, lambda c: None, rho_rope=False), dtype=torch.float32).config)
    assert config_class().parallax == {"rho_rope": True, "gate": "none", "attn_mask_type": "causal"}
    assert config_class(parallax={"gate": "head"}).parallax == {"rho_rope": True, "gate": "head",
                                                                "attn_mask_type": "causal"}
    config_class(parallax={"gate": "head"}).save_pretrained(str(tmp_path / "new"))
    assert config_class.from_pretrained(str(tmp_path / "new")).parallax["gate"] == "head"
    folder = tmp_path / "export"
    config = json.loads((folder / "config.json").read_text())
    full = dict(config["parallax"])
    del config["parallax"]["rho_rope"]
    (folder / "partial.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: missing parallax.rho_rope;"):
        config_class.from_json_file(str(folder / "partial.json"))
    with pytest.raises(ValueError, match=r"config.json: missing parallax.rho_rope;"):
        config_class.from_dict(config)
    with pytest.raises(ValueError, match=r"missing parallax.attn_mask_type, parallax.gate;"):
        load(folder, dtype=torch.float32, parallax={"rho_rope": True})
    with pytest.raises(ValueError, match=r"parallax: unknown keys \['window'\]"):
        load(folder, dtype=torch.float32, parallax={**full, "window": 4})
    assert load(folder, dtype=torch.float32, parallax={**full, "rho_rope": True}).config.parallax["rho_rope"] is True


@pytest.mark.parametrize("key, value, message", [
    ("rope_theta", "1e4", r"rope_theta: expected a positive number, got '1e4'"),
    ("num_attention_heads", 4.0, r"num_attention_heads: expected a positive integer, got 4.0"),
    ("tie_word_embeddings", "false", r"tie_word_embeddings: expected true or false, got 'false'"),
])
def test_field_keywords_of_from_pretrained_are_checked(tmp_path, key, value, message):
    """from_pretrained's keywords are set on the config after __init__ (transformers' from_dict): a
    rope_theta given as text there passed the check config.json's values get, and failed in torch."""
    folder = edited_export(tmp_path, lambda c: None)
    config_class = type(load(folder, dtype=torch.float32).config)
    with pytest.raises(ValueError, match=message):
        config_class.from_pretrained(str(folder), **{key: value})
    assert config_class.from_pretrained(str(folder), rope_theta=1e4).rope_theta == 1e4


def test_a_config_without_token_ids_runs(tmp_path):
    """transformers 5's base config defines no eos_token_id: a config built in code without one, or a
    causal export's config.json without it, failed at the first forward (AttributeError)."""
    hf = load(edited_export(tmp_path, lambda c: c.pop("eos_token_id")), dtype=torch.float64)
    assert hf.config.eos_token_id is None
    ours = to_fp64(tiny_model("parallax", seed=0))
    tokens = torch.stack(random_rows([10, 10]))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), **TOL)
    config = type(hf.config)(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    with torch.no_grad():
        assert type(hf)(config)(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 64)


@pytest.mark.parametrize("edit", [lambda c: c.update(num_attention_heads=16),
                                  lambda c: c.update(num_key_value_heads=8),
                                  lambda c: c.update(head_dim=16, num_attention_heads=16, num_key_value_heads=8)],
                         ids=["heads", "kv_heads", "head_dim"])
def test_head_count_edits_are_refused_at_loading(tmp_path, edit):
    """Other head counts give other weight shapes: refused by transformers, and with
    ignore_mismatched_sizes (the mismatched weights then initialised at random) by the model."""
    folder = edited_export(tmp_path, edit)
    with pytest.raises((RuntimeError, ValueError), match="mismatched|another shape"):
        load(folder, dtype=torch.float32)
    with pytest.raises(ValueError, match="weights of another shape"):
        load(folder, dtype=torch.float32, ignore_mismatched_sizes=True)


def test_saved_again_loads_the_same_model(tmp_path):
    """save_pretrained of a loaded export (config, weights, modeling code) loads to the same logits."""
    ours, hf = fp64_pair(tmp_path / "a", gate="token")
    hf.save_pretrained(str(tmp_path / "b"))
    again = load(tmp_path / "b", dtype=torch.float64)
    tokens = torch.stack(random_rows([10, 10]))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, ours(tokens), **TOL)
