"""Imports go one way: kernels -> optimizers -> parallax_titan -> eval -> entry points (train.py, scripts).

Read from the source with ``ast`` (every import, also those inside functions), so a lazy import
cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# package -> packages of ours it may import from (besides itself)
ALLOWED = {
    "kernels": set(),
    "optimizers": {"kernels"},
    "parallax_titan": {"kernels", "optimizers"},
    "eval": {"kernels", "optimizers", "parallax_titan"},
    "scripts": {"kernels", "optimizers", "parallax_titan", "eval"},
}
OURS = {*ALLOWED, "train", "tests"}


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, a module of ``package``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                found.append((node.lineno, ".".join([*base, node.module] if node.module else base)))
            else:
                found.append((node.lineno, node.module))
    return found


def layer_violations(layer: str, source: str, package: str) -> list[str]:
    """Imports in ``source`` (a module of ``layer``) of our packages that ``layer`` may not use."""
    return [f"line {line}: {module}" for line, module in imported_modules(source, package)
            if module.split(".")[0] in OURS - {layer} - ALLOWED[layer]]


def python_files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).parts[:-1])


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below(layer):
    bad = {str(p.relative_to(REPO)): v for p in python_files(layer)
           if (v := layer_violations(layer, p.read_text(encoding="utf-8"), package_of(p)))}
    assert bad == {}


def test_nothing_imports_the_training_entry_point():
    files = [p for folder in (*ALLOWED, "tests") for p in python_files(folder)] + [REPO / "train.py"]
    importers = [f"{p.relative_to(REPO)}:{line}" for p in files
                 for line, module in imported_modules(p.read_text(encoding="utf-8"), package_of(p))
                 if module.split(".")[0] == "train"]
    assert importers == []


def test_the_check_sees_lazy_and_relative_imports():
    source = "import torch\n\ndef f():\n    from eval.model import ParallaxLM\n\nfrom .. import train\nfrom .model import x\n"
    assert imported_modules(source, "parallax_titan.config") == [
        (1, "torch"), (6, "parallax_titan"), (7, "parallax_titan.config.model"), (4, "eval.model")]
    assert layer_violations("parallax_titan", source, "parallax_titan.config") == ["line 4: eval.model"]
    assert layer_violations("kernels", "from optimizers import MuonAdamW\n", "kernels") == ["line 1: optimizers"]
    assert layer_violations("eval", "import parallax_titan.model\nimport train\n", "eval") == ["line 2: train"]


def test_no_import_path_edits_outside_conftest():
    """Modules are run from the repository root (``python -m``); nothing edits the import path."""
    needle = ".".join(("sys", "path"))  # spelled so that this file does not match its own search
    files = [p for folder in (*ALLOWED, "tests") for p in python_files(folder)] + [REPO / "train.py"]
    offenders = [str(p.relative_to(REPO)) for p in files
                 if needle in p.read_text(encoding="utf-8") and p.name != "conftest.py"]
    assert offenders == []
