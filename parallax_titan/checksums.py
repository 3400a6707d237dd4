"""Checksums of a checkpoint's files: a manifest written at save time and checked before a load.

``manifest.json`` in a step folder lists every file of the checkpoint with its size in bytes and a
digest of each ``CHUNK_BYTES`` chunk of it. Chunks let several threads hash one large file (a DCP
``.distcp`` file holds a whole rank's shard) and let a mismatch name the byte range that changed.
The digest is xxh3-128 (``xxhash``, about memory speed); without ``xxhash`` installed, blake2b-128
(hashlib, several times slower). The manifest names its algorithm, and a check uses that one.

Nothing here knows about DCP or ranks: :mod:`parallax_titan.checkpointing` decides which files a
rank hashes and where the manifest goes.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from parallax_titan.atomic import write_text

MANIFEST_FILE = "manifest.json"
CHUNK_BYTES = 64 << 20
FORMAT = 1


def _xxh3_128():
    import xxhash

    return xxhash.xxh3_128()


ALGORITHMS: dict[str, Callable] = {
    "xxh3_128": _xxh3_128,
    "blake2b_128": lambda: hashlib.blake2b(digest_size=16),
}


def default_algorithm() -> str:
    """``"xxh3_128"`` when ``xxhash`` is importable, else ``"blake2b_128"``."""
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return "blake2b_128"
    return "xxh3_128"


def _hasher(algorithm: str):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"checksum algorithm {algorithm!r} is unknown; expected one of {', '.join(ALGORITHMS)}")
    try:
        return ALGORITHMS[algorithm]()
    except ImportError:
        raise ValueError(f"checksum algorithm {algorithm!r} needs the xxhash package (pip install xxhash)") from None


@dataclass(frozen=True)
class FileEntry:
    """One file of a manifest: its size in bytes and the hex digest of each chunk, in order."""

    size: int
    digests: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's files (name relative to the folder -> entry), hashed with ``algorithm``."""

    algorithm: str
    chunk_bytes: int
    files: dict[str, FileEntry]


def _chunk_digest(path: str, index: int, chunk_bytes: int, size: int, algorithm: str) -> str:
    """Digest of bytes [index * chunk_bytes, +chunk_bytes) of the ``size``-byte file ``path``, hashed
    straight from the page cache through a memory map (no copy, no buffer)."""
    start = index * chunk_bytes
    skip = start % mmap.ALLOCATIONGRANULARITY  # a map starts at a multiple of it
    hasher = _hasher(algorithm)
    try:
        with open(path, "rb") as f, \
                mmap.mmap(f.fileno(), skip + min(chunk_bytes, size - start), access=mmap.ACCESS_READ,
                          offset=start - skip) as mapped, memoryview(mapped) as view, view[skip:] as chunk:
            hasher.update(chunk)
    except ValueError as exc:  # the file shrank after its size was read
        raise OSError(f"{path}: cannot map bytes from {start} ({exc})") from None
    return hasher.hexdigest()


def _chunk_count(size: int, chunk_bytes: int) -> int:
    return -(-size // chunk_bytes)


def digest_files(folder: str, names: Iterable[str], threads: int = 1, algorithm: str | None = None,
                 chunk_bytes: int = CHUNK_BYTES) -> dict[str, FileEntry]:
    """Size and chunk digests of each file ``folder/name``, hashed by ``threads`` threads in parallel.

    Raises OSError (naming the path) if a file cannot be read."""
    algorithm = algorithm or default_algorithm()
    _hasher(algorithm)  # fail before starting threads
    sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in names}
    tasks = [(name, k) for name, size in sizes.items() for k in range(_chunk_count(size, chunk_bytes))]

    def run(task: tuple[str, int]) -> str:
        name, index = task
        return _chunk_digest(os.path.join(folder, name), index, chunk_bytes, sizes[name], algorithm)

    with ThreadPoolExecutor(max(1, threads)) as pool:
        results = list(pool.map(run, tasks))
    digests: dict[str, list[str]] = {name: [] for name in sizes}
    for (name, _), digest in zip(tasks, results):
        digests[name].append(digest)
    return {name: FileEntry(sizes[name], tuple(digests[name])) for name in sizes}


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` as JSON (keys sorted) to ``path`` whole (:func:`parallax_titan.atomic.write_text`)."""
    write_text(path, json.dumps(data, indent=1, sort_keys=True))


def write_manifest(folder: str, files: dict[str, FileEntry], algorithm: str,
                   chunk_bytes: int = CHUNK_BYTES) -> str:
    """Write ``folder/manifest.json`` atomically (:func:`write_json_atomic`); returns its path."""
    path = os.path.join(folder, MANIFEST_FILE)
    write_json_atomic(path, {
        "format": FORMAT, "algorithm": algorithm, "chunk_bytes": chunk_bytes,
        "files": {name: {"size": e.size, "digests": list(e.digests)} for name, e in sorted(files.items())},
    })
    return path


def read_manifest(folder: str) -> Manifest:
    """The manifest in ``folder``; ValueError naming its path when it is missing or malformed."""
    path = os.path.join(folder, MANIFEST_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        files = {name: FileEntry(int(e["size"]), tuple(e["digests"])) for name, e in data["files"].items()}
        manifest = Manifest(str(data["algorithm"]), int(data["chunk_bytes"]), files)
    except FileNotFoundError:
        raise ValueError(f"{path!r} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path!r} is not a readable manifest ({type(exc).__name__}: {exc})") from None
    if data.get("format") != FORMAT:
        raise ValueError(f"{path!r} has format {data.get('format')!r}; this version reads format {FORMAT}")
    if manifest.algorithm not in ALGORITHMS:
        raise ValueError(f"{path!r} has algorithm {manifest.algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    outside = [name for name in sorted(files) if name in ("", ".", "..") or os.path.basename(name) != name]
    if outside:
        raise ValueError(f"{path!r} lists {outside[0]!r}; expected the names of files in its own folder")
    _check_chunks(path, manifest)
    return manifest


def _check_chunks(path: str, manifest: Manifest) -> None:
    """ValueError naming the manifest ``path`` unless every file has one digest per chunk (with
    fewer, :func:`content_problems` would leave the rest of the file unchecked)."""
    if manifest.chunk_bytes <= 0:
        raise ValueError(f"{path!r} has chunk_bytes = {manifest.chunk_bytes}; expected a positive size")
    for name, entry in sorted(manifest.files.items()):
        expected = _chunk_count(entry.size, manifest.chunk_bytes)
        if entry.size < 0 or len(entry.digests) != expected:
            raise ValueError(f"{path!r} lists {len(entry.digests)} digests for {name} ({entry.size} bytes); expected "
                             f"{expected}, one per {manifest.chunk_bytes}-byte chunk")


def _size_problem(folder: str, name: str, expected: int) -> str | None:
    path = os.path.join(folder, name)
    if os.path.lexists(path) and not os.path.isfile(path):
        return f"{path}: a folder or a broken link, not a file (listed in {MANIFEST_FILE})"
    try:
        size = os.path.getsize(path)
    except OSError:
        return f"{path}: missing (listed in {MANIFEST_FILE})"
    if size == expected:
        return None
    what = "truncated" if size < expected else "longer than written"
    return f"{path}: {size} bytes, {MANIFEST_FILE} lists {expected} ({what})"


def size_problems(folder: str, manifest: Manifest, names: Iterable[str] | None = None) -> list[str]:
    """Files of ``manifest`` (or only ``names``) that are missing in ``folder`` or have another size.

    Reads no file contents (stat only)."""
    names = sorted(manifest.files if names is None else names)
    return [p for p in (_size_problem(folder, n, manifest.files[n].size) for n in names) if p]


def content_problems(folder: str, manifest: Manifest, names: Iterable[str] | None = None,
                     threads: int = 1) -> list[str]:
    """Every problem of the files of ``manifest`` (or only ``names``) in ``folder``: a missing file,
    another size (as :func:`size_problems`), or the first chunk whose digest differs, each naming
    the file (and the byte range). Hashes in ``threads`` threads."""
    problems, intact = [], []
    for name in sorted(manifest.files if names is None else names):
        problem = _size_problem(folder, name, manifest.files[name].size)
        if problem:
            problems.append(problem)
        else:
            intact.append(name)
    found = digest_files(folder, intact, threads, manifest.algorithm, manifest.chunk_bytes)
    for name in intact:
        for k, (saved, now) in enumerate(zip(manifest.files[name].digests, found[name].digests)):
            if saved != now:
                start, end = k * manifest.chunk_bytes, min((k + 1) * manifest.chunk_bytes, manifest.files[name].size)
                problems.append(f"{os.path.join(folder, name)}: bytes {start}-{end} differ from their "
                                f"{manifest.algorithm} checksum in {MANIFEST_FILE} (corrupted)")
                break
    return problems
