"""Data fed what a careless or hostile user hands it: pre-tokenizer options that silently wrote an
empty dataset or read a whole file into one tokenizer batch, source flags the source kind did not
read, a cut .jsonl.gz, a pre-tokenized validation split too small for one round of ranks x batch,
which crashed the first validation mid-run, and a data seed that did nothing or crashed in NumPy."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parallax_titan.config import ConfigError, load_config
from parallax_titan.data import build_dataloader, build_validation_dataloader
from parallax_titan.data import pretokenize as pt
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH
from scripts.pretokenize import main as cli
from tests._output_folders import refused_output
from tests.test_bad_data import truncated_gzip
from tests.test_pretokenize import corpus_docs, write_jsonl
from tests.test_pretokenized import config_argv, job


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


def hub_layout(root, texts) -> str:
    """A Hugging Face dataset repository's layout (README config ``default``, split ``en``, parquet)."""
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.table({"content": texts}), root / "data" / "part-0.parquet")
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: en\n    path: data/*.parquet\n---\n")
    return str(root)


@pytest.mark.parametrize("kind, flag, value", [
    ("embedded", "--path", "/data/my_corpus"),  # tokenized the embedded corpus, recorded this path as the source
    ("local", "--split", "validation"),
    ("local", "--name", "default"),
    ("local", "--revision", "v2"),
    ("embedded", "--revision", "v2"),
    ("hub", "--docs-per-shard", "3"),  # one unit per hub file whatever the flag
])
def test_source_flags_the_source_does_not_read_are_refused(tmp_path, source, capsys, kind, flag, value):
    """These were dropped without a word and the run exited 0 (the manifest recorded them as the source);
    now a usage error (exit 2) before the source is read."""
    path = {"embedded": [], "local": ["--path", source.path],
            "hub": ["--path", hub_layout(tmp_path / "repo", corpus_docs(6)), "--name", "default", "--split", "en"]}
    argv = ["--source", kind, *path[kind], "--tokenizer", TINY_TOKENIZER_PATH, "--out", str(tmp_path / "out"),
            "--no-progress", flag, value]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}: " in err and value in err and f"is not read by --source {kind}" in err
    assert not (tmp_path / "out").exists()


def test_truncated_gzip_source_is_named_not_a_traceback(tmp_path, capsys):
    """Planning counts each file's records: a cut .jsonl.gz raised gzip's EOFError out of the
    command, a traceback naming no file."""
    path, _ = truncated_gzip(tmp_path / "cut.jsonl.gz")
    argv = ["--source", "local", "--path", path, "--tokenizer", TINY_TOKENIZER_PATH, "--out", str(tmp_path / "out"),
            "--no-progress"]
    assert cli(argv) == 1
    err = capsys.readouterr().err
    assert f"error: data file {path!r} cannot be read to its end (Compressed file ended" in err
    assert "truncated or corrupt" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_data_seed_outside_64_bits_is_refused_before_the_first_batch(small, tmp_path, seed):
    """It passed the config and the loader build, then the first batch failed in NumPy
    (OverflowError: Python integer -1 out of bounds for uint64), after the model was built."""
    message = rf"training\.data_seed: expected an integer in \[0, 2\*\*64\), got {seed}$"
    with pytest.raises(ConfigError, match=message):
        load_config(config_argv(tmp_path, "--training.dataset_path", small, f"--training.data_seed={seed}"))
    config = job(small, batch=1)
    config.training.data_seed = seed
    with pytest.raises(ValueError, match=message):
        build_dataloader(1, 0, None, config)
    config.training.data_seed = 2**64 - 1
    next(iter(build_dataloader(1, 0, None, config)))


def test_data_seed_with_a_text_dataset_is_refused(tmp_path):
    """Only the pre-tokenized order reads it: a text dataset trained on the same order whatever the
    seed, so runs meant to differ in their data did not."""
    argv = ["--job.config_file", "configs/test_cpu_2rank.toml", "--job.dump_folder", str(tmp_path),
            "--training.dataset", "default_corpus"]
    load_config(argv)
    with pytest.raises(ConfigError, match=r"training\.data_seed = 7: only dataset = 'pretokenized' is shuffled by it; "
                                          r"'default_corpus' is read in its stored order"):
        load_config([*argv, "--training.data_seed", "7"])
