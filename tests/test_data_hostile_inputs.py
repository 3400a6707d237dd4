"""Data inputs that trained on something else than asked, or never trained: a data-parallel rank whose
share of a text dataset holds no document (it re-looped forever, flooding the log), one pre-tokenized
folder listed twice under two names (the run trained on one dataset and logged two), a source weight
below the mixing resolution (refused at the loader build without naming the key), weights whose sum
overflows (the mixture fell to equal shares), a parquet file with two ``content`` columns (a
KeyError traceback), a directory's hidden copies of its files (read twice), files of other formats
and linked folders (left out without a word), and a file reached through two links (read twice)."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parallax_titan.config import ConfigError, load_config
from parallax_titan.data import CORPUS_DIR, build_dataloader, build_validation_dataloader, check_dataset_config
from parallax_titan.data.mixture import Mixture
from parallax_titan.data.records import check_file, record_count, resolve_data_files
from parallax_titan.data.text import TextDataset
from tests.test_data import SEQ_LEN, make_job, take, tok  # noqa: F401 (fixture)
from tests.test_pretokenized import SEQ, data  # noqa: F401 (fixture)


def write_docs(path, texts):
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"content": text}) + "\n")
    return str(path)


def first_batch(loader):
    """The loader's first batch; a TimeoutError after a minute, where the loader used to re-loop forever."""
    def stop(*_):
        raise TimeoutError("the loader gave no batch and no error within a minute")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 60, 1)  # again every second: logging swallows one raised in a warning
    try:
        return take(loader, 1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_rank_without_documents_is_named_instead_of_relooping_forever(tok, tmp_path):
    # one document on two ranks, sharded: rank 1 takes every second document, so none
    path = write_docs(tmp_path / "one.jsonl", ["a short document " * 40])
    rank0 = build_dataloader(2, 0, tok, make_job("local", path))
    assert take(rank0, 2)  # rank 0 re-reads its one document
    rank1 = build_dataloader(2, 1, tok, make_job("local", path))
    with pytest.raises(ValueError, match=r"training\.dataset = 'local' \(training\.dataset_path = '.*one\.jsonl'\): "
                                         r"data-parallel rank 1 of 2 read no document in a whole pass.*"
                                         r"training\.data_order = 'global'"):
        first_batch(rank1)


def test_a_validation_set_without_a_good_record_is_named(tok, tmp_path):
    # under bad_data = "skip" a parquet footer with rows passes the check, and every row is null
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"content": pa.array([None, None], pa.string())}), path)
    job = make_job("local", str(path))
    job.reliability.bad_data = "skip"
    job.validation.steps = 3  # an endless validation loader
    loader = build_validation_dataloader(1, 0, tok, job, infinite=True)
    with pytest.raises(ValueError, match=r"validation\.dataset = 'local' \(validation\.dataset_path = '.*nulls\.parquet'\): a whole pass "
                                         r"over the data gave no document \(every record left out as bad"):
        first_batch(loader)


def test_a_pass_from_a_saved_end_of_the_documents_is_not_an_empty_share(tok):
    # resumed at the end of the documents, a pass gives nothing and the next starts over
    path = os.path.join(CORPUS_DIR, "validation.jsonl.gz")
    dataset = TextDataset("default_corpus_validation", None, tok, SEQ_LEN, infinite=True)
    dataset.load_state_dict({"token_buffer": [], "sample_idx": record_count(path)})
    first = next(iter(dataset))[0]["input"]
    fresh = next(iter(TextDataset("default_corpus_validation", None, tok, SEQ_LEN)))[0]["input"]
    assert first.tolist() == fresh.tolist()


def sources_config(tmp_path, sources, *extra):
    toml = tmp_path / "mix.toml"
    text = open("configs/test_cpu_2rank.toml").read()
    for source in sources:
        text += "\n[[training.sources]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in source.items())
    toml.write_text(text)
    return ["--job.config_file", str(toml), "--job.dump_folder", str(tmp_path), "--training.dataset",
            "pretokenized", "--training.seq_len", str(SEQ), *extra]


def test_one_folder_listed_twice_is_refused(data, tmp_path):
    twice = [{"path": data["a"], "weight": 0.9, "name": "web"},
             {"path": data["a"] + "/.", "weight": 0.1, "name": "code"}]
    with pytest.raises(ConfigError, match=r"training\.sources\[1\]\.path = '.*a/\.' is the folder of "
                                          r"training\.sources\[0\]\.path"):
        load_config(sources_config(tmp_path, twice))


def test_a_weight_below_the_mixing_resolution_is_named_at_config(data, tmp_path):
    tiny = [{"path": data["a"], "weight": 1.0}, {"path": data["b"], "weight": 1e-6}]
    with pytest.raises(ConfigError, match=r"training\.sources\[1\]\.weight = 1e-06: a share of 1e-06 of the "
                                          r"sequences, below the mixing resolution 1/65536"):
        load_config(sources_config(tmp_path, tiny))
    budgets = [{"path": data["a"], "tokens": 10**9}, {"path": data["b"], "tokens": 1}]
    with pytest.raises(ConfigError, match=r"training\.sources\[1\]\.tokens = 1: a share of 1e-09"):
        load_config(sources_config(tmp_path, budgets))


@pytest.mark.parametrize("weights, shares", [([1.5e308, 1e308], [0.6, 0.4]), ([3.0, 1.0], [0.75, 0.25])])
def test_weights_whose_sum_overflows_keep_their_ratio(weights, shares):
    mixture = Mixture.from_weights(weights)
    assert mixture.period == 1 << 16
    np.testing.assert_allclose(mixture.counts / mixture.period, shares, atol=1 / mixture.period)


def test_a_parquet_file_with_two_content_columns_is_named(tmp_path):
    path = tmp_path / "two.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["content", "content"]), path)
    with pytest.raises(ValueError, match=r"two\.parquet: 2 columns named 'content'; expected one"):
        check_file(str(path))
    cfg = make_job("local", str(path)).training
    with pytest.raises(ValueError, match=r"2 columns named 'content'"):
        check_dataset_config(cfg, "training")
    assert os.path.isfile(path)


def test_a_directory_leaves_out_hidden_copies_and_names_files_it_does_not_read(tmp_path, caplog):
    """A notebook's checkpoint folder holds a copy of a data file: both used to be read (its documents
    trained on twice); a ``.json`` file beside them was left out without a word."""
    write_docs(tmp_path / "data.jsonl", ["one"])
    (tmp_path / ".ipynb_checkpoints").mkdir()
    write_docs(tmp_path / ".ipynb_checkpoints" / "data-checkpoint.jsonl", ["one"])
    write_docs(tmp_path / ".hidden.jsonl", ["two"])
    write_docs(tmp_path / "notes.json", ["three"])
    with caplog.at_level("WARNING"):
        files = resolve_data_files(str(tmp_path), key="training.dataset_path")
    assert files == [str(tmp_path / "data.jsonl")]
    assert "training.dataset_path" in caplog.text and "1 file(s) without a .parquet/.jsonl/.jsonl.gz ending" in caplog.text
    assert "notes.json" in caplog.text


def test_a_directory_reads_its_linked_folders_and_each_file_once(tmp_path, caplog):
    """A folder linked into the data directory (a common layout on shared storage) was left out without
    a word, while a glob's ``**`` read it; a file reached through two links was read twice by a glob.
    Links back up the tree are not followed round."""
    shared = tmp_path / "shared" / "v3"
    shared.mkdir(parents=True)
    write_docs(shared / "b.jsonl", ["two"])
    root = tmp_path / "data"
    root.mkdir()
    write_docs(root / "a.jsonl", ["one"])
    (root / "linked").symlink_to(shared, target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)
    (shared / "latest").symlink_to(shared, target_is_directory=True)
    with caplog.at_level("WARNING"):
        assert resolve_data_files(str(root)) == [str(root / "a.jsonl"), str(root / "linked" / "b.jsonl")]
    assert "the same file" not in caplog.text
    for link in (root / "loop", shared / "latest"):  # a glob's ** would follow these round (Python's glob)
        link.unlink()
    (root / "v3").symlink_to(shared, target_is_directory=True)  # b.jsonl through two links
    for path in (str(root), str(root / "**" / "*.jsonl")):
        caplog.clear()
        with caplog.at_level("WARNING"):
            files = resolve_data_files(path, key="training.dataset_path")
        assert files == [str(root / "a.jsonl"), str(root / "linked" / "b.jsonl")]
        assert f"training.dataset_path = {path!r}" in caplog.text and "1 file(s) are the same file as" in caplog.text
        assert str(root / "v3" / "b.jsonl") in caplog.text
