"""The fixed held-out batch of the diagnostics pass."""

from __future__ import annotations

import torch

from torchtitan.hf_datasets.text_datasets import DATASETS

from parallax_titan.data.records import DEFAULT_MAX_RECORD_BYTES
from parallax_titan.data.text import load_text  # importing it registers our datasets with TorchTitan

DEFAULT_DATASET = "default_corpus_validation"


def resolve_dataset(job_config, config) -> tuple[str, str]:
    """(dataset name, path) of the held-out batch: ``[diagnostics] dataset`` when set, else the
    ``[validation]`` data when validation is enabled, else the embedded validation corpus."""
    if config.dataset:
        name, path = config.dataset, config.dataset_path
    elif job_config.validation.enable:
        name, path = job_config.validation.dataset, job_config.validation.dataset_path or ""
    else:
        name, path = DEFAULT_DATASET, ""
    if name.lower() not in DATASETS:
        raise ValueError(f"diagnostics.dataset = {name!r} is not a known dataset; expected one of {sorted(DATASETS)}")
    return name.lower(), path or DATASETS[name.lower()].path


def heldout_tokens(name: str, path: str, tokenizer, batch_size: int, seq_len: int,
                   policy: tuple[bool, int] = (False, DEFAULT_MAX_RECORD_BYTES)) -> torch.Tensor:
    """The first ``batch_size * seq_len`` tokens of the dataset's documents, each encoded as
    tokens + eos (the training convention), as a (batch_size, seq_len) int64 tensor. ``policy``:
    (skip bad records, longest JSONL line), the job's (``parallax_titan.data.record_policy``), which
    the config check read the files under."""
    spec = DATASETS[name]
    needed = batch_size * seq_len
    tokens: list[int] = []
    for sample in load_text(name, path, *policy):
        tokens.extend(tokenizer.encode(spec.sample_processor(sample), add_bos=True, add_eos=True))
        if len(tokens) >= needed:
            return torch.tensor(tokens[:needed], dtype=torch.long).view(batch_size, seq_len)
    raise ValueError(
        f"diagnostics: dataset {name!r} at {path!r} has only {len(tokens)} tokens; the held-out batch "
        f"needs diagnostics.batch_size * seq_len = {batch_size} * {seq_len} = {needed}; expected at most "
        f"{len(tokens)} (a smaller batch_size or seq_len, or another diagnostics.dataset)"
    )
