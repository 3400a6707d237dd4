"""Output paths that a command writing a whole folder must refuse before its work."""

from __future__ import annotations

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
