"""Malformed local data: a clear error naming file and line, or skipped and counted per file and
reason (``[reliability] bad_data``); record size caps; unreadable tokenizers; vocabulary sizes."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parallax_titan.config import ConfigError, load_config
from parallax_titan.data import check_dataset_config, resolve_data_files
from parallax_titan.data.records import check_file, documents
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer, check_tokenizer_vocab

GOOD = [f"good document {i}" for i in range(3)]


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "a_good.jsonl").write_text("".join(json.dumps({"content": t}) + "\n" for t in GOOD))
    (tmp_path / "b_bad.jsonl").write_bytes(b"".join([
        json.dumps({"content": "kept one"}).encode() + b"\n",
        b'{"content": "caf\xe9"}\n',  # latin-1 byte: not UTF-8
        b'{"content": "unterminated\n',
        json.dumps({"text": "wrong column"}).encode() + b"\n",
        json.dumps({"content": None}).encode() + b"\n",
        json.dumps({"content": 12345}).encode() + b"\n",
        json.dumps({"content": "kept two"}).encode() + b"\n",
    ]))
    (tmp_path / "c_empty.jsonl").write_bytes(b"")
    return tmp_path


def test_error_policy_names_the_file_and_line(data_dir):
    with pytest.raises(ValueError, match="c_empty.jsonl.* is empty"):
        resolve_data_files(str(data_dir))
    with pytest.raises(ValueError, match=r"b_bad.jsonl, line 2: not valid UTF-8"):
        list(documents([str(data_dir / "b_bad.jsonl")]))


def test_non_string_content_names_file_and_line(tmp_path):
    path = tmp_path / "numbers.jsonl"
    path.write_text(json.dumps({"content": "fine"}) + "\n" + json.dumps({"content": 12345}) + "\n")
    with pytest.raises(ValueError, match=r"numbers\.jsonl, line 2: 'content' is 12345 \(int\); expected a string"):
        list(documents([str(path)]))


def test_skip_policy_counts_per_file_and_reason(data_dir, caplog):
    files = resolve_data_files(str(data_dir), skip_bad=True)
    assert [os.path.basename(f) for f in files] == ["a_good.jsonl", "b_bad.jsonl"]
    with caplog.at_level(logging.WARNING):
        texts = [d["content"] for d in documents(files, skip_bad=True)]
    assert texts == GOOD + ["kept one", "kept two"]
    report = [r.getMessage() for r in caplog.records if "b_bad.jsonl: skipped" in r.getMessage()]
    assert len(report) == 1, caplog.text
    message = report[0]
    assert "skipped 5 bad records" in message
    for count_and_reason, line in [("1 invalid UTF-8", 2), ("1 invalid JSON", 3), ("1 no 'content' field", 4),
                                   ("2 'content' is not a string", 5)]:
        assert f"{count_and_reason} (first: " in message and f"line {line}:" in message
    assert "a_good.jsonl: skipped" not in caplog.text


def truncated_gzip(path, n_docs: int = 400) -> tuple[str, list[str]]:
    """A .jsonl.gz cut in the middle of its gzip stream (a partial download or copy), and its texts."""
    texts = [" ".join(hashlib.sha256(f"{i}.{j}".encode()).hexdigest() for j in range(8)) for i in range(n_docs)]
    data = gzip.compress("".join(json.dumps({"content": t}) + "\n" for t in texts).encode())
    path.write_bytes(data[:len(data) // 2])
    return str(path), texts


def test_truncated_gzip_is_named_or_skipped_as_one_bad_record(tmp_path, caplog):
    """The config check reads the first record only, so a cut .jsonl.gz passed it; training then
    stopped mid-run with gzip's EOFError, which names no file, under either bad-data policy."""
    path, texts = truncated_gzip(tmp_path / "cut.jsonl.gz")
    check_file(path)
    with caplog.at_level(logging.WARNING):
        kept = [d["content"] for d in documents([path], skip_bad=True)]
    assert 0 < len(kept) < len(texts) and kept == texts[:len(kept)]
    assert "cut.jsonl.gz: skipped 1 bad records" in caplog.text and "1 file unreadable" in caplog.text
    with pytest.raises(ValueError, match=rf"cut\.jsonl\.gz, line {len(kept) + 1}: the file cannot be read from here "
                                         r"on \(Compressed file ended .*\); it is truncated or corrupt"):
        list(documents([path]))


def test_binary_file_is_reported_by_reason_not_as_empty(tmp_path):
    path = tmp_path / "image.jsonl"
    path.write_bytes(bytes(range(256)) * 8 + b"\n\xff\xfe\n")
    with pytest.raises(ValueError) as info:
        check_file(str(path), skip_bad=True)
    message = str(info.value)
    assert "is empty" not in message
    assert re.search(r"image\.jsonl' has no good record \(\d+ bad records: \d+ invalid JSON .*\d+ invalid UTF-8", message)


def test_skip_policy_parquet_null_content(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"content": ["x", None, "y"]}), path)
    assert [d["content"] for d in documents([str(path)], skip_bad=True)] == ["x", "y"]
    with pytest.raises(ValueError, match=r"d\.parquet, row 2: 'content' is null"):
        list(documents([str(path)]))


def test_parquet_content_of_another_type_is_named(tmp_path):
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"content": [1, 2]}), path)
    with pytest.raises(ValueError, match=r"ints\.parquet: column 'content' holds int64, expected strings"):
        resolve_data_files(str(path))



def damaged_row_group(path, texts: list[str], group: int, rows_per_group: int) -> str:
    """A parquet file of ``texts`` whose row group ``group`` is overwritten (its footer intact)."""
    pq.write_table(pa.table({"content": texts}), path, row_group_size=rows_per_group)
    column = pq.ParquetFile(path).metadata.row_group(group).column(0)
    with open(path, "r+b") as f:
        f.seek(column.dictionary_page_offset or column.data_page_offset)
        f.write(b"\xff" * column.total_compressed_size)
    return str(path)


def test_parquet_row_group_that_cannot_be_read_is_named_or_skipped(tmp_path, caplog):
    """The config check reads the footer only; a damaged row group then stopped training mid-run
    with Arrow's OSError, which names no file, under either bad-data policy."""
    texts = [f"document {i} " * 20 for i in range(300)]
    path = damaged_row_group(tmp_path / "damaged.parquet", texts, group=1, rows_per_group=100)
    check_file(path)
    with pytest.raises(ValueError, match=r"(?s)damaged\.parquet, rows 101-200: row group 1 cannot be read \(.*\); "
                                         r"the file is corrupt"):
        list(documents([path]))
    with caplog.at_level(logging.WARNING):
        kept = [d["content"] for d in documents([path], skip_bad=True)]
    assert kept == texts[:100] + texts[200:]
    assert "damaged.parquet: skipped 1 bad records" in caplog.text and "1 file unreadable" in caplog.text


def test_lone_surrogate_escape_is_a_bad_record_not_a_tokenizer_crash(tmp_path):
    """``"\\ud800"`` is valid JSON in ASCII, so the record passed every check; its text has no UTF-8
    form, and the tokenizer raised a TypeError naming no file (in the pre-tokenizer, or in training
    mid-run), under either bad-data policy."""
    from parallax_titan.data import pretokenize as pt

    path = tmp_path / "surrogate.jsonl"
    path.write_text('{"content": "fine"}\n{"content": "half of a pair \\ud800"}\n{"content": "after"}\n')
    spec = pt.SourceSpec("local", str(path))
    with pytest.raises(ValueError, match=r"surrogate\.jsonl, line 2: 'content' is not valid Unicode text \(.*"
                                         r"surrogates not allowed\); expected text without lone surrogate escapes"):
        pt.pretokenize(spec, str(tmp_path / "error"), TINY_TOKENIZER_PATH, progress=False)
    manifest = pt.pretokenize(spec, str(tmp_path / "skip"), TINY_TOKENIZER_PATH, pt.Options(bad_data="skip"),
                              progress=False)
    assert manifest["bad_records"] == {str(path): {"invalid UTF-8": 1}}
    assert sum(manifest["splits"][split]["documents"] for split in manifest["splits"]) == 2


def test_deeply_nested_json_is_an_invalid_record(tmp_path):
    """A line of 200,000 nested brackets, well within the length cap, raised RecursionError out of
    the reader, which neither bad-data policy caught."""
    path = tmp_path / "nested.jsonl"
    path.write_text('{"content": "kept"}\n{"content": "x", "a": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    assert [d["content"] for d in documents([str(path)], skip_bad=True)] == ["kept"]
    with pytest.raises(ValueError, match=r"nested\.jsonl, line 2: not valid JSON \(nested too deeply to parse\)"):
        list(documents([str(path)]))

def test_nothing_usable_is_still_an_error(tmp_path):
    (tmp_path / "e.jsonl").write_bytes(b"")
    with pytest.raises(ValueError, match="none of its 1 files is usable"):
        resolve_data_files(str(tmp_path), skip_bad=True)


def test_config_check_follows_the_policy(data_dir):
    class Training:
        dataset, dataset_path, sources = "local", str(data_dir), []

    with pytest.raises(ValueError, match="c_empty.jsonl"):
        check_dataset_config(Training())
    check_dataset_config(Training(), skip_bad=True)


def test_long_record_is_refused_or_skipped_within_the_cap(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"".join([json.dumps({"content": "before"}).encode() + b"\n",
                               json.dumps({"content": "x" * 5000}).encode() + b"\n",
                               json.dumps({"content": "after"}).encode() + b"\n"]))
    with pytest.raises(ValueError, match=r"long\.jsonl, line 2: record of 5016 bytes is longer than the limit of 1000"):
        list(documents([str(path)], max_bytes=1000))
    assert [d["content"] for d in documents([str(path)], skip_bad=True, max_bytes=1000)] == ["before", "after"]
    assert len(list(documents([str(path)], max_bytes=6000))) == 3  # a line exactly within the cap is read


PEAK_RSS = """
import json, resource, sys
from parallax_titan.data.records import check_file, documents
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
texts = [d["content"] for d in documents([sys.argv[1]], skip_bad=True, max_bytes=1 << 20)]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"texts": texts, "peak_growth_kib": after - before}))
"""


def test_fifty_megabyte_line_costs_at_most_the_cap(tmp_path):
    """A 50 MB single-line document under a 1 MiB cap: skipped, and the reader's peak memory grows by
    a few MiB (the cap and read chunks), not by the line."""
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"content": "' + b"y" * (50 << 20) + b'"}\n')
        f.write(json.dumps({"content": "small"}).encode() + b"\n")
    out = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["texts"] == ["small"]
    assert result["peak_growth_kib"] < 16 << 10, result


def test_garbage_tokenizer_file_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(b"\xff\xfe not a tokenizer \x00")
    with pytest.raises(ValueError, match=r"model\.hf_assets_path = .*tokenizer\.json is not a readable tokenizer"):
        PretrainTokenizer(str(tmp_path))


def test_vocab_check_reads_a_replaced_tokenizer_file_again(tmp_path):
    """The vocabulary size is cached per file version: a tokenizer.json replaced in place is read
    again, so a bad replacement is still named."""
    shutil.copy(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), tmp_path / "tokenizer.json")
    check_tokenizer_vocab(str(tmp_path), 4096)
    (tmp_path / "tokenizer.json").write_bytes(b"{ truncated")
    with pytest.raises(ValueError, match="is not a readable tokenizer"):
        check_tokenizer_vocab(str(tmp_path), 4096)


def test_vocab_size_is_checked_against_the_tokenizer(tmp_path):
    with pytest.raises(ValueError, match=r"model\.vocab_size: 1000 is smaller than .*4096 tokens"):
        check_tokenizer_vocab(TINY_TOKENIZER_PATH, 1000)
    check_tokenizer_vocab(TINY_TOKENIZER_PATH, 4096)
    with pytest.raises(ConfigError, match=r"model\.vocab_size: 1000 is smaller"):
        load_config(["--job.config_file", "configs/demo_cpu.toml", "--model.vocab_size", "1000",
                     "--job.dump_folder", str(tmp_path)])
