"""The TrainSpec's data builders and the checks a run makes on its data before training.

``check_dataset_config`` (called by config validation, on every rank, cheap) checks names, paths,
local files, and for ``pretokenized`` the manifests, the tokenizer hash and every shard's size.
``build_dataloader`` then (on each rank, before the first step) verifies the shards' checksums,
each rank a share of them, and builds the loader. ``resume_problem`` is the rule for a saved data
position this loader cannot take, which the trainer checks before the build. ``build_validator`` is
TorchTitan's validator reading our validation loader.
"""

from __future__ import annotations

import copy
import math
import os

import torch
from torchtitan.components.validate import Validator
from torchtitan.tools.logging import logger

from parallax_titan.config.schema import seed_problem
from parallax_titan.data.mixture import PERIOD, shares, unmixable_source
from parallax_titan.data.pretokenized import (
    DOCUMENT_STARTS, PretokenizedLoader, ReadAhead, SequenceSource, sequence_count_problem,
)
from parallax_titan.data.records import (DEFAULT_MAX_RECORD_BYTES, JSONL_SUFFIXES, check_file, files_fingerprint,
                                        list_data_files, resolve_data_files)
from parallax_titan.data.shards import TokenStream, check_split, read_manifest, split_shards
from parallax_titan.data.text import (
    EMBEDDED, GLOBAL_STATE_KEY, TEXT_DATASETS, build_text_loader, check_ultrafineweb_path,
)

PRETOKENIZED = "pretokenized"
DATASET_NAMES = (*TEXT_DATASETS, PRETOKENIZED)


def _split_of(section_name: str) -> str:
    return "train" if section_name == "training" else "validation"


def _skip_bad(job_config) -> bool:
    return job_config.reliability.bad_data == "skip"


def _max_bytes(job_config) -> int:
    return getattr(job_config.training, "max_record_bytes", DEFAULT_MAX_RECORD_BYTES)


def record_policy(job_config) -> tuple[bool, int]:
    """How a job reads text records: (skip bad ones, ``reliability.bad_data = "skip"``; the longest
    JSONL line, ``training.max_record_bytes``)."""
    return _skip_bad(job_config), _max_bytes(job_config)


def source_entries(cfg, section: str) -> list[tuple[str, str, float]]:
    """(name, path, weight or token budget) of each pre-tokenized source of a section:
    ``[[training.sources]]`` when given, else ``dataset_path`` with weight 1."""
    sources = getattr(cfg, "sources", [])
    if sources:
        return [(s.name or os.path.basename(os.path.normpath(s.path)), s.path, float(s.weight or s.tokens))
                for s in sources]
    path = cfg.dataset_path or ""
    return [(os.path.basename(os.path.normpath(path)) or "data", path, 1.0)]


def _source_key(cfg, section: str, i: int) -> str:
    return f"{section}.sources[{i}].path" if getattr(cfg, "sources", []) else f"{section}.dataset_path"


def _sources_problem(cfg, section: str) -> str | None:
    """Why ``[[<section>.sources]]`` cannot be mixed as written, or None: a folder listed twice (under
    two names the run would log two datasets and train on one), or a weight or token budget whose
    share of the sum is below the mixing resolution (no slot of a period would be its). Entries
    whose values the config's own check refuses are left to it."""
    sources = getattr(cfg, "sources", [])
    entries = source_entries(cfg, section) if sources else []
    seen = {}
    for i, (_, path, _) in enumerate(entries):
        folder = os.path.realpath(path) if path else None
        if folder in seen:
            return (f"{section}.sources[{i}].path = {path!r} is the folder of {section}.sources[{seen[folder]}]"
                    f".path = {entries[seen[folder]][1]!r}; expected each dataset once (its weight sets its share)")
        if folder:
            seen[folder] = i
    weights = [weight for _, _, weight in entries]
    if len(weights) < 2 or not all(isinstance(w, (int, float)) and math.isfinite(w) and w > 0 for w in weights):
        return None
    s = unmixable_source(weights)
    if s is None:
        return None
    key = "tokens" if sources[s].tokens else "weight"
    return (f"{section}.sources[{s}].{key} = {getattr(sources[s], key)!r}: a share of {shares(weights)[s]:.3g} of the "
            f"sequences, below the mixing resolution 1/{PERIOD} (the source would never be drawn); expected a larger "
            "share, or no such source")


def check_pretokenized(cfg, section: str, tokenizer_path: str | None, checksums: bool = False) -> list[dict]:
    """Check each source of a ``pretokenized`` section; returns their manifests.

    The manifest exists and is ours, its tokenizer's sha256 is that of ``tokenizer_path``'s
    ``tokenizer.json`` (when given), and every shard of the section's split is there with its
    recorded size (and sha256 with ``checksums``). ValueError naming the key and what is wrong.
    """
    from parallax_titan.tokenizer import tokenizer_sha256

    problem = _sources_problem(cfg, section)
    if problem:
        raise ValueError(problem)
    wanted = tokenizer_sha256(tokenizer_path) if tokenizer_path else None
    manifests = []
    for i, (_, path, _) in enumerate(source_entries(cfg, section)):
        key = _source_key(cfg, section, i)
        manifest = read_manifest(path, key)
        saved = manifest["tokenizer"]["sha256"]
        if wanted is not None and saved != wanted:
            raise ValueError(f"{key} = {path!r} was tokenized with another tokenizer (tokenizer.json sha256 "
                             f"{saved[:12]}..., from {manifest['tokenizer'].get('path')!r}) than model.hf_assets_path "
                             f"= {tokenizer_path!r} (sha256 {wanted[:12]}...); pre-tokenize with this tokenizer or "
                             "set model.hf_assets_path to the one used")
        check_split(path, manifest, _split_of(section), key, checksums)
        manifests.append(manifest)
    return manifests


def data_seed_problem(seed: int, dataset: str, key: str) -> str | None:
    """Why ``training.data_seed`` (named ``key``) cannot order ``dataset``, or None. Only the
    pre-tokenized order reads it, as a 64-bit key of its permutation
    (:func:`~parallax_titan.data.mixture.permutation`): a text dataset's order does not change with
    it, and a seed outside ``[0, 2**64)`` has no such key (NumPy would fail at the first batch, after
    the model is built)."""
    if dataset != PRETOKENIZED and seed:
        return (f"{key} = {seed!r}: only dataset = {PRETOKENIZED!r} is shuffled by it; {dataset!r} is read in its "
                "stored order, which the seed does not change; remove it, or pre-tokenize the data (python -m "
                "scripts.pretokenize)")
    return seed_problem(key, seed) if dataset == PRETOKENIZED else None


def dataset_files(section) -> str | None:
    """:func:`~parallax_titan.data.records.files_fingerprint` of the files a text dataset of
    ``section`` (``[training]``) reads from its ``dataset_path``: a ``local`` dataset's, or the file
    given in place of an embedded corpus; None for the others (the embedded files change only with the
    code, Ultra-FineWeb and pre-tokenized shards check their own files) and for a path that names no
    files (the data check refuses it)."""
    name = section.dataset.lower()
    if not section.dataset_path or name not in ("local", *EMBEDDED):
        return None
    try:
        files = list_data_files(section.dataset_path, warn=False) if name == "local" else [section.dataset_path]
        return files_fingerprint(files)
    except (ValueError, OSError):
        return None


def check_embedded_path(path: str | None, name: str, key: str) -> None:
    """ValueError naming ``key`` when ``path`` (set in place of embedded dataset ``name``'s file) is a
    folder or a file of another format than JSONL (a missing file is :func:`check_file`'s): that loader
    reads one JSONL file into memory, so a parquet file would pass the file check and fail at the
    loader build as invalid UTF-8 naming no key, and a folder would be said not to exist."""
    if path and (os.path.isdir(path) or os.path.isfile(path) and not path.endswith(JSONL_SUFFIXES)):
        what = "a folder" if os.path.isdir(path) else "a file of another format"
        raise ValueError(f"{key} = {path!r}: {name!r} reads one .jsonl/.jsonl.gz file, and this is {what}; expected "
                         "such a file, or dataset = 'local' for parquet files, a folder or a glob")


def check_dataset_config(cfg, section: str = "training", skip_bad: bool = False, tokenizer_path: str | None = None,
                         max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
    """Validate ``cfg.dataset`` / ``cfg.dataset_path`` (``cfg.sources``, ``cfg.data_seed``) without reading the data.

    ``cfg`` is JobConfig.training or JobConfig.validation (``section`` names it in errors). For
    ``local`` each file's footer / first record is checked; for ``pretokenized``,
    :func:`check_pretokenized` without checksums; for ``ultrafineweb`` a ``dataset_path`` folder must
    be a clone with the English split's files; remote datasets are not contacted. Raises
    ValueError naming the key and the value.
    """
    name = (cfg.dataset or "").lower()
    if name not in DATASET_NAMES:
        raise ValueError(f"{section}.dataset = {cfg.dataset!r} is not a known dataset; expected one of "
                         f"{sorted(DATASET_NAMES)}")
    if getattr(cfg, "sources", []) and name != PRETOKENIZED:
        raise ValueError(f"{section}.sources: mixing needs {section}.dataset = {PRETOKENIZED!r}, got {cfg.dataset!r}")
    problem = data_seed_problem(getattr(cfg, "data_seed", 0), name, f"{section}.data_seed")
    if problem:
        raise ValueError(problem)
    if name == "local":
        resolve_data_files(cfg.dataset_path, f"{section}.dataset_path", skip_bad, max_bytes)
    elif name == "ultrafineweb" and cfg.dataset_path:
        check_ultrafineweb_path(cfg.dataset_path, f"{section}.dataset_path")
    elif name in EMBEDDED:
        check_embedded_path(cfg.dataset_path, name, f"{section}.dataset_path")
        check_file(cfg.dataset_path or TEXT_DATASETS[name].path)
    elif name == PRETOKENIZED:
        check_pretokenized(cfg, section, tokenizer_path)


def verify_checksums_share(cfg, section: str, dp_rank: int, dp_world_size: int) -> None:
    """Verify the sha256 of this rank's share of the shards (shard j of the sorted list when
    ``j % dp_world_size == dp_rank``); together the ranks check every shard once."""
    split, j = _split_of(section), 0
    for i, (_, path, _) in enumerate(source_entries(cfg, section)):
        manifest = read_manifest(path, _source_key(cfg, section, i))
        for shard in split_shards(manifest, split):
            if j % dp_world_size == dp_rank:
                one = {**manifest, "splits": {split: {"shards": [m for m in manifest["splits"][split]["shards"]
                                                                 if m["unit"] == shard.unit]}}}
                check_split(path, one, split, _source_key(cfg, section, i), checksums=True)
            j += 1


def _sources(cfg, section: str, seq_len: int) -> tuple[list[SequenceSource], list[float]]:
    sources, weights = [], []
    for i, (name, path, weight) in enumerate(source_entries(cfg, section)):
        manifest = read_manifest(path, _source_key(cfg, section, i))
        source = SequenceSource(name, TokenStream(path, _split_of(section), manifest), seq_len)
        problem = sequence_count_problem(source)
        if problem:
            raise ValueError(f"{_source_key(cfg, section, i)} = {path!r}: {problem}")
        sources.append(source)
        weights.append(weight)
    return sources, weights


def global_batch_size(job_config, dp_world_size: int) -> int:
    """Sequences per optimizer step: ``training.global_batch_size``, or local batch x ranks when unset."""
    training = job_config.training
    return training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * dp_world_size


def _check_budgets(job_config, sources: list[SequenceSource], dp_world_size: int) -> None:
    """Token budgets (``tokens``) must add up to the run's tokens: steps x global batch x seq_len."""
    entries = job_config.training.sources
    if not entries or not entries[0].tokens:
        return
    training = job_config.training
    run_tokens = training.steps * global_batch_size(job_config, dp_world_size) * training.seq_len
    budget = sum(s.tokens for s in entries)
    if abs(budget - run_tokens) > run_tokens // 1000:
        raise ValueError(f"training.sources: the token budgets add up to {budget:,}, but the run trains on "
                         f"training.steps x global batch x seq_len = {run_tokens:,} tokens; make them agree (or use "
                         "weights)")
    for source, entry in zip(sources, entries):
        epochs = entry.tokens / max(1, source.num_sequences * source.seq_len)
        if epochs > 1:
            logger.warning(f"training.sources: {source.name} gives {entry.tokens:,} tokens from "
                           f"{source.num_sequences * source.seq_len:,}: {epochs:.2f} epochs")


def _check_validation_round(section, source: SequenceSource, dp_world_size: int) -> None:
    """Validation reads whole rounds of ranks x local batch sequences: a split without one would
    give no batch, and TorchTitan's validator fails on an empty pass (mid-run, at the first
    ``validation.freq`` step). ValueError naming the key and the sizes."""
    round_size = dp_world_size * section.local_batch_size
    if source.num_sequences < round_size:
        raise ValueError(f"validation.dataset_path = {section.dataset_path!r}: validation split has "
                         f"{source.num_sequences} sequences of seq_len + 1 tokens, fewer than one round of "
                         f"{dp_world_size} data-parallel ranks x validation.local_batch_size "
                         f"{section.local_batch_size}; lower validation.local_batch_size or validation.seq_len, or "
                         "pre-tokenize with a larger --validation-fraction")


def build_pretokenized_loader(job_config, section_name: str, dp_world_size: int, dp_rank: int) -> PretokenizedLoader:
    """The ``pretokenized`` loader of ``[training]`` or ``[validation]``, after verifying this rank's share
    of the shard checksums (``training.verify_shards = "checksum"``)."""
    section = getattr(job_config, section_name)
    if getattr(job_config.training, "verify_shards", "checksum") == "checksum":
        verify_checksums_share(section, section_name, dp_rank, dp_world_size)
    sources, weights = _sources(section, section_name, section.seq_len)
    training = section_name == "training"
    if training:
        _check_budgets(job_config, sources, dp_world_size)
    else:
        _check_validation_round(section, sources[0], dp_world_size)
    return PretokenizedLoader(
        sources, weights, local_batch_size=section.local_batch_size, dp_rank=dp_rank, dp_world_size=dp_world_size,
        global_batch_size=global_batch_size(job_config, dp_world_size), seed=job_config.training.data_seed,
        training=training, document_starts=job_config.parallax.attn_mask_type == "block_causal",
        read_ahead=ReadAhead.from_config(section.dataloader))


def saved_loader_keys(checkpoint_dir: str) -> list[str]:
    """The data-loader keys saved in the DCP step folder ``checkpoint_dir`` (``dp_rank_0``,
    ``world_size``, ...; none in a weights-only save)."""
    from torch.distributed.checkpoint import FileSystemReader

    entries = FileSystemReader(checkpoint_dir).read_metadata().state_dict_metadata
    return sorted(k.split(".", 1)[1] for k in entries if k.startswith("dataloader."))


def resume_problem(job_config, dp_world_size: int, checkpoint_dir: str) -> str | None:
    """Why this run (``dp_world_size`` data-parallel ranks) cannot continue from the data position
    saved in the step folder ``checkpoint_dir``, or None. The trainer checks the step its resume
    loads before the build (:func:`parallax_titan.resume.checkpoint_problems`).

    ``pretokenized`` and ``data_order = "global"`` save one position for all ranks and resume on any
    number of ranks; ``"sharded"`` saves one state per rank, each over its own documents, which
    another number of ranks cannot continue.
    """
    saved = saved_loader_keys(checkpoint_dir)
    if not saved:
        return None
    training = job_config.training
    if training.dataset.lower() == PRETOKENIZED:
        wanted, kind = ["data", "position"], f"training.dataset = {PRETOKENIZED!r}"
    elif training.data_order == "global":
        wanted, kind = [GLOBAL_STATE_KEY], "training.data_order = 'global'"
    else:
        ranks = sorted(int(k.rsplit("_", 1)[1]) for k in saved if k.startswith("dp_rank_"))
        if ranks and len(ranks) != dp_world_size:
            return (f"the checkpoint holds the data positions of {len(ranks)} data-parallel ranks in "
                    f"training.data_order = 'sharded' (each rank read its own part of the documents); this run has "
                    f"{dp_world_size}: resume on {len(ranks)} ranks, or use training.data_order = 'global' or "
                    f"training.dataset = {PRETOKENIZED!r}, whose position is one index")
        wanted, kind = sorted(["world_size"] + [f"dp_rank_{r}" for r in ranks]), "training.data_order = 'sharded'"
    if saved != wanted:
        return (f"the checkpoint's data-loader state ({', '.join(saved)}) was not written with {kind}, this run's "
                "setting; resume with the data settings the checkpoint was written with")
    return None


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config, infinite: bool = True):
    """TrainSpec.build_dataloader_fn: the checkpointable training loader of ``[training]``.

    Text datasets: :func:`parallax_titan.data.text.build_text_loader` (tokenized while training);
    ``pretokenized``: :class:`PretokenizedLoader`. Raises ValueError, before any training, for bad
    data.
    """
    training = job_config.training
    check_dataset_config(training, "training", _skip_bad(job_config), max_bytes=_max_bytes(job_config))
    if training.dataset.lower() == PRETOKENIZED:
        return build_pretokenized_loader(job_config, "training", dp_world_size, dp_rank)
    return build_text_loader(training, dp_world_size, dp_rank, tokenizer, data_order=training.data_order,
                             infinite=infinite, skip_bad=_skip_bad(job_config), max_bytes=_max_bytes(job_config))


def _text_sources(cfg, skip_bad: bool, max_bytes: int) -> set[str]:
    """The files (real paths) or hub ids a text dataset section reads."""
    name = cfg.dataset.lower()
    if name == "local":
        paths = resolve_data_files(cfg.dataset_path, "dataset_path", skip_bad, max_bytes)
    else:
        paths = [cfg.dataset_path or TEXT_DATASETS[name].path]
    return {os.path.realpath(p) if os.path.exists(p) else p for p in paths}


def training_overlap(job_config) -> str | None:
    """Why ``[validation]`` reads documents ``[training]`` trains on, or None: both text datasets
    reading a file (or hub dataset) in common. The pre-tokenized validation split is held out by text
    hash, so a pre-tokenized section on either side does not overlap."""
    train, val = job_config.training, job_config.validation
    if PRETOKENIZED in (train.dataset.lower(), val.dataset.lower()):
        return None
    skip_bad, max_bytes = _skip_bad(job_config), _max_bytes(job_config)
    shared = _text_sources(train, skip_bad, max_bytes) & _text_sources(val, skip_bad, max_bytes)
    if not shared:
        return None
    return (f"validation.dataset = {val.dataset!r} reads {sorted(shared)[:3]}, which training.dataset = "
            f"{train.dataset!r} trains on: the validation loss is not a held-out loss (the embedded corpus's "
            "held-out file is default_corpus_validation; pre-tokenized data has a validation split)")


def build_validation_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config, infinite: bool = False):
    """The loader of ``[validation]`` (same batch format as :func:`build_dataloader`).

    Text datasets are read in the global order, whole rounds of ranks x local batch only: every
    rank gets the same number of batches (each batch is a collective, so a rank with one more
    would wait forever, as split documents of unequal lengths give), and the batches do not depend
    on the number of ranks, as the pre-tokenized validation split's do not."""
    validation = job_config.validation
    check_dataset_config(validation, "validation", _skip_bad(job_config), max_bytes=_max_bytes(job_config))
    overlap = training_overlap(job_config) if dp_rank == 0 else None  # one warning, one pass over the files
    if overlap:
        logger.warning(overlap)
    if validation.dataset.lower() == PRETOKENIZED:
        return build_pretokenized_loader(job_config, "validation", dp_world_size, dp_rank)
    return build_text_loader(validation, dp_world_size, dp_rank, tokenizer, data_order="global", infinite=infinite,
                             skip_bad=_skip_bad(job_config), max_bytes=_max_bytes(job_config),
                             section_name="validation")


def document_boundaries_from_starts(starts: torch.Tensor):
    """Block-causal masks from a batch's ``document_starts`` (bool [batch, seq]): the model's
    :class:`~parallax_titan.model.DocumentBoundaries` (every row start is a document start)."""
    from parallax_titan.model import DocumentBoundaries

    flat = starts.clone()
    flat[:, 0] = True
    positions = torch.nonzero(flat.flatten(), as_tuple=False).flatten()
    end = torch.tensor([flat.numel()], dtype=positions.dtype, device=positions.device)
    return DocumentBoundaries(torch.cat([positions, end]).to(torch.int32))


class ValidationPasses:
    """The validation loader, each pass from the start of the validation set.

    A text loader keeps its stream position between iterations: without the restart, a second
    whole-set pass (``validation.steps = -1``) would give no batch and TorchTitan's validator would
    fail on an empty list, and with ``validation.steps = N`` each pass would score the next N
    batches, so the losses of two steps would come from different data. A pass that gives no batch
    (a set shorter than one round of ranks x ``validation.local_batch_size``) raises ValueError
    naming the keys. A finite set (pre-tokenized, or ``validation.steps = -1``) that ends before
    ``validation.steps`` batches is scored whole, with a warning the first time: the loss is over
    fewer batches than the config asks for.
    """

    def __init__(self, loader, section, dp_world_size: int):
        self.loader, self.section, self.dp_world_size = loader, section, dp_world_size
        self.start = copy.deepcopy(loader.state_dict())
        self.warned = False

    def __iter__(self):
        self.loader.load_state_dict(copy.deepcopy(self.start))
        count = 0
        for batch in self.loader:
            count += 1
            yield batch
        if count and count < self.section.steps and not self.warned:
            self.warned = True
            logger.warning(f"validation.steps = {self.section.steps}: the validation set gives {count} batches of "
                           f"{self.dp_world_size} data-parallel ranks x validation.local_batch_size "
                           f"{self.section.local_batch_size}; each pass scores those {count}")
        if not count:
            raise ValueError(f"validation.dataset = {self.section.dataset!r}: a validation pass gave no batch, its "
                             f"documents fill fewer than one round of {self.dp_world_size} data-parallel ranks x "
                             f"validation.local_batch_size {self.section.local_batch_size} sequences of "
                             f"validation.seq_len + 1 = {self.section.seq_len + 1} tokens; lower either, or use a "
                             "larger validation set")


class DataValidator(Validator):
    """TorchTitan's validator over :func:`build_validation_dataloader`; the batches' document starts
    (pre-tokenized data) become the model's block-causal masks."""

    def __init__(self, *, job_config, dp_world_size, dp_rank, tokenizer, parallel_dims, loss_fn, validation_context,
                 maybe_enable_amp, metrics_processor, pp_schedule=None, pp_has_first_stage=None,
                 pp_has_last_stage=None):
        self.job_config, self.tokenizer, self.parallel_dims, self.loss_fn = job_config, tokenizer, parallel_dims, loss_fn
        loader = build_validation_dataloader(dp_world_size, dp_rank, tokenizer, job_config,
                                             infinite=job_config.validation.steps != -1)
        self.validation_dataloader = ValidationPasses(loader, job_config.validation, dp_world_size)
        self.validation_context, self.maybe_enable_amp = validation_context, maybe_enable_amp
        self.metrics_processor = metrics_processor
        self.pp_schedule, self.pp_has_first_stage, self.pp_has_last_stage = pp_schedule, pp_has_first_stage, pp_has_last_stage

    def post_dataloading_process(self, input_dict, labels, model_parts):
        starts = input_dict.pop(DOCUMENT_STARTS, None)
        inputs, labels, extra_inputs, extra_kwargs = super().post_dataloading_process(input_dict, labels, model_parts)
        if starts is not None and getattr(model_parts[0].model_args, "needs_document_masks", False):
            extra_kwargs["attention_masks"] = document_boundaries_from_starts(starts)
        return inputs, labels, extra_inputs, extra_kwargs


def build_validator(**kwargs) -> DataValidator:
    """TrainSpec.build_validator_fn: :class:`DataValidator`."""
    return DataValidator(**kwargs)
