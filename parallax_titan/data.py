"""Datasets and dataloaders, registered into TorchTitan's text-dataset registry at import.

Datasets (``training.dataset`` / ``validation.dataset``):
  * ``ultrafineweb``: HF ``openbmb/Ultra-FineWeb`` (config ``default``, split ``en``),
    streamed; ``dataset_path`` may point to a mirror (hub id or local clone).
  * ``local``: ``dataset_path`` = a file, a directory or a glob of .parquet /
    .jsonl / .jsonl.gz files with a ``content`` text column, streamed in sorted order.
  * ``default_corpus`` / ``default_corpus_validation``: the embedded public-domain
    corpus (parallax_titan/assets/corpus, see SOURCE.md there).

Batches come from TorchTitan's HuggingFaceTextDataset: documents are tokenized as
``tokens + [eos]``, concatenated, and cut into windows of ``seq_len + 1`` tokens
yielded as ``({"input": x[:-1]}, x[1:])``. Its state (sample index or stream
position, plus the token buffer) is saved by DCP through ParallelAwareDataloader,
so a resumed run continues at the exact next sample.

``training.data_order`` picks which sequences a data-parallel rank gets: "sharded" is TorchTitan's
split of the documents by rank; "global" (:class:`GlobalOrderTextDataset`) has every rank read the
whole stream and keep its slice of each global batch, so a run's batches do not depend on the
number of GPUs.
"""

import functools
import glob
import gzip
import json
import os
from dataclasses import asdict

import pyarrow.parquet as pq
from datasets import Dataset, IterableDataset, load_dataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.tools.logging import logger
from torchtitan.hf_datasets.text_datasets import (
    DATASETS,
    HuggingFaceTextDataset,
    build_text_dataloader,
    build_text_validation_dataloader,
)

TEXT_COLUMN = "content"
CORPUS_DIR = os.path.join(os.path.dirname(__file__), "assets", "corpus")
ULTRAFINEWEB = "openbmb/Ultra-FineWeb"
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
_PARQUET_SUFFIXES = (".parquet",)


def _text(sample: dict) -> str:
    """Sample processor: the ``content`` column, which must be a string."""
    text = sample.get(TEXT_COLUMN)
    if not isinstance(text, str):
        raise ValueError(
            f"record has {TEXT_COLUMN}={text!r} (type {type(text).__name__}); expected a string"
        )
    return text


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _parse_jsonl_line(path: str, lineno: int, raw: bytes) -> dict | None:
    """The record of one JSONL line (None for a blank line); ValueError naming file and line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}, line {lineno}: not valid UTF-8 ({e})") from None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {lineno}: not valid JSON ({e})") from None
    if not isinstance(record, dict) or TEXT_COLUMN not in record:
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{path}, line {lineno}: no '{TEXT_COLUMN}' column (found {found})")
    return record


def _jsonl_records(path: str, skipped: list[str] | None = None):
    """Yield (line_number, record) from a JSONL(.gz) file; clear errors name the file and line.

    With ``skipped`` (a list), malformed lines are not raised but appended to it as messages.
    """
    with _open_binary(path) as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                record = _parse_jsonl_line(path, lineno, raw)
            except ValueError as e:
                if skipped is None:
                    raise
                skipped.append(str(e))
                continue
            if record is not None:
                yield lineno, record


def _check_file(path: str, skip_bad: bool = False) -> None:
    """Cheap check of one data file: exists, not empty, has the ``content`` column.

    Reads only the parquet footer or the first JSONL record (the first well-formed one with
    ``skip_bad``).
    """
    if not os.path.isfile(path):
        raise ValueError(f"data file {path!r} does not exist")
    if os.path.getsize(path) == 0:
        raise ValueError(f"data file {path!r} is empty")
    if path.endswith(_PARQUET_SUFFIXES):
        meta = pq.ParquetFile(path).metadata
        columns = meta.schema.names
        if TEXT_COLUMN not in columns:
            raise ValueError(f"{path}: no '{TEXT_COLUMN}' column (found {columns})")
        if meta.num_rows == 0:
            raise ValueError(f"data file {path!r} is empty (0 rows)")
    elif path.endswith(_JSONL_SUFFIXES):
        if next(_jsonl_records(path, [] if skip_bad else None), None) is None:
            raise ValueError(f"data file {path!r} is empty (no JSON records)")
    else:
        raise ValueError(
            f"data file {path!r}: unsupported format; expected {_PARQUET_SUFFIXES + _JSONL_SUFFIXES}"
        )


def resolve_data_files(path: str | None, key: str = "training.dataset_path",
                       skip_bad: bool = False) -> list[str]:
    """Expand a file, directory or glob into a sorted list of data files, each checked.

    ``key`` names the config key in error messages. All files must be parquet, or all JSONL.
    With ``skip_bad``, files that fail their check (empty, no ``content`` column) are left out
    with a warning; it is still an error when none is left.
    """
    if not path:
        raise ValueError(
            f"{key} is not set (got {path!r}); dataset 'local' needs a .parquet/.jsonl/.jsonl.gz "
            "file, a directory of them, or a glob"
        )
    if os.path.isdir(path):
        files = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names
                 if name.endswith(_PARQUET_SUFFIXES + _JSONL_SUFFIXES)]
    elif os.path.isfile(path):
        files = [path]
    else:
        files = glob.glob(path, recursive=True)
    files = sorted(files)
    if not files:
        raise ValueError(f"{key} = {path!r} matches no .parquet/.jsonl/.jsonl.gz files")
    if len({f.endswith(_PARQUET_SUFFIXES) for f in files}) > 1:
        raise ValueError(f"{key} = {path!r} mixes parquet and JSONL files; use one format")
    usable = []
    for f in files:
        try:
            _check_file(f, skip_bad)
            usable.append(f)
        except ValueError as e:
            if not skip_bad:
                raise
            logger.warning(f"skipping data file ({e}); reliability.bad_data = 'skip'")
    if not usable:
        raise ValueError(f"{key} = {path!r}: none of its {len(files)} files is usable")
    return usable


def _file_texts(path: str, skipped: list[str] | None):
    if path.endswith(_PARQUET_SUFFIXES):
        for batch in pq.ParquetFile(path).iter_batches(columns=[TEXT_COLUMN], batch_size=1024):
            yield from batch.column(0).to_pylist()
    else:
        for _, record in _jsonl_records(path, skipped):
            yield record[TEXT_COLUMN]


def _file_documents(files: list[str], skip_bad: bool = False):
    """Generator for IterableDataset.from_generator; one shard per file.

    With ``skip_bad``, malformed records (invalid UTF-8 or JSON, no or non-string ``content``)
    are skipped and counted, and the count per file is logged when the file is done.
    """
    for path in files:
        skipped: list[str] | None = [] if skip_bad else None
        for text in _file_texts(path, skipped):
            if skipped is not None and not isinstance(text, str):
                skipped.append(f"{path}: {TEXT_COLUMN}={text!r} is not a string")
                continue
            yield {TEXT_COLUMN: text}
        if skipped:
            logger.warning(f"{path}: skipped {len(skipped)} malformed records (first: {skipped[0]})")


def load_local(path: str | None, skip_bad: bool = False) -> IterableDataset:
    """Stream documents from local files (see resolve_data_files), in sorted file order."""
    files = resolve_data_files(path, key="training.dataset_path (or validation.dataset_path)", skip_bad=skip_bad)
    return IterableDataset.from_generator(_file_documents, gen_kwargs={"files": files, "skip_bad": skip_bad})


def load_embedded(path: str) -> Dataset:
    """Load an embedded corpus file fully into memory (a few MB) as a map-style Dataset."""
    _check_file(path)
    texts = [record[TEXT_COLUMN] for _, record in _jsonl_records(path)]
    return Dataset.from_dict({TEXT_COLUMN: texts})


def load_ultrafineweb(path: str) -> IterableDataset:
    """Stream Ultra-FineWeb's English split (``path`` = hub id or a local mirror)."""
    return load_dataset(path, name="default", split="en", streaming=True)


DATASET_CONFIGS = {
    "ultrafineweb": DatasetConfig(path=ULTRAFINEWEB, loader=load_ultrafineweb, sample_processor=_text),
    "local": DatasetConfig(path="", loader=load_local, sample_processor=_text),
    "default_corpus": DatasetConfig(
        path=os.path.join(CORPUS_DIR, "train.jsonl.gz"), loader=load_embedded, sample_processor=_text
    ),
    "default_corpus_validation": DatasetConfig(
        path=os.path.join(CORPUS_DIR, "validation.jsonl.gz"), loader=load_embedded, sample_processor=_text
    ),
}
DATASETS.update(DATASET_CONFIGS)


def _skip_bad(job_config) -> bool:
    return getattr(getattr(job_config, "reliability", None), "bad_data", "error") == "skip"


def _use_bad_data_policy(job_config) -> None:
    """TorchTitan calls a dataset's loader with its path only: bind this job's policy to it."""
    DATASETS["local"] = DatasetConfig(
        path="", loader=functools.partial(load_local, skip_bad=_skip_bad(job_config)), sample_processor=_text
    )


def check_dataset_config(cfg, section: str = "training", skip_bad: bool = False) -> None:
    """Validate ``cfg.dataset`` / ``cfg.dataset_path`` without loading data.

    ``cfg`` is JobConfig.training or JobConfig.validation (``section`` names it in
    errors). For ``local`` each file's footer / first record is checked; remote
    datasets are not contacted. Raises ValueError naming the key and the value.
    """
    name = (cfg.dataset or "").lower()
    if name not in DATASETS:
        raise ValueError(
            f"{section}.dataset = {cfg.dataset!r} is not a known dataset; expected one of {sorted(DATASETS)}"
        )
    if name == "local":
        resolve_data_files(cfg.dataset_path, key=f"{section}.dataset_path", skip_bad=skip_bad)
    elif name in ("default_corpus", "default_corpus_validation"):
        _check_file(cfg.dataset_path or DATASETS[name].path)


def rank_keeps_sequence(index: int, dp_rank: int, dp_world_size: int, local_batch_size: int) -> bool:
    """Global data order: whether packed sequence ``index`` of the whole stream is this rank's.

    Consecutive blocks of ``local_batch_size`` sequences go to ranks 0, 1, ..., so global step s
    (with gradient accumulation A) trains on sequences ``[s*G, (s+1)*G)``, G = local batch x
    ranks x A, and one rank with A microbatches sees what A ranks see in one.
    """
    return (index // local_batch_size) % dp_world_size == dp_rank


class GlobalOrderTextDataset(HuggingFaceTextDataset):
    """TorchTitan's packed-sequence dataset read whole on every rank, keeping this rank's sequences.

    The parent yields sequence 0, 1, 2, ... of the full stream (``dp_rank`` 0 of 1); this class
    counts them and keeps those :func:`rank_keeps_sequence` assigns to ``dp_rank``. Its state adds
    the count to the parent's (document index or stream position, token buffer), so a resumed run
    continues at the exact next sequence.
    """

    def __init__(self, *, dp_rank: int, dp_world_size: int, local_batch_size: int, **kwargs):
        super().__init__(dp_rank=0, dp_world_size=1, **kwargs)
        self.dp_rank, self.dp_world_size, self.local_batch_size = dp_rank, dp_world_size, local_batch_size
        self._sequence_idx = 0

    def __iter__(self):
        for sample in super().__iter__():
            index = self._sequence_idx
            self._sequence_idx += 1
            if rank_keeps_sequence(index, self.dp_rank, self.dp_world_size, self.local_batch_size):
                yield sample

    def state_dict(self):
        """The parent's state plus the index of the next sequence of the full stream."""
        return {**super().state_dict(), "sequence_idx": self._sequence_idx}

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict`'s position."""
        super().load_state_dict(state_dict)
        self._sequence_idx = state_dict["sequence_idx"]


def _build_global_order_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config,
                                   infinite: bool) -> ParallelAwareDataloader:
    """TorchTitan's ``build_text_dataloader`` with :class:`GlobalOrderTextDataset`."""
    training = job_config.training
    dataset = GlobalOrderTextDataset(
        dataset_name=training.dataset, dataset_path=training.dataset_path, tokenizer=tokenizer,
        seq_len=training.seq_len, infinite=infinite,
        dp_rank=dp_rank, dp_world_size=dp_world_size, local_batch_size=training.local_batch_size,
    )
    return ParallelAwareDataloader(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                   **{**asdict(training.dataloader), "batch_size": training.local_batch_size})


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config, infinite: bool = True):
    """TrainSpec.build_dataloader_fn: checkpointable loader over ``job_config.training``.

    Each batch is ``({"input": LongTensor[local_batch_size, seq_len]}, labels)`` with
    labels the inputs shifted left by one token. With ``training.data_order = "sharded"`` ranks
    read disjoint documents; with ``"global"`` every rank reads the whole stream and keeps its
    slice of each global batch (:class:`GlobalOrderTextDataset`).
    """
    check_dataset_config(job_config.training, "training", _skip_bad(job_config))
    _use_bad_data_policy(job_config)
    if job_config.training.data_order == "global":
        return _build_global_order_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite)
    return build_text_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite=infinite)


def build_validation_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config,
                                infinite: bool = False):
    """Validation loader over ``job_config.validation`` (same batch format as build_dataloader)."""
    check_dataset_config(job_config.validation, "validation", _skip_bad(job_config))
    _use_bad_data_policy(job_config)
    return build_text_validation_dataloader(dp_world_size, dp_rank, tokenizer, job_config,
                                            infinite=infinite)


__all__ = [
    "GlobalOrderTextDataset", "build_dataloader", "build_validation_dataloader", "check_dataset_config",
    "load_local", "load_embedded", "load_ultrafineweb", "rank_keeps_sequence", "resolve_data_files",
]
