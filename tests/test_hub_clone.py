"""Local clones of Hugging Face dataset repositories: the asked split is read from the files the
README declares for it, whether or not the other splits were downloaded, in the order and with the
records `datasets` gives for a complete clone; bad clones are refused naming the option."""

from __future__ import annotations

import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import load_dataset

from parallax_titan.config import ConfigError, load_config
from parallax_titan.data import pretokenize as pt
from parallax_titan.data.hub_clone import is_hub_id, load_split, split_files
from parallax_titan.data.text import load_ultrafineweb
from parallax_titan.spec import register_all

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")
README = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: en\n    path: data/en/*.parquet\n"
          "  - split: zh\n    path: data/zh/*.parquet\n---\n# a miniature Ultra-FineWeb\n")
register_all()


def clone(root, with_zh: bool, readme: str = README):
    """Two English parquet files (written out of name order) and, if ``with_zh``, one Chinese."""
    (root / "data" / "en").mkdir(parents=True)
    for name, texts in (("part-1.parquet", ["c", "d"]), ("part-0.parquet", ["a", "b"])):
        pq.write_table(pa.table({"content": texts, "score": [0.5] * len(texts)}), root / "data" / "en" / name)
    if with_zh:
        (root / "data" / "zh").mkdir()
        pq.write_table(pa.table({"content": ["zh"], "score": [0.5]}), root / "data" / "zh" / "part-0.parquet")
    (root / "README.md").write_text(readme)
    return str(root)


def test_a_complete_clone_reads_as_datasets_reads_it(tmp_path):
    root = clone(tmp_path, with_zh=True)
    ours = list(load_split(root, "default", "en", "--path"))
    theirs = list(load_dataset(root, name="default", split="en", streaming=True))
    assert ours == theirs and [r["content"] for r in ours] == ["a", "b", "c", "d"]
    assert load_split(root, "default", "en", "--path").num_shards == 2


def test_a_clone_with_only_the_english_files_is_read(tmp_path):
    """`datasets` refuses the config when a declared split matches no file (the documented
    `--include` download of the English files only)."""
    root = clone(tmp_path, with_zh=False)
    with pytest.raises(ValueError):
        list(load_dataset(root, name="default", split="en", streaming=True))
    assert [r["content"] for r in load_ultrafineweb(root)] == ["a", "b", "c", "d"]


@pytest.mark.parametrize("readme,config,split,message", [
    (None, "default", "en", r"--path = '.*': no README.md declaring configs"),
    ("---\nlicense: mit\n---\n", "default", "en", r"no README.md declaring configs"),
    (README, "other", "en", r"README.md declares no config 'other'; it declares \['default'\]"),
    (README, "default", "fr", r"config 'default' declares no split 'fr'"),
    (README, "default", "zh", r"no file matches split 'zh' of config 'default' \(\['data/zh/\*.parquet'\]\)"),
    # a README.md that is not the hub's format: tracebacks (yaml's ParserError, AttributeError, TypeError)
    ("---\nconfigs: [default\n---\n", "default", "en", r"README.md has metadata that cannot be read \(ParserError"),
    ("---\nconfigs: default\n---\n", "default", "en", r"README.md's configs is 'default'; expected a list of configs"),
    (README[:README.index("  data_files:")] + "  data_files: 5\n---\n", "default", "en",
     r"README.md's config 'default': data_files is 5; expected a path pattern, a list of them, or a list of"),
    # a pattern out of the clone read the files beside it
    (README.replace("path: data/en/", "path: ../*/data/en/"), "default", "en",
     r"README.md's config 'default': path pattern '\.\./\*/data/en/\*\.parquet' reaches outside the clone"),
])
def test_bad_clones_are_refused_naming_the_option(tmp_path, readme, config, split, message):
    root = clone(tmp_path, with_zh=False, readme=readme or "")
    if readme is None:
        os.remove(os.path.join(root, "README.md"))
    with pytest.raises(ValueError, match=message):
        split_files(root, config, split, "--path")


def test_mixed_formats_in_one_split_are_refused(tmp_path):
    root = clone(tmp_path, with_zh=False, readme=README.replace("data/en/*.parquet", "data/en/*"))
    (tmp_path / "data" / "en" / "extra.jsonl").write_text('{"content": "e"}\n')
    with pytest.raises(ValueError, match=r"split 'en' mixes file formats \['json', 'parquet'\]"):
        split_files(root, "default", "en", "--path")


def test_data_files_without_split_names_are_split_train_and_one_config_is_the_default(tmp_path):
    readme = "---\nconfigs:\n- config_name: only\n  data_files: data/en/*.parquet\n---\n"
    root = clone(tmp_path, with_zh=False, readme=readme)
    assert [os.path.basename(f) for f in split_files(root, None, "train", "--path")] == ["part-0.parquet",
                                                                                          "part-1.parquet"]
    with pytest.raises(ValueError, match="declares no split 'en'"):
        split_files(root, None, "en", "--path")


def test_hub_ids_and_folders_are_told_apart(tmp_path):
    assert is_hub_id("openbmb/Ultra-FineWeb") and is_hub_id("org/name.v2")
    assert not any(is_hub_id(p) for p in ("/data/Ultra-FineWeb", "./a/b", "a/b/c", "~/x", "name"))


@pytest.mark.parametrize("path,message", [
    ("/nonexistent/Ultra-FineWeb", r"training.dataset_path = '/nonexistent/Ultra-FineWeb': no such folder; "
                                   r"expected a local clone of openbmb/Ultra-FineWeb or a hub dataset id"),
    ("{empty}", r"training.dataset_path = '.*': no README.md declaring configs"),
    ("{zh_only}", r"training.dataset_path = '.*': no file matches split 'en' of config 'default'"),
])
def test_config_refuses_an_ultrafineweb_path_that_cannot_be_read(tmp_path, path, message):
    """Before any work: the loader would fail at its build, inside `datasets`."""
    (tmp_path / "empty").mkdir()
    zh_only = tmp_path / "zh_only"
    (zh_only / "data" / "zh").mkdir(parents=True)
    pq.write_table(pa.table({"content": ["zh"]}), zh_only / "data" / "zh" / "part-0.parquet")
    (zh_only / "README.md").write_text(README)
    path = path.format(empty=tmp_path / "empty", zh_only=zh_only)
    with pytest.raises(ConfigError, match=message):
        load_config(["--job.config_file", DEMO, "--training.dataset", "ultrafineweb", "--training.dataset_path", path])


def test_config_takes_a_partial_clone_and_a_hub_id(tmp_path):
    for path in (clone(tmp_path, with_zh=False), "openbmb/Ultra-FineWeb"):
        load_config(["--job.config_file", DEMO, "--training.dataset", "ultrafineweb", "--training.dataset_path", path])


def test_pretokenizer_reads_a_partial_clone_and_refuses_a_revision_for_it(tmp_path):
    root = clone(tmp_path / "clone", with_zh=False)
    spec = pt.SourceSpec("hub", root, name="default", split="en")
    assert [u["num_shards"] for u in pt.plan_units(spec, pt.Options())] == [2, 2]
    with pytest.raises(ValueError, match=r"--revision: 'v1' is not read from a local clone"):
        pt.check_source(pt.SourceSpec("hub", root, name="default", split="en", revision="v1"), pt.Options())


def test_a_file_cut_short_in_a_clone_is_named_before_anything_is_read(tmp_path):
    """An interrupted download left a parquet file without its footer: the config check passed, and
    training stopped at that file mid-run (after the files before it) with Arrow's error; the
    pre-tokenizer with a traceback, after tokenizing the files before it."""
    root = clone(tmp_path / "clone", with_zh=False)
    part = tmp_path / "clone" / "data" / "en" / "part-1.parquet"
    os.truncate(part, part.stat().st_size // 2)
    message = re.escape(f" = '{root}': data file '{part}' is not a readable parquet file (Parquet magic bytes")
    with pytest.raises(ConfigError, match=rf"training\.dataset_path{message}"):
        load_config(["--job.config_file", DEMO, "--training.dataset", "ultrafineweb", "--training.dataset_path", root])
    spec = pt.SourceSpec("hub", root, name="default", split="en")
    with pytest.raises(ValueError, match=rf"--path{message}"):
        pt.plan_units(spec, pt.Options())
