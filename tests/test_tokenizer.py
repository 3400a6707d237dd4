"""Tokenizers: document convention (tokens + one <|endoftext|>, no BOS), assets, errors."""

import hashlib
import json
import os
import filecmp
import re
import shutil
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from parallax_titan.tokenizer import (
    EOS_TOKEN,
    TINY_TOKENIZER_PATH,
    build_tokenizer,
    check_tokenizer_path,
)
from tests._output_folders import full_disk, refused_output

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN3_PATH = os.path.join(ROOT, "assets", "tokenizer", "qwen3")
TEXTS = [
    "To be, or not to be, that is the question:",
    "  leading spaces\n\n\ttabs and\r\nCRLF  ",
    "Unicode: café, naïve, ’quotes’, 你好, emoji 🎭.",
    "",
]


def job(path):
    return SimpleNamespace(model=SimpleNamespace(hf_assets_path=path))


@pytest.fixture(scope="module")
def tiny():
    return build_tokenizer(job(TINY_TOKENIZER_PATH))


def test_tiny_vocab_and_special_ids(tiny):
    assert tiny.get_vocab_size() == 4096
    assert tiny.eos_id == tiny.token_to_id(EOS_TOKEN) == 0
    assert tiny.bos_id is None


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_round_trip_and_one_eos(tiny, text):
    plain = tiny.encode(text, add_bos=False, add_eos=False)
    doc = tiny.encode(text, add_bos=True, add_eos=True)
    assert doc == plain + [tiny.eos_id]
    assert doc.count(tiny.eos_id) == 1
    assert tiny.decode(plain) == text
    assert tiny.decode(doc, skip_special_tokens=False) == text + EOS_TOKEN


def test_literal_special_token_in_text_is_not_eos(tiny):
    text = f"first document{EOS_TOKEN}still the same document"
    doc = tiny.encode(text, add_bos=True, add_eos=True)
    assert doc.count(tiny.eos_id) == 1 and doc[-1] == tiny.eos_id
    assert tiny.decode(doc[:-1]) == text


def test_tokenizer_json_is_parsed_once(monkeypatch):
    """Building the tokenizer parses tokenizer.json once (TorchTitan's loader would parse it again)."""
    parsed = []
    from_file = Tokenizer.from_file
    monkeypatch.setattr(Tokenizer, "from_file", staticmethod(lambda path: parsed.append(path) or from_file(path)))
    tok = build_tokenizer(job(TINY_TOKENIZER_PATH))
    assert parsed == [os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json")]
    assert tok.tokenizer.get_vocab_size() == 4096


def test_eos_enforced_without_config(tmp_path):
    shutil.copy(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), tmp_path)
    tok = build_tokenizer(job(str(tmp_path)))
    assert tok.eos_id == 0 and tok.bos_id is None
    assert tok.encode("abc", add_bos=True, add_eos=True)[-1] == 0


def test_tokenizer_without_endoftext_rejected(tmp_path):
    Tokenizer(models.BPE(vocab={"a": 0}, merges=[])).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"model\.hf_assets_path.*no <\|endoftext\|>"):
        build_tokenizer(job(str(tmp_path)))


@pytest.mark.parametrize("path", [None, "", "/nonexistent/tokenizer/dir"])
def test_missing_path_errors(path):
    with pytest.raises(ValueError, match=r"model\.hf_assets_path.*get_tokenizer\.py") as info:
        build_tokenizer(job(path))
    assert repr(path) in str(info.value)


def test_missing_tokenizer_json_error(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\n")
    with pytest.raises(ValueError, match=r"no tokenizer\.json.*vocab\.txt.*get_tokenizer\.py"):
        check_tokenizer_path(str(tmp_path))
    assert check_tokenizer_path(TINY_TOKENIZER_PATH) == TINY_TOKENIZER_PATH



@pytest.mark.parametrize("layout", ["folder", "broken_link"])
def test_tokenizer_json_that_is_not_a_file_is_named(tmp_path, layout):
    """The message said the folder had no tokenizer.json while listing one among its files."""
    if layout == "folder":
        (tmp_path / "tokenizer.json").mkdir()
    else:
        (tmp_path / "tokenizer.json").symlink_to(tmp_path / "absent.json")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path}/tokenizer.json is a folder or a broken link; "
                                                   "expected the tokenizer file")):
        check_tokenizer_path(str(tmp_path))


@pytest.mark.parametrize("config", ["{not json", "", "[1]", '{"eos_token": 5}', None],
                         ids=["garbage", "empty", "list", "eos_int", "folder"])
def test_unreadable_tokenizer_config_is_named(tmp_path, config):
    """TorchTitan reads tokenizer_config.json after our checks: a bad one stopped the trainer's start
    with a JSONDecodeError, AttributeError, IsADirectoryError or ValueError naming no file."""
    shutil.copy(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), tmp_path)
    if config is None:
        (tmp_path / "tokenizer_config.json").mkdir()
    else:
        (tmp_path / "tokenizer_config.json").write_text(config)
    where = f"model.hf_assets_path = '{tmp_path}': {tmp_path}/tokenizer_config.json cannot be read ("
    with pytest.raises(ValueError, match=rf"^{re.escape(where)}.*\); expected a JSON object whose bos_token and eos_"):
        build_tokenizer(job(str(tmp_path)))

def test_tiny_tokenizer_training_is_deterministic(tmp_path):
    """Training twice on the same text gives the same tokenizer (validation split: fast)."""
    from scripts.build_tiny_tokenizer import train_tokenizer

    corpus = os.path.join(os.path.dirname(TINY_TOKENIZER_PATH), "..", "corpus", "validation.jsonl.gz")
    first, second = (train_tokenizer(corpus, 512).to_str() for _ in range(2))
    assert first == second
    trained = Tokenizer.from_str(first)
    assert trained.get_vocab_size() == 512 and trained.token_to_id(EOS_TOKEN) == 0
    assert isinstance(trained.pre_tokenizer, pre_tokenizers.ByteLevel)


@pytest.mark.slow
def test_committed_tiny_tokenizer_is_reproducible():
    from scripts.build_tiny_tokenizer import DEFAULT_CORPUS, train_tokenizer

    with open(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), encoding="utf-8") as f:
        committed = json.load(f)
    assert json.loads(train_tokenizer(DEFAULT_CORPUS, 4096).to_str()) == committed


# --- the real Qwen3 tokenizer (fetched by scripts/get_tokenizer.py, not committed) ---

qwen3 = pytest.mark.skipif(
    not os.path.isfile(os.path.join(QWEN3_PATH, "tokenizer.json")),
    reason="assets/tokenizer/qwen3 missing: run `python scripts/get_tokenizer.py`",
)
SENTENCE = "The quick brown fox jumps over the lazy dog."
# Pieces of SENTENCE in byte-level BPE ("Ġ" = leading space) and their ids, read
# from the fetched tokenizer.json; checked below against its raw vocab table.
SENTENCE_PIECES = ["The", "Ġquick", "Ġbrown", "Ġfox", "Ġjumps", "Ġover", "Ġthe", "Ġlazy", "Ġdog", "."]
SENTENCE_IDS = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13]


@qwen3
def test_qwen3_file_pinned():
    from scripts.get_tokenizer import TOKENIZER_SHA256, TOKENIZER_SIZE

    with open(os.path.join(QWEN3_PATH, "tokenizer.json"), "rb") as f:
        data = f.read()
    assert len(data) == TOKENIZER_SIZE == 11_422_654
    assert hashlib.sha256(data).hexdigest() == TOKENIZER_SHA256


@qwen3
def test_qwen3_vocab_and_endoftext():
    tok = build_tokenizer(job(QWEN3_PATH))
    assert tok.get_vocab_size() == 151_669
    assert tok.eos_id == tok.token_to_id(EOS_TOKEN) == 151_643
    assert tok.bos_id is None


@qwen3
def test_qwen3_known_sentence():
    with open(os.path.join(QWEN3_PATH, "tokenizer.json"), encoding="utf-8") as f:
        raw = json.load(f)
    vocab = raw["model"]["vocab"]
    assert [vocab[p] for p in SENTENCE_PIECES] == SENTENCE_IDS
    assert {t["content"]: t["id"] for t in raw["added_tokens"]}[EOS_TOKEN] == 151_643
    tok = build_tokenizer(job(QWEN3_PATH))
    ids = tok.encode(SENTENCE, add_bos=True, add_eos=True)
    assert ids == SENTENCE_IDS + [151_643]
    assert tok.decode(ids) == SENTENCE


@pytest.fixture
def no_download(monkeypatch):
    import scripts.build_corpus
    import scripts.get_tokenizer

    def download(*args, **kwargs):
        raise AssertionError("downloaded before the output folder was checked")

    monkeypatch.setattr(scripts.get_tokenizer, "fetch", download)
    monkeypatch.setattr(scripts.build_corpus, "fetch_archive", download)


@pytest.mark.parametrize("layout", ["file", "under_file", "other_tokenizer"])
def test_get_tokenizer_out_dir_is_checked_before_downloading(tmp_path, capsys, no_download, layout):
    """--out-dir a file was a traceback after the 11 MB download; a folder with another tokenizer.json
    (e.g. --out-dir parallax_titan/assets/tokenizer/tiny) had it replaced by Qwen3's."""
    from scripts.get_tokenizer import main

    if layout == "other_tokenizer":
        out = tmp_path / "out"
        shutil.copytree(TINY_TOKENIZER_PATH, out)
    else:
        out = refused_output(tmp_path, layout)
    with pytest.raises(SystemExit) as exit_info:
        main(["--out-dir", str(out)])
    assert exit_info.value.code == 2
    assert "--out-dir" in capsys.readouterr().err
    if layout == "other_tokenizer":
        assert filecmp.cmp(out / "tokenizer.json", os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), shallow=False)


@pytest.mark.parametrize("flag", ["--out-dir", "--download-dir"])
def test_build_corpus_folders_are_checked_before_downloading(tmp_path, capsys, no_download, flag):
    """A file where a folder goes was a traceback (after the downloads, for --out-dir)."""
    from scripts.build_corpus import main

    (tmp_path / "file").write_text("a file")
    with pytest.raises(SystemExit) as exit_info:
        main([flag, str(tmp_path / "file"), *([] if flag == "--out-dir" else ["--out-dir", str(tmp_path / "o")])])
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_get_tokenizer_failed_write_leaves_nothing_the_rerun_refuses(tmp_path, monkeypatch):
    """tokenizer.json was opened at its final path: a write that failed part-way (a full disk, a kill)
    left a part of it, which every rerun then refused as another tokenizer."""
    import scripts.get_tokenizer as get_tokenizer

    with open(os.path.join(TINY_TOKENIZER_PATH, "tokenizer.json"), "rb") as f:
        data = f.read()
    monkeypatch.setattr(get_tokenizer, "fetch", lambda source: (data, "a test"))
    monkeypatch.setattr(get_tokenizer, "TOKENIZER_SHA256", hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(get_tokenizer, "EOS_ID", Tokenizer.from_str(data.decode()).token_to_id(EOS_TOKEN))
    out = tmp_path / "qwen3"
    with full_disk(len(data) // 2), pytest.raises(OSError):
        get_tokenizer.main(["--out-dir", str(out)])
    assert os.listdir(out) == []
    get_tokenizer.main(["--out-dir", str(out)])
    assert (out / "tokenizer.json").read_bytes() == data


@pytest.mark.parametrize("layout", ["foreign", "train_only"])
def test_build_corpus_refuses_a_folder_of_other_data_before_downloading(tmp_path, capsys, no_download, layout):
    """--out-dir a folder of the user's data had its train.jsonl.gz replaced by the corpus."""
    from scripts.build_corpus import main

    out = refused_output(tmp_path, "foreign", "train.jsonl.gz", "the user's data")
    if layout == "train_only":
        (out / "notes.txt").unlink()
    with pytest.raises(SystemExit) as exit_info:
        main(["--out-dir", str(out)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--out-dir" in err and str(out) in err
    assert (out / "train.jsonl.gz").read_text() == "the user's data"


def test_build_corpus_accepts_an_earlier_corpus(tmp_path):
    """Its own output (and a split a killed run left half written) is rewritten."""
    from scripts.build_corpus import check_out_dir

    for name in ("train.jsonl.gz", "validation.jsonl.gz", "SOURCE.md", ".train.jsonl.gz.partial-123"):
        (tmp_path / name).write_text("earlier")
    check_out_dir(str(tmp_path))


def test_build_corpus_failed_write_leaves_the_earlier_split_whole(tmp_path):
    """Each split was opened over the earlier one: a write that failed part-way left a cut gzip
    stream, read as fewer documents or failing part-way through training."""
    from scripts.build_corpus import write_jsonl_gz

    path = str(tmp_path / "train.jsonl.gz")
    docs = [{"content": f"document {i} " + os.urandom(64).hex(), "source": str(i)} for i in range(200)]
    write_jsonl_gz(docs[:10], path)
    with open(path, "rb") as f:
        earlier = f.read()
    with full_disk(len(earlier) + 4096), pytest.raises(OSError):
        write_jsonl_gz(docs, path)
    with open(path, "rb") as f:
        assert f.read() == earlier
    assert os.listdir(tmp_path) == ["train.jsonl.gz"]


@pytest.mark.parametrize("script, name", [("get_tokenizer", "tokenizer.json"), ("get_tokenizer", "SOURCE.md"),
                                          ("build_corpus", "validation.jsonl.gz")])
def test_a_folder_where_an_output_file_goes_is_refused_before_downloading(tmp_path, capsys, no_download, script,
                                                                          name):
    """The rename over it failed with a traceback, after the downloads."""
    import importlib

    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    if script == "build_corpus":
        (out / "train.jsonl.gz").write_text("an earlier split")
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"scripts.{script}").main(["--out-dir", str(out)])
    assert exit_info.value.code == 2 and f"--out-dir: {str(out / name)!r} is a folder" in capsys.readouterr().err
