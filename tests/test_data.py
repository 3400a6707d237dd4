"""Datasets and dataloaders: batch layout against an independent token stream,
determinism, disjoint DP ranks, the global data order, exact resume, local files, clear errors."""

import gzip
import json
import logging
import os
import re
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchtitan.hf_datasets.text_datasets import DATASETS

from parallax_titan.config import JobConfig

from parallax_titan.data import (
    CORPUS_DIR,
    build_dataloader,
    build_validation_dataloader,
    check_dataset_config,
    load_ultrafineweb,
    rank_keeps_sequence,
)
from parallax_titan.data.build import training_overlap
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, build_tokenizer

SEQ_LEN, BATCH = 32, 2
TRAIN_FILE = os.path.join(CORPUS_DIR, "train.jsonl.gz")


def make_job(dataset="default_corpus", path=None, seq_len=SEQ_LEN, batch=BATCH, data_order="sharded"):
    job = JobConfig()
    job.training.data_order = data_order
    job.model.hf_assets_path = TINY_TOKENIZER_PATH
    job.training.dataset, job.training.dataset_path = dataset, path
    job.training.seq_len, job.training.local_batch_size = seq_len, batch
    job.validation.dataset, job.validation.dataset_path = dataset, path
    job.validation.seq_len, job.validation.local_batch_size = seq_len, batch
    return job


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(make_job())


def read_contents(path, limit=None):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line)["content"] for line in f]
    return rows[:limit]


def reference_windows(tok, docs, n_windows, seq_len=SEQ_LEN):
    """Independent reference: concatenate tokens+[eos] per document, cut windows of seq_len+1."""
    stream = []
    for doc in docs:
        stream += tok.encode(doc, add_bos=False, add_eos=False) + [tok.eos_id]
        if len(stream) >= n_windows * (seq_len + 1):
            break
    w = torch.tensor(stream[: n_windows * (seq_len + 1)]).view(n_windows, seq_len + 1)
    return w[:, :-1], w[:, 1:]


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def stacked(batches):
    return (torch.cat([b[0]["input"] for b in batches]), torch.cat([b[1] for b in batches]))


def test_batches_match_reference_stream(tok):
    batches = take(build_dataloader(1, 0, tok, make_job()), 4)
    for inputs, labels in batches:
        assert inputs["input"].shape == labels.shape == (BATCH, SEQ_LEN)
        assert inputs["input"].dtype == labels.dtype == torch.long
    x, y = stacked(batches)
    ref_x, ref_y = reference_windows(tok, read_contents(TRAIN_FILE, 20), 4 * BATCH)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_document_boundaries_are_single_eos(tok):
    """Whole first document = its tokens, then one eos, then the second document (no BOS)."""
    docs = read_contents(TRAIN_FILE, 2)
    n0 = len(tok.encode(docs[0], add_bos=False, add_eos=False))
    n_windows = n0 // (SEQ_LEN + 1) + 2
    batches = take(build_dataloader(1, 0, tok, make_job(batch=1)), n_windows)
    stream = torch.cat([torch.cat([b[0]["input"][0], b[1][0, -1:]]) for b in batches]).tolist()
    assert stream[n0] == tok.eos_id and stream.count(tok.eos_id) == 1
    assert tok.decode(stream[:n0]) == docs[0]
    assert tok.decode(stream[n0 + 1:]) == tok.decode(tok.encode(docs[1])[: len(stream) - n0 - 1])


def test_deterministic(tok):
    a = stacked(take(build_dataloader(1, 0, tok, make_job()), 3))
    b = stacked(take(build_dataloader(1, 0, tok, make_job()), 3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def rank_documents(tok, job, world):
    return [list(build_dataloader(world, r, tok, job).dataset._data) for r in range(world)]


def test_two_ranks_disjoint_default_corpus(tok):
    r0, r1 = rank_documents(tok, make_job(), 2)
    all_docs = read_contents(TRAIN_FILE)
    texts0, texts1 = [d["content"] for d in r0], [d["content"] for d in r1]
    assert sorted(texts0 + texts1) == sorted(all_docs)
    assert not set(texts0) & set(texts1)
    x0 = take(build_dataloader(2, 0, tok, make_job()), 1)[0][0]["input"]
    x1 = take(build_dataloader(2, 1, tok, make_job()), 1)[0][0]["input"]
    assert not torch.equal(x0, x1)


def test_global_order_sequence_selection():
    """Blocks of local_batch_size consecutive sequences go to ranks 0, 1, 0, 1, ..."""
    kept = {rank: [i for i in range(16) if rank_keeps_sequence(i, rank, 2, 2)] for rank in (0, 1)}
    assert kept == {0: [0, 1, 4, 5, 8, 9, 12, 13], 1: [2, 3, 6, 7, 10, 11, 14, 15]}
    assert [i for i in range(8) if rank_keeps_sequence(i, 0, 1, 4)] == list(range(8))
    by_rank = [[i for i in range(24) if rank_keeps_sequence(i, r, 3, 2)] for r in range(3)]
    assert sorted(sum(by_rank, [])) == list(range(24)) and by_rank[2][:2] == [4, 5]


def test_global_order_batches_do_not_depend_on_the_rank_count(tok):
    """Step s holds sequences [s*G, (s+1)*G): 1 rank x batch 4 = 1 rank x 2 microbatches of 2 = 2 ranks x 2."""
    one = take(build_dataloader(1, 0, tok, make_job(batch=4, data_order="global")), 3)
    micro = take(build_dataloader(1, 0, tok, make_job(batch=2, data_order="global")), 6)
    ranks = [take(build_dataloader(2, r, tok, make_job(batch=2, data_order="global")), 3) for r in (0, 1)]
    for step, (x, y) in enumerate(one):
        two_rank = stacked([ranks[0][step], ranks[1][step]])
        accumulated = stacked(micro[2 * step:2 * step + 2])
        for got in (two_rank, accumulated):
            assert torch.equal(got[0], x["input"]) and torch.equal(got[1], y)
    assert torch.equal(stacked(one)[0], reference_windows(tok, read_contents(TRAIN_FILE, 20), 12)[0])


def write_jsonl(path, docs, extra=True):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"content": d, "score": 0.5, "id": i} if extra else {"content": d}) + "\n")


def write_parquet(path, docs, column="content"):
    pq.write_table(pa.table({column: docs, "score": [0.5] * len(docs)}), path)


@pytest.fixture(scope="module")
def docs():
    return read_contents(TRAIN_FILE, 60)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet"])
def test_local_files_match_reference(tok, docs, tmp_path, fmt):
    path = tmp_path / f"data.{fmt}"
    (write_parquet if fmt == "parquet" else write_jsonl)(path, docs)
    x, y = stacked(take(build_dataloader(1, 0, tok, make_job("local", str(path))), 3))
    ref_x, ref_y = reference_windows(tok, docs, 3 * BATCH)
    assert torch.equal(x, ref_x) and torch.equal(y, ref_y)


def test_local_directory_and_glob_sorted(tok, docs, tmp_path):
    write_parquet(tmp_path / "b.parquet", docs[30:])
    write_parquet(tmp_path / "a.parquet", docs[:30])
    for path in (str(tmp_path), str(tmp_path / "*.parquet")):
        x, _ = stacked(take(build_dataloader(1, 0, tok, make_job("local", path, seq_len=256)), 2))
        assert torch.equal(x, reference_windows(tok, docs, 2 * BATCH, 256)[0])


@pytest.mark.parametrize("n_files", [1, 2])
def test_two_ranks_disjoint_local(tok, docs, tmp_path, n_files):
    half = len(docs) // n_files
    for i in range(n_files):
        write_jsonl(tmp_path / f"part{i}.jsonl", docs[i * half:(i + 1) * half])
    r0, r1 = rank_documents(tok, make_job("local", str(tmp_path)), 2)
    texts0, texts1 = [d["content"] for d in r0], [d["content"] for d in r1]
    assert texts0 and texts1 and not set(texts0) & set(texts1)
    assert sorted(texts0 + texts1) == sorted(docs[: n_files * half])


def resume_check(tok, job, skip, n=3, world=1, rank=0):
    loader = build_dataloader(world, rank, tok, job)
    it = iter(loader)
    for _ in range(skip):
        next(it)
    state = loader.state_dict()
    expected = [next(it) for _ in range(n)]
    resumed = build_dataloader(world, rank, tok, job)
    resumed.load_state_dict(state)
    got = take(resumed, n)
    for (ex, ey), (gx, gy) in zip(expected, got):
        assert torch.equal(ex["input"], gx["input"]) and torch.equal(ey, gy)


def test_resume_default_corpus(tok):
    resume_check(tok, make_job(), skip=40)


def test_resume_global_order(tok):
    """Rank 0 of 2 in the global order resumes at its exact next sequence (mid global batch)."""
    resume_check(tok, make_job(data_order="global"), skip=40, world=2, rank=0)


@pytest.mark.parametrize("data_order", ["sharded", "global"])
def test_worker_process_gives_the_same_batches_and_resumes_exactly(tok, data_order):
    """``[training.dataloader] num_workers = 1`` (tokenising off the training loop's thread, as the
    GPU configs do) yields the in-process loader's batches, and its state resumes exactly."""
    job = make_job(data_order=data_order)
    in_process = take(build_dataloader(2, 1, tok, job), 45)
    job.training.dataloader.num_workers, job.training.dataloader.prefetch_factor = 1, 2
    for (ex, ey), (gx, gy) in zip(in_process, take(build_dataloader(2, 1, tok, job), 45)):
        assert torch.equal(ex["input"], gx["input"]) and torch.equal(ey, gy)
    resume_check(tok, job, skip=40, world=2, rank=1)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_resume_local_across_files(tok, docs, tmp_path, fmt):
    writer = write_parquet if fmt == "parquet" else write_jsonl
    writer(tmp_path / f"a.{fmt}", docs[:3])
    writer(tmp_path / f"b.{fmt}", docs[3:10])
    # skip far enough to be inside the second file, with a partial token buffer
    resume_check(tok, make_job("local", str(tmp_path), seq_len=64), skip=80)


def test_resume_after_reloop(tok, docs, tmp_path):
    write_jsonl(tmp_path / "small.jsonl", docs[:2])
    n_tokens = sum(len(tok.encode(d)) + 1 for d in docs[:2])
    resume_check(tok, make_job("local", str(tmp_path / "small.jsonl")),
                 skip=n_tokens // ((SEQ_LEN + 1) * BATCH) + 2)


def test_validation_loader_finite(tok):
    loader = build_validation_dataloader(1, 0, tok, make_job("default_corpus_validation", seq_len=512, batch=8))
    n_tokens = sum(len(tok.encode(d)) + 1 for d in read_contents(os.path.join(CORPUS_DIR, "validation.jsonl.gz")))
    assert sum(x["input"].shape[0] for x, _ in loader) == n_tokens // 513 // 8 * 8  # whole rounds only


def overlap_job(train, val):
    job = make_job()
    (job.training.dataset, job.training.dataset_path), (job.validation.dataset, job.validation.dataset_path) = train, val
    return job


def test_validation_on_training_documents_is_named(tmp_path, docs):
    write_jsonl(tmp_path / "a.jsonl", docs[:5])
    write_jsonl(tmp_path / "b.jsonl", docs[5:10])
    for train, val in ((("default_corpus", None), ("default_corpus", None)),
                       (("default_corpus", None), ("local", TRAIN_FILE)),
                       (("local", str(tmp_path)), ("local", str(tmp_path / "b.jsonl"))),
                       (("ultrafineweb", None), ("ultrafineweb", "openbmb/Ultra-FineWeb"))):
        note = training_overlap(overlap_job(train, val))
        assert note and note.startswith(f"validation.dataset = {val[0]!r} reads ") and "not a held-out loss" in note
    for train, val in ((("default_corpus", None), ("default_corpus_validation", None)),
                       (("local", str(tmp_path / "a.jsonl")), ("local", str(tmp_path / "b.jsonl"))),
                       (("ultrafineweb", None), ("local", str(tmp_path / "b.jsonl")))):
        assert training_overlap(overlap_job(train, val)) is None


def test_the_validation_loader_warns_of_training_documents(tok, caplog):
    with caplog.at_level(logging.WARNING):
        build_validation_dataloader(1, 0, tok, overlap_job(("default_corpus", None), ("default_corpus", None)))
    assert "which training.dataset = 'default_corpus' trains on" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build_validation_dataloader(1, 0, tok, overlap_job(("default_corpus", None), ("default_corpus_validation", None)))
    assert "trains on" not in caplog.text


def test_text_validation_gives_every_rank_the_same_batches_of_one_stream(tok):
    """Every rank runs the same number of validation batches (each is a collective: a rank with one
    more would wait forever), and the ranks' batches are the one-rank stream's, whatever the count."""
    job = make_job("default_corpus_validation", seq_len=64, batch=2)
    ranks = [[x["input"] for x, _ in build_validation_dataloader(2, r, tok, job)] for r in range(2)]
    job.validation.local_batch_size = 4
    one = [x["input"] for x, _ in build_validation_dataloader(1, 0, tok, job)]
    n_tokens = sum(len(tok.encode(d)) + 1 for d in read_contents(os.path.join(CORPUS_DIR, "validation.jsonl.gz")))
    assert len(ranks[0]) == len(ranks[1]) == len(one) == n_tokens // 65 // 4
    for a, b, both in zip(*ranks, one):
        assert torch.equal(torch.cat([a, b]), both)


@pytest.mark.parametrize("infinite", [False, True])
def test_every_validation_pass_starts_from_the_start(tok, infinite):
    """validation.steps = -1 (finite) or N (infinite): a second pass scores the first pass's batches
    (the loader alone continues where the last pass stopped: nothing, or the next N batches)."""
    from parallax_titan.data.build import ValidationPasses

    job = make_job("default_corpus_validation", seq_len=64, batch=4)
    passes = ValidationPasses(build_validation_dataloader(1, 0, tok, job, infinite=infinite), job.validation, 1)

    def first(n):
        batches = []
        for x, _ in passes:
            batches.append(x["input"])
            if len(batches) == n:
                break
        return batches

    n = 5 if infinite else 10**6
    a, b = first(n), first(n)
    assert len(a) == len(b) > 3 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_validation_set_shorter_than_its_steps_is_named_once(tok, caplog):
    """A finite validation set (pre-tokenized data ends; text data with steps = -1 does too) that
    gives fewer than validation.steps batches was scored over fewer batches without a word."""
    from parallax_titan.data.build import ValidationPasses

    job = make_job("default_corpus_validation", seq_len=64, batch=4)
    whole = len(list(build_validation_dataloader(1, 0, tok, job)))
    job.validation.steps = whole + 7
    passes = ValidationPasses(build_validation_dataloader(1, 0, tok, job), job.validation, 1)
    with caplog.at_level(logging.WARNING):
        assert len(list(passes)) == len(list(passes)) == whole
    message = (f"validation.steps = {whole + 7}: the validation set gives {whole} batches of 1 data-parallel ranks x "
               f"validation.local_batch_size 4; each pass scores those {whole}")
    assert caplog.text.count(message) == 1


def test_text_validation_pass_without_a_batch_is_named(tok, tmp_path):
    """A validation set shorter than one round gives no batch: a ValueError naming the keys, not
    TorchTitan's validator failing on an empty list."""
    from parallax_titan.data.build import ValidationPasses

    write_jsonl(tmp_path / "short.jsonl", ["a few words " * 3])  # 11 tokens with its end: one sequence of 9
    job = make_job("local", str(tmp_path / "short.jsonl"), seq_len=8, batch=4)
    with pytest.raises(ValueError, match=r"validation\.dataset = 'local'.*2 data-parallel ranks x "
                                         r"validation\.local_batch_size 4"):
        list(ValidationPasses(build_validation_dataloader(2, 0, tok, job), job.validation, 2))
    job.validation.local_batch_size = 1
    assert len(list(ValidationPasses(build_validation_dataloader(1, 0, tok, job), job.validation, 1))) >= 1


# --- errors ---

def test_missing_dataset_path(tok):
    with pytest.raises(ValueError, match=r"training\.dataset_path is not set"):
        build_dataloader(1, 0, tok, make_job("local", None))
    with pytest.raises(ValueError, match=r"validation\.dataset_path is not set"):
        check_dataset_config(SimpleNamespace(dataset="local", dataset_path=None), "validation")


def test_unknown_dataset_and_bad_path():
    with pytest.raises(ValueError, match=r"training\.dataset = 'c5'.*ultrafineweb"):
        check_dataset_config(SimpleNamespace(dataset="c5", dataset_path=None))
    with pytest.raises(ValueError, match=r"training\.dataset_path = '/no/such/\*\.jsonl' matches no"):
        check_dataset_config(SimpleNamespace(dataset="local", dataset_path="/no/such/*.jsonl"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_missing_content_column(tmp_path, fmt):
    path = tmp_path / f"bad.{fmt}"
    if fmt == "parquet":
        write_parquet(path, ["some text"], column="text")
    else:
        path.write_text(json.dumps({"text": "some text", "score": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"no 'content' (column|field)") as info:
        check_dataset_config(SimpleNamespace(dataset="local", dataset_path=str(path)))
    assert str(path) in str(info.value) and "'text'" in str(info.value)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet"])
def test_empty_file(tmp_path, fmt):
    path = tmp_path / f"empty.{fmt}"
    if fmt == "parquet":
        write_parquet(path, [])
    elif fmt == "jsonl.gz":
        write_jsonl(path, [])
    else:
        path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"is empty") as info:
        check_dataset_config(SimpleNamespace(dataset="local", dataset_path=str(path)))
    assert str(path) in str(info.value)


def test_non_utf8_named_at_iteration(tok, tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"content": "fine"}\n{"content": "caf\xe9"}\n')
    loader = build_dataloader(1, 0, tok, make_job("local", str(path)))
    with pytest.raises(ValueError, match=r"latin1\.jsonl, line 2: not valid UTF-8"):
        take(loader, 1)


def test_non_string_content(tok, tmp_path):
    path = tmp_path / "null.jsonl"
    path.write_text('{"content": null}\n')
    with pytest.raises(ValueError, match=r"null\.jsonl, line 1: 'content' is None \(NoneType\); expected a string"):
        take(build_dataloader(1, 0, tok, make_job("local", str(path))), 1)


# --- Ultra-FineWeb: registry entry, and the loader on an offline mirror layout ---

def test_ultrafineweb_registered_and_mirror(tok, docs, tmp_path):
    assert DATASETS["ultrafineweb"].path == "openbmb/Ultra-FineWeb"
    (tmp_path / "data" / "en").mkdir(parents=True)
    write_parquet(tmp_path / "data" / "en" / "part-0.parquet", docs)
    (tmp_path / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        "  - split: en\n    path: data/en/*.parquet\n---\n"
    )
    stream = load_ultrafineweb(str(tmp_path))
    assert [r["content"] for r in stream.take(3)] == docs[:3]
    x, _ = stacked(take(build_dataloader(1, 0, tok, make_job("ultrafineweb", str(tmp_path))), 2))
    assert torch.equal(x, reference_windows(tok, docs, 2 * BATCH)[0])


def test_ultrafineweb_unreachable_names_the_key_and_the_ways_round(monkeypatch):
    """No network and no mirror: datasets' ConnectionError comes back naming training.dataset, the hub
    id and what runs without the hub (a clone in dataset_path, local parquet files, shards)."""
    from parallax_titan.data import text

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openbmb/Ultra-FineWeb' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(text, "load_dataset", unreachable)
    with pytest.raises(ConnectionError, match=r'training.dataset = "ultrafineweb": \'openbmb/Ultra-FineWeb\' could '
                       r"not be reached \(Couldn't reach .*\); expected network access .* training.dataset_path"):
        load_ultrafineweb("openbmb/Ultra-FineWeb")


def test_global_order_state_is_one_for_all_ranks_and_moves_between_rank_counts(tok):
    """Between steps the ranks of the global order hold one state (saved once); 2 ranks x batch 2
    stopped after 3 steps continue on 1 rank x batch 4 with the straight run's sequences."""
    straight = take(build_dataloader(1, 0, tok, make_job(batch=4, data_order="global")), 6)
    loaders = [build_dataloader(2, r, tok, make_job(batch=2, data_order="global")) for r in (0, 1)]
    iters = [iter(loader) for loader in loaders]
    for _ in range(3):
        for it in iters:
            next(it)
    states = [loader.state_dict() for loader in loaders]
    assert list(states[0]) == ["global_order"] and states[0] == states[1]
    resumed = build_dataloader(1, 0, tok, make_job(batch=4, data_order="global"))
    resumed.load_state_dict(states[0])
    for (ex, ey), (gx, gy) in zip(straight[3:], take(resumed, 3)):
        assert torch.equal(ex["input"], gx["input"]) and torch.equal(ey, gy)


@pytest.mark.parametrize("name", ["default_corpus", "default_corpus_validation"])
def test_embedded_dataset_path_that_is_not_one_jsonl_file_is_named(tmp_path, name):
    """The embedded datasets read one JSONL file: a parquet file passed the config check and failed at
    the loader build as 'line 1: not valid UTF-8' naming no key; a folder was said not to exist."""
    parquet = tmp_path / "docs.parquet"
    write_parquet(parquet, ["some text"])
    for path in (str(parquet), str(tmp_path)):
        with pytest.raises(ValueError, match=rf"training\.dataset_path = {re.escape(repr(path))}: {name!r} reads one "
                                             r"\.jsonl/\.jsonl\.gz file.*dataset = 'local'"):
            check_dataset_config(SimpleNamespace(dataset=name, dataset_path=path))
    jsonl = tmp_path / "docs.jsonl.gz"
    write_jsonl(jsonl, ["some text"])
    check_dataset_config(SimpleNamespace(dataset=name, dataset_path=str(jsonl)))
