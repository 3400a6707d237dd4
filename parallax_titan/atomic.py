"""Files written whole: after a failure or a kill, a reader finds the earlier file or the complete new
one, never a part of it (checkpoint metadata, data manifests, evaluation results; a truncated JSONL
would be read as fewer documents or runs)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends
    without an error, removed when it raises. Hidden (a leading dot) and with another suffix, so
    that no reader takes it for ``path`` while it is written."""
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.partial-{os.getpid()}")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole (:func:`replacing`), flushed to disk before the rename."""
    with replacing(path) as temporary, open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def finite_or_null(value):
    """``value`` (nested dicts, lists, floats) with every NaN or inf float as None: strict JSON
    readers (jq, JSON.parse) refuse the bare NaN that Python's json writes."""
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: str, value, indent: int | None = None) -> None:
    """Write ``value`` to ``path`` whole (:func:`write_text`) as strict JSON, a NaN or inf as null
    (:func:`finite_or_null`)."""
    write_text(path, json.dumps(finite_or_null(value), indent=indent, allow_nan=False))
