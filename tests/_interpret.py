"""Run a test module's Triton kernels under the CPU interpreter in a child process (test helper).

``TRITON_INTERPRET`` must be set before Triton is imported, so the kernels run in a fresh
interpreter: ``run_interpreted("tests.test_x", path)`` imports the module there and calls its
``_interpret_main(path)``, which saves its results to ``path``; the results are loaded here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def run_interpreted(module: str, out_path) -> dict:
    """``module._interpret_main(out_path)`` under ``TRITON_INTERPRET=1``; its saved results."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    code = f"import {module} as m; m._interpret_main({str(out_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out_path)


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1.0) -> float:
    """||a - b|| / max(||b||, floor) in fp64; the floor keeps exactly-zero gradients (L = 1, window 1)
    comparable: measured against the problem's scale instead."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(floor)).item()
