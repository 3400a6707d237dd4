"""The pre-tokenizer: shards against an independent encoding, manifests against hashlib, the
validation split by text hash, resuming after a crash without rewriting finished shards, processes,
bad records, a hub-layout source, the command line."""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parallax_titan.data import CORPUS_DIR
from parallax_titan.data import pretokenize as pt
from parallax_titan.data.shards import SPLITS, check_split
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer
from scripts.pretokenize import main as cli

FRACTION = 0.2


def corpus_docs(n: int) -> list[str]:
    with gzip.open(os.path.join(CORPUS_DIR, "train.jsonl.gz"), "rt", encoding="utf-8") as f:
        return [json.loads(line)["content"] for _, line in zip(range(n), f)]


@pytest.fixture(scope="module")
def docs():
    return corpus_docs(60)


@pytest.fixture(scope="module")
def tok():
    return PretrainTokenizer(TINY_TOKENIZER_PATH)


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"content": t}) + "\n" for t in texts))
    return str(path)


def run(source, out, **options):
    opts = pt.Options(**{"validation_fraction": FRACTION, "docs_per_shard": 25, **options})
    return pt.pretokenize(source, str(out), TINY_TOKENIZER_PATH, opts, progress=False)


def held_out(text: str) -> bool:
    """The documented rule, computed here: blake2b-64 of the UTF-8 text (little-endian) / 2^64 < fraction."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") < FRACTION * 2**64


def read_split(out, manifest, split):
    tokens, ends = [], []
    for shard in manifest["splits"][split]["shards"]:
        tokens.append(np.fromfile(os.path.join(out, split, shard["unit"] + ".bin"), dtype="<u4"))
        ends.append(np.fromfile(os.path.join(out, split, shard["unit"] + ".idx"), dtype="<u8"))
    return tokens, ends


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, docs):
    base = tmp_path_factory.mktemp("pt")
    source = pt.SourceSpec("local", write_jsonl(base / "docs.jsonl", docs))
    return source, base / "out", run(source, base / "out")


def test_shards_hold_each_document_encoded_plus_eos(local_run, docs, tok):
    _, out, manifest = local_run
    assert [s["unit"] for s in manifest["splits"]["train"]["shards"]] == ["00000", "00001", "00002"]
    for split, wanted in (("train", False), ("validation", True)):
        expected = [np.array(tok.encode(d, add_bos=True, add_eos=True), np.uint32) for d in docs if held_out(d) == wanted]
        tokens, ends = read_split(out, manifest, split)
        flat = np.concatenate(tokens)
        assert np.array_equal(flat, np.concatenate(expected))
        # each shard's index: its documents' cumulative lengths
        starts = np.concatenate([[0], np.cumsum([len(t) for t in tokens])])
        documents = np.concatenate([e + s for e, s in zip(ends, starts[:-1])])
        assert np.array_equal(documents, np.cumsum([len(e) for e in expected]))
        assert manifest["splits"][split]["documents"] == len(expected)
        assert manifest["splits"][split]["tokens"] == len(flat)
    assert 0 < manifest["splits"]["validation"]["documents"] < manifest["splits"]["train"]["documents"]


def test_manifest_records_tokenizer_source_and_checksums(local_run, docs):
    source, out, manifest = local_run
    with open(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), "rb") as f:
        assert manifest["tokenizer"]["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert manifest["tokenizer"]["eos_id"] == 0 and manifest["tokenizer"]["vocab_size"] == 4096
    assert manifest["source"]["kind"] == "local" and manifest["source"]["files"][0]["path"] == source.path
    assert manifest["source"]["revision"]
    for split in ("train", "validation"):
        for shard in manifest["splits"][split]["shards"]:
            for ext, key in (("bin", "bin_sha256"), ("idx", "idx_sha256")):
                with open(os.path.join(out, split, f"{shard['unit']}.{ext}"), "rb") as f:
                    assert hashlib.sha256(f.read()).hexdigest() == shard[key]
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f) == manifest


def test_killed_run_resumes_without_rewriting_finished_shards(tmp_path, docs, monkeypatch, local_run):
    source = pt.SourceSpec("local", write_jsonl(tmp_path / "docs.jsonl", docs))
    out = tmp_path / "out"
    real = pt.run_unit

    def crash_on_third(root, spec, options, tokenizer_path, eos_id, unit):
        if unit["name"] == "00002":
            # half a shard on disk, as a kill would leave it
            (out / "train").mkdir(exist_ok=True)
            (out / "train" / "00002.bin.tmp").write_bytes(b"\x01\x02")
            raise KeyboardInterrupt
        return real(root, spec, options, tokenizer_path, eos_id, unit)

    monkeypatch.setattr(pt, "run_unit", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        run(source, out)
    assert not (out / "manifest.json").exists()
    assert sorted(os.listdir(out / "shards")) == ["00000.json", "00001.json"]
    finished = {p: os.stat(p) for p in (out / "train" / "00000.bin", out / "validation" / "00001.idx",
                                        out / "shards" / "00000.json")}
    monkeypatch.setattr(pt, "run_unit", real)
    manifest = run(source, out)
    for path, stat in finished.items():
        assert os.stat(path).st_mtime_ns == stat.st_mtime_ns and os.stat(path).st_ino == stat.st_ino
    straight = local_run[2]
    assert manifest["splits"] == straight["splits"]
    assert not (out / "train" / "00002.bin.tmp").exists()


@pytest.mark.parametrize("damage", ["truncated_shard", "missing_index", "empty_unit_manifest", "other_source"])
def test_rerun_redoes_a_unit_whose_manifest_or_shards_are_damaged(tmp_path, docs, local_run, damage):
    """A rerun took every shards/<unit>.json as a finished unit: one left empty by a crash stopped it
    with a JSONDecodeError; a finished unit's truncated or deleted shard went into manifest.json
    again (training refused it, and no rerun repaired it); with plan.json deleted, a unit manifest
    of another source file entered the new dataset's manifest with its shards."""
    source = pt.SourceSpec("local", write_jsonl(tmp_path / "docs.jsonl", docs))
    out = tmp_path / "out"
    if damage == "other_source":
        run(pt.SourceSpec("local", write_jsonl(tmp_path / "other.jsonl", docs[::-1])), out)
        os.remove(out / "plan.json")
    else:
        run(source, out)
    if damage == "truncated_shard":
        os.truncate(out / "train" / "00001.bin", 8)
    elif damage == "missing_index":
        os.remove(out / "validation" / "00002.idx")
    elif damage == "empty_unit_manifest":
        (out / "shards" / "00001.json").write_text("")
    manifest = run(source, out)
    assert manifest["splits"] == local_run[2]["splits"]
    for split in SPLITS:
        check_split(str(out), manifest, split, "out", checksums=True)


def test_units_of_another_tokenizer_are_redone_when_the_plan_is_gone(tmp_path, docs, local_run):
    """With plan.json deleted, the unit manifests of a run with another tokenizer (the same unit
    ranges) were taken as finished: the dataset's manifest named the new tokenizer over the old one's
    token ids."""
    other = tmp_path / "other_tokenizer"
    other.mkdir()
    spec = json.loads((open(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), encoding="utf-8")).read())
    vocab = spec["model"]["vocab"]
    vocab["e"], vocab["t"] = vocab["t"], vocab["e"]  # the same text, other ids
    (other / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    source = pt.SourceSpec("local", write_jsonl(tmp_path / "docs.jsonl", docs))
    out = tmp_path / "out"
    opts = pt.Options(validation_fraction=FRACTION, docs_per_shard=25)
    first = pt.pretokenize(source, str(out), str(other), opts, progress=False)
    assert first["splits"]["train"]["tokens"] == local_run[2]["splits"]["train"]["tokens"]
    assert [s["bin_sha256"] for s in first["splits"]["train"]["shards"]] != \
        [s["bin_sha256"] for s in local_run[2]["splits"]["train"]["shards"]]
    os.remove(out / "plan.json")
    manifest = run(source, out)
    assert manifest["splits"] == local_run[2]["splits"]
    for split in SPLITS:
        check_split(str(out), manifest, split, "out", checksums=True)


def test_resume_with_other_settings_is_refused(local_run):
    source, out, _ = local_run
    with pytest.raises(ValueError, match=r"other settings \(options differ\); rerun with the same arguments"):
        run(source, out, validation_fraction=0.5)


def test_processes_write_the_same_shards(tmp_path, docs, local_run):
    source = pt.SourceSpec("local", write_jsonl(tmp_path / "docs.jsonl", docs))
    opts = pt.Options(validation_fraction=FRACTION, docs_per_shard=25)
    manifest = pt.pretokenize(source, str(tmp_path / "out"), TINY_TOKENIZER_PATH, opts, num_proc=2, progress=False)
    assert manifest["splits"] == local_run[2]["splits"]


def test_bad_records_counted_per_file_and_reason(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"content": "one"}\n{"content": 5}\nnot json\n{"content": "two"}\n')
    with pytest.raises(ValueError, match=r"mixed\.jsonl, line 2: 'content' is 5"):
        run(pt.SourceSpec("local", str(path)), tmp_path / "strict")
    manifest = run(pt.SourceSpec("local", str(path)), tmp_path / "lenient", bad_data="skip", validation_fraction=0.0)
    assert manifest["bad_records"] == {str(path): {"'content' is not a string": 1, "invalid JSON": 1}}
    assert manifest["splits"]["train"]["documents"] == 2


def test_bad_record_in_a_worker_process_stops_the_run_naming_it(tmp_path, docs):
    """--num-proc 2 with one bad line: the worker's BadRecordError reaches the parent whole (it did not
    unpickle, the pool logged a TypeError and the run hung) and stops the run naming file and line."""
    import pickle

    from parallax_titan.data.records import BadRecordError

    error = pickle.loads(pickle.dumps(BadRecordError("f.jsonl, line 3: invalid JSON", "invalid JSON")))
    assert (str(error), error.reason) == ("f.jsonl, line 3: invalid JSON", "invalid JSON")
    path = tmp_path / "docs.jsonl"
    write_jsonl(path, docs[:20])
    with open(path, "a") as fh:
        fh.write("{not json\n")
    opts = pt.Options(validation_fraction=0.0, docs_per_shard=5)
    with pytest.raises(ValueError, match=r"docs\.jsonl, line 21: not valid JSON"):
        pt.pretokenize(pt.SourceSpec("local", str(path)), str(tmp_path / "out"), TINY_TOKENIZER_PATH, opts,
                       num_proc=2, progress=False)


def test_hub_layout_source_one_unit_per_file(tmp_path, docs, tok):
    """A Hugging Face dataset repository's layout (README configs, parquet files) read through
    `datasets`, as a local clone of Ultra-FineWeb would be."""
    (tmp_path / "repo" / "data" / "en").mkdir(parents=True)
    pq.write_table(pa.table({"content": docs[:10]}), tmp_path / "repo" / "data" / "en" / "part-0.parquet")
    pq.write_table(pa.table({"content": docs[10:20]}), tmp_path / "repo" / "data" / "en" / "part-1.parquet")
    (tmp_path / "repo" / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: en\n    path: data/en/*.parquet\n---\n")
    spec = pt.SourceSpec("hub", str(tmp_path / "repo"), name="default", split="en")
    manifest = run(spec, tmp_path / "out", validation_fraction=0.0, docs_per_shard=0)
    assert len(manifest["splits"]["train"]["shards"]) == 2
    tokens, _ = read_split(tmp_path / "out", manifest, "train")
    expected = np.concatenate([tok.encode(d, add_bos=True, add_eos=True) for d in docs[:20]])
    assert np.array_equal(np.concatenate(tokens), expected)


def test_command_line_embedded_corpus(tmp_path, capsys):
    out = tmp_path / "embedded"
    assert cli(["--source", "embedded", "--tokenizer", TINY_TOKENIZER_PATH, "--out", str(out),
                "--docs-per-shard", "1000", "--num-proc", "1", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert f"train: {manifest['splits']['train']['tokens']:,} tokens" in printed
    # both embedded files, every document once
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["validation"]["documents"] == 2229 + 49
    assert cli(["--source", "local", "--tokenizer", TINY_TOKENIZER_PATH, "--out", str(out)]) == 2
