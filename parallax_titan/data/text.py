"""Text datasets tokenized while training: the embedded corpus, local files, Ultra-FineWeb.

Datasets (``training.dataset`` / ``validation.dataset``):
  * ``ultrafineweb``: HF ``openbmb/Ultra-FineWeb`` (config ``default``, split ``en``), streamed;
    ``dataset_path`` may point to a mirror (hub id or local clone).
  * ``local``: ``dataset_path`` = a file, a directory or a glob of .parquet / .jsonl / .jsonl.gz
    files with a ``content`` text column, streamed in sorted order (:mod:`.records`).
  * ``default_corpus`` / ``default_corpus_validation``: the embedded public-domain corpus.

They are registered once, at import, in TorchTitan's registry (``DATASETS``, its extension point),
so TorchTitan's own tools find them. Our loaders do not go through the registry's loader: they
build :class:`TextDataset` with the job's bad-data policy passed in, so no global changes per job.

Batches are TorchTitan's: documents become ``tokens + [eos]``, are concatenated and cut into
windows of ``seq_len + 1`` tokens, yielded as ``({"input": x[:-1]}, x[1:])``.
``training.data_order = "sharded"`` splits the documents by rank (TorchTitan's behaviour);
``"global"`` (:class:`GlobalOrderTextDataset`) has every rank read the whole stream and keep its
slice of each global batch, so the batches do not depend on the number of ranks, and its saved
position (:class:`GlobalOrderLoader`) is one state shared by all ranks, so a run may resume on
another number of ranks.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import asdict

from datasets import Dataset, IterableDataset, load_dataset
from datasets.distributed import split_dataset_by_node
from torchdata.stateful_dataloader import StatefulDataLoader
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataset

from parallax_titan.data.hub_clone import checked_split_files, is_hub_id, load_split
from parallax_titan.data.records import (
    DEFAULT_MAX_RECORD_BYTES, TEXT_COLUMN, check_file, documents, jsonl_texts, resolve_data_files,
)

CORPUS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "corpus")
ULTRAFINEWEB = "openbmb/Ultra-FineWeb"
EMBEDDED = ("default_corpus", "default_corpus_validation")
GLOBAL_STATE_KEY = "global_order"


def sample_text(sample: dict) -> str:
    """Sample processor: the ``content`` column, which must be a string."""
    text = sample.get(TEXT_COLUMN)
    if not isinstance(text, str):
        raise ValueError(f"record has {TEXT_COLUMN}={text!r:.60} (type {type(text).__name__}); expected a string")
    return text


def load_local(path: str | None, skip_bad: bool = False, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> IterableDataset:
    """Stream documents from local files (see resolve_data_files), in sorted file order."""
    files = resolve_data_files(path, "training.dataset_path (or validation.dataset_path)", skip_bad, max_bytes)
    return IterableDataset.from_generator(documents, gen_kwargs={"files": files, "skip_bad": skip_bad,
                                                                 "max_bytes": max_bytes})


def load_embedded(path: str) -> Dataset:
    """Load an embedded corpus file fully into memory (a few MB) as a map-style Dataset."""
    check_file(path)
    return Dataset.from_dict({TEXT_COLUMN: [text for _, text in jsonl_texts(path)]})


def load_ultrafineweb(path: str) -> IterableDataset:
    """Stream Ultra-FineWeb's English split (``path`` = hub id, or a local clone: only the English
    files need be there, :mod:`.hub_clone`). Unreachable (no network, no clone): ConnectionError
    naming the keys and the ways to run without the hub."""
    if os.path.isdir(path):
        return load_split(path, "default", "en", "training.dataset_path (or validation.dataset_path)")
    try:
        return load_dataset(path, name="default", split="en", streaming=True)
    except ConnectionError as exc:
        raise ConnectionError(
            f'training.dataset = "ultrafineweb": {path!r} could not be reached ({exc}); expected network access '
            f"to the Hugging Face hub, or a local clone of {ULTRAFINEWEB} in training.dataset_path (docs/data.md), "
            'or its parquet files through dataset = "local", or pre-tokenized shards') from exc


def check_ultrafineweb_path(path: str, key: str) -> None:
    """ValueError naming ``key`` unless ``path`` is a hub id (not contacted here) or a local clone
    whose README declares config ``default``, split ``en``, with at least one of its files present
    and each of them readable (:func:`~parallax_titan.data.hub_clone.checked_split_files`)."""
    if os.path.isdir(path):
        checked_split_files(path, "default", "en", key)
    elif not is_hub_id(path):
        raise ValueError(f"{key} = {path!r}: no such folder; expected a local clone of {ULTRAFINEWEB} or a hub "
                         "dataset id (owner/name)")


TEXT_DATASETS = {
    "ultrafineweb": DatasetConfig(path=ULTRAFINEWEB, loader=load_ultrafineweb, sample_processor=sample_text),
    "local": DatasetConfig(path="", loader=load_local, sample_processor=sample_text),
    "default_corpus": DatasetConfig(
        path=os.path.join(CORPUS_DIR, "train.jsonl.gz"), loader=load_embedded, sample_processor=sample_text),
    "default_corpus_validation": DatasetConfig(
        path=os.path.join(CORPUS_DIR, "validation.jsonl.gz"), loader=load_embedded, sample_processor=sample_text),
}
DATASETS.update(TEXT_DATASETS)


def load_text(name: str, path: str | None, skip_bad: bool, max_bytes: int):
    """The documents of text dataset ``name`` at ``path`` (its default path when empty)."""
    spec = TEXT_DATASETS[name]
    if name == "local":
        return load_local(path, skip_bad, max_bytes)
    return spec.loader(path or spec.path)


class TextDataset(HuggingFaceTextDataset):
    """TorchTitan's packed-sequence text dataset over one of :data:`TEXT_DATASETS`, loaded with the
    job's bad-data policy (TorchTitan's constructor would call the registry's loader with a path only).

    ``section`` (``training`` or ``validation``) names the config keys in errors. An endless
    (``infinite``) dataset whose documents give nothing in two passes in a row raises ValueError:
    TorchTitan's loop would re-read the empty share forever, and the other ranks would wait on this
    one. One empty pass is normal: a pass resumed at the end of the documents."""

    def __init__(self, name: str, path: str | None, tokenizer, seq_len: int, dp_rank: int = 0,
                 dp_world_size: int = 1, infinite: bool = False, skip_bad: bool = False,
                 max_bytes: int = DEFAULT_MAX_RECORD_BYTES, section: str = "training"):
        self.dataset_name = name.lower()
        self._data = split_dataset_by_node(load_text(self.dataset_name, path, skip_bad, max_bytes),
                                           dp_rank, dp_world_size)
        self._tokenizer = tokenizer
        self.seq_len = seq_len
        self.infinite = infinite
        self._text_processor = sample_text
        self._sample_idx = 0
        self._token_buffer: list[int] = []
        self._where = (f"{section}.dataset = {name!r} ({section}.dataset_path = {path!r})" if path
                       else f"{section}.dataset = {name!r}")
        self._share = (dp_rank, dp_world_size)
        self._empty_passes = 0

    def _get_data_iter(self):
        if self._empty_passes >= 2:
            raise ValueError(self._no_document_message())
        return self._counted(super()._get_data_iter())

    def _no_document_message(self) -> str:
        rank, ranks = self._share
        skipped = "every record left out as bad under reliability.bad_data = 'skip'"
        if ranks == 1:
            return (f"{self._where}: a whole pass over the data gave no document ({skipped}); expected at least "
                    "one good document")
        return (f"{self._where}: data-parallel rank {rank} of {ranks} read no document in a whole pass over its "
                f"share of the data (fewer documents than ranks, or {skipped}); expected at least one good document "
                "per rank: add data, use fewer ranks, or training.data_order = 'global' (every rank reads every "
                "document)")

    def _counted(self, samples):
        """``samples``, counting the passes in a row that give none."""
        empty = True
        for sample in samples:
            empty, self._empty_passes = False, 0
            yield sample
        if empty:
            self._empty_passes += 1


def rank_keeps_sequence(index: int, dp_rank: int, dp_world_size: int, local_batch_size: int) -> bool:
    """Global data order: whether packed sequence ``index`` of the whole stream is this rank's.

    Consecutive blocks of ``local_batch_size`` sequences go to ranks 0, 1, ..., so global step s
    (with gradient accumulation A) trains on sequences ``[s*G, (s+1)*G)``, G = local batch x
    ranks x A, and one rank with A microbatches sees what A ranks see in one.
    """
    return (index // local_batch_size) % dp_world_size == dp_rank


class GlobalOrderTextDataset(TextDataset):
    """The whole token stream on every rank, of which each rank keeps its sequences.

    It reads one round (``local_batch_size x dp_world_size`` sequences) ahead before yielding this
    rank's block of it, so whenever a batch has been handed out every rank's state is the same: the
    stream position at the end of the round, and ``sequence_idx``, the index of the next sequence.
    """

    def __init__(self, *, dp_rank: int, dp_world_size: int, local_batch_size: int, **kwargs):
        super().__init__(dp_rank=0, dp_world_size=1, **kwargs)
        self.dp_rank, self.dp_world_size, self.local_batch_size = dp_rank, dp_world_size, local_batch_size
        self._sequence_idx = 0

    def __iter__(self):
        round_size = self.local_batch_size * self.dp_world_size
        kept = []
        for sample in super().__iter__():
            index = self._sequence_idx
            self._sequence_idx += 1
            if rank_keeps_sequence(index, self.dp_rank, self.dp_world_size, self.local_batch_size):
                kept.append(sample)
            if self._sequence_idx % round_size == 0:
                yield from kept
                kept = []

    def state_dict(self):
        """The parent's state plus the index of the next sequence of the full stream."""
        return {**super().state_dict(), "sequence_idx": self._sequence_idx}

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict`'s position."""
        super().load_state_dict(state_dict)
        self._sequence_idx = state_dict["sequence_idx"]


class GlobalOrderLoader(ParallelAwareDataloader):
    """TorchTitan's loader whose saved state is one value for all ranks (key :data:`GLOBAL_STATE_KEY`).

    Between steps every rank of a :class:`GlobalOrderTextDataset` holds the same state, at sequence
    ``step x global batch``; saving it under one key lets a run with another number of ranks (the
    same global batch) load it and keep its own sequences from there.
    """

    def state_dict(self) -> dict:
        return {GLOBAL_STATE_KEY: pickle.dumps(StatefulDataLoader.state_dict(self))}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict:
            StatefulDataLoader.load_state_dict(self, pickle.loads(state_dict[GLOBAL_STATE_KEY]))


def build_text_loader(section, dp_world_size: int, dp_rank: int, tokenizer, *, data_order: str,
                      infinite: bool, skip_bad: bool, max_bytes: int,
                      section_name: str = "training") -> ParallelAwareDataloader:
    """A checkpointable loader over the text dataset of ``section`` (``[training]`` or ``[validation]``,
    named by ``section_name`` in errors).

    Each batch is ``({"input": LongTensor[local_batch_size, seq_len]}, labels)``, labels the inputs
    shifted left by one token. ``data_order``: "sharded" or "global" (module docstring).
    """
    common = dict(name=section.dataset, path=section.dataset_path, tokenizer=tokenizer, seq_len=section.seq_len,
                  infinite=infinite, skip_bad=skip_bad, max_bytes=max_bytes, section=section_name)
    kwargs = {**asdict(section.dataloader), "batch_size": section.local_batch_size}
    if data_order == "global":
        dataset = GlobalOrderTextDataset(dp_rank=dp_rank, dp_world_size=dp_world_size,
                                         local_batch_size=section.local_batch_size, **common)
        return GlobalOrderLoader(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, **kwargs)
    dataset = TextDataset(dp_rank=dp_rank, dp_world_size=dp_world_size, **common)
    return ParallelAwareDataloader(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, **kwargs)

