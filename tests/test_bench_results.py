"""scripts.bench.results: the header every results page opens with, its command, the page writer, and
the counts the benchmarks' command lines take (positive_int)."""

import json
import os
import re
import shlex

import pytest
import torch

from scripts.bench.results import command_line, describe, gpu_description, header, table, write_results
from tests._output_folders import full_disk

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
    ("generate", ["--batches", "0"]),
    ("optimizers", ["--iters", "0"]),
    ("optimizers", ["--micro", "-1"]),
    ("trace_summary", ["trace.json", "--top", "0"]),
    ("train", ["parallax", "--steps", "0"]),
    ("train", ["parallax", "--ngpu", "0"]),
    ("train", ["parallax", "--local-batch", "0"]),
    ("train", ["parallax", "--run-timeout", "0"]),
])
def test_benchmark_counts_below_one_are_refused_before_any_work(module, argv, capsys):
    """A count of 0 ran a benchmark (some for minutes on a GPU) and then failed on an empty median
    or wrote a page of nothing; argparse now refuses it, naming the value. (--run-timeout 0 stopped
    every training run at once; --top -1 dropped the last kernel of the table.)"""
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"scripts.bench.{module}").main(argv)
    assert info.value.code == 2
    assert f"{argv[-1]!r}: expected an int >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("module, argv, option", [
    ("gram", ["--shapes", "5"], "--shapes"),
    ("gram", ["--shapes", "0,-1"], "--shapes"),
    ("attention", ["--shapes", "4"], "--shapes"),
    ("attention", ["--shapes", "-1"], "--shapes"),
    ("attention", ["--methods", "softmax_cudnn,parallax_our"], "--methods"),
    ("generate", ["--variants", "parallax,transfomer"], "--variants"),
    ("optimizers", ["--flavor", "7B"], "--flavor"),
    ("mad_step", ["--mixers", "attention,parallx"], "--mixers"),
    ("mad_step", ["--config", "no_such.toml"], "--config"),
    ("mad_step", ["--device", f"cuda:{torch.cuda.device_count()}"], "--device"),
])
def test_benchmark_names_and_indices_are_refused_before_any_work(module, argv, option, capsys, tmp_path):
    """A negative index counted from the end of the list, a large one failed after the GPU check; a
    misspelt name was dropped without a word (--methods) or failed only when its turn came, after the
    earlier rows were timed."""
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"scripts.bench.{module}").main([*argv, "--out", str(tmp_path / "page")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert option in err and argv[-1].split(",")[-1] in err
    assert not list(tmp_path.iterdir())


def test_a_page_that_fails_to_write_leaves_the_earlier_one(tmp_path):
    """A benchmark rewrites its page after every row: a write cut short (a full disk, a kill) left a
    page and JSON holding part of the new text."""
    meta = describe("Title", "what", "python -m scripts.bench.x")
    prefix = str(tmp_path / "page")
    write_results(prefix, meta, "first\n", {"rows": [1]})
    before = {name: (tmp_path / name).read_text() for name in ("page.md", "page.json")}
    with full_disk(len(before["page.json"]) + 100), pytest.raises(OSError):
        write_results(prefix, meta, "x" * 10_000 + "\n", {"rows": list(range(10_000))})
    assert {name: (tmp_path / name).read_text() for name in os.listdir(tmp_path)} == before


@pytest.mark.parametrize("module, argv, message", [
    ("attention_profile", ["run", "--dim", "100"], "argument --dim: invalid choice: 100"),
    ("attention_profile", ["profile", "--out-dir", "o", "--dims", "128", "32"], "argument --dims: invalid choice: 32"),
    ("attention_profile", ["run", "--dim", "128", "--hq", "16", "--hkv", "5"], "--hq 16 is not a multiple of --hkv 5"),
    ("kernel_resources", ["--d", "128", "100"], "argument --d: invalid choice: 100"),
])
def test_kernel_benchmark_shapes_the_kernels_lack_are_refused(module, argv, message, capsys):
    """A head dim without a shipped Hopper config was a KeyError once the earlier rows had compiled (for
    minutes), another a compile error; query heads that do not group over the key heads failed inside
    the profiled run."""
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"scripts.bench.{module}").main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_a_benchmark_without_options_refuses_arguments(capsys):
    """scripts.bench.scale took no arguments and ignored any: --flavor 1.7B printed the fixed tables."""
    from scripts.bench import scale

    with pytest.raises(SystemExit) as info:
        scale.main(["--flavor", "1.7B"])
    assert info.value.code == 2 and "unrecognized arguments: --flavor 1.7B" in capsys.readouterr().err
