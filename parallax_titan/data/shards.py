"""Pre-tokenized shards on disk: the format, writing one shard, reading a split, checking a dataset.

A dataset folder, written by ``python -m scripts.pretokenize``::

    manifest.json                 the dataset: format, tokenizer, source, splits, every shard
    plan.json                     what the pre-tokenizer was asked to do (a resumed run must match it)
    shards/<unit>.json            one finished unit of input: its shards' counts and checksums (written last)
    <split>/<unit>.bin            token ids, uint32 little-endian, the unit's documents back to back
    <split>/<unit>.idx            document ends, uint64 little-endian: cumulative token counts

``split`` is ``train`` or ``validation``. Document d of a shard spans tokens ``[end[d-1], end[d])``
(``end[-1] = 0``) and ends with the tokenizer's end-of-document token. A split's token stream is
its shards' tokens in unit order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from parallax_titan.atomic import write_text

FORMAT = "parallax-titan-tokens"
VERSION = 1
TOKEN_DTYPE = np.dtype("<u4")
INDEX_DTYPE = np.dtype("<u8")
SPLITS = ("train", "validation")
MANIFEST = "manifest.json"
PLAN = "plan.json"
UNITS_DIR = "shards"


def file_sha256(path: str) -> str:
    """Hex sha256 of the file at ``path``, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def shard_paths(root: str, split: str, unit: str) -> tuple[str, str]:
    """(tokens .bin, index .idx) paths of ``unit``'s shard of ``split``."""
    return os.path.join(root, split, f"{unit}.bin"), os.path.join(root, split, f"{unit}.idx")


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` whole (:func:`parallax_titan.atomic.write_text`: synced before
    the rename, so a crash leaves no empty file under the final name; a unit manifest marks its shards
    finished)."""
    write_text(path, json.dumps(data, indent=1) + "\n")


class ShardWriter:
    """Appends documents to one shard (``.bin`` + ``.idx``), hashing as it writes.

    The files are written under temporary names and renamed by :meth:`close`, which returns the
    shard's entry for the manifests: ``{"tokens", "documents", "bin_sha256", "idx_sha256"}``.
    """

    def __init__(self, root: str, split: str, unit: str):
        self.paths = shard_paths(root, split, unit)
        os.makedirs(os.path.dirname(self.paths[0]), exist_ok=True)
        self._files = [open(f"{p}.tmp", "wb") for p in self.paths]
        self._hashes = [hashlib.sha256(), hashlib.sha256()]
        self.tokens = 0
        self.documents = 0

    def _write(self, which: int, array: np.ndarray) -> None:
        data = array.tobytes()
        self._files[which].write(data)
        self._hashes[which].update(data)

    def add(self, docs: list[np.ndarray]) -> None:
        """Append documents, each a uint32 array that already ends with the end-of-document token."""
        if not docs:
            return
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        self._write(0, np.concatenate(docs).astype(TOKEN_DTYPE, copy=False))
        self._write(1, (self.tokens + np.cumsum(lengths)).astype(INDEX_DTYPE))
        self.tokens += int(lengths.sum())
        self.documents += len(docs)

    def close(self) -> dict:
        """Finish the files (flushed to disk, renamed) and return the shard's manifest entry."""
        for f, path in zip(self._files, self.paths):
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(f"{path}.tmp", path)
        return {"tokens": self.tokens, "documents": self.documents,
                "bin_sha256": self._hashes[0].hexdigest(), "idx_sha256": self._hashes[1].hexdigest()}


def read_manifest(root: str, key: str) -> dict:
    """The manifest of the dataset at ``root``; ValueError naming ``key`` (the config key) otherwise."""
    path = os.path.join(root or "", MANIFEST)
    if not root or not os.path.isdir(root):
        raise ValueError(f"{key} = {root!r} is not a directory; expected a folder written by "
                         "`python -m scripts.pretokenize`")
    if not os.path.isfile(path):
        units = os.path.join(root, UNITS_DIR)
        done = len([n for n in os.listdir(units) if n.endswith(".json")]) if os.path.isdir(units) else 0
        hint = (f"pre-tokenization has not finished ({done} units done): rerun the same "
                "`python -m scripts.pretokenize` command to complete it") if done else "not a pre-tokenized dataset"
        raise ValueError(f"{key} = {root!r} has no {MANIFEST}; {hint}")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{key}: {path} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{key}: {path} holds a JSON {type(manifest).__name__}; expected the object "
                         "`python -m scripts.pretokenize` writes")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"{key}: {path} is format {manifest.get('format')!r} version {manifest.get('version')!r}; "
                         f"expected {FORMAT!r} version {VERSION}")
    problem = manifest_problem(manifest)
    if problem:
        raise ValueError(f"{key}: {path} is not a manifest `python -m scripts.pretokenize` wrote: {problem}")
    return manifest


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


_SHARD_FIELDS = (("tokens", _is_count, "an integer >= 0"), ("documents", _is_count, "an integer >= 0"),
                 ("bin_sha256", _is_sha256, "a sha256 in hex"), ("idx_sha256", _is_sha256, "a sha256 in hex"))


def shard_entry_problem(entry) -> str | None:
    """Why ``entry`` is not a shard's entry (``{"tokens", "documents": integers >= 0, "bin_sha256",
    "idx_sha256": hex sha256}``), as ``"tokens is '12'; expected an integer >= 0"``, or None."""
    if not isinstance(entry, dict):
        return f"is {entry!r:.60}; expected an object with {', '.join(name for name, _, _ in _SHARD_FIELDS)}"
    for name, valid, expected in _SHARD_FIELDS:
        if name not in entry:
            return f"has no {name!r}; expected {expected}"
        if not valid(entry[name]):
            return f"{name} is {entry[name]!r:.80}; expected {expected}"
    return None


def _unit_problem(unit) -> str | None:
    """Why ``unit`` cannot name a shard's files (a path would read files outside the split's folder)."""
    if not isinstance(unit, str) or unit in ("", ".", "..") or os.path.basename(unit) != unit:
        return f"unit is {unit!r:.80}; expected a file name in the split's folder, such as '00000'"
    return None


def manifest_problem(manifest: dict) -> str | None:
    """Why a manifest of this format and version does not describe its data as the readers need, or
    None: the token dtype, the tokenizer's sha256, and each split's shards, each with a plain unit
    name (a path would read files elsewhere) listed once (twice would train on it twice per epoch)
    and the fields of :func:`shard_entry_problem`. A problem names the JSON key."""
    if manifest.get("dtype") != TOKEN_DTYPE.str:
        return f"dtype is {manifest.get('dtype')!r}; expected {TOKEN_DTYPE.str!r} (uint32 little-endian)"
    tokenizer = manifest.get("tokenizer")
    if not isinstance(tokenizer, dict) or not _is_sha256(tokenizer.get("sha256")):
        return f"tokenizer is {tokenizer!r:.80}; expected an object with the sha256 of its tokenizer.json"
    splits = manifest.get("splits")
    if not isinstance(splits, dict):
        return f"splits is {splits!r:.80}; expected an object of splits ({', '.join(SPLITS)})"
    for split, info in splits.items():
        shards = info.get("shards") if isinstance(info, dict) else None
        if not isinstance(shards, list):
            return f"splits.{split}.shards is {shards!r:.80}; expected a list of shard entries"
        units = set()
        for i, entry in enumerate(shards):
            problem = shard_entry_problem(entry) or _unit_problem(entry.get("unit"))
            if problem:
                return f"splits.{split}.shards[{i}] {problem}"
            if entry["unit"] in units:
                return (f"splits.{split}.shards[{i}]: unit {entry['unit']!r} is listed twice; expected each shard "
                        "once")
            units.add(entry["unit"])
    return None


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a split: its unit name, counts and checksums (from the manifest)."""

    unit: str
    tokens: int
    documents: int
    bin_sha256: str
    idx_sha256: str


def split_shards(manifest: dict, split: str) -> list[ShardInfo]:
    """The shards of ``split`` in stream order."""
    return [ShardInfo(s["unit"], s["tokens"], s["documents"], s["bin_sha256"], s["idx_sha256"])
            for s in manifest["splits"][split]["shards"]]


def check_split(root: str, manifest: dict, split: str, key: str, checksums: bool) -> None:
    """Every shard of ``split`` is there with its manifest's sizes (and, with ``checksums``, its
    sha256); its index ends at its token count. ValueError naming the file and what is wrong."""
    if split not in manifest.get("splits", {}):
        raise ValueError(f"{key} = {root!r} has no {split!r} split (found {sorted(manifest.get('splits', {}))})")
    for shard in split_shards(manifest, split):
        bin_path, idx_path = shard_paths(root, split, shard.unit)
        for path, size in ((bin_path, shard.tokens * TOKEN_DTYPE.itemsize),
                           (idx_path, shard.documents * INDEX_DTYPE.itemsize)):
            if not os.path.isfile(path):
                raise ValueError(f"{key}: shard file {path} is missing (listed in {MANIFEST})")
            if os.path.getsize(path) != size:
                raise ValueError(f"{key}: shard file {path} has {os.path.getsize(path)} bytes, the manifest says "
                                 f"{size}: the shard is corrupt or incomplete")
        if shard.documents and int(np.fromfile(idx_path, INDEX_DTYPE, offset=(shard.documents - 1) * 8)[0]) != shard.tokens:
            raise ValueError(f"{key}: index {idx_path} does not end at the shard's {shard.tokens} tokens: corrupt")
        if checksums:
            for path, want in ((bin_path, shard.bin_sha256), (idx_path, shard.idx_sha256)):
                if file_sha256(path) != want:
                    raise ValueError(f"{key}: shard file {path} does not match its sha256 in {MANIFEST}: corrupt")


class TokenStream:
    """One split of a pre-tokenized dataset as one memory-mapped token stream.

    ``tokens(start, stop)`` -> uint32 array of stream positions ``[start, stop)`` (across shards);
    ``document_starts(start, stop)`` -> the positions in ``(start, stop)`` where a document begins.
    Shards are mapped when first read, at most ``open_shards`` at a time (the rest are unmapped).
    """

    def __init__(self, root: str, split: str, manifest: dict, open_shards: int = 64):
        self.root, self.split = root, split
        self.shards = [s for s in split_shards(manifest, split) if s.tokens]
        self.starts = np.cumsum([0] + [s.tokens for s in self.shards], dtype=np.int64)
        self.num_tokens = int(self.starts[-1])
        self._map = functools.lru_cache(maxsize=open_shards)(self._open)

    def _open(self, i: int) -> tuple[np.memmap, np.memmap]:
        bin_path, idx_path = shard_paths(self.root, self.split, self.shards[i].unit)
        return np.memmap(bin_path, TOKEN_DTYPE, mode="r"), np.memmap(idx_path, INDEX_DTYPE, mode="r")

    def _pieces(self, start: int, stop: int):
        """(shard, local start, local stop, stream offset of the shard) covering ``[start, stop)``."""
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            base = int(self.starts[i])
            end = min(stop, int(self.starts[i + 1]))
            yield i, start - base, end - base, base
            start, i = end, i + 1

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Stream tokens ``[start, stop)`` as a uint32 array (a copy)."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"tokens [{start}, {stop}) outside the stream of {self.num_tokens}")
        parts = [np.asarray(self._map(i)[0][a:b]) for i, a, b, _ in self._pieces(start, stop)]
        return np.concatenate(parts) if len(parts) != 1 else parts[0].copy()

    def document_starts(self, start: int, stop: int) -> np.ndarray:
        """Stream positions p with ``start < p < stop`` at which a document begins (int64, ascending)."""
        found = []
        for i, a, b, base in self._pieces(start, stop):
            ends = self._map(i)[1]
            if a == 0:  # a shard holds whole documents: its first token starts one
                found.append(np.array([base], np.int64))
            lo, hi = np.searchsorted(ends, [a, b])  # ends e with a <= e < b: the next document starts at e
            found.append(np.asarray(ends[lo:hi], dtype=np.int64) + base)
        starts = np.concatenate(found) if found else np.zeros(0, np.int64)
        return starts[starts > start]
