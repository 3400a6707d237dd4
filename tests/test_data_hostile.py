"""Data fed what a careless or hostile user hands it: pre-tokenizer options that silently wrote an
empty dataset or read a whole file into one tokenizer batch, and a pre-tokenized validation split
too small for one round of ranks x batch, which crashed the first validation mid-run."""

from __future__ import annotations

import pytest

from parallax_titan.data import build_validation_dataloader
from parallax_titan.data import pretokenize as pt
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH
from scripts.pretokenize import main as cli
from tests._output_folders import refused_output
from tests.test_pretokenize import corpus_docs, write_jsonl
from tests.test_pretokenized import job


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return pt.SourceSpec("local", write_jsonl(tmp_path_factory.mktemp("docs") / "docs.jsonl", corpus_docs(12)))


@pytest.mark.parametrize("field, value, flag", [
    ("docs_per_shard", -5, "--docs-per-shard"),  # range(0, n, -5) planned no unit: a manifest of 0 tokens
    ("batch_size", 0, "--batch-size"),  # a batch never filled: the whole unit in one tokenizer call
    ("batch_size", -3, "--batch-size"),
])
def test_bad_pretokenize_options_are_refused_before_any_work(tmp_path, source, field, value, flag):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=rf"{flag}: expected .*, got {value}"):
        pt.pretokenize(source, str(out), TINY_TOKENIZER_PATH, pt.Options(**{field: value}), progress=False)
    assert not out.exists()  # no plan.json that a corrected rerun would be refused against


@pytest.mark.parametrize("flag, value, message", [
    ("--docs-per-shard", "-1", "--docs-per-shard: expected an integer >= 0 (0: one shard per file), got -1"),
    ("--batch-size", "0", "--batch-size: expected a positive integer, got 0"),
    ("--validation-fraction", "nan", "--validation-fraction: expected a number in [0, 1), got nan"),
    ("--validation-fraction", "1", "--validation-fraction: expected a number in [0, 1), got 1.0"),
])
def test_bad_pretokenize_option_on_the_command_line(tmp_path, source, capsys, flag, value, message):
    """A usage error exits 2 (it exited 1, the status of a bad record met during the work) before
    --out is created."""
    argv = ["--source", "local", "--path", source.path, "--tokenizer", TINY_TOKENIZER_PATH,
            "--out", str(tmp_path / "out"), flag, value, "--no-progress"]
    assert cli(argv) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def small(tmp_path_factory, source):
    """12 documents, a quarter of them held out: a validation split of a few hundred tokens."""
    out = tmp_path_factory.mktemp("small") / "data"
    pt.pretokenize(source, str(out), TINY_TOKENIZER_PATH, pt.Options(validation_fraction=0.25), progress=False)
    return str(out)


def test_validation_split_smaller_than_one_round_is_refused_at_build(small):
    """No whole round: the loader yielded nothing and TorchTitan's validator failed at its first
    pass (torch.stack of no losses), after training up to validation.freq."""
    sequences = build_validation_dataloader(1, 0, None, job(small, batch=1)).sources[0].num_sequences
    assert sequences >= 2
    build_validation_dataloader(2, 1, None, job(small, batch=sequences // 2))  # one round fits
    with pytest.raises(ValueError, match=rf"validation\.dataset_path = .*: validation split has {sequences} sequences "
                                         rf"of seq_len \+ 1 tokens, fewer than one round of 2 data-parallel ranks x "
                                         rf"validation\.local_batch_size {sequences}"):
        build_validation_dataloader(2, 0, None, job(small, batch=sequences))


def cli_args(tmp_path, source, *extra):
    return ["--source", "local", "--path", source.path, "--tokenizer", TINY_TOKENIZER_PATH,
            "--out", str(tmp_path / "out"), "--no-progress", *extra]


@pytest.mark.parametrize("flag, value", [
    ("--num-proc", "0"),  # ran in one process, as if asked for one
    ("--num-proc", "-2"),
    ("--max-record-bytes", "0"),  # every record was bad: the run stopped at the first line, or hung in a pool
    ("--max-record-bytes", "-1"),
])
def test_counts_below_one_are_refused_by_name(tmp_path, source, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        cli(cli_args(tmp_path, source, flag, value))
    assert exit_info.value.code == 2 and f"argument {flag}: '{value}': expected an int >= 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", ["file", "under_file", "foreign"])
def test_out_that_is_not_a_pretokenization_is_refused(tmp_path, source, capsys, layout):
    """--out a file (or below one) was a traceback from makedirs; a folder of other files got
    manifest.json, plan.json and the split folders written among them, over a manifest.json of its own."""
    out = refused_output(tmp_path, layout, "manifest.json", "the user's file")
    argv = cli_args(tmp_path, source)
    argv[argv.index("--out") + 1] = str(out)
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "--out" in err and str(out) in err and "Traceback" not in err
    if layout == "foreign":
        assert "notes.txt" in err and sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt"]
        assert (out / "manifest.json").read_text() == "the user's file"


def test_out_of_an_earlier_pretokenization_is_accepted(small):
    from scripts.pretokenize import check_out

    check_out(small)  # its rerun resumes it


@pytest.mark.parametrize("layout", ["missing", "file", "no_tokenizer_json"])
def test_tokenizer_is_named_as_the_flag(tmp_path, source, capsys, layout):
    """The error named model.hf_assets_path, a config key this command does not have, and exited 1."""
    path = tmp_path / "tok"
    if layout == "file":
        path.write_text("x")
    elif layout == "no_tokenizer_json":
        path.mkdir()
    argv = cli_args(tmp_path, source)
    argv[argv.index("--tokenizer") + 1] = str(path)
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer = {str(path)!r}" in err and "model.hf_assets_path" not in err
    assert not (tmp_path / "out").exists()
