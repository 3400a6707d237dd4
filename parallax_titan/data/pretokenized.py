"""The ``pretokenized`` dataset: fixed-length sequences read from memory-mapped shards, no tokenizer.

A source is one split of a pre-tokenized dataset (:mod:`.shards`): its token stream is cut at a
stride of ``seq_len`` into sequences of ``seq_len + 1`` tokens (sequence i covers stream tokens
``[i*seq_len, i*seq_len + seq_len + 1)``: input the first ``seq_len``, labels the last ``seq_len``,
so every token but the first is a label once per epoch).

Training order: global position g = 0, 1, 2, ... is one sequence of one source, fixed by the
seed and the mixture (:mod:`.mixture`). Rank r of W, local batch b, takes its k-th batch from
positions ``[(k*W + r)*b, (k*W + r + 1)*b)``, so step s trains on positions ``[(s-1)G, sG)``
(G = the global batch) whatever W and the gradient accumulation are. The loader's state is one
number, the next position ``k*W*b``, the same on every rank: a run resumes on any number of ranks
with the same global batch.

Batch k is a function of k alone, so reading ahead (:class:`ReadAhead`, TorchTitan's
``[<section>.dataloader]`` keys) changes when a batch is read, never which: the state counts the
batches handed to the trainer, not those read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torchtitan.components.dataloader import BaseDataLoader

from parallax_titan.data.mixture import Mixture, permutation
from parallax_titan.data.shards import TokenStream

DOCUMENT_STARTS = "document_starts"


@dataclass(frozen=True)
class SequenceSource:
    """One source: a split's token stream cut into sequences of ``seq_len + 1`` tokens."""

    name: str
    stream: TokenStream
    seq_len: int

    @property
    def num_sequences(self) -> int:
        return max(0, (self.stream.num_tokens - 1) // self.seq_len)

    def window(self, i: int) -> np.ndarray:
        """Tokens of sequence ``i`` (uint32, ``seq_len + 1``)."""
        return self.stream.tokens(i * self.seq_len, i * self.seq_len + self.seq_len + 1)

    def document_starts(self, i: int) -> np.ndarray:
        """(seq_len,) bool: where a document begins in sequence ``i``'s input (position 0 always)."""
        start = i * self.seq_len
        row = np.zeros(self.seq_len, dtype=bool)
        row[self.stream.document_starts(start, start + self.seq_len) - start] = True
        row[0] = True
        return row


def sequence_count_problem(source: SequenceSource) -> str | None:
    """A reason a source cannot give a sequence (fewer than ``seq_len + 1`` tokens), or None."""
    if source.num_sequences == 0:
        return (f"{source.name}: {source.stream.split} split has {source.stream.num_tokens} tokens, fewer than "
                f"seq_len + 1 = {source.seq_len + 1}")
    return None


@dataclass(frozen=True)
class ReadAhead:
    """How batches are read: in the training process (``workers`` 0), or ``prefetch`` batches ahead on
    one background thread (``workers`` 1: reading memory-mapped shards releases the GIL, and a thread
    needs no copy of the shards' index as a worker process would); with ``pin_memory``, into page-locked
    memory where CUDA is there, so the copy to the GPU is a direct one."""

    workers: int = 0
    prefetch: int = 2
    pin_memory: bool = False

    @classmethod
    def from_config(cls, loader) -> "ReadAhead":
        """From TorchTitan's ``[<section>.dataloader]`` (num_workers 0 or 1, prefetch_factor, pin_memory;
        checked by the config)."""
        return cls(workers=loader.num_workers, prefetch=loader.prefetch_factor or 2, pin_memory=loader.pin_memory)

    def read(self, load, keys):
        """``load(k)`` for each k of ``keys`` in order, read ahead as configured."""
        if not self.workers:
            yield from (self._pinned(load(k)) for k in keys)
            return
        keys = iter(keys)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pretokenized-read-ahead")
        try:
            pending = deque(pool.submit(self._read_pinned, load, k) for k in itertools.islice(keys, self.prefetch))
            while pending:
                batch = pending.popleft().result()
                pending.extend(pool.submit(self._read_pinned, load, k) for k in itertools.islice(keys, 1))
                yield batch
        finally:  # a closed generator (the run ended) drops the batches read ahead
            if not sys.is_finalizing():  # at interpreter exit the thread module is already torn down
                pool.shutdown(wait=True, cancel_futures=True)

    def _read_pinned(self, load, k):
        return self._pinned(load(k))

    def _pinned(self, batch):
        if not (self.pin_memory and torch.cuda.is_available()):
            return batch
        inputs, labels = batch
        return {key: value.pin_memory() for key, value in inputs.items()}, labels.pin_memory()


class PretokenizedLoader(BaseDataLoader):
    """Batches of pre-tokenized sequences in the global order (module docstring).

    Each batch is ``({"input": LongTensor[b, seq_len]}, labels LongTensor[b, seq_len])``, plus
    ``input["document_starts"]`` (bool [b, seq_len]) from the shards' document index when
    ``document_starts`` is set. ``training``: an endless permuted mixture whose position is saved;
    otherwise (validation) each pass reads the first source in stream order from the start, in
    whole rounds of ``W x b`` sequences, and saves nothing. ``read_ahead``: how batches are read.
    """

    def __init__(self, sources: list[SequenceSource], weights: list[float], *, local_batch_size: int,
                 dp_rank: int, dp_world_size: int, global_batch_size: int, seed: int, training: bool,
                 document_starts: bool, read_ahead: ReadAhead = ReadAhead()):
        self.sources, self.weights = sources, weights
        self.mixture = Mixture.from_weights(weights)
        self.local_batch_size, self.dp_rank, self.dp_world_size = local_batch_size, dp_rank, dp_world_size
        self.global_batch_size, self.seed, self.training = global_batch_size, seed, training
        self.with_document_starts, self.read_ahead = document_starts, read_ahead
        self._batch = 0  # batches this rank has handed out since the position was set

    @property
    def fingerprint(self) -> str:
        """What the meaning of a position depends on: sequence length, seed, sources and weights."""
        setup = [self.seed, [(s.seq_len, s.num_sequences, w) for s, w in zip(self.sources, self.weights)]]
        return hashlib.sha256(json.dumps(setup).encode()).hexdigest()[:16]

    def sequence_id(self, position: int) -> tuple[int, int]:
        """(source, sequence index) at global ``position`` of the training order."""
        s, draw = self.mixture.locate(position)
        n = self.sources[s].num_sequences
        epoch, k = divmod(draw, n)
        return s, int(permutation(n, self.seed, s, epoch)[k])

    def batch_positions(self, k: int) -> range:
        """Global positions of this rank's ``k``-th batch."""
        start = (k * self.dp_world_size + self.dp_rank) * self.local_batch_size
        return range(start, start + self.local_batch_size)

    def batch(self, ids: list[tuple[int, int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The batch of (source, sequence) ``ids``."""
        windows = np.stack([self.sources[s].window(i) for s, i in ids]).astype(np.int64)
        tokens = torch.from_numpy(windows)
        inputs = {"input": tokens[:, :-1]}
        if self.with_document_starts:
            inputs[DOCUMENT_STARTS] = torch.from_numpy(np.stack([self.sources[s].document_starts(i) for s, i in ids]))
        return inputs, tokens[:, 1:]

    def batch_ids(self, k: int) -> list[tuple[int, int]]:
        """(source, sequence) ids of this rank's ``k``-th batch: of the training order, or (validation)
        of the first source in stream order."""
        if self.training:
            return [self.sequence_id(g) for g in self.batch_positions(k)]
        return [(0, g) for g in self.batch_positions(k)]

    def __iter__(self):
        if not self.training:
            rounds = self.sources[0].num_sequences // (self.dp_world_size * self.local_batch_size)
            yield from self.read_ahead.read(self._load, range(rounds))
            return
        while True:  # once, unless a state is loaded while iterating: then again from its position
            start = self._batch
            batches = self.read_ahead.read(self._load, itertools.count(start))
            for k, batch in enumerate(batches, start):
                if self._batch != k:
                    batches.close()  # drops the batches read ahead of the old position
                    break
                self._batch = k + 1  # before the yield: a state taken after this batch points past it
                yield batch

    def _load(self, k: int):
        return self.batch(self.batch_ids(k))

    def mixture_metrics(self, step: int) -> dict[str, float]:
        """Realised share of sequences and tokens drawn from each source over steps 1..``step``."""
        taken = self.mixture.taken(step * self.global_batch_size)
        total = max(1, int(taken.sum()))
        metrics = {}
        for source, n in zip(self.sources, taken):
            metrics[f"data/{source.name}/fraction"] = int(n) / total
            metrics[f"data/{source.name}/tokens"] = float(int(n) * source.seq_len)
        return metrics

    def state_dict(self) -> dict:
        """``{"position": next global position, "data": fingerprint}``, identical on every rank."""
        if not self.training:
            return {}
        return {"position": self._batch * self.dp_world_size * self.local_batch_size, "data": self.fingerprint}

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue at the saved position; ValueError when it does not fit this run's data or ranks."""
        if not state_dict or not self.training:
            return
        if state_dict["data"] != self.fingerprint:
            raise ValueError("the checkpoint's data position belongs to another data setup (the sources, their "
                             "weights, training.seq_len or training.data_seed changed); resume with the same data "
                             "settings, or start a new job.dump_folder")
        position, round_size = int(state_dict["position"]), self.dp_world_size * self.local_batch_size
        if position % round_size:
            raise ValueError(f"the checkpoint's data position {position} is not a multiple of data-parallel ranks "
                             f"{self.dp_world_size} x training.local_batch_size {self.local_batch_size}: the global "
                             "batch must stay the same across a resume")
        self._batch = position // round_size
