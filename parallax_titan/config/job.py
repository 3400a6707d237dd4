"""The job config: TorchTitan's JobConfig with Parallax-Titan's typed sections, and its loader.

:func:`load_config` is the one way a run's config is made: TOML + ``--section.key value``
overrides, checked for unknown keys and types, parsed by TorchTitan's ConfigManager into a
:class:`JobConfig`, then validated once (every section's ``validate()`` and the checks that need
two sections) before anything is built.

No ``from __future__ import annotations`` here: tyro reads these annotations as real types.
"""

import os
import tomllib
from dataclasses import dataclass, field

from torchtitan.config import ConfigManager
from torchtitan.config import job_config as titan

from parallax_titan.config.diagnostics import Diagnostics
from parallax_titan.config.optim import LRScheduler, Optimizer
from parallax_titan.config.schema import toml_problems
from parallax_titan.config.sections import (
    Checkpoint, Eval, Metrics, Model, Parallax, Parallelism, Reliability, Training, Validation, _problems_of,
    mixer_problems,
)

FLOAT8 = "quantize.linear.float8"


class ConfigError(ValueError):
    """A config problem; the message lists every offending key with its value."""


@dataclass
class JobConfig(titan.JobConfig):
    """TorchTitan's JobConfig with our sections; every TorchTitan key keeps its meaning."""

    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    metrics: Metrics = field(default_factory=Metrics)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    validation: Validation = field(default_factory=Validation)
    parallelism: Parallelism = field(default_factory=Parallelism)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    parallax: Parallax = field(default_factory=Parallax)
    reliability: Reliability = field(default_factory=Reliability)
    eval: Eval = field(default_factory=Eval)
    diagnostics: Diagnostics = field(default_factory=Diagnostics)

    def validate(self, check_data: bool = True) -> list[str]:
        """Every problem of the config: each section's, then those that involve two sections.

        ``check_data``: also check that the training (and validation) data can be read; tools that
        only build the model (evaluation, export) leave it off."""
        sections = (self.model, self.parallax, self.training, self.validation, self.metrics, self.checkpoint,
                    self.parallelism, self.optimizer, self.lr_scheduler, self.reliability, self.eval,
                    self.diagnostics)
        problems = [p for section in sections for p in section.validate()]
        problems += self._model_problems(model_ok=not self.model.validate()) + self._job_problems()
        return problems + (self._data_problems() if check_data else [])

    def _model_problems(self, model_ok: bool) -> list[str]:
        """Head counts and switches of the model this config builds (needs a valid [model])."""
        if not model_ok:
            return []
        from parallax_titan.spec import model_args_for
        from parallax_titan.tokenizer import check_tokenizer_vocab

        args, problems = model_args_for(self), []
        name, flavor = self.model.name, self.model.flavor
        if args.n_heads % args.n_kv_heads:
            problems.append(f"model.n_heads: {args.n_heads} query heads is not a multiple of model.n_kv_heads = "
                            f"{args.n_kv_heads} (model {name!r}, flavor {flavor!r})")
        problems += mixer_problems(self, args)
        problems += self.optimizer.head_dim_problems(args.head_dim)
        problems += _problems_of(lambda: check_tokenizer_vocab(self.model.hf_assets_path, args.vocab_size))
        if self.parallax.init_from_transformer and args.mixer != "parallax":
            problems.append(f"parallax.init_from_transformer: set to {self.parallax.init_from_transformer!r}, "
                            f"but model.name {name!r} is not Parallax")
        return problems + self._float8_problems() + self._hf_save_problems(args.mixer)

    def _hf_save_problems(self, mixer: str) -> list[str]:
        """TorchTitan's Hugging Face last save holds model weights only, and needs their HF names."""
        from parallax_titan.hf_adapter import HF_MIXERS

        ckpt, problems = self.checkpoint, []
        if ckpt.enable and ckpt.last_save_in_hf and not ckpt.last_save_model_only:
            problems.append("checkpoint.last_save_in_hf: true needs checkpoint.last_save_model_only = true "
                            "(the Hugging Face format holds the model weights only)")
        if ckpt.enable and ckpt.last_save_in_hf and self.parallax.window:
            problems.append(f"checkpoint.last_save_in_hf: parallax.window = {self.parallax.window} has no Hugging "
                            "Face form (its modeling code is full causal attention)")
        if ckpt.enable and ckpt.last_save_in_hf and mixer not in HF_MIXERS:
            problems.append(f"checkpoint.last_save_in_hf: model.name = {self.model.name!r} has no Hugging Face "
                            "weight names; only the transformer and parallax variants have them")
        if ckpt.enable and ckpt.last_save_in_hf and self.eval.at_end:
            problems.append("checkpoint.last_save_in_hf: true writes the final step as Hugging Face safetensors, "
                            "which eval.at_end = true cannot score (it reads a DCP checkpoint); turn one off, and "
                            "convert afterwards with scripts/export_hf.py export")
        return problems

    def _float8_problems(self) -> list[str]:
        if FLOAT8 not in self.model.converters:
            return []
        import importlib.util

        import torch

        if importlib.util.find_spec("torchao") is None:
            return [f"model.converters: {FLOAT8!r} needs torchao (pip install torchao==0.18.0)"]
        emulate = self.quantize.linear.float8.emulate
        if not torch.cuda.is_available():
            return [] if emulate else [
                f"model.converters: {FLOAT8!r} on a machine without CUDA needs quantize.linear.float8.emulate = "
                "true (float8 matmuls need an sm89+ GPU; emulation is for tests)"]
        capability = torch.cuda.get_device_capability()
        if capability < (8, 9) and not emulate:
            return [f"model.converters: {FLOAT8!r} needs an sm89+ GPU (Ada, Hopper); this one is sm"
                    f"{capability[0]}{capability[1]}; quantize.linear.float8.emulate = true emulates it (for tests)"]
        if emulate and self.compile.enable and "model" in self.compile.components:
            return ["quantize.linear.float8.emulate = true does not work with compile.enable = true and 'model' "
                    "in compile.components (TorchTitan's rule); use the hardware float8 path or disable compile"]
        return []

    def _data_problems(self) -> list[str]:
        """The training and validation data sources, read under the bad-data policy."""
        from parallax_titan.data import check_dataset_config

        skip_bad, tokenizer = self.reliability.bad_data == "skip", self.model.hf_assets_path
        limit = self.training.max_record_bytes
        problems = _problems_of(lambda: check_dataset_config(self.training, "training", skip_bad, tokenizer, limit))
        if self.validation.enable:
            problems += _problems_of(
                lambda: check_dataset_config(self.validation, "validation", skip_bad, tokenizer, limit))
        return problems

    def _job_problems(self) -> list[str]:
        """The final evaluation, the validation and diagnostics windows, the global batch and WDA."""
        problems = self._batch_problems() + self.lr_scheduler.anneal_problems(self.training.steps, self.optimizer)
        if self.eval.at_end and not self.checkpoint.enable:
            problems.append("eval.at_end: true needs checkpoint.enable = true (the suite scores the final checkpoint)")
        if _int_above(self.reliability.stop_at_step, 0) and not self.checkpoint.enable:
            problems.append(f"reliability.stop_at_step: {self.reliability.stop_at_step} saves a checkpoint to resume "
                            "from, which needs checkpoint.enable = true (without it the run would stop and lose "
                            "its state)")
        # each run's training.steps is its last step (a resume continues the count): a later stop never comes
        if _int_above(self.reliability.stop_at_step, self.training.steps):
            problems.append(f"reliability.stop_at_step: expected at most training.steps = {self.training.steps} (the "
                            f"run ends there, so the stop would never come), got {self.reliability.stop_at_step!r}")
        problems += self._never_running_periods()
        # the model's RoPE table holds training.seq_len positions: a longer row fails at its first forward
        if _int_above(self.diagnostics.seq_len, self.training.seq_len):
            problems.append(f"diagnostics.seq_len: expected at most training.seq_len = {self.training.seq_len}, "
                            f"got {self.diagnostics.seq_len!r}")
        if self.validation.enable and _int_above(self.validation.seq_len, self.training.seq_len):
            problems.append(f"validation.seq_len: expected at most training.seq_len = {self.training.seq_len} (the "
                            f"model's RoPE table), got {self.validation.seq_len!r}")
        return problems + self._diagnostics_dataset_problems()

    def _never_running_periods(self) -> list[str]:
        """Periodic passes switched on with a period past the last step: they would never run."""
        diagnostics, steps = self.diagnostics, self.training.steps
        periods = (("diagnostics.freq", diagnostics.freq, diagnostics.enable),
                   ("diagnostics.spectral_freq", diagnostics.spectral_freq, diagnostics.enable and diagnostics.spectral),
                   ("eval.every_n_steps", self.eval.every_n_steps, True))
        return [f"{key}: expected at most training.steps = {steps} (the pass runs after every {key.split('.')[1]}-th "
                f"step, so it would never run), got {period!r}"
                for key, period, on in periods if on and _int_above(period, steps)]

    def _diagnostics_dataset_problems(self) -> list[str]:
        """The held-out batch's dataset must be a text dataset: the trainer reads it only after the
        model is built."""
        if not self.diagnostics.enable:
            return []
        from parallax_titan.diagnostics.batch import resolve_dataset

        problems = _problems_of(lambda: resolve_dataset(self, self.diagnostics))
        if problems and not self.diagnostics.dataset:
            problems = [f"{problems[0]} (taken from validation.dataset; set diagnostics.dataset to a text "
                        "dataset such as 'default_corpus_validation')"]
        if problems or not self.diagnostics.dataset:
            return problems  # [validation] data is checked as validation's
        from parallax_titan.data import check_dataset_config

        # the trainer reads the held-out batch after the model is built: check its file(s) now
        diagnostics, skip_bad = self.diagnostics, self.reliability.bad_data == "skip"
        return [p if p.startswith("diagnostics.") else f"diagnostics.dataset_path = {diagnostics.dataset_path!r}: {p}"
                for p in _problems_of(lambda: check_dataset_config(
                    diagnostics, "diagnostics", skip_bad, None, self.training.max_record_bytes))]

    def _batch_problems(self) -> list[str]:
        """TorchTitan needs the global batch to be a multiple of local batch x data-parallel degree
        (it asserts so after the build); the degree comes from ``WORLD_SIZE`` (1 without torchrun)."""
        training, world = self.training, world_size()
        wanted = training.global_batch_size
        if not all(isinstance(v, int) for v in (wanted, training.local_batch_size, world)):
            return []  # a wrong type is reported by Training.validate
        if wanted < 0 or training.local_batch_size < 1:
            return []
        degree = data_parallel_degree(self, world)
        per_step = training.local_batch_size * degree
        if degree >= 1 and wanted >= 1 and wanted % per_step == 0:
            return []
        return [f"training.global_batch_size: {wanted} is not a positive multiple of training.local_batch_size x "
                f"data-parallel degree = {training.local_batch_size} x {degree} = {per_step} (on {world} "
                f"rank{'s' if world != 1 else ''}); use a multiple of {per_step}, or -1 for {per_step}"]


def _int_above(value, limit) -> bool:
    """Whether ``value`` and ``limit`` are ints (a wrong type is reported by its section) and value > limit."""
    return all(isinstance(v, int) and not isinstance(v, bool) for v in (value, limit)) and value > limit


def world_size() -> int:
    """The number of ranks this run has: ``WORLD_SIZE`` as torchrun sets it, 1 without it."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def data_parallel_degree(config: "JobConfig", world: int) -> int:
    """Data-parallel ranks of ``world`` ranks (replicate x shard; -1 shards over what is left)."""
    p = config.parallelism
    others = p.tensor_parallel_degree * p.pipeline_parallel_degree * p.context_parallel_degree
    replicate = p.data_parallel_replicate_degree
    shard = p.data_parallel_shard_degree if p.data_parallel_shard_degree > 0 else world // max(1, others * replicate)
    return replicate * shard


def global_batch_size(config: "JobConfig", world: int) -> int:
    """Sequences per optimizer step: ``training.global_batch_size``, or local batch x data-parallel degree."""
    wanted = config.training.global_batch_size
    return wanted if wanted > 0 else config.training.local_batch_size * data_parallel_degree(config, world)


# TorchTitan (and tyro) take the key in either spelling; the file must be checked in both
CONFIG_FILE_FLAGS = ("--job.config_file", "--job.config-file")


def config_file_from_argv(argv: list[str]) -> str | None:
    """The value of ``--job.config_file`` (or ``--job.config-file``) in ``argv`` (either ``--k v`` or
    ``--k=v``), if any: the first one, as TorchTitan's loader reads it."""
    for i, arg in enumerate(argv):
        key, sep, value = arg.partition("=")
        if sep and key in CONFIG_FILE_FLAGS:
            return value
        if arg in CONFIG_FILE_FLAGS and i + 1 < len(argv):
            return argv[i + 1]
    return None


def read_toml(path: str) -> dict:
    """The TOML file at ``path`` as a dict, its keys and value types checked; ConfigError otherwise."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"job.config_file: {path!r} does not exist") from None
    except OSError as exc:  # a folder, no permission, ...
        raise ConfigError(f"job.config_file: {path!r} cannot be read as a TOML file: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # TOML is UTF-8; tomllib raises the latter
        raise ConfigError(f"job.config_file: {path!r} is not valid TOML: {exc}") from None
    problems = toml_problems(data, JobConfig)
    if problems:
        raise ConfigError(f"invalid config {path}:\n  " + "\n  ".join(problems))
    return data


def load_config(argv: list[str], check_data: bool = True) -> JobConfig:
    """TOML (``--job.config_file``) + CLI overrides -> a validated :class:`JobConfig`.

    Raises :class:`ConfigError` listing every problem (``<section.key>: ...``) before anything is
    built. ``check_data=False`` skips the data-source checks (for tools that only build the model).
    """
    path = config_file_from_argv(argv)
    if path is not None:
        read_toml(path)
    config = ConfigManager(JobConfig).parse_args(argv)
    problems = config.validate(check_data)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return config
