"""Malformed local data: a clear error naming file and line, or skipped and counted
(``[reliability] bad_data``)."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parallax_titan.data import _file_documents, check_dataset_config, resolve_data_files

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
        json.dumps({"content": "kept two"}).encode() + b"\n",
    ]))
    (tmp_path / "c_empty.jsonl").write_bytes(b"")
    return tmp_path


def test_error_policy_names_the_file(data_dir):
    with pytest.raises(ValueError, match="c_empty.jsonl.* is empty"):
        resolve_data_files(str(data_dir))
    with pytest.raises(ValueError, match=r"b_bad.jsonl, line 2: not valid UTF-8"):
        list(_file_documents([str(data_dir / "b_bad.jsonl")]))


def test_skip_policy_skips_and_counts(data_dir, caplog):
    files = resolve_data_files(str(data_dir), skip_bad=True)
    assert [f.rsplit("/", 1)[1] for f in files] == ["a_good.jsonl", "b_bad.jsonl"]
    with caplog.at_level(logging.WARNING):
        texts = [d["content"] for d in _file_documents(files, skip_bad=True)]
    assert texts == GOOD + ["kept one", "kept two"]
    assert "b_bad.jsonl: skipped 4 malformed records" in caplog.text


def test_skip_policy_parquet_null_content(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"content": ["x", None, "y"]}), path)
    assert [d["content"] for d in _file_documents([str(path)], skip_bad=True)] == ["x", "y"]


def test_nothing_usable_is_still_an_error(tmp_path):
    (tmp_path / "e.jsonl").write_bytes(b"")
    with pytest.raises(ValueError, match="none of its 1 files is usable"):
        resolve_data_files(str(tmp_path), skip_bad=True)


def test_config_check_follows_the_policy(data_dir):
    class Training:
        dataset, dataset_path = "local", str(data_dir)

    with pytest.raises(ValueError, match="c_empty.jsonl"):
        check_dataset_config(Training())
    check_dataset_config(Training(), skip_bad=True)
