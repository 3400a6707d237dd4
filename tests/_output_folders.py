"""Output paths that a command writing a whole folder must refuse before its work."""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path


def refused_output(tmp_path: Path, layout: str, users_file: str = "", text: str = "") -> Path:
    """``tmp_path/out`` laid out as ``layout``: ``"file"`` (a file there), ``"under_file"`` (a path
    below a file), or ``"foreign"`` (a folder of the user's: ``users_file`` holding ``text``, and
    notes.txt)."""
    out = tmp_path / "out"
    if layout == "foreign":
        out.mkdir()
        (out / users_file).write_text(text)
        (out / "notes.txt").write_text("keep")
        return out
    out.write_text("a file")
    return out / "sub" if layout == "under_file" else out


@contextlib.contextmanager
def full_disk(limit_bytes: int):
    """Within the block, no file of this process may grow beyond ``limit_bytes`` (a full disk: Python
    ignores SIGXFSZ, so a write past it fails with EFBIG, as ENOSPC would)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
