"""The ``pretokenized`` dataset: windows against the raw shards, the permutation and the mixture
against brute force, the same sequences per step on any number of ranks, resume across rank counts,
document starts against the end-of-document tokens, and every error before training."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
import torch

from parallax_titan.config import ConfigError, JobConfig, load_config
from parallax_titan.config.sections import DataSource
from parallax_titan.data import build_dataloader, build_validation_dataloader, document_boundaries_from_starts
from parallax_titan.data import pretokenize as pt
from parallax_titan.data.mixture import Mixture, permutation
from parallax_titan.model import document_boundaries
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH

SEQ = 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two pre-tokenized datasets of the embedded corpus (different documents), 5 shards and 1."""
    base = tmp_path_factory.mktemp("shards")
    out = {}
    for name, docs_per_shard, path in (("a", 40, "a.jsonl"), ("b", 0, "b.jsonl")):
        from tests.test_pretokenize import corpus_docs, write_jsonl

        texts = corpus_docs(260)[:200] if name == "a" else corpus_docs(260)[200:]
        spec = pt.SourceSpec("local", write_jsonl(base / path, texts))
        opts = pt.Options(validation_fraction=0.1, docs_per_shard=docs_per_shard)
        pt.pretokenize(spec, str(base / name), TINY_TOKENIZER_PATH, opts, progress=False)
        out[name] = str(base / name)
    return out


def job(path=None, sources=(), batch=4, global_batch=-1, mask="causal", dump="/nonexistent/dump"):
    j = JobConfig()
    j.model.hf_assets_path = TINY_TOKENIZER_PATH
    j.training.dataset, j.training.dataset_path = "pretokenized", path
    j.training.sources = [DataSource(**s) for s in sources]
    j.training.seq_len, j.training.local_batch_size, j.training.global_batch_size = SEQ, batch, global_batch
    j.validation.dataset, j.validation.dataset_path = "pretokenized", path
    j.validation.seq_len, j.validation.local_batch_size = SEQ, batch
    j.parallax.attn_mask_type = mask
    j.job.dump_folder = dump
    return j


def stream(root, split="train"):
    manifest = json.load(open(os.path.join(root, "manifest.json")))
    return np.concatenate([np.fromfile(os.path.join(root, split, s["unit"] + ".bin"), "<u4")
                           for s in manifest["splits"][split]["shards"]])


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_permutation_is_a_seeded_permutation():
    p = permutation(1000, 0, 0, 0)
    assert sorted(p.tolist()) == list(range(1000))
    assert np.array_equal(p, permutation(1000, 0, 0, 0))
    others = [permutation(1000, 1, 0, 0), permutation(1000, 0, 1, 0), permutation(1000, 0, 0, 1)]
    assert all((q != p).mean() > 0.9 for q in others)


@pytest.mark.parametrize("weights", [[1.0], [0.7, 0.3], [1, 2, 3], [0.5, 0.25, 0.125, 0.125]])
def test_mixture_against_brute_force(weights):
    mix = Mixture.from_weights(weights, period=40)
    share = np.asarray(weights) / sum(weights)
    quantised = mix.counts / mix.period
    counts = np.zeros(len(weights), np.int64)
    for g in range(3 * mix.period + 7):
        assert np.array_equal(mix.taken(g), counts)
        s, k = mix.locate(g)
        assert k == counts[s]  # draws of a source come in order, none skipped or repeated
        counts[s] += 1
        assert np.abs(counts - quantised * (g + 1)).max() <= 1  # interleaved, not in runs
    assert np.abs(mix.counts / mix.period - share).max() <= 1 / mix.period


def test_mixture_refuses_bad_weights():
    with pytest.raises(ValueError, match="weights must be > 0"):
        Mixture.from_weights([1.0, 0.0])
    with pytest.raises(ValueError, match="below the mixing resolution"):
        Mixture.from_weights([1.0, 1e-9], period=100)


def test_batches_are_windows_of_the_raw_stream(data):
    loader = build_dataloader(1, 0, None, job(data["a"]))
    tokens = stream(data["a"])
    for k, (inputs, labels) in enumerate(take(loader, 3)):
        assert inputs["input"].shape == labels.shape == (4, SEQ) and inputs["input"].dtype == torch.long
        for row, g in enumerate(loader.batch_positions(k)):
            _, i = loader.sequence_id(g)
            window = torch.from_numpy(tokens[i * SEQ:i * SEQ + SEQ + 1].astype(np.int64))
            assert torch.equal(inputs["input"][row], window[:-1]) and torch.equal(labels[row], window[1:])
    assert "document_starts" not in inputs


def ids_per_step(world, batch, steps, global_batch, jobs_kwargs, state=None):
    """(source, sequence) ids each step trains on, over ranks and microbatches; the loaders' states."""
    loaders = [build_dataloader(world, r, None, job(**jobs_kwargs, batch=batch, global_batch=global_batch))
               for r in range(world)]
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    iters = [iter(loader) for loader in loaders]
    accumulation = global_batch // (batch * world)
    steps_ids, steps_tokens = [], []
    for _ in range(steps):
        ids, tokens = [], []
        for _ in range(accumulation):
            for loader, it in zip(loaders, iters):
                k = loader._batch
                x, _ = next(it)
                ids += [loader.sequence_id(g) for g in loader.batch_positions(k)]
                tokens.append(x["input"])
        steps_ids.append(ids)
        steps_tokens.append(torch.cat(tokens))
    return steps_ids, steps_tokens, [loader.state_dict() for loader in loaders]


def test_same_sequences_per_step_on_any_number_of_ranks(data):
    mix = {"sources": [{"path": data["a"], "weight": 3.0}, {"path": data["b"], "weight": 1.0}]}
    one_ids, one_tokens, _ = ids_per_step(1, 8, 5, 8, mix)
    for world, batch in ((2, 4), (4, 2), (1, 2)):
        ids, tokens, states = ids_per_step(world, batch, 5, 8, mix)
        assert [sorted(s) for s in ids] == [sorted(s) for s in one_ids]
        assert ids == one_ids and all(torch.equal(a, b) for a, b in zip(tokens, one_tokens))
        assert all(s == states[0] for s in states) and states[0]["position"] == 5 * 8
    sources = [s for step in one_ids for s, _ in step]
    assert sources.count(0) == 30 and sources.count(1) == 10


def test_resume_on_another_number_of_ranks(data):
    kwargs = {"path": data["a"]}
    straight, _, _ = ids_per_step(1, 4, 6, 4, kwargs)
    _, _, states = ids_per_step(2, 2, 2, 4, kwargs)  # 2 ranks stop after step 2
    resumed, _, _ = ids_per_step(1, 4, 4, 4, kwargs, state=states[0])  # 1 rank continues
    assert resumed == straight[2:]
    _, _, states = ids_per_step(1, 4, 3, 4, kwargs)  # and 1 -> 2 ranks
    resumed, _, _ = ids_per_step(2, 2, 3, 4, kwargs, state=states[0])
    assert resumed == straight[3:]


def test_resume_refuses_another_global_batch_or_data(data):
    loader = build_dataloader(1, 0, None, job(data["a"], batch=4))
    take(loader, 1)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="not a multiple of data-parallel ranks 1 x training.local_batch_size 8"):
        build_dataloader(1, 0, None, job(data["a"], batch=8)).load_state_dict(state)
    with pytest.raises(ValueError, match="another data setup"):
        build_dataloader(1, 0, None, job(data["b"], batch=4)).load_state_dict(state)


def test_epochs_cycle_through_new_permutations(data):
    loader = build_dataloader(1, 0, None, job(data["b"], batch=4))
    n = loader.sources[0].num_sequences
    first = [loader.sequence_id(g)[1] for g in range(n)]
    second = [loader.sequence_id(g)[1] for g in range(n, 2 * n)]
    assert sorted(first) == sorted(second) == list(range(n)) and first != second


def test_document_starts_match_the_end_of_document_tokens(data):
    loader = build_dataloader(1, 0, None, job(data["a"], mask="block_causal"))
    seen = False
    for inputs, _ in take(loader, 100):
        starts = inputs["document_starts"]
        eos_after = torch.zeros_like(starts)
        eos_after[:, 1:] = inputs["input"][:, :-1] == 0  # a document starts right after eos (id 0)
        eos_after[:, 0] = True
        assert torch.equal(starts, eos_after)
        from_index = document_boundaries_from_starts(starts).cu_seqlens
        assert torch.equal(from_index, document_boundaries(inputs["input"], eos_id=0).cu_seqlens)
        seen = seen or bool(starts[:, 1:].any())
    assert seen  # the test saw documents begin inside rows


def test_validation_reads_whole_rounds_in_order(data):
    tokens = stream(data["a"], "validation")
    loaders = [build_validation_dataloader(2, r, None, job(data["a"], batch=2)) for r in (0, 1)]
    n = (len(tokens) - 1) // SEQ
    batches = [list(loader) for loader in loaders]
    assert len(batches[0]) == len(batches[1]) == n // 4
    rows = torch.cat([torch.cat([b0[0]["input"], b1[0]["input"]]) for b0, b1 in zip(*batches)])
    expected = np.stack([tokens[i * SEQ:i * SEQ + SEQ] for i in range(4 * (n // 4))]).astype(np.int64)
    assert torch.equal(rows, torch.from_numpy(expected))
    assert [len(list(loaders[0]))] == [n // 4]  # a second pass starts again
    from parallax_titan.data.build import ValidationPasses  # as the trainer's validator reads it

    passes = ValidationPasses(loaders[0], job(data["a"], batch=2).validation, 2)
    assert [len(list(passes)), len(list(passes))] == [n // 4, n // 4]


def test_mixture_metrics_report_realised_shares(data):
    loader = build_dataloader(1, 0, None, job(sources=[{"path": data["a"], "weight": 3.0, "name": "big"},
                                                       {"path": data["b"], "weight": 1.0}], batch=4))
    metrics = loader.mixture_metrics(10)
    drawn = [loader.sequence_id(g)[0] for g in range(40)]
    assert metrics["data/big/fraction"] == drawn.count(0) / 40 == 0.75
    assert metrics["data/b/tokens"] == drawn.count(1) * SEQ


# --- errors, all before the first step ---

def config_argv(tmp_path, *extra):
    return ["--job.config_file", "configs/test_cpu_2rank.toml", "--job.dump_folder", str(tmp_path),
            "--training.dataset", "pretokenized", "--training.seq_len", str(SEQ), *extra]


def test_config_accepts_a_dataset_and_checks_the_tokenizer(data, tmp_path):
    load_config(config_argv(tmp_path, "--training.dataset_path", data["a"]))
    other = tmp_path / "tok"
    other.mkdir()
    tokenizer = json.load(open(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json")))
    json.dump(tokenizer, open(other / "tokenizer.json", "w"), indent=1)  # same tokens, other bytes
    with pytest.raises(ConfigError, match=r"training\.dataset_path = .* was tokenized with another tokenizer"):
        load_config(config_argv(tmp_path, "--training.dataset_path", data["a"], "--model.hf_assets_path", str(other)))


def copy_of(data, tmp_path):
    shutil.copytree(data["a"], tmp_path / "copy")
    return str(tmp_path / "copy")


def test_missing_or_truncated_shards_stop_at_config(data, tmp_path):
    path = copy_of(data, tmp_path)
    os.truncate(os.path.join(path, "train", "00001.bin"), 100)
    with pytest.raises(ConfigError, match=r"00001\.bin has 100 bytes, the manifest says \d+: .*corrupt"):
        load_config(config_argv(tmp_path, "--training.dataset_path", path))
    os.remove(os.path.join(path, "train", "00001.bin"))
    with pytest.raises(ConfigError, match=r"shard file .*00001\.bin is missing"):
        load_config(config_argv(tmp_path, "--training.dataset_path", path))
    os.remove(os.path.join(path, "manifest.json"))
    with pytest.raises(ConfigError, match=r"has no manifest\.json; pre-tokenization has not finished \(5 units done\)"):
        load_config(config_argv(tmp_path, "--training.dataset_path", path))


def test_corrupt_shard_stops_the_loader_build(data, tmp_path):
    path = copy_of(data, tmp_path)
    shard = os.path.join(path, "train", "00002.bin")
    with open(shard, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 1]))
    load_config(config_argv(tmp_path, "--training.dataset_path", path))  # sizes agree
    with pytest.raises(ValueError, match=r"00002\.bin does not match its sha256 in manifest\.json: corrupt"):
        build_dataloader(1, 0, None, job(path))
    # the ranks share the checksum work: the rank holding shard 2 of 5 finds it
    found = []
    for rank in range(3):
        try:
            build_dataloader(3, rank, None, job(path))
        except ValueError:
            found.append(rank)
    assert found == [2]


@pytest.mark.parametrize("entry, message", [
    ({"weight": 0.0}, r"training\.sources\[1\]\.weight: expected a finite number > 0, got 0\.0"),
    ({"weight": -1.0}, r"training\.sources\[1\]\.weight: expected a finite number > 0, got -1\.0"),
    ({"weight": 1.0, "tokens": 5}, r"training\.sources\[1\]: set weight or tokens, not both"),
    ({"tokens": 100}, r"training\.sources: give every source a weight, or every source a token budget"),
])
def test_bad_source_entries_stop_at_config(data, tmp_path, entry, message):
    toml = tmp_path / "mix.toml"
    second = ", ".join(f"{k} = {v!r}" for k, v in entry.items())
    toml.write_text(open("configs/test_cpu_2rank.toml").read().replace("[training]\n", "[training]\n", 1)
                    + f'\n[[training.sources]]\npath = "{data["a"]}"\nweight = 1.0\n'
                    + f'\n[[training.sources]]\npath = "{data["b"]}"\n{second.replace(", ", chr(10))}\n')
    with pytest.raises(ConfigError, match=message):
        load_config(["--job.config_file", str(toml), "--job.dump_folder", str(tmp_path),
                     "--training.dataset", "pretokenized"])


def test_sources_from_toml_and_token_budgets(data, tmp_path):
    toml = tmp_path / "mix.toml"
    toml.write_text(open("configs/test_cpu_2rank.toml").read()
                    + f'\n[[training.sources]]\npath = "{data["a"]}"\ntokens = 144\nname = "shakespeare"\n'
                    + f'\n[[training.sources]]\npath = "{data["b"]}"\ntokens = 48\n')
    argv = ["--job.config_file", str(toml), "--job.dump_folder", str(tmp_path), "--training.dataset", "pretokenized",
            "--training.seq_len", str(SEQ), "--training.local_batch_size", "2", "--training.steps", "3"]
    config = load_config(argv)
    assert [s.name for s in config.training.sources] == ["shakespeare", ""]
    loader = build_dataloader(2, 0, None, config)  # 3 steps x 4 sequences x 16 tokens = 192 = 144 + 48
    assert loader.mixture_metrics(3)["data/shakespeare/fraction"] == 0.75
    with pytest.raises(ValueError, match=r"token budgets add up to 192, but the run trains on .* = 384 tokens"):
        build_dataloader(4, 0, None, config)


def reading_ahead(j, workers=1, prefetch=3, pin=False):
    j.training.dataloader.num_workers, j.training.dataloader.prefetch_factor = workers, prefetch
    j.training.dataloader.pin_memory = j.validation.dataloader.pin_memory = pin
    j.validation.dataloader.num_workers, j.validation.dataloader.prefetch_factor = workers, prefetch
    return j


def test_read_ahead_gives_the_same_batches_and_position(data, monkeypatch):
    """``num_workers = 1`` reads on a thread, ``prefetch_factor`` batches ahead of the trainer: the same
    batches in the same order, and the saved position counts the batches handed out, not those read
    (a resume from it would otherwise skip the read-ahead batches)."""
    plain = build_dataloader(1, 0, None, job(data["a"]))
    ahead = build_dataloader(1, 0, None, reading_ahead(job(data["a"])))
    threads = []
    load = ahead._load
    monkeypatch.setattr(ahead, "_load", lambda k: threads.append(threading.current_thread().name)
                        or load(k))
    it = iter(ahead)
    first = [next(it) for _ in range(2)]
    assert ahead.state_dict() == plain.state_dict() | {"position": 2 * 4}
    deadline = time.monotonic() + 60
    while len(threads) < 2 + 3 and time.monotonic() < deadline:  # the thread reads 3 batches ahead, unasked
        time.sleep(0.01)
    assert len(threads) == 2 + 3 and all(t.startswith("pretokenized-read-ahead") for t in threads)
    for (x, y), (x0, y0) in zip(first + [next(it) for _ in range(3)], take(plain, 5)):
        assert torch.equal(x["input"], x0["input"]) and torch.equal(y, y0)
    it.close()  # the run ends: the reader stops
    resumed = build_dataloader(1, 0, None, reading_ahead(job(data["a"])))
    resumed.load_state_dict(ahead.state_dict())
    fresh = build_dataloader(1, 0, None, job(data["a"]))
    assert torch.equal(next(iter(resumed))[0]["input"], take(fresh, 6)[5][0]["input"])


def test_read_ahead_validation_and_pinned_memory(data, monkeypatch):
    """Validation passes read ahead alike; ``pin_memory`` pins each tensor of the batch where CUDA is
    there (torch's CPU build has no page-locked memory: the batch is left as it is)."""
    plain = [b for b in build_validation_dataloader(1, 0, None, job(data["a"]))]
    ahead = build_validation_dataloader(1, 0, None, reading_ahead(job(data["a"], mask="block_causal"), pin=True))
    assert len(list(ahead)) == len(plain)
    pinned = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t.shape) or t.clone())
    batches = list(ahead)
    assert [torch.equal(b[0]["input"], p[0]["input"]) for b, p in zip(batches, plain)] == [True] * len(plain)
    assert len(pinned) == 3 * len(plain)  # input, document starts, labels


@pytest.mark.parametrize("workers", [0, 1])
def test_a_state_loaded_while_iterating_takes_effect_at_the_next_batch(data, workers):
    """load_state_dict on a loader already iterated (and read ahead): the next batch is the loaded
    position's, and the saved position follows it."""
    loader = build_dataloader(1, 0, None, reading_ahead(job(data["a"]), workers=workers, prefetch=3 if workers else None))
    fresh = take(build_dataloader(1, 0, None, job(data["a"])), 6)
    it = iter(loader)
    next(it)
    loader.load_state_dict(loader.state_dict() | {"position": 4 * 4})
    assert torch.equal(next(it)[0]["input"], fresh[4][0]["input"]) and loader.state_dict()["position"] == 5 * 4
    assert torch.equal(next(it)[0]["input"], fresh[5][0]["input"])
