"""The TOML sections Parallax-Titan adds to TorchTitan's, each with a ``validate()``.

Sections TorchTitan already has (``[model]``, ``[training]``, ``[metrics]``, ...) are subclasses of
TorchTitan's dataclasses, so every TorchTitan key keeps its meaning. ``validate()`` returns every
problem of the section on its own, as ``"<section>.<key>: ..."`` strings; checks that need two
sections live in :meth:`parallax_titan.config.JobConfig.validate`.

No ``from __future__ import annotations`` here: tyro reads these annotations as real types.
"""

import math
import os
from dataclasses import dataclass, field
from typing import Literal

from torchtitan.config import job_config as titan

from parallax_titan.config.schema import value_problems
from parallax_titan.suite import PAPER_SUITE


def positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def finite_at_least(value, low: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low


@dataclass
class Parallax:
    """``[parallax]``: the attention mixer's switches."""

    rho_rope: bool = True
    """Apply RoPE to the probe rho (same cos/sin as q). The paper's ablation turns it off."""

    gate: Literal["none", "token", "head"] = "none"
    """Sigmoid gate on rho after its norm: one scalar per token, or one per token and head."""

    probe_init: Literal["normal", "zero"] = "normal"
    """"zero": the rho-norm weight starts at 0 (W_R like W_Q either way), so every layer computes
    exactly softmax attention at step 0 and the probe grows from there by about the lr per step."""

    attn_backend: Literal["auto", "reference", "triton"] = "auto"
    """Parallax kernel: fused Triton on CUDA and the exact PyTorch reference on CPU when auto."""

    fused_norm_rope: bool = True
    """The per-head RMSNorms and RoPE of q, k and rho as Triton kernels where they apply (CUDA, the
    fused attention backend, heads of 64 or more, no gate); false keeps TorchTitan's norm modules
    and RoPE, compiled by Inductor. Same math; the kernels round once after RoPE, as a compiled block does."""

    hopper_kernels: bool = True
    """The attention forward and backward as the Gluon kernels of ``kernels/parallax/hopper.py`` where
    they apply (an sm_90 GPU, the fused backend, bf16/fp16, heads of 64 or 128); false keeps the Triton
    kernels. Same math; outputs and gradients may differ in their last bits (summation order)."""

    attn_mask_type: Literal["causal", "block_causal"] = "causal"
    """causal over the packed row, or block_causal: no attention across <|endoftext|>."""

    window: int = 0
    """Sliding window W of Parallax attention: query i reads keys i - W < j <= i (SPEC 1b); 0 = full
    causal attention. Parallax models only."""

    init_from_transformer: str = ""
    """Up-training: a DCP checkpoint folder of a Transformer run (e.g. outputs/x/checkpoint/step-1000)
    loaded into a Parallax model at step 0, with rho-norm weights 0 (as ``probe_init = "zero"``). A
    requeued job that resumes a step of its own neither reads nor needs it."""

    def validate(self) -> list[str]:
        problems = value_problems(self, "parallax")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            problems.append(f"parallax.window: expected an int >= 0 (0 = full causal attention), got {self.window!r}")
        return problems  # init_from_transformer's folder is checked where it is loaded (resume.checkpoint_problems)


@dataclass
class Model(titan.Model):
    """``[model]``: TorchTitan's keys (``name`` = variant, ``flavor`` = size, ``hf_assets_path`` =
    tokenizer folder, ``converters``) plus shape overrides on top of the flavor (0 keeps its value)."""

    dim: int = 0
    """Model width d_model."""

    n_layers: int = 0
    """Number of blocks."""

    n_heads: int = 0
    """Query heads Hq (also the number of probe heads)."""

    n_kv_heads: int = 0
    """Key/value heads Hkv; Hq must be a multiple of Hkv."""

    head_dim: int = 0
    """Head dimension D."""

    hidden_dim: int = 0
    """SwiGLU FFN width."""

    vocab_size: int = 0
    """Embedding rows; must be at least the tokenizer's vocabulary."""

    def validate(self) -> list[str]:
        from parallax_titan.mixers import fla_hopper_blocker, fla_missing
        from parallax_titan.model import SHAPE_KEYS
        from parallax_titan.spec import BASE_FLAVORS, VARIANTS
        from parallax_titan.tokenizer import check_tokenizer_path

        if self.name not in VARIANTS:
            return [f"model.name: {self.name!r} is not a Parallax-Titan variant; expected one of {', '.join(VARIANTS)}"]
        if self.flavor not in BASE_FLAVORS:
            return [f"model.flavor: {self.flavor!r} is unknown; expected one of {', '.join(BASE_FLAVORS)}"]
        # before any model build: the fla mixers are an optional install, and fla 0.6.0's GDN backward
        # stops on Hopper with triton < 3.7.1 unless tilelang is there (after minutes of compiling)
        blocker = fla_missing(self.name) or fla_hopper_blocker(self.name)
        problems = [blocker] if blocker else []
        problems += value_problems(self, "model")  # a wrong type set in code; TOML and CLI are checked earlier
        problems += [f"model.{k}: expected a positive integer, got {getattr(self, k)!r}"
                     for k in SHAPE_KEYS if isinstance(getattr(self, k), int) and getattr(self, k) < 0]
        problems += _problems_of(lambda: check_tokenizer_path(self.hf_assets_path))
        return problems + self._converter_problems()

    def _converter_problems(self) -> list[str]:
        from parallax_titan.compat import model_converter_names

        known = model_converter_names()
        return [f"model.converters: {name!r} is not a TorchTitan model converter; expected one of "
                f"{', '.join(map(repr, known))}" for name in self.converters if name not in known]



def mixer_problems(job, args) -> list[str]:
    """Problems of the model's sequence mixer (``args.mixer`` of the model ``job`` builds) with the
    ``[parallax]`` switches and with the shapes the run feeds it: block-causal masks need a mixer that
    takes document boundaries, a sliding window needs Parallax attention, a changed switch a mixer
    that reads it (:data:`MIXER_SWITCHES`), and exact LLA's cost per forward (``kernels.exact_lla_cost``,
    the direct Cholesky solve) must stay within ``args.lla_max_cost`` for every (batch, seq_len) the
    run uses (training, validation, evaluation, diagnostics)."""
    from parallax_titan.mixers import VARLEN_MIXERS

    name, parallax, problems = job.model.name, job.parallax, []
    packed = ("parallax", *VARLEN_MIXERS)  # mixers that take document boundaries
    if parallax.attn_mask_type == "block_causal" and args.mixer not in packed:
        problems.append(f"parallax.attn_mask_type: 'block_causal' needs a mixer that takes packed documents "
                        f"({', '.join(packed)}); model.name {name!r} supports 'causal' only")
    if isinstance(parallax.window, int) and parallax.window > 0 and args.mixer != "parallax":
        problems.append(f"parallax.window: a sliding window needs Parallax attention (model.name parallax or "
                        f"parallax_dagger); got window = {parallax.window} with model.name {name!r}")
    problems += _unread_switch_problems(parallax, name, args.mixer)
    if args.mixer == "exact_lla" and args.lla_max_cost is not None:
        problems += _exact_lla_cost_problems(job, args)
    return problems


# [parallax] switches that some mixers read (parallax_titan.model, parallax_titan.mixers): what each
# configures and the mixers that read it. The others (TorchTitan's attention, fla's layers, the other
# family kernels) have no such part and would ignore a changed value.
MIXER_SWITCHES = {
    **dict.fromkeys(("rho_rope", "gate", "probe_init"), ("the probe rho of Parallax attention", ("parallax",))),
    "attn_backend": ("the kernels of Parallax attention and Affine Linear Attention", ("parallax", "affine_la")),
    "fused_norm_rope": ("the norm and RoPE kernels of Parallax attention's input projection", ("parallax",)),
    "hopper_kernels": ("the sm_90 Gluon kernels of Parallax attention", ("parallax",)),
}


def _unread_switch_problems(parallax: Parallax, name: str, mixer: str) -> list[str]:
    """A ``[parallax]`` switch changed from its default on a model whose mixer does not read it:
    refused, not ignored; the message names the models that read it."""
    default, problems = Parallax(), []
    for key, (what, readers) in MIXER_SWITCHES.items():
        value = getattr(parallax, key)
        if mixer not in readers and value != getattr(default, key):
            problems.append(f"parallax.{key}: {value!r} configures {what}, but model.name {name!r} has none (it "
                            f"would be ignored); use model.name {_models_of(readers)}, or keep the default "
                            f"{getattr(default, key)!r}")
    return problems


def _models_of(mixers: tuple[str, ...]) -> str:
    """The ``model.name`` values whose mixer is one of ``mixers``, as "a, b or c"."""
    from parallax_titan.spec import BASE_FLAVORS, VARIANTS, variant_args

    base = BASE_FLAVORS["debug"]  # any size: a variant's mixer does not depend on it
    names = [v for v in VARIANTS if variant_args(v, base).mixer in mixers]
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def _exact_lla_cost_problems(job, args) -> list[str]:
    from kernels.family.lla import exact_lla_cost

    training = job.training
    shapes = [("training", "training.local_batch_size", training.local_batch_size, "training.seq_len",
               training.seq_len)]
    if job.validation.enable:
        shapes.append(("validation", "validation.local_batch_size", job.validation.local_batch_size,
                       "validation.seq_len", job.validation.seq_len))
    if job.eval.at_end or job.eval.every_n_steps:
        shapes.append(("evaluation", "eval.batch_size", job.eval.batch_size, "eval.max_length",
                       job.eval.max_length or training.seq_len))
    if job.diagnostics.enable:
        shapes.append(("diagnostics", "diagnostics.batch_size", job.diagnostics.batch_size, "diagnostics.seq_len",
                       job.diagnostics.seq_len or training.seq_len))
    problems = []
    for what, batch_key, batch, len_key, seq_len in shapes:
        cost = exact_lla_cost(batch, seq_len, args.n_heads, args.head_dim)
        if cost > args.lla_max_cost:
            problems.append(
                f"model.name: 'exact_lla' costs B*Hq*L*(L*D^2 + D^3) = {cost:.3g} multiply-adds per layer and "
                f"forward for {what} ({batch_key} B = {batch}, {len_key} L = {seq_len}, Hq = {args.n_heads}, "
                f"D = {args.head_dim}), above the limit {args.lla_max_cost:.3g}: exact LLA solves one D x D "
                "system per query and is meant for MAD and small models; use a smaller batch or sequence, or "
                "model.name 'parallax' (learned probe) or 'affine_mesanet' (uniform weights)")
    return problems


def is_pretokenized(dataset) -> bool:
    """Whether a ``dataset`` key names the pre-tokenized shards (``parallax_titan.data.PRETOKENIZED``),
    which their own loader reads, and not a text dataset."""
    return isinstance(dataset, str) and dataset.lower() == "pretokenized"


def loader_problems(loader, section: str, dataset) -> list[str]:
    """``[<section>.dataloader]`` of the section's ``dataset``: at most one worker (a worker process
    for text, a read-ahead thread for pre-tokenized shards, ``data.pretokenized.ReadAhead``), a
    prefetch factor only with it, persistent workers only with a worker process."""
    problems = []
    if loader.num_workers not in (0, 1):
        # every worker would replay the whole stream: our datasets are split by rank, not by worker
        problems.append(f"{section}.dataloader.num_workers: expected 0 (load in the training process) or 1 "
                        f"(one background reader), got {loader.num_workers!r}")
    if loader.persistent_workers and (loader.num_workers == 0 or is_pretokenized(dataset)):
        # TorchTitan drops it without a word when there is no worker to keep; the pre-tokenized
        # read-ahead is a thread started per pass, with nothing to keep
        problems.append(f"{section}.dataloader.persistent_workers: true keeps worker processes alive between "
                        f"epochs, but {_loader_of(loader, section, dataset)} starts none (it would be ignored); "
                        f"expected false{'' if is_pretokenized(dataset) else ', or num_workers = 1'}")
    if loader.prefetch_factor is not None and (loader.num_workers == 0 or loader.prefetch_factor < 1):
        problems.append(f"{section}.dataloader.prefetch_factor: expected unset with num_workers = 0, or a "
                        f"positive integer with num_workers = 1; got {loader.prefetch_factor!r} with "
                        f"num_workers = {loader.num_workers!r}")
    return problems


def _loader_of(loader, section: str, dataset) -> str:
    if is_pretokenized(dataset):
        return f"{section}.dataset = 'pretokenized' (read ahead on a thread)"
    return f"num_workers = {loader.num_workers!r}"


@dataclass
class DataSource:
    """One ``[[training.sources]]`` entry: a pre-tokenized dataset and its share of the mixture."""

    path: str = ""
    """Folder written by ``python -m scripts.pretokenize`` (its ``train`` split is read)."""

    weight: float = 0.0
    """Share of the training sequences, relative to the other sources' weights (> 0)."""

    tokens: int = 0
    """Or a token budget: the tokens this source gives over ``training.steps`` (all sources then use
    budgets, which must add up to steps x global batch x seq_len)."""

    name: str = ""
    """Name in the logged proportions (``data/<name>/fraction``); empty: the folder's name."""


@dataclass
class Training(titan.Training):
    """``[training]``: TorchTitan's keys plus the data order, pre-tokenized sources and record limits."""

    data_order: Literal["sharded", "global"] = "sharded"
    """Text datasets: which packed sequences a data-parallel rank trains on. "sharded" (TorchTitan's):
    each rank reads its own part of the documents, so the batches depend on the number of ranks.
    "global": every rank reads the whole token stream and keeps sequence i when
    ``(i // local_batch_size) % dp_world_size == dp_rank``, so step s trains on sequences
    ``[s*G, (s+1)*G)`` (G = local batch x DP degree x gradient accumulation) on any number of
    GPUs; each rank then tokenizes the whole stream. ``dataset = "pretokenized"`` is always global."""

    sources: list[DataSource] = field(default_factory=list)
    """``dataset = "pretokenized"``: the datasets to mix (``[[training.sources]]`` tables); empty:
    ``dataset_path`` alone."""

    data_seed: int = 0
    """Seed of the pre-tokenized sequence permutation (independent of ``debug.seed``)."""

    verify_shards: Literal["checksum", "size"] = "checksum"
    """Before training: check every shard's sha256 against its manifest (the ranks share the work),
    or only its size (config validation always checks sizes and the tokenizer hash)."""

    max_record_bytes: int = 64 << 20
    """Longest JSONL line a text reader takes; a longer one is a bad record (``reliability.bad_data``)."""

    def __post_init__(self):
        # TOML gives [[training.sources]] as dicts: make them typed entries (unknown keys are
        # reported by the TOML check before this runs)
        self.sources = [DataSource(**s) if isinstance(s, dict) else s for s in self.sources]

    def validate(self) -> list[str]:
        problems = value_problems(self, "training")
        # gc_freq: TorchTitan asserts it only when the trainer starts (a raw AssertionError)
        for key in ("steps", "seq_len", "local_batch_size", "max_record_bytes", "gc_freq"):
            if not positive_int(getattr(self, key)):
                problems.append(f"training.{key}: expected a positive integer, got {getattr(self, key)!r}")
        if not finite_at_least(self.max_norm, 0) or self.max_norm == 0:
            problems.append(f"training.max_norm: expected a finite number > 0, got {self.max_norm!r}")
        return problems + loader_problems(self.dataloader, "training", self.dataset) + self._source_problems()

    def _source_problems(self) -> list[str]:
        """Each ``[[training.sources]]`` entry: a path, and a weight > 0 or a token budget > 0 (one kind for all)."""
        problems = []
        if self.sources and self.dataset_path:
            problems.append(f"training.dataset_path: set to {self.dataset_path!r} beside training.sources; set one")
        for i, source in enumerate(self.sources):
            key = f"training.sources[{i}]"
            problems += [f"{key}.{p.split('.', 1)[1]}" for p in value_problems(source, "source")]
            if not source.path:
                problems.append(f"{key}.path: expected a pre-tokenized dataset folder, got {source.path!r}")
            if source.weight and source.tokens:
                problems.append(f"{key}: set weight or tokens, not both (got weight = {source.weight!r}, "
                                f"tokens = {source.tokens!r})")
            elif source.tokens:
                if not positive_int(source.tokens):
                    problems.append(f"{key}.tokens: expected a positive integer, got {source.tokens!r}")
            elif not (finite_at_least(source.weight, 0) and source.weight > 0):
                problems.append(f"{key}.weight: expected a finite number > 0, got {source.weight!r}")
        if len({bool(s.tokens) for s in self.sources}) > 1:
            problems.append("training.sources: give every source a weight, or every source a token budget")
        names = [s.name or os.path.basename(os.path.normpath(s.path)) for s in self.sources]
        if len(set(names)) < len(names):
            problems.append(f"training.sources: names {names} repeat; set name = ... to tell them apart")
        return problems


@dataclass
class Metrics(titan.Metrics):
    """``[metrics]``: TorchTitan's keys plus a progress bar and a JSONL log."""

    progress_bar: bool = True
    """Show a tqdm progress bar with the loss on rank 0."""

    save_jsonl: bool = True
    """Append every logged metric to ``<job.dump_folder>/metrics.jsonl`` (rank 0), one JSON line per log."""

    def validate(self) -> list[str]:
        problems = value_problems(self, "metrics")
        if not positive_int(self.log_freq):
            problems.append(f"metrics.log_freq: expected a positive integer, got {self.log_freq!r}")
        if self.save_for_all_ranks and not (self.enable_tensorboard or self.enable_wandb):
            # TorchTitan builds no logger then; metrics.jsonl is rank 0's whatever this says
            problems.append("metrics.save_for_all_ranks: true writes the TensorBoard and W&B logs of every rank, but "
                            "metrics.enable_tensorboard and enable_wandb are false (metrics.jsonl is rank 0's only), "
                            "so it would be ignored; expected false, or a logger on")
        return problems


@dataclass
class Checkpoint(titan.Checkpoint):
    """``[checkpoint]``: TorchTitan's keys plus checksums and what a corrupt checkpoint does."""

    verify: bool = True
    """Write ``manifest.json`` (a checksum per file) with every checkpoint and check it before a
    load (a resume, ``initial_load_path``, ``parallax.init_from_transformer``, ``[eval] at_end``);
    a step counts as complete only with a manifest. ``false``: neither (DCP's ``.metadata`` alone
    marks a complete step)."""

    on_corrupt: Literal["fallback", "stop"] = "fallback"
    """A corrupt or truncated checkpoint file on resume: load the newest valid checkpoint instead
    (with a warning naming the file; the bad folder is renamed ``corrupt-N``), or stop."""

    def validate(self) -> list[str]:
        problems = value_problems(self, "checkpoint")
        if self.enable and not positive_int(self.interval):
            problems.append(f"checkpoint.interval: expected a positive integer, got {self.interval!r}")
        if not isinstance(self.keep_latest_k, int) or self.keep_latest_k < 0 or self.keep_latest_k == 1:
            problems.append(f"checkpoint.keep_latest_k: expected 0 (keep all) or an integer >= 2 (TorchTitan's "
                            f"rule), got {self.keep_latest_k!r}")
        if self.export_dtype != "float32" and not self.last_save_model_only:
            # TorchTitan converts only the model-only last save
            problems.append(f"checkpoint.export_dtype: {self.export_dtype!r} applies to the model-only last save; "
                            "with checkpoint.last_save_model_only = false it would be ignored")
        return problems + self._load_problems() + self._fault_tolerance_problems()

    def _load_problems(self) -> list[str]:
        """What the run loads: TorchTitan fails on these only when training starts (after the build),
        or, with ``enable = false``, ignores them without a word."""
        problems = []
        unknown = [k for k in self.exclude_from_loading if k not in CHECKPOINT_STATES]
        if unknown:
            # TorchTitan raises a ValueError at the load, which our loader reports as a damaged file
            problems.append(f"checkpoint.exclude_from_loading: expected entries from "
                            f"{', '.join(map(repr, CHECKPOINT_STATES))}, got {unknown!r}")
        if isinstance(self.load_step, int) and self.load_step < -1:
            problems.append(f"checkpoint.load_step: expected -1 (the newest step) or a step >= 0, got "
                            f"{self.load_step!r}")
        if self.initial_load_in_hf and not self.initial_load_model_only:
            problems.append("checkpoint.initial_load_in_hf: true needs checkpoint.initial_load_model_only = true (a "
                            "Hugging Face checkpoint holds model weights only; TorchTitan asserts it at the load)")
        if self.initial_load_in_hf_quantized and not self.initial_load_in_hf:
            problems.append("checkpoint.initial_load_in_hf_quantized: true needs checkpoint.initial_load_in_hf = true")
        if self.create_seed_checkpoint and self.load_only:
            problems.append("checkpoint.create_seed_checkpoint: true writes nothing with checkpoint.load_only = true")
        if not self.enable:
            ignored = [("load_step", self.load_step != -1), ("initial_load_path", bool(self.initial_load_path)),
                       ("exclude_from_loading", bool(self.exclude_from_loading)),
                       ("initial_load_in_hf", self.initial_load_in_hf),
                       ("initial_load_model_only", not self.initial_load_model_only)]
            problems += [f"checkpoint.{key}: set to {getattr(self, key)!r}, but checkpoint.enable = false loads "
                         "nothing (it would be ignored); set checkpoint.enable = true" for key, on in ignored if on]
            if self.create_seed_checkpoint:
                problems.append("checkpoint.create_seed_checkpoint: true writes nothing with checkpoint.enable = false "
                                "(the run would only log that it did); set checkpoint.enable = true")
            # what a save would write: with enable = false TorchTitan's manager saves nothing
            unwritten = [("last_save_in_hf", self.last_save_in_hf),
                         ("enable_first_step_checkpoint", self.enable_first_step_checkpoint),
                         ("export_dtype", self.export_dtype != "float32" and self.last_save_model_only)]
            problems += [f"checkpoint.{key}: set to {getattr(self, key)!r}, but checkpoint.enable = false writes no "
                         "checkpoint (it would be ignored); set checkpoint.enable = true, or keep the default "
                         f"{getattr(titan.Checkpoint(), key)!r}" for key, on in unwritten if on]
        return problems

    def _fault_tolerance_problems(self) -> list[str]:
        """TorchTitan reads ``enable_ft_dataloader_checkpoints`` only with a TorchFT manager, which
        Parallax-Titan's trainer never builds (``fault_tolerance.enable`` is refused)."""
        if self.enable_ft_dataloader_checkpoints:
            return []
        return ["checkpoint.enable_ft_dataloader_checkpoints: False is never read by Parallax-Titan's trainer "
                "(TorchTitan reads it with fault tolerance only, which the trainer never builds), so it would be "
                "ignored; expected True"]


# the states a trainer checkpoint holds (TorchTitan's CheckpointManager): what exclude_from_loading may name
CHECKPOINT_STATES = ("model", "optimizer", "lr_scheduler", "dataloader", "train_state")


@dataclass
class Validation(titan.Validation):
    """``[validation]``: TorchTitan's keys; ``dataset = "pretokenized"`` reads the ``validation``
    split of the folder ``dataset_path``."""

    def __post_init__(self):
        """Not TorchTitan's assert on ``steps`` (a raw AssertionError from inside the parser):
        :meth:`validate` names the key with the section's other problems."""

    def validate(self) -> list[str]:
        problems = value_problems(self, "validation")
        if not (isinstance(self.steps, int) and (self.steps >= 1 or self.steps == -1)):
            problems.append(f"validation.steps: expected a positive integer or -1 (the whole validation set), "
                            f"got {self.steps!r}")
        for key in ("freq", "local_batch_size", "seq_len"):
            if self.enable and not positive_int(getattr(self, key)):
                problems.append(f"validation.{key}: expected a positive integer, got {getattr(self, key)!r}")
        # the text validation loader takes these as the training loader does (data/text.py)
        return problems + (loader_problems(self.dataloader, "validation", self.dataset) if self.enable else [])


@dataclass
class Parallelism(titan.Parallelism):
    """``[parallelism]``: TorchTitan's keys; FSDP2 / HSDP / DDP are supported."""

    def validate(self) -> list[str]:
        problems = [f"parallelism.{key}: {getattr(self, key)} is not supported yet; use FSDP (data_parallel_*)"
                    for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree")
                    if getattr(self, key) != 1]
        # no MoE layers: TorchTitan would build an expert mesh that nothing uses (or assert on it)
        problems += [f"parallelism.{key}: expected 1 (Parallax-Titan's models have no experts), got "
                     f"{getattr(self, key)!r}"
                     for key in ("expert_parallel_degree", "expert_tensor_parallel_degree") if getattr(self, key) != 1]
        problems += self._unused_option_problems()
        # TorchTitan asserts these only when the trainer sets up its device mesh
        if not positive_int(self.data_parallel_replicate_degree):
            problems.append(f"parallelism.data_parallel_replicate_degree: expected a positive integer, got "
                            f"{self.data_parallel_replicate_degree!r}")
        shard = self.data_parallel_shard_degree
        if not (positive_int(shard) or (isinstance(shard, int) and shard == -1)):
            problems.append(f"parallelism.data_parallel_shard_degree: expected -1 (the ranks left) or a positive "
                            f"integer, got {shard!r}")
        return problems

    def _unused_option_problems(self) -> list[str]:
        """Options of tensor, pipeline, context and expert parallelism: with their degrees at 1 (the
        only ones supported) TorchTitan never reads them, so a changed value would be ignored."""
        default = titan.Parallelism()
        return [f"parallelism.{key}: set to {getattr(self, key)!r}, but {degree} = 1 (Parallax-Titan trains with "
                f"data parallelism only), so it would be ignored; expected {getattr(default, key)!r}"
                for key, degree in PARALLELISM_OPTIONS.items()
                if getattr(self, degree) == 1 and getattr(self, key) != getattr(default, key)]


# options read only with another parallelism than data parallelism: the degree that enables each
PARALLELISM_OPTIONS = {
    "disable_loss_parallel": "tensor_parallel_degree",
    "enable_async_tensor_parallel": "tensor_parallel_degree",
    **{key: "pipeline_parallel_degree" for key in (
        "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
        "pipeline_parallel_expert_parallel_overlap")},
    "context_parallel_load_balancer": "context_parallel_degree",
    "context_parallel_rotate_method": "context_parallel_degree",
    "expert_parallel_comm_backend": "expert_parallel_degree",
}


@dataclass
class Reliability:
    """``[reliability]``: interruptions and numerical failures."""

    save_on_sigterm: bool = True
    """On SIGTERM (as sent by schedulers before preemption), finish the step, save a full checkpoint
    and exit with code 0; rerunning the same command resumes from it. With ``checkpoint.enable =
    false`` it stops without one and says so."""

    stop_at_step: int = 0
    """Save a full checkpoint and exit after this step (0: never); simulates an interruption. At most
    ``training.steps``, and needs ``checkpoint.enable`` (both checked with the other sections)."""

    bad_data: Literal["error", "skip"] = "error"
    """Malformed local data (an empty file, a file or record without a string ``content``, invalid
    UTF-8 or JSON): stop with an error naming the file and line, or skip it and log how many
    records each file lost."""

    nonfinite: Literal["skip", "stop", "off"] = "skip"
    """Non-finite loss or gradient: skip the optimizer step, or save and stop (without checkpoints:
    stop, saying none was written); the report names the step and the first parameter whose
    gradient is not finite. "off" does not check."""

    def validate(self) -> list[str]:
        problems = value_problems(self, "reliability")
        if isinstance(self.stop_at_step, int) and self.stop_at_step < 0:
            problems.append(f"reliability.stop_at_step: expected 0 (never) or a step, got {self.stop_at_step!r}")
        return problems


EVAL_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class Eval:
    """``[eval]``: downstream evaluation (lm-eval, zero-shot) of the final checkpoint, and of the
    live model during training."""

    at_end: bool = False
    """Run the suite on the final checkpoint when training ends; the table goes to <dump_folder>/eval/."""

    every_n_steps: int = 0
    """During training, after every N-th step: run ``tasks`` (``limit`` documents each) on the live
    model's weights, sharded across data-parallel ranks, and log the scores as
    ``eval/downstream/<task>/<metric>`` (TensorBoard, metrics.jsonl). 0 = never. Training is unchanged by it."""

    tasks: list[str] = field(default_factory=lambda: list(PAPER_SUITE))
    """Tasks to run: the paper's suite or a subset of it (lambada_openai, wikitext, boolq, ...)."""

    limit: int = 0
    """Documents per task, 0 = all."""

    batch_size: int = 8
    """Sequences per forward pass."""

    device: str = ""
    """cpu, cuda, cuda:N; empty: CUDA when available."""

    dtype: str = "auto"
    """auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16 or float16."""

    max_length: int = 0
    """Scoring window in tokens; 0 = training.seq_len."""

    data_dir: str = ""
    """Folder with <task>.jsonl files read instead of the Hugging Face hub/cache (offline)."""

    bootstrap_iters: int = 100000
    """lm-eval bootstrap iterations for the standard errors (0 = none)."""

    def validate(self) -> list[str]:
        problems = value_problems(self, "eval")
        unknown = [t for t in self.tasks if t not in PAPER_SUITE]
        if unknown:
            problems.append(f"eval.tasks: unknown {unknown}; expected names from {list(PAPER_SUITE)}")
        repeated = sorted({t for t in self.tasks if self.tasks.count(t) > 1})
        if repeated:
            problems.append(f"eval.tasks: {repeated} given more than once; expected each task once")
        if not self.tasks and (self.at_end or self.every_n_steps):
            problems.append(f"eval.tasks: empty with eval.at_end = {self.at_end} and eval.every_n_steps = "
                            f"{self.every_n_steps}; expected at least one task from {list(PAPER_SUITE)}")
        if self.dtype not in EVAL_DTYPES:
            problems.append(f"eval.dtype: expected one of {EVAL_DTYPES}, got {self.dtype!r}")
        if isinstance(self.device, str) and self.device not in ("", "auto"):
            problems += _problems_of(lambda: check_eval_device(self.device))
        for key, low in (("limit", 0), ("batch_size", 1), ("max_length", 0), ("bootstrap_iters", 0),
                         ("every_n_steps", 0)):
            if isinstance(getattr(self, key), int) and getattr(self, key) < low:
                problems.append(f"eval.{key}: expected an integer >= {low}, got {getattr(self, key)!r}")
        return problems


def check_eval_device(device: str) -> None:
    """ValueError naming ``eval.device`` unless it is a CPU or CUDA device name (the final
    evaluation would otherwise fail on it only after training)."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"eval.device: expected empty (CUDA when available), 'cpu', 'cuda' or 'cuda:N', "
                         f"got {device!r}")


def _problems_of(check) -> list[str]:
    """Run a check that raises ValueError with a message naming its key; its message, or nothing."""
    try:
        check()
    except ValueError as exc:
        return [str(exc)]
    return []
