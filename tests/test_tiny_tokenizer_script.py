"""python -m scripts.build_tiny_tokenizer: bad options refused before training, nothing written unless
the tokenizer has the asked size, tokenizer.json written whole (the validation split: fast)."""

from __future__ import annotations

import os

import pytest
from tokenizers import Tokenizer

from parallax_titan.tokenizer import EOS_TOKEN
from scripts import build_tiny_tokenizer as script
from tests._output_folders import full_disk, refused_output

CORPUS = os.path.join(os.path.dirname(script.DEFAULT_CORPUS), "validation.jsonl.gz")


def run(out, *extra: str) -> None:
    script.main(["--corpus", CORPUS, "--out-dir", str(out), *extra])


def refused(capsys, out, *extra: str) -> str:
    """stderr of a run that must stop with exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        run(out, *extra)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def no_training(monkeypatch):
    def train(*args, **kwargs):
        raise AssertionError("trained before the options were checked")

    monkeypatch.setattr(script, "train_tokenizer", train)


@pytest.mark.parametrize("size", ["0", "-5", "256", "4k"])
def test_vocab_size_below_the_byte_alphabet_is_refused(tmp_path, capsys, no_training, size):
    """-5 was an OverflowError traceback from the trainer; 0 .. 256 wrote a tokenizer of 257 tokens."""
    err = refused(capsys, tmp_path / "out", "--vocab-size", size)
    assert f"argument --vocab-size: {size!r}: expected an int >= 257" in err
    assert not (tmp_path / "out").exists()


def test_missing_corpus_is_refused(tmp_path, capsys, no_training):
    """A traceback from gzip."""
    err = refused(capsys, tmp_path / "out", "--corpus", str(tmp_path / "missing.jsonl.gz"))
    assert f"--corpus: {str(tmp_path / 'missing.jsonl.gz')!r} is not a file" in err


@pytest.mark.parametrize("layout", ["file", "under_file", "foreign"])
def test_out_dir_is_checked_before_training(tmp_path, capsys, no_training, layout):
    """An --out-dir that is a file was a traceback after training; a folder of the user's (another
    tokenizer's, with its SOURCE.md) had its tokenizer.json replaced."""
    out = refused_output(tmp_path, layout, "tokenizer.json", "the user's tokenizer")
    err = refused(capsys, out)
    assert "--out-dir: " in err and str(out) in err
    if layout == "foreign":
        assert (out / "tokenizer.json").read_text() == "the user's tokenizer"


def test_unreadable_corpus_is_named(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl.gz"
    corpus.write_text('{"content": "plain text, not gzip"}\n')
    err = refused(capsys, tmp_path / "out", "--corpus", str(corpus))
    assert f"--corpus: {str(corpus)!r} cannot be read (BadGzipFile" in err
    assert not (tmp_path / "out").exists()


def test_a_vocabulary_the_corpus_cannot_fill_writes_nothing(tmp_path, capsys):
    """The trainer stops when no pair is seen twice: the tokenizer was written smaller than asked."""
    err = refused(capsys, tmp_path / "out", "--vocab-size", "100000")
    assert "--vocab-size 100000: the corpus gives " in err and "nothing was written" in err
    assert not (tmp_path / "out").exists()


def test_rerun_replaces_its_tokenizer_whole(tmp_path):
    """A second run into the folder of the first is accepted; one that fails writing (a full disk)
    leaves the first tokenizer.json, not a part of the new one."""
    out = tmp_path / "out"
    run(out, "--vocab-size", "300")
    first = (out / "tokenizer.json").read_bytes()
    trained = Tokenizer.from_str(first.decode())
    assert trained.get_vocab_size() == 300 and trained.token_to_id(EOS_TOKEN) == 0
    with full_disk(len(first) + 1000), pytest.raises(Exception):
        run(out, "--vocab-size", "2000")
    assert (out / "tokenizer.json").read_bytes() == first
    assert sorted(os.listdir(out)) == ["tokenizer.json", "tokenizer_config.json"]
    run(out, "--vocab-size", "400")
    assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() == 400


def test_empty_out_dir_is_refused_before_training(capsys, no_training):
    """--out-dir "" (an unset shell variable) passed the shared folder check (as it did for get_tokenizer,
    build_corpus and export_hf) and failed at the first write, after the work."""
    assert "--out-dir: got '', which names no folder; expected a new or empty folder" in refused(capsys, "")
