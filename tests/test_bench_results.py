"""scripts.bench.results: the header every results page opens with, its command, the page writer, and
the counts the benchmarks' command lines take (positive_int)."""

import json
import re
import shlex

import pytest
import torch

from scripts.bench.results import command_line, describe, gpu_description, header, table, write_results

ARGV = ["parallax", "--extra", "--compile.no-enable --training.seq_len 2048", "--out", "/tmp/a b"]


def test_command_line_reproduces_the_arguments_through_the_shell():
    command = command_line("scripts.bench.train", ARGV)
    assert command.startswith("python -m scripts.bench.train parallax --extra ")
    assert shlex.split(command) == ["python", "-m", "scripts.bench.train", *ARGV]


def test_header_names_what_where_which_versions_how_and_when():
    meta = describe("Training throughput", "tokens/s of parallax", command_line("scripts.bench.train", ARGV))
    text = header(meta)
    lines = text.splitlines()
    assert lines[0] == "# Training throughput" and lines[2] == "Measured: tokens/s of parallax"
    assert f"- Command (from the repository root): `{meta['command']}`" in lines
    software = next(line for line in lines if line.startswith("- Software: "))
    for name, version in (("torch", torch.__version__), ("CUDA", meta["cuda"]), ("Python", meta["python"])):
        assert f"{name} {version}" in software
    assert re.fullmatch(r"- Date: \d{4}-\d\d-\d\d \d\d:\d\d UTC", lines[-2])
    assert text.endswith("\n\n")  # the body starts after a blank line
    if not torch.cuda.is_available():
        assert meta["gpu"].startswith("none (CPU") and meta["cuda"] in (torch.version.cuda, "none (CPU build of torch)")


def test_gpu_description_counts_each_model(monkeypatch):
    names = ["NVIDIA H200", "NVIDIA H100", "NVIDIA H200"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: names[i])
    assert gpu_description() == "NVIDIA H200 x 2, NVIDIA H100 x 1"


def test_table_lines():
    assert table(["a", "b"], [(1, "x"), (2.5, None)]) == ["| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | None |"]
    assert table(["a"], []) == ["| a |", "|---|"]


def test_write_results_writes_the_page_and_its_json(tmp_path):
    meta = describe("Title", "what", "python -m scripts.bench.x")
    prefix = str(tmp_path / "new_folder" / "page")
    text = write_results(prefix, meta, "body\n", {"rows": [1, 2]})
    assert text == header(meta) + "body\n" == (tmp_path / "new_folder" / "page.md").read_text()
    assert json.loads((tmp_path / "new_folder" / "page.json").read_text()) == {"meta": meta, "rows": [1, 2]}
    write_results(str(tmp_path / "md_only"), meta, "body\n")
    assert (tmp_path / "md_only.md").is_file() and not (tmp_path / "md_only.json").exists()


@pytest.mark.parametrize("module, argv", [
    ("checkpoint", ["--iters", "0"]),
    ("data", ["--copies", "0"]),
    ("data", ["--batches", "-1"]),
    ("generate", ["--new-tokens", "0"]),
    ("gram", ["--rep", "0"]),
    ("attention_profile", ["run", "--dim", "128", "--batch", "0"]),
    ("attention_autotune", ["--rounds", "0"]),
])
def test_benchmark_counts_below_one_are_refused_before_any_work(module, argv, capsys):
    """A count of 0 ran a benchmark (some for minutes on a GPU) and then failed on an empty median
    or wrote a page of nothing; argparse now refuses it, naming the value."""
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"scripts.bench.{module}").main(argv)
    assert info.value.code == 2
    assert f"{argv[-1]!r}: expected an int >= 1" in capsys.readouterr().err
