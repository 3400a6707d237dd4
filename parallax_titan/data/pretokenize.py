"""The pre-tokenizer: a text source in, a pre-tokenized dataset (:mod:`.shards`) out.

The input is cut into units (a local file, or ``docs_per_shard`` records of it; a hub dataset's
file), planned before any work and recorded in ``plan.json``. Each unit is read in order,
encoded in batches by ``tokenizers`` (each document as its tokens + eos), and split into ``train``
and ``validation`` by a hash of its text (:func:`is_validation`); it writes one shard per split
and then its unit manifest, which marks it finished. Units run in ``num_proc`` processes. A rerun
with the same arguments skips finished units (their shards are never rewritten) and redoes the
others, and those whose unit manifest is unreadable or whose shards are missing or truncated;
when every unit is finished the dataset's ``manifest.json`` is written from the unit manifests.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import queue
from dataclasses import asdict, dataclass

from torchtitan.tools.logging import logger

from parallax_titan.data.hub_clone import checked_split_files, load_split
from parallax_titan.data.records import (
    DEFAULT_MAX_RECORD_BYTES, NOT_A_STRING, TEXT_COLUMN, BadRecordError, BadRecords, file_texts, record_count,
    resolve_data_files,
)
from parallax_titan.data.shards import (
    FORMAT, INDEX_DTYPE, MANIFEST, PLAN, SPLITS, TOKEN_DTYPE, UNITS_DIR, VERSION, ShardWriter, file_sha256,
    shard_entry_problem, shard_paths, write_json_atomic,
)
from parallax_titan.data.text import CORPUS_DIR

EMBEDDED_FILES = (os.path.join(CORPUS_DIR, "train.jsonl.gz"), os.path.join(CORPUS_DIR, "validation.jsonl.gz"))
SOURCE_KINDS = ("embedded", "local", "hub")
VALIDATION_RULE = "blake2b-64 of the UTF-8 text, little-endian, / 2^64 < fraction"


@dataclass(frozen=True)
class SourceSpec:
    """What to read. ``kind``: "embedded" (the corpus in parallax_titan/assets), "local" (``path`` =
    a file, directory or glob of JSONL/parquet files) or "hub" (``path`` = a Hugging Face dataset id
    or a local clone of one, read with ``datasets`` as config ``name``, split ``split``, at ``revision``)."""

    kind: str
    path: str = ""
    name: str | None = None
    split: str = "train"
    revision: str | None = None


@dataclass(frozen=True)
class Options:
    """How to pre-tokenize: the validation fraction, records per unit (0: one unit per file), the
    batch handed to the tokenizer, the bad-data policy and the record size cap."""

    validation_fraction: float = 0.01
    docs_per_shard: int = 0
    batch_size: int = 1024
    bad_data: str = "error"
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES


def is_validation(text: str, fraction: float) -> bool:
    """Whether a document goes to the validation split: its hash (:data:`VALIDATION_RULE`) is below
    ``fraction`` of the hash range, so the choice depends on the text alone."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


def _hub_dataset(spec: SourceSpec):
    """The source's split, streamed: from the hub, or from a local clone's README-declared files."""
    from datasets import load_dataset

    if os.path.isdir(spec.path):
        return load_split(spec.path, spec.name, spec.split, "--path")
    return load_dataset(spec.path, name=spec.name, split=spec.split, streaming=True, revision=spec.revision)


def _resolved_revision(spec: SourceSpec) -> str | None:
    """The commit a hub dataset's revision points to (None for a local clone, or without network)."""
    if os.path.isdir(spec.path):
        return None
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(spec.path, revision=spec.revision).sha
    except Exception:  # offline, or no hub client: the manifest records the requested revision only
        return None


def _files_of(spec: SourceSpec, options: Options) -> list[str]:
    if spec.kind == "embedded":
        return list(EMBEDDED_FILES)
    return resolve_data_files(spec.path, "--path", options.bad_data == "skip", options.max_record_bytes)


def describe_source(spec: SourceSpec, options: Options) -> dict:
    """The manifest's record of the source: kind, path, and a revision (hub commit, or for files
    their names and sizes; the embedded corpus by sha256)."""
    if spec.kind == "hub":
        return {**asdict(spec), "resolved_revision": _resolved_revision(spec)}
    files = _files_of(spec, options)
    listing = [{"path": _plan_path(spec, f), "bytes": os.path.getsize(f)} for f in files]
    if spec.kind == "embedded":
        listing = [{**entry, "sha256": file_sha256(f)} for entry, f in zip(listing, files)]
    fingerprint = hashlib.sha256(json.dumps([(os.path.basename(e["path"]), e["bytes"]) for e in listing]).encode())
    return {**asdict(spec), "files": listing, "revision": fingerprint.hexdigest()}


def _plan_path(spec: SourceSpec, path: str) -> str:
    """A file as the plan names it: the embedded corpus by file name (the same in every checkout)."""
    return os.path.basename(path) if spec.kind == "embedded" else path


def plan_units(spec: SourceSpec, options: Options) -> list[dict]:
    """The units of the source, in stream order: ``{"name", "file", "start", "stop"}`` for files
    (records ``[start, stop)``), ``{"name", "hub_shard", "num_shards"}`` for a hub dataset."""
    if spec.kind == "hub":
        if os.path.isdir(spec.path):  # a local clone: its files checked once, before any unit reads them
            checked_split_files(spec.path, spec.name, spec.split, "--path", options.bad_data == "skip")
        n = _hub_dataset(spec).num_shards
        return [{"name": f"{i:05d}", "hub_shard": i, "num_shards": n} for i in range(n)]
    units = []
    for path in _files_of(spec, options):
        count = record_count(path)
        step = options.docs_per_shard or max(count, 1)
        for start in range(0, max(count, 1), step):
            units.append({"name": f"{len(units):05d}", "file": _plan_path(spec, path), "start": start, "stop": min(count, start + step)})
    return units


def unit_texts(spec: SourceSpec, unit: dict, bad: BadRecords | None, max_bytes: int):
    """The good texts of one unit, in order (bad records raised, or counted in ``bad``)."""
    if "file" in unit:
        path = os.path.join(CORPUS_DIR, unit["file"]) if spec.kind == "embedded" else unit["file"]
        for _, text in file_texts(path, bad, unit["start"], unit["stop"], max_bytes):
            yield text
        return
    where = f"{spec.path} (hub shard {unit['hub_shard']} of {unit['num_shards']})"
    shard = _hub_dataset(spec).shard(num_shards=unit["num_shards"], index=unit["hub_shard"])
    for row, record in enumerate(shard, start=1):
        text = record.get(TEXT_COLUMN)
        if isinstance(text, str):
            yield text
            continue
        error = BadRecordError(f"{where}, row {row}: '{TEXT_COLUMN}' is {text!r:.60}; expected a string", NOT_A_STRING)
        if bad is None:
            raise error
        bad.add(where, error)


_report = None  # this process's progress callback: tokens written


def _init_worker(report) -> None:
    global _report
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per process
    _report = report


def _batches(texts, size: int):
    batch = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str):
    """The tokenizer at ``path``, loaded once per process (the Qwen3 file takes about a second to parse)."""
    from parallax_titan.tokenizer import load_tokenizer_json

    return load_tokenizer_json(path)


def run_unit(root: str, spec: SourceSpec, options: Options, tokenizer_path: str, eos_id: int, unit: dict) -> dict:
    """Tokenize one unit into its two shards, then write its manifest; returns the manifest."""
    from parallax_titan.tokenizer import encode_documents

    tokenizer = _tokenizer(tokenizer_path)
    bad = BadRecords() if options.bad_data == "skip" else None
    writers = {split: ShardWriter(root, split, unit["name"]) for split in SPLITS}
    for texts in _batches(unit_texts(spec, unit, bad, options.max_record_bytes), options.batch_size):
        docs = encode_documents(tokenizer, texts, eos_id)
        held_out = [is_validation(t, options.validation_fraction) for t in texts]
        writers["validation"].add([d for d, v in zip(docs, held_out) if v])
        writers["train"].add([d for d, v in zip(docs, held_out) if not v])
        if _report is not None:
            _report(sum(len(d) for d in docs))
    manifest = {"unit": unit["name"], "input": unit, "splits": {s: w.close() for s, w in writers.items()},
                "bad_records": {path: dict(counts) for path, counts in (bad.counts if bad else {}).items()}}
    if bad is not None:
        for path in bad.counts:
            bad.log(path)
    write_json_atomic(os.path.join(root, UNITS_DIR, f"{unit['name']}.json"), manifest)
    return manifest


def _run_unit_star(args) -> dict:
    return run_unit(*args)


def settings_sha256(plan: dict) -> str:
    """What every unit's shards depend on besides its records, hashed: the tokenizer's content and
    eos id, the source and the options. Each planned unit carries it, so a unit manifest left by
    another tokenizer or source is not taken as finished even when ``plan.json`` is gone."""
    settings = {"tokenizer": {k: plan["tokenizer"][k] for k in ("sha256", "eos_id")}, "source": plan["source"],
                "options": plan["options"]}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _check_plan(root: str, plan: dict) -> None:
    """Write ``plan.json``, or check that a resumed run was asked for the same thing."""
    path = os.path.join(root, PLAN)
    if os.path.isfile(path):
        saved = _read_plan(path)
        differing = sorted(k for k in plan.keys() | saved.keys() if plan.get(k) != saved.get(k))
        if len(differing) > 1 and "units" in differing:  # they carry the settings' hash
            differing.remove("units")
        if differing:
            raise ValueError(f"--out {root!r} holds a pre-tokenization with other settings ({', '.join(differing)} "
                             "differ); rerun with the same arguments to finish it, or choose another --out")
        return
    os.makedirs(os.path.join(root, UNITS_DIR), exist_ok=True)
    write_json_atomic(path, plan)


def _read_plan(path: str) -> dict:
    """The ``plan.json`` at ``path``; ValueError naming ``--out`` and the file when it is no plan."""
    fix = "expected the plan an earlier run wrote; choose another --out, or delete the folder to start over"
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except ValueError as e:  # invalid JSON or UTF-8
        raise ValueError(f"--out: {path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(saved, dict):
        raise ValueError(f"--out: {path} holds a JSON {type(saved).__name__}; {fix}")
    return saved


def check_layout(root: str, units: list[dict]) -> None:
    """ValueError naming ``--out`` when a folder stands where the run writes a file in ``root`` (the
    manifests, the plan, the shards of ``units``), or a file where it writes a folder: the rename or
    the write would fail only after the units' work. A link is replaced as a file is."""
    for name in (UNITS_DIR, *SPLITS):
        path = os.path.join(root, name)
        if os.path.lexists(path) and not os.path.isdir(path):
            raise ValueError(f"--out: {path!r} is a file; expected the folder of that name a pre-tokenization "
                             "writes, or none; nothing was written")
    files = [os.path.join(root, MANIFEST), os.path.join(root, PLAN)]
    for unit in units:
        files.append(os.path.join(root, UNITS_DIR, f"{unit['name']}.json"))
        files += [p for split in SPLITS for p in shard_paths(root, split, unit["name"])]
    for path in files:
        if os.path.isdir(path) and not os.path.islink(path):
            raise ValueError(f"--out: {path!r} is a folder; expected the file of that name a pre-tokenization "
                             "writes, or none; nothing was written")


def _is_bad_records(value) -> bool:
    """Whether ``value`` is a unit's bad-record counts: ``{file: {reason: count}}``."""
    return isinstance(value, dict) and all(
        isinstance(counts, dict) and all(isinstance(n, int) and n >= 0 for n in counts.values())
        for counts in value.values())


def _unfinished_reason(root: str, manifest: dict, unit: dict) -> str | None:
    """Why the unit manifest ``manifest`` does not mark plan unit ``unit`` as finished, or None: it
    was written for another input (an older plan) or unit, an entry the dataset's manifest copies is
    malformed (an edited file), or a shard it lists is missing or not of its size (truncated, or lost
    in a crash after the manifest was written)."""
    if manifest.get("input") != unit:
        return f"it records the input {manifest.get('input')}, the plan {unit}"
    if manifest.get("unit") != unit["name"]:
        return f"it names unit {manifest.get('unit')!r}"
    if not _is_bad_records(manifest.get("bad_records")):
        return f"its bad_records is {manifest.get('bad_records')!r:.80}, expected {{file: {{reason: count}}}}"
    for split in SPLITS:
        entry = manifest["splits"][split]
        problem = shard_entry_problem(entry)
        if problem:
            return f"its {split} shard {problem}"
        for path, size in zip(shard_paths(root, split, unit["name"]),
                              (entry["tokens"] * TOKEN_DTYPE.itemsize, entry["documents"] * INDEX_DTYPE.itemsize)):
            if not os.path.isfile(path) or os.path.getsize(path) != size:
                return f"{path} is missing or not {size} bytes"
    return None


def finished_units(root: str, units: list[dict]) -> dict[str, dict]:
    """Name -> manifest of every unit of the plan ``units`` that ``root`` holds finished. A unit
    manifest that cannot be read, or that :func:`_unfinished_reason` refuses, is logged and left out,
    so the unit is done again (its shard files rewritten) instead of entering the dataset's manifest."""
    done = {}
    for unit in units:
        path = os.path.join(root, UNITS_DIR, f"{unit['name']}.json")
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                manifest = json.load(f)
            reason = _unfinished_reason(root, manifest, unit)
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # a half-written or edited file
            reason = f"it is not a unit manifest ({type(e).__name__}: {e})"
        if reason:
            logger.warning(f"{path}: unit {unit['name']} is done again: {reason}")
            continue
        done[unit["name"]] = manifest
    return done


def dataset_manifest(plan: dict, units: list[dict]) -> dict:
    """The dataset's manifest from its plan and its finished units (in plan order)."""
    splits = {}
    for split in SPLITS:
        shards = [{"unit": u["unit"], **u["splits"][split]} for u in units]
        splits[split] = {"tokens": sum(s["tokens"] for s in shards), "documents": sum(s["documents"] for s in shards),
                         "shards": shards}
    bad = {}
    for u in units:
        for path, counts in u["bad_records"].items():
            for reason, n in counts.items():
                bad.setdefault(path, {}).setdefault(reason, 0)
                bad[path][reason] += n
    return {"format": FORMAT, "version": VERSION, "dtype": TOKEN_DTYPE.str, "tokenizer": plan["tokenizer"],
            "source": plan["source"], "validation": {"fraction": plan["options"]["validation_fraction"],
                                                     "rule": VALIDATION_RULE},
            "splits": splits, "bad_records": bad}


def check_options(options: Options) -> None:
    """ValueError naming the flag of the first out-of-range option, before anything is written:
    a negative ``docs_per_shard`` planned no unit (a manifest of 0 tokens), a ``batch_size`` < 1
    never filled a batch (a whole unit in one tokenizer call)."""
    if not 0 <= options.validation_fraction < 1:
        raise ValueError(f"--validation-fraction: expected a number in [0, 1), got {options.validation_fraction}")
    if options.docs_per_shard < 0:
        raise ValueError(f"--docs-per-shard: expected an integer >= 0 (0: one shard per file), got "
                         f"{options.docs_per_shard}")
    if options.batch_size < 1:
        raise ValueError(f"--batch-size: expected a positive integer, got {options.batch_size}")


def check_source(spec: SourceSpec, options: Options) -> None:
    """ValueError naming the flag of a setting the source kind does not read, before anything is
    written: it would be recorded in the manifest's source although the data did not follow it
    (``--source embedded --path X`` tokenized the embedded corpus and recorded path X)."""
    if spec.kind not in SOURCE_KINDS:
        raise ValueError(f"--source: {spec.kind!r}; expected one of {SOURCE_KINDS}")
    default = SourceSpec(spec.kind)
    if spec.kind == "embedded" and spec.path:
        raise ValueError(f"--path: {spec.path!r} is not read by --source embedded (it reads the corpus in "
                         "parallax_titan/assets); use --source local or hub to read it")
    if spec.kind != "hub":
        for flag, value, unset in (("--name", spec.name, default.name), ("--split", spec.split, default.split),
                                   ("--revision", spec.revision, default.revision)):
            if value != unset:
                raise ValueError(f"{flag}: {value!r} is not read by --source {spec.kind} (only --source hub reads it)")
    elif options.docs_per_shard:
        raise ValueError(f"--docs-per-shard: {options.docs_per_shard} is not read by --source hub (a hub dataset is "
                         "cut into units by its own files)")
    elif options.max_record_bytes != Options().max_record_bytes:
        raise ValueError(f"--max-record-bytes: {options.max_record_bytes} is not read by --source hub (`datasets` "
                         "reads its records, longer lines included); use --source local on its files to cap a line")
    elif spec.revision is not None and os.path.isdir(spec.path):
        raise ValueError(f"--revision: {spec.revision!r} is not read from a local clone ({spec.path!r} is a folder: "
                         "its files are read as they are); check out that revision into the clone instead")


def pretokenize(spec: SourceSpec, root: str, tokenizer_path: str, options: Options = Options(), num_proc: int = 1,
                progress: bool = True) -> dict:
    """Pre-tokenize ``spec`` into the folder ``root`` (module docstring); returns the manifest.

    Resumable: finished units are kept. Raises ValueError for bad arguments, a ``root`` that
    :func:`check_layout` refuses or whose ``plan.json`` is no plan (before any unit is tokenized) or,
    under ``bad_data = "error"``, the first bad record (finished units stay).
    """
    from parallax_titan.tokenizer import EOS_TOKEN, load_tokenizer_json, tokenizer_sha256

    check_source(spec, options)
    check_options(options)
    tokenizer = load_tokenizer_json(tokenizer_path)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    if eos_id is None:
        raise ValueError(f"--tokenizer {tokenizer_path!r}: tokenizer.json has no {EOS_TOKEN} token")
    plan = {"tokenizer": {"sha256": tokenizer_sha256(tokenizer_path), "path": tokenizer_path, "eos_id": eos_id,
                          "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True)},
            "source": describe_source(spec, options), "options": asdict(options)}
    settings = settings_sha256(plan)
    plan["units"] = [{**unit, "settings": settings} for unit in plan_units(spec, options)]
    check_layout(root, plan["units"])
    os.makedirs(root, exist_ok=True)
    _check_plan(root, plan)
    done = finished_units(root, plan["units"])
    todo = [u for u in plan["units"] if u["name"] not in done]
    _run(todo, root, spec, options, tokenizer_path, eos_id, num_proc, progress, len(plan["units"]))
    done = finished_units(root, plan["units"])
    manifest = dataset_manifest(plan, [done[u["name"]] for u in plan["units"]])
    write_json_atomic(os.path.join(root, MANIFEST), manifest)
    return manifest


def _run(todo: list[dict], root: str, spec: SourceSpec, options: Options, tokenizer_path: str, eos_id: int,
         num_proc: int, progress: bool, total_units: int) -> None:
    """Run the units ``todo`` in ``num_proc`` processes, with a tqdm bar of tokens and tokens/s."""
    from tqdm import tqdm

    done = total_units - len(todo)
    bar = tqdm(total=None, unit="tok", unit_scale=True, disable=not progress, dynamic_ncols=True,
               desc=f"{done}/{total_units} units")
    args = [(root, spec, options, tokenizer_path, eos_id, unit) for unit in todo]
    try:
        if num_proc <= 1:
            _init_worker(bar.update)
            for _ in map(_run_unit_star, args):
                done += 1
                bar.set_description(f"{done}/{total_units} units")
        else:
            _run_pool(args, num_proc, bar, done, total_units)
    finally:
        _init_worker(None)
        bar.close()


def _run_pool(args: list[tuple], num_proc: int, bar, done: int, total_units: int) -> None:
    context = multiprocessing.get_context("fork")
    tokens = context.Queue()
    with context.Pool(num_proc, initializer=_init_worker, initargs=(tokens.put,)) as pool:
        results = pool.imap_unordered(_run_unit_star, args)
        remaining = len(args)
        while remaining:
            try:
                results.next(timeout=0.5)
                remaining -= 1
                done += 1
                bar.set_description(f"{done}/{total_units} units")
            except multiprocessing.TimeoutError:
                pass
            while True:
                try:
                    bar.update(tokens.get_nowait())
                except queue.Empty:
                    break
