"""What every benchmark's results page carries, and the one writer of pages and their JSON.

A page opens with a header: what was measured, the hardware and software it ran on (GPU, torch,
triton, CUDA, Python), the command that reproduces it from the repository root, and the date.
``describe`` gathers that once into a ``meta`` dict; ``header`` renders it as markdown;
``write_results`` writes ``PREFIX.md`` (header + body) and ``PREFIX.json`` (``{"meta": ..., **data}``),
each whole (a benchmark that rewrites its page after every row, killed or out of disk space mid-write,
leaves the earlier page, not a cut one).
``positive_int`` is the benchmarks' argparse type for counts and sizes; ``add_batch_arguments`` and
``require_cuda`` are the shape options and the GPU check of the per-layer kernel benchmarks.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
from pathlib import Path
from typing import Iterable, Sequence

from parallax_titan.atomic import write_text


def positive_int(text: str) -> int:
    """An int >= 1 (argparse type); anything else is an argparse error naming the text."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an int >= 1")
    return int(text)


def add_batch_arguments(ap: argparse.ArgumentParser) -> None:
    """``--batch`` (local batch, default 4) and ``--seq-len`` (tokens per sequence, default 4096): the
    0.6B training step's shapes, as ``scripts.bench.train`` runs them."""
    ap.add_argument("--batch", type=positive_int, default=4, help="local batch (default 4, bench_train's)")
    ap.add_argument("--seq-len", type=positive_int, default=4096, help="tokens per sequence (default 4096)")


def require_cuda(module: str) -> None:
    """SystemExit naming ``module`` unless a CUDA GPU is visible (the benchmark times kernels on it)."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"{module} needs a CUDA GPU")


def command_line(module: str, argv: Sequence[str]) -> str:
    """The shell command that reruns ``python -m module`` with the arguments ``argv`` (a list of str)."""
    return shlex.join(["python", "-m", module, *argv])


def gpu_description() -> str:
    """The visible GPUs, e.g. ``"NVIDIA H200 x 2"``; without CUDA, ``"none (CPU, N cores)"``.

    Reads the device properties only (no tensor is allocated), so a benchmark that launches its
    runs as subprocesses can call it without taking memory on the GPUs they train on."""
    import torch

    if not torch.cuda.is_available():
        return f"none (CPU, {os.cpu_count()} cores)"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return ", ".join(f"{name} x {names.count(name)}" for name in dict.fromkeys(names))


def software_versions() -> dict[str, str]:
    """Versions of torch, triton, CUDA (the one torch was built with) and Python, as strings."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {"torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda or "none (CPU build of torch)", "python": platform.python_version()}


def describe(title: str, measured: str, command: str) -> dict[str, str]:
    """The ``meta`` of a results page: its title, what was measured, the reproducing command, the
    GPU (``gpu_description``), the software versions and the UTC date, all strings."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"title": title, "measured": measured, "command": command, "gpu": gpu_description(),
            **software_versions(), "date": date}


def header(meta: dict[str, str]) -> str:
    """The markdown header of a results page from ``describe``'s ``meta``; ends with a blank line."""
    return "\n".join([
        f"# {meta['title']}", "",
        f"Measured: {meta['measured']}", "",
        f"- Hardware: {meta['gpu']}",
        f"- Software: torch {meta['torch']}, triton {meta['triton']}, CUDA {meta['cuda']}, Python {meta['python']}",
        f"- Command (from the repository root): `{meta['command']}`",
        f"- Date: {meta['date']}", "", ""])


def table_row(cells: Sequence[object]) -> str:
    """One markdown table line of ``cells`` (each written with str)."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table as lines: the column names, the separator, one ``table_row`` per row."""
    return [table_row(columns), "|" + "---|" * len(columns), *map(table_row, rows)]


def write_results(prefix: str, meta: dict[str, str], body: str, data: dict | None = None) -> str:
    """Write ``prefix``.md (``header(meta)`` then ``body``) and, given ``data``, ``prefix``.json
    (``{"meta": meta, **data}``), each whole (:func:`parallax_titan.atomic.write_text`), the page
    last; make the folder if needed; return the markdown."""
    text = header(meta) + body
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    if data is not None:
        write_text(prefix + ".json", json.dumps({"meta": meta, **data}, indent=1))
    write_text(prefix + ".md", text)
    return text


def write_result_page(prefix: str, result: dict, lines: Sequence[str]) -> str:
    """``write_results`` for a benchmark's ``result`` dict (its ``"meta"`` plus the data): the body is
    ``lines`` joined, the JSON every other entry of ``result``; returns the markdown."""
    data = {key: value for key, value in result.items() if key != "meta"}
    return write_results(prefix, result["meta"], "\n".join(lines) + "\n", data)
