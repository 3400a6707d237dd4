"""Datasets and data loaders.

* :mod:`.records`: documents from local JSONL / parquet files under the bad-data policy.
* :mod:`.text`: text datasets tokenized while training (embedded corpus, local files,
  Ultra-FineWeb), registered once in TorchTitan's ``DATASETS``; the global data order.
* :mod:`.shards`: the pre-tokenized format (uint32 tokens, document index, manifests).
* :mod:`.pretokenize`: the pre-tokenizer behind ``python -m scripts.pretokenize``.
* :mod:`.mixture`, :mod:`.pretokenized`: the ``pretokenized`` dataset: permuted, mixed sequences
  whose order and saved position do not depend on the number of ranks.
* :mod:`.build`: the TrainSpec builders (``build_dataloader``, ``build_validator``) and the checks.

docs/data.md describes the formats and guarantees.
"""

from parallax_titan.data.build import (
    DATASET_NAMES, PRETOKENIZED, build_dataloader, build_validation_dataloader, build_validator,
    check_dataset_config, document_boundaries_from_starts, record_policy,
)
from parallax_titan.data.pretokenized import DOCUMENT_STARTS, PretokenizedLoader
from parallax_titan.data.records import BadRecords, resolve_data_files
from parallax_titan.data.text import (
    CORPUS_DIR, GlobalOrderTextDataset, load_embedded, load_local, load_ultrafineweb, rank_keeps_sequence,
)

__all__ = [
    "BadRecords", "CORPUS_DIR", "DATASET_NAMES", "DOCUMENT_STARTS", "GlobalOrderTextDataset", "PRETOKENIZED",
    "PretokenizedLoader", "build_dataloader", "build_validation_dataloader", "build_validator",
    "check_dataset_config", "document_boundaries_from_starts", "load_embedded", "load_local", "load_ultrafineweb",
    "rank_keeps_sequence", "record_policy", "resolve_data_files",
]
