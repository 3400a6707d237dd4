"""Data fed what a careless or hostile user hands it: pre-tokenizer options that silently wrote an
empty dataset or read a whole file into one tokenizer batch, source flags the source kind did not
read, a cut .jsonl.gz, a pre-tokenized validation split too small for one round of ranks x batch,
which crashed the first validation mid-run, and a data seed that did nothing or crashed in NumPy."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parallax_titan.config import ConfigError, load_config
from parallax_titan.data import build_dataloader, build_validation_dataloader, check_dataset_config
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
    ("hub", "--max-record-bytes", "100"),  # `datasets` reads the records: every line taken, the cap recorded
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


def _shards(manifest):
    return manifest["splits"]["train"]["shards"]


def _in_place(edit):
    """``edit`` (which changes the manifest it is given) as a function returning the manifest."""
    return lambda manifest: (edit(manifest), manifest)[1]


@pytest.mark.parametrize("edit, message", [
    (lambda m: [m], r"holds a JSON list; expected the object"),
    (lambda m: {**m, "tokenizer": "qwen3"}, r"tokenizer is 'qwen3'; expected an object with the sha256"),
    (lambda m: {**m, "splits": ["train"]}, r"splits is \['train'\]; expected an object of splits"),
    (lambda m: {**m, "splits": {"train": {"tokens": 5}}}, r"splits\.train\.shards is None; expected a list"),
    (lambda m: {**m, "dtype": "<u2"}, r"dtype is '<u2'; expected '<u4'"),  # was read as uint32 all the same
    (_in_place(lambda m: _shards(m)[0].pop("bin_sha256")), r"splits\.train\.shards\[0\] has no 'bin_sha256'"),
    (_in_place(lambda m: _shards(m)[0].update(tokens=-1)), r"splits\.train\.shards\[0\] tokens is -1; expected an"),
    (_in_place(lambda m: _shards(m)[0].update(tokens=float(_shards(m)[0]["tokens"]))), r"tokens is \d+\.0; expected"),
    (_in_place(lambda m: _shards(m)[0].update(unit="../validation/00000")),  # a path: another folder's files
     r"splits\.train\.shards\[0\] unit is '\.\./validation/00000'; expected a file name in the split's folder"),
    (_in_place(lambda m: _shards(m).append(dict(_shards(m)[0]))),  # trained on twice per epoch, without a word
     r"splits\.train\.shards\[1\]: unit '00000' is listed twice; expected each shard once"),
], ids=["list", "tokenizer", "splits", "shards", "dtype", "sha", "negative", "float", "path", "twice"])
def test_malformed_manifest_is_named_at_config(small, tmp_path, edit, message):
    """A hand-edited manifest.json gave KeyError, TypeError or AttributeError tracebacks out of the
    config check, or was taken as it stood: a shard listed twice, a unit path reading another
    folder's shard, another dtype."""
    path = tmp_path / "data"
    shutil.copytree(small, path)
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps(edit(manifest)))
    where = re.escape(f"training.dataset_path: {path}/manifest.json ")
    with pytest.raises(ValueError, match=rf"^{where}.*{message}"):
        check_dataset_config(job(str(path)).training, "training", tokenizer_path=TINY_TOKENIZER_PATH)


@pytest.mark.parametrize("entry, kind", [
    ("manifest.json", "folder"), ("plan.json", "folder"), ("shards/00000.json", "folder"),
    ("train/00000.bin", "folder"), ("validation/00000.idx", "folder"), ("shards", "file"), ("train", "file"),
])
def test_out_with_a_folder_where_a_file_goes_is_refused_before_any_work(tmp_path, source, capsys, entry, kind):
    """The rename of the file over the folder (or the write into a file taken for a folder) failed
    with IsADirectoryError, NotADirectoryError or FileExistsError tracebacks naming no flag, once a
    unit was tokenized (manifest.json: once all of them were)."""
    out = tmp_path / "out"
    target = out / entry
    target.parent.mkdir(parents=True)
    if kind == "folder":
        target.mkdir()
    else:
        target.write_text("x")
    assert cli(cli_args(tmp_path, source)) == 1
    err = capsys.readouterr().err
    assert f"error: --out: {str(target)!r} is a {kind}; expected the {'file' if kind == 'folder' else 'folder'} of " \
           "that name a pre-tokenization writes, or none; nothing was written" in err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == sorted({entry, os.path.dirname(entry)} - {""})


@pytest.mark.parametrize("text, message", [
    ("", r"plan\.json is not valid JSON \(Expecting value"),
    ("[1, 2]", r"plan\.json holds a JSON list"),  # was an AttributeError traceback
], ids=["empty", "list"])
def test_plan_that_is_not_a_plan_is_named(small, tmp_path, source, text, message):
    out = tmp_path / "data"
    shutil.copytree(small, out)
    (out / "plan.json").write_text(text)
    with pytest.raises(ValueError, match=rf"^--out: {re.escape(str(out))}/{message}.*expected the plan an earlier "
                                         r"run wrote"):
        pt.pretokenize(source, str(out), TINY_TOKENIZER_PATH, pt.Options(validation_fraction=0.25), progress=False)


@pytest.mark.parametrize("edit, reason", [
    (lambda u: u["splits"]["train"].pop("bin_sha256"), "its train shard has no 'bin_sha256'"),
    (lambda u: u.pop("bad_records"), "its bad_records is None"),
    (lambda u: u.update(unit="00007"), "it names unit '00007'"),
], ids=["sha", "bad_records", "unit"])
def test_unit_manifest_with_a_malformed_entry_is_done_again(small, tmp_path, source, caplog, edit, reason):
    """A unit manifest whose input and shard sizes matched was taken as finished whatever its other
    entries: without bad_records the final manifest raised KeyError after every unit was done;
    without a checksum it was written as the dataset's, and training raised KeyError."""
    out = tmp_path / "data"
    shutil.copytree(small, out)
    unit = json.loads((out / "shards" / "00000.json").read_text())
    edit(unit)
    (out / "shards" / "00000.json").write_text(json.dumps(unit))
    with caplog.at_level(logging.WARNING):
        manifest = pt.pretokenize(source, str(out), TINY_TOKENIZER_PATH, pt.Options(validation_fraction=0.25),
                                  progress=False)
    assert f"unit 00000 is done again: {reason}" in caplog.text
    assert manifest == json.loads((pathlib.Path(small) / "manifest.json").read_text())
    check_dataset_config(job(str(out)).training, "training", tokenizer_path=TINY_TOKENIZER_PATH)
