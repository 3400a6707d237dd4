"""Run a test module's Triton kernels under the CPU interpreter in child processes (test helper).

``TRITON_INTERPRET`` must be set before Triton is imported, so the kernels run in fresh
interpreters: ``run_interpreted("tests.test_x", out_dir, parts)`` starts ``parts`` children at once;
each imports the module, takes its ``_interpret_jobs()`` (callables that each return a dict of
results), runs every ``parts``-th of them and saves what they return; the parent merges the dicts.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300


def run_interpreted(module: str, out_dir, parts: int = 1) -> dict:
    """``module._interpret_jobs()`` under ``TRITON_INTERPRET=1``, dealt round-robin to ``parts`` child
    processes that run at the same time; the union of their results."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    out_dir = Path(out_dir)
    children = []
    for part in range(parts):
        path, log = out_dir / f"part{part}.pt", open(out_dir / f"part{part}.log", "w+")
        code = f"from tests._interpret import run_part; run_part({module!r}, {str(path)!r}, {part}, {parts})"
        children.append((path, log, subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                                                     stdout=log, stderr=subprocess.STDOUT)))
    results = {}
    try:
        for path, log, child in children:
            child.wait(timeout=TIMEOUT_S)
            log.seek(0)
            assert child.returncode == 0, log.read()[-4000:]
            results.update(torch.load(path))
    finally:
        for _, log, child in children:
            child.kill()
            log.close()
    return results


def run_part(module: str, out_path: str, part: int, parts: int) -> None:
    """Child side of ``run_interpreted``: jobs ``part``, ``part + parts``, ... of the module's
    ``_interpret_jobs()``; their merged results saved to ``out_path``."""
    results = {}
    for job in importlib.import_module(module)._interpret_jobs()[part::parts]:
        results.update(job())
    torch.save(results, out_path)


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1.0) -> float:
    """||a - b|| / max(||b||, floor) in fp64; the floor keeps exactly-zero gradients (L = 1, window 1)
    comparable: measured against the problem's scale instead."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(floor)).item()
