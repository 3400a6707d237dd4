"""Documents from local files (JSONL, JSONL.gz, parquet), with every bad record named or counted.

A record is one document: a JSONL line holding an object with a string ``content`` field, or a
parquet row whose ``content`` column is a string. Under ``reliability.bad_data = "error"`` the first
bad record stops the read with a ValueError naming the file, the line (or row) and the reason;
under ``"skip"`` it is left out and counted in a :class:`BadRecords` report, which gives the count
per file and per reason. A JSONL line is read with a length cap (``max_record_bytes``), so a huge
line costs at most the cap in memory before it is refused or skipped.
"""

from __future__ import annotations

import collections
import glob
import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from torchtitan.tools.logging import logger

TEXT_COLUMN = "content"
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)
DEFAULT_MAX_RECORD_BYTES = 64 << 20
_CHUNK = 1 << 20

# reasons a record is bad (the keys of BadRecords' counts)
INVALID_UTF8 = "invalid UTF-8"
INVALID_JSON = "invalid JSON"
NOT_AN_OBJECT = "not a JSON object"
NO_CONTENT = f"no '{TEXT_COLUMN}' field"
NOT_A_STRING = f"'{TEXT_COLUMN}' is not a string"
TOO_LONG = "record too long"
UNREADABLE = "file unreadable"  # a truncated or corrupt .gz: nothing after the point can be read
_READ_ERRORS = (EOFError, OSError, zlib.error)  # what gzip raises for a truncated or damaged stream


class BadRecordError(ValueError):
    """One bad record; ``reason`` is one of the module's reason strings, the message names file and line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        # pickled whole: a pre-tokenizer worker process hands it to the parent (the default reduce
        # calls __init__ with the message only, which failed in the pool and hung the run)
        return type(self), (str(self), self.reason)


@dataclass
class BadRecords:
    """Bad records met under ``bad_data = "skip"``: counts per file and reason, the first message of each."""

    counts: dict[str, collections.Counter] = field(default_factory=dict)
    first: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, path: str, error: BadRecordError) -> None:
        """Count ``error`` against ``path``."""
        self.counts.setdefault(path, collections.Counter())[error.reason] += 1
        self.first.setdefault((path, error.reason), str(error))

    def total(self, path: str | None = None) -> int:
        """Bad records in ``path`` (all files when None)."""
        files = [path] if path is not None else list(self.counts)
        return sum(sum(self.counts.get(f, {}).values()) for f in files)

    def by_reason(self) -> dict[str, int]:
        """Counts per reason over every file."""
        total: collections.Counter = collections.Counter()
        for counts in self.counts.values():
            total.update(counts)
        return dict(total)

    def describe(self, path: str) -> str:
        """``"2 invalid UTF-8 (first: ...), 1 invalid JSON (first: ...)"`` for ``path``."""
        return ", ".join(f"{n} {reason} (first: {self.first[(path, reason)]})"
                         for reason, n in sorted(self.counts.get(path, {}).items()))

    def log(self, path: str) -> None:
        """Log the file's counts by reason, if it had bad records."""
        if self.total(path):
            logger.warning(f"{path}: skipped {self.total(path)} bad records "
                           f"(reliability.bad_data = 'skip'): {self.describe(path)}")


def open_binary(path: str):
    """The file at ``path`` opened for binary reading, decompressed when it ends in ``.gz``."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _readline(f, size: int, path: str, lineno: int) -> bytes:
    """``f.readline(size)``; a read that fails (a truncated or corrupt gzip stream) is a BadRecordError
    naming the file and the line, instead of gzip's EOFError that names neither."""
    try:
        return f.readline(size)
    except _READ_ERRORS as e:
        raise BadRecordError(f"{path}, line {lineno}: the file cannot be read from here on ({e}); it is truncated "
                             "or corrupt", UNREADABLE) from None


def _read_line(f, path: str, lineno: int, max_bytes: int) -> bytes | None:
    """The next line of ``f`` (None at the end). A line over ``max_bytes`` is consumed in chunks and
    reported as a BadRecordError, so its size never sits in memory."""
    line = _readline(f, max_bytes + 1, path, lineno)
    if not line:
        return None
    if len(line) <= max_bytes or line.endswith(b"\n") and len(line) == max_bytes + 1:
        return line
    size = len(line)
    while not line.endswith(b"\n"):
        line = _readline(f, _CHUNK, path, lineno)
        if not line:
            break
        size += len(line)
    raise BadRecordError(f"{path}, line {lineno}: record of {size} bytes is longer than the limit of {max_bytes} "
                         "bytes (training.max_record_bytes / --max-record-bytes)", TOO_LONG)


def parse_jsonl_line(path: str, lineno: int, raw: bytes) -> str | None:
    """The ``content`` string of one JSONL line (None for a blank line); BadRecordError otherwise."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRecordError(f"{path}, line {lineno}: not valid UTF-8 ({e})", INVALID_UTF8) from None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRecordError(f"{path}, line {lineno}: not valid JSON ({e})", INVALID_JSON) from None
    except RecursionError:  # nesting deeper than Python's stack, inside the length cap
        raise BadRecordError(f"{path}, line {lineno}: not valid JSON (nested too deeply to parse)",
                             INVALID_JSON) from None
    if not isinstance(record, dict):
        raise BadRecordError(f"{path}, line {lineno}: a JSON {type(record).__name__}, expected an object with a "
                             f"string '{TEXT_COLUMN}'", NOT_AN_OBJECT)
    if TEXT_COLUMN not in record:
        raise BadRecordError(f"{path}, line {lineno}: no '{TEXT_COLUMN}' field (found {sorted(record)})", NO_CONTENT)
    text = record[TEXT_COLUMN]
    if not isinstance(text, str):
        raise BadRecordError(f"{path}, line {lineno}: '{TEXT_COLUMN}' is {text!r:.60} ({type(text).__name__}); "
                             "expected a string", NOT_A_STRING)
    try:  # a \ud800 escape is valid JSON but no Unicode text: the tokenizer would raise a TypeError on it
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRecordError(f"{path}, line {lineno}: '{TEXT_COLUMN}' is not valid Unicode text ({e}); expected "
                             "text without lone surrogate escapes", INVALID_UTF8) from None
    return text


def jsonl_texts(path: str, bad: BadRecords | None = None, start: int = 0, stop: int | None = None,
                max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text) of each good record of a JSONL(.gz) file, lines ``[start, stop)`` (0-based).

    ``bad``: count bad records there (``bad_data = "skip"``); None raises the first one. A file that
    cannot be read on (a truncated or corrupt .gz) ends there, as one bad record."""
    with open_binary(path) as f:
        lineno = 0
        while stop is None or lineno < stop:
            try:
                raw = _read_line(f, path, lineno + 1, max_bytes)
                if raw is None:
                    return
                text = parse_jsonl_line(path, lineno + 1, raw) if lineno >= start else None
            except BadRecordError as e:
                if lineno >= start:  # a line before the range belongs to another reader
                    if bad is None:
                        raise
                    bad.add(path, e)
                if e.reason == UNREADABLE:
                    return
                text = None
            lineno += 1
            if text is not None:
                yield lineno, text


def _string_column(path: str, schema: pa.Schema) -> None:
    if TEXT_COLUMN not in schema.names:
        raise ValueError(f"{path}: no '{TEXT_COLUMN}' column (found {schema.names})")
    if schema.names.count(TEXT_COLUMN) > 1:  # Arrow then finds none by name (a KeyError)
        raise ValueError(f"{path}: {schema.names.count(TEXT_COLUMN)} columns named '{TEXT_COLUMN}'; expected one")
    kind = schema.field(TEXT_COLUMN).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"{path}: column '{TEXT_COLUMN}' holds {kind}, expected strings")


def _row_group_texts(file: pq.ParquetFile, path: str, group: int, first_row: int) -> list[str | None]:
    """The ``content`` of one row group; a group that cannot be decoded (a damaged file whose footer
    reads) is a BadRecordError naming the file and its rows, instead of Arrow's error naming neither."""
    try:
        return file.read_row_group(group, columns=[TEXT_COLUMN]).column(0).to_pylist()
    except (pa.ArrowException, OSError) as e:
        rows = file.metadata.row_group(group).num_rows
        raise BadRecordError(f"{path}, rows {first_row + 1}-{first_row + rows}: row group {group} cannot be read "
                             f"({e}); the file is corrupt", UNREADABLE) from None


def parquet_texts(path: str, bad: BadRecords | None = None, start: int = 0,
                  stop: int | None = None) -> Iterator[tuple[int, str]]:
    """(row number, text) of rows ``[start, stop)`` (0-based) of a parquet file, reading only the row
    groups that hold them; a null ``content`` is a bad record, and so is a row group that cannot be
    read, as one (row numbers are 1-based in messages)."""
    file = pq.ParquetFile(path)
    _string_column(path, file.schema_arrow)
    stop = file.metadata.num_rows if stop is None else stop
    first_row = 0
    for group in range(file.metadata.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if first_row + rows > start and first_row < stop:
            try:
                texts = _row_group_texts(file, path, group, first_row)
            except BadRecordError as error:
                if bad is None:
                    raise
                bad.add(path, error)
                texts = []
            for offset, text in enumerate(texts):
                row = first_row + offset
                if start <= row < stop:
                    if text is None:
                        error = BadRecordError(f"{path}, row {row + 1}: '{TEXT_COLUMN}' is null", NOT_A_STRING)
                        if bad is None:
                            raise error
                        bad.add(path, error)
                        continue
                    yield row + 1, text
        first_row += rows


def file_texts(path: str, bad: BadRecords | None = None, start: int = 0, stop: int | None = None,
               max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Iterator[tuple[int, str]]:
    """(line or row number, text) of the good records ``[start, stop)`` of one data file."""
    if path.endswith(PARQUET_SUFFIXES):
        return parquet_texts(path, bad, start, stop)
    return jsonl_texts(path, bad, start, stop, max_bytes)


def record_count(path: str) -> int:
    """Records (JSONL lines, parquet rows) in one data file, good or bad: the footer, or a line count.
    ValueError naming the file when it cannot be read to its end (a truncated or corrupt .gz): its
    records cannot be counted, whatever the bad-data policy."""
    if path.endswith(PARQUET_SUFFIXES):
        return pq.ParquetFile(path).metadata.num_rows
    count, last = 0, b"\n"
    with open_binary(path) as f:
        try:
            while chunk := f.read(_CHUNK):
                count += chunk.count(b"\n")
                last = chunk[-1:]
        except _READ_ERRORS as e:
            raise ValueError(f"data file {path!r} cannot be read to its end ({e}); it is truncated or "
                             "corrupt") from None
    return count + (last != b"\n")


def check_file(path: str, skip_bad: bool = False, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
    """Cheap check of one data file: it exists and holds a good record (a parquet footer with a
    string ``content`` column and rows; the first good JSONL record). Raises ValueError naming the
    file; a file without one good record lists what its records were."""
    if not os.path.isfile(path):
        raise ValueError(f"data file {path!r} does not exist")
    if os.path.getsize(path) == 0:
        raise ValueError(f"data file {path!r} is empty (0 bytes)")
    if path.endswith(PARQUET_SUFFIXES):
        try:
            file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"data file {path!r} is not a readable parquet file ({e})") from None
        if file.metadata.num_rows == 0:
            raise ValueError(f"data file {path!r} is empty (0 rows)")
        _string_column(path, file.schema_arrow)
    elif path.endswith(JSONL_SUFFIXES):
        bad = BadRecords()
        try:
            found = next(jsonl_texts(path, bad if skip_bad else None, max_bytes=max_bytes), None)
        except OSError as e:  # a file that cannot be opened (its reads are bad records)
            raise ValueError(f"data file {path!r} cannot be read ({e})") from None
        if found is None:
            if bad.total(path):
                raise ValueError(f"data file {path!r} has no good record ({bad.total(path)} bad records: "
                                 f"{bad.describe(path)})")
            raise ValueError(f"data file {path!r} is empty (no records, only blank lines if any)")
    else:
        raise ValueError(f"data file {path!r}: unsupported format; expected {PARQUET_SUFFIXES + JSONL_SUFFIXES}")


def _directory_files(path: str) -> tuple[list[str], list[str]]:
    """The data files under directory ``path`` (searched recursively) and its other files. Hidden files
    and folders (a leading ".", such as ``.ipynb_checkpoints``, whose copies of the data files would be
    read twice) are neither, as in ``datasets`` and as a glob's ``*`` leaves them out. Linked folders
    are searched as a glob's ``**`` searches them (without following, their files would be left out
    without a word), except a link back to a folder on the way down to it, which would lead round
    forever; a file reached twice is read once (:func:`_distinct_files`)."""
    data, others = [], []
    above = {path: frozenset([os.path.realpath(path)])}  # each folder walked: the real folders down to it
    for root, folders, names in os.walk(path, followlinks=True):
        real = {f: os.path.realpath(os.path.join(root, f)) for f in folders}
        folders[:] = sorted(f for f in folders if not f.startswith(".") and real[f] not in above[root])
        above.update({os.path.join(root, f): above[root] | {real[f]} for f in folders})
        for name in names:
            if not name.startswith("."):
                (data if name.endswith(PARQUET_SUFFIXES + JSONL_SUFFIXES) else others).append(os.path.join(root, name))
    return data, sorted(others)


def _distinct_files(files: list[str], key: str, path: str, warn: bool = True) -> list[str]:
    """``files`` (sorted) with each real file once, the first path to it kept: links (a linked folder
    beside its real one, two links to one folder) would otherwise have its documents read twice. The
    paths left out are named in a warning."""
    kept, seen, again = [], {}, []
    for f in files:
        real = os.path.realpath(f)
        if real in seen:
            again.append(f"{f} (= {seen[real]})")
            continue
        seen[real] = f
        kept.append(f)
    if again and warn:
        logger.warning(f"{key} = {path!r}: {len(again)} file(s) are the same file as one listed before them (links) "
                       f"and are read once, e.g. {again[:3]}")
    return kept


def list_data_files(path: str | None, key: str = "training.dataset_path", warn: bool = True) -> list[str]:
    """The data files a file, directory (searched recursively, hidden files and folders left out; its
    files of other formats are named in a warning) or glob names, sorted, each real file once; not
    checked (:func:`resolve_data_files` checks them). ``key`` names the config key in error messages;
    ``warn``: log the files left out. All files must be parquet, or all JSONL."""
    if not path:
        raise ValueError(f"{key} is not set (got {path!r}); expected a .parquet/.jsonl/.jsonl.gz file, a directory "
                         "of them, or a glob")
    if os.path.isdir(path):
        files, others = _directory_files(path)
        if others and warn:
            logger.warning(f"{key} = {path!r}: {len(others)} file(s) without a .parquet/.jsonl/.jsonl.gz ending are not "
                           f"read, e.g. {others[:3]}")
    elif os.path.isfile(path):
        files = [path]
    else:
        files = glob.glob(path, recursive=True)
    files = _distinct_files(sorted(files), key, path, warn)
    if not files:
        raise ValueError(f"{key} = {path!r} matches no .parquet/.jsonl/.jsonl.gz files")
    if len({f.endswith(PARQUET_SUFFIXES) for f in files}) > 1:
        raise ValueError(f"{key} = {path!r} mixes parquet and JSONL files; use one format")
    return files


def files_fingerprint(files: list[str]) -> str:
    """``files`` summarised for a checkpoint's settings: their count, total bytes and a hash of their
    paths relative to their common folder and their sizes. The same for the same files moved
    elsewhere; another for a file added, removed, renamed or changed in size (a text loader's saved
    position is an index into this list)."""
    root = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    listing = [(os.path.relpath(os.path.abspath(f), root), os.path.getsize(f)) for f in files]
    digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]
    return f"{len(files)} files, {sum(size for _, size in listing)} bytes, sha256 {digest}"


def resolve_data_files(path: str | None, key: str = "training.dataset_path", skip_bad: bool = False,
                       max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> list[str]:
    """:func:`list_data_files`, each file checked. With ``skip_bad``, files that fail their check are
    left out with a warning; none left is an error."""
    files = list_data_files(path, key)
    usable = []
    for f in files:
        try:
            check_file(f, skip_bad, max_bytes)
            usable.append(f)
        except ValueError as e:
            if not skip_bad:
                raise
            logger.warning(f"skipping data file ({e}); reliability.bad_data = 'skip'")
    if not usable:
        raise ValueError(f"{key} = {path!r}: none of its {len(files)} files is usable")
    return usable


def documents(files: list[str], skip_bad: bool = False, max_bytes: int = DEFAULT_MAX_RECORD_BYTES):
    """Generator of ``{"content": text}`` over ``files`` in order (``datasets`` from_generator; one
    shard per file). With ``skip_bad``, each file's bad records are logged by reason when it ends."""
    for path in files:
        bad = BadRecords() if skip_bad else None
        for _, text in file_texts(path, bad, max_bytes=max_bytes):
            yield {TEXT_COLUMN: text}
        if bad is not None:
            bad.log(path)
