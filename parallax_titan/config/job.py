"""The job config: TorchTitan's JobConfig with Parallax-Titan's typed sections, and its loader.

:func:`load_config` is the one way a run's config is made: TOML + ``--section.key value``
overrides, checked for unknown keys and types, parsed by TorchTitan's ConfigManager into a
:class:`JobConfig`, then validated once (every section's ``validate()`` and the checks that need
two sections) before anything is built.

No ``from __future__ import annotations`` here: tyro reads these annotations as real types.
"""

import importlib.util
import os
import tomllib
from dataclasses import dataclass, field, fields

from torchtitan.config import ConfigManager
from torchtitan.config import job_config as titan

from parallax_titan.config.diagnostics import Diagnostics
from parallax_titan.config.optim import LRScheduler, Optimizer
from parallax_titan.config.schema import seed_problem, toml_problems
from parallax_titan.config.sections import (
    Checkpoint, Eval, Metrics, Model, Parallax, Parallelism, Reliability, Training, Validation, _problems_of,
    finite_at_least, is_pretokenized, mixer_problems, positive_int,
)

FLOAT8 = "quantize.linear.float8"
MX = "quantize.linear.mx"
COMPILE_COMPONENTS = ("model", "loss")  # what TorchTitan's compile.components is tested for
ROPE_MIXERS = ("softmax", "parallax", "exact_lla")
"""Mixers that rotate queries and keys with RoPE, in pairs of channels (an even ``head_dim``; they
compute with ``rope_theta``); the fla mixers and the uniform-weight family members take no positions.
Kept by hand; a test builds every non-fla mixer with two ``rope_theta`` values and checks that exactly
these compute another output."""
AC_DETERMINISM_CHECKS = ("default", "none")  # torch.utils.checkpoint's determinism_check values


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

        ``check_data``: also the checks of the training machine: the training (and validation) data
        can be read, and the devices that profiling, MXFP8 and the memory-budget checkpointing need
        are here, and what only the trainer writes (diagnostics figures need TensorBoard). Tools that
        only build the model (evaluation, export, the launcher) leave it off: they may run where the
        training does not."""
        sections = (self.model, self.parallax, self.training, self.validation, self.metrics, self.checkpoint,
                    self.parallelism, self.optimizer, self.lr_scheduler, self.reliability, self.eval,
                    self.diagnostics)
        problems = [p for section in sections for p in section.validate()]
        problems += self._titan_problems()
        problems += self._model_problems(model_ok=not self.model.validate()) + self._job_problems()
        return problems + (self._data_problems() + self._machine_problems() + self._figure_problems()
                           if check_data else [])

    def _figure_problems(self) -> list[str]:
        """The trainer's diagnostics draw their figures into TensorBoard only (``scripts.analyze``, which
        turns diagnostics on for its own pass, writes PNG files: not checked there)."""
        if self.diagnostics.enable and self.diagnostics.figures and not self.metrics.enable_tensorboard:
            return ["diagnostics.figures: true draws the depth figures into TensorBoard, but "
                    "metrics.enable_tensorboard = false (they would be dropped); turn one of them over"]
        return []

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
        if args.mixer in ROPE_MIXERS and args.head_dim % 2:
            # TorchTitan's RoPE table has 2 * (head_dim // 2) columns: its assert fails at the first forward
            problems.append(f"model.head_dim: {args.head_dim} is odd, but model.name {name!r} applies RoPE to its "
                            "heads, which rotates pairs of channels (the first forward would fail); expected an even "
                            "head_dim")
        problems += mixer_problems(self, args)
        problems += self.optimizer.head_dim_problems(args.head_dim)
        problems += _problems_of(lambda: check_tokenizer_vocab(self.model.hf_assets_path, args.vocab_size))
        if self.parallax.init_from_transformer and args.mixer != "parallax":
            problems.append(f"parallax.init_from_transformer: set to {self.parallax.init_from_transformer!r}, "
                            f"but model.name {name!r} is not Parallax")
        initial = self.checkpoint.initial_load_path or self.checkpoint.initial_load_in_hf
        if self.parallax.init_from_transformer and initial:
            # TorchTitan's initial load comes after the conversion and replaces the whole model
            problems.append(f"parallax.init_from_transformer = {self.parallax.init_from_transformer!r} and "
                            "checkpoint.initial_load_path / initial_load_in_hf both name the run's starting weights, "
                            "and the initial load would replace the converted Transformer's; expected one of them")
        return (problems + self._float8_problems() + self._converter_problems() + self._hf_save_problems(args.mixer)
                + self._layer_sac_problems(args.n_layers) + self._op_sac_problems(args))

    def _layer_sac_problems(self, n_layers: int) -> list[str]:
        """Layer-level selective AC wraps every N-th block (TorchTitan counts the blocks from 1): an N
        above the model's blocks wraps none, and the run trains without activation checkpointing."""
        ac = self.activation_checkpoint
        option = ac.selective_ac_option
        if ac.mode != "selective" or not (isinstance(option, str) and option.isdigit()):
            return []  # "op", or a bad option that _activation_checkpoint_problems names
        every = int(option)
        if every <= n_layers or option == titan.ActivationCheckpoint().selective_ac_option:
            return []  # TorchTitan's default on a one-block model: no checkpointing was asked for
        return [f"activation_checkpoint.selective_ac_option: {option!r} checkpoints every {every}-th block, but the "
                f"model has {n_layers} blocks (model.n_layers), so no block would be checkpointed; expected at most "
                f"{n_layers}, or activation_checkpoint.mode = 'none'"]

    def _op_sac_problems(self, args) -> list[str]:
        """The module names whose matmuls op-level AC recomputes: TorchTitan matches each as a part of
        the module names of every block (``layers.<i>.<name in the block>``) when the model is
        parallelised; one matching nothing was ignored, one matching a module that is not a Linear
        raised there (after the build)."""
        ac = self.activation_checkpoint
        names = ac.per_op_sac_force_recompute_mm_shapes_by_fqns
        default = titan.ActivationCheckpoint().per_op_sac_force_recompute_mm_shapes_by_fqns
        if (ac.mode, ac.selective_ac_option) != ("selective", "op") or names == default:
            return []
        import torch

        from parallax_titan.model import Block

        with torch.device("meta"):
            block = Block(0, args)
        inside = list(block.named_modules())  # the block's own name "" too, as TorchTitan's
        fused = {f"attention.{name}" for name in getattr(block.attention, "FUSED_INPUTS", ())
                 if getattr(block.attention, name) is not None}
        linears = ", ".join(sorted(fqn for fqn, m in inside if isinstance(m, torch.nn.Linear)))
        key, problems = "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", []
        for name in names:
            matched = [(f"layers.{i}.{fqn}", m) for i in range(args.n_layers) for fqn, m in inside
                       if name in f"layers.{i}.{fqn}"]
            other = next((fqn for fqn, m in matched if not isinstance(m, torch.nn.Linear)), None)
            if not matched:
                problems.append(f"{key}: {name!r} is part of no module name 'layers.<i>.<module>' (it would be "
                                f"ignored); a block's Linear modules are {linears}")
            elif other is not None:
                problems.append(f"{key}: {name!r} matches {other!r}, which is not a Linear (TorchTitan raises when it "
                                f"applies AC); expected a part of the names of Linear modules only ({linears})")
            elif all(fqn.split(".", 2)[2] in fused for fqn, _ in matched):
                problems.append(f"{key}: {name!r} names only modules of the fused input projection "
                                f"({', '.join(sorted(fused))}: one matmul of their concatenated weights, whose shape "
                                "TorchTitan's rule never sees), so it would be ignored")
        return problems

    def _converter_problems(self) -> list[str]:
        """Model converters besides float8 linear: MoE converters find nothing to convert, and the
        settings of a converter that is not in ``model.converters`` are never read."""
        problems = [f"model.converters: {name!r} converts MoE expert layers (grouped GEMMs); Parallax-Titan's models "
                    "have none (it would convert nothing)" for name in self.model.converters if ".grouped_mm." in name]
        for kind in ("linear", "grouped_mm"):
            for name in ("float8", "mx"):
                converter = f"quantize.{kind}.{name}"
                settings = getattr(getattr(self.quantize, kind), name)
                changed = [f.name for f in fields(settings)
                           if getattr(settings, f.name) != getattr(type(settings)(), f.name)]
                if changed and converter not in self.model.converters:
                    problems.append(f"{converter}.{changed[0]}: set to {getattr(settings, changed[0])!r}, but "
                                    f"{converter!r} is not in model.converters (it would be ignored)")
        return problems

    def _machine_problems(self) -> list[str]:
        """What this machine lacks for the run: TorchTitan finds these only when the trainer builds
        the converters, parallelises the model or starts profiling (after the build)."""
        import torch

        from parallax_titan.compat import pinned_memory_saves_problem

        cuda, problems = torch.cuda.is_available(), []
        if MX in self.model.converters:
            capability = torch.cuda.get_device_capability() if cuda else None
            if capability is None or capability < (10, 0):
                here = f"sm{capability[0]}{capability[1]}" if capability else "no CUDA"
                problems.append(f"model.converters: {MX!r} needs an sm100+ GPU (MXFP8); this machine has {here}")
        if self.activation_checkpoint.mode == "memory_budget" and not cuda:
            problems.append("activation_checkpoint.mode: 'memory_budget' needs torch.compile, which train.py switches "
                            "off on a machine without CUDA")
        problems += [f"profiling.{key}: true needs a CUDA device (TorchTitan's {what} fails on a machine without "
                     "CUDA when training starts)" for key, what, on in
                     (("enable_profiling", "profiler", self.profiling.enable_profiling),
                      ("enable_memory_snapshot", "memory snapshot", self.profiling.enable_memory_snapshot))
                     if on and not cuda]
        pinned = self.checkpoint.enable and self.checkpoint.async_mode == "async_with_pinned_mem"
        problem = pinned_memory_saves_problem() if pinned else None
        if problem:
            problems.append(f"checkpoint.async_mode: 'async_with_pinned_mem' {problem}; use 'async'")
        if self.metrics.enable_wandb and importlib.util.find_spec("wandb") is None:
            # TorchTitan logs the missing module and trains on without W&B
            problems.append("metrics.enable_wandb: true needs the wandb package, which is not installed here "
                            "(pip install wandb); expected false without it")
        return problems + self._float8_machine_problems() + self._rank_count_problems()

    def _rank_count_problems(self) -> list[str]:
        """The parallel degrees against the ranks torchrun started (``WORLD_SIZE``; train.py sets 1
        without torchrun): TorchTitan asserts their product when the trainer builds its mesh."""
        p, world = self.parallelism, os.environ.get("WORLD_SIZE")
        degrees = (p.data_parallel_replicate_degree, p.data_parallel_shard_degree)
        if world is None or not all(positive_int(d) or d == -1 for d in degrees):
            return []  # no launcher here, or a bad degree that Parallelism.validate names
        world, (replicate, shard) = int(world), degrees
        data_parallel = data_parallel_degree(self, world)  # -1 shards over the ranks left
        if data_parallel != world:
            return [f"parallelism.data_parallel_replicate_degree x data_parallel_shard_degree = {replicate} x {shard}: "
                    f"expected {'a divisor of' if shard == -1 else 'a product equal to'} the {world} rank"
                    f"{'s' if world != 1 else ''} this run has (WORLD_SIZE)"]
        return self._unsharded_problems(world) if data_parallel // replicate == 1 else []

    def _unsharded_problems(self, world: int) -> list[str]:
        """FSDP settings of a run whose shard degree is 1 on ``world`` ranks: TorchTitan applies FSDP
        only with a shard degree above 1 (one rank, or DDP across replicas, shards nothing)."""
        ranks, problems = f"{world} rank{'s' if world != 1 else ''}", []
        if self.training.enable_cpu_offload:
            # TorchTitan builds the model on the CPU for the offload, and only FSDP's sharding moves it
            problems.append(f"training.enable_cpu_offload: true offloads FSDP-sharded parameters, but the shard degree "
                            f"is 1 on {ranks} (nothing is sharded: the model would stay on the CPU); expected false, "
                            "or a data_parallel_shard_degree > 1")
        reshard, default = self.parallelism.fsdp_reshard_after_forward, titan.Parallelism().fsdp_reshard_after_forward
        if reshard != default:
            problems.append(f"parallelism.fsdp_reshard_after_forward: set to {reshard!r}, but the shard degree is 1 on "
                            f"{ranks} (FSDP is not applied: nothing is gathered to reshard), so it would be ignored; "
                            f"expected the default {default!r}, or a data_parallel_shard_degree > 1")
        return problems

    def _titan_problems(self) -> list[str]:
        """TorchTitan sections our classes do not subclass: values TorchTitan accepts and then ignores
        in our trainer, or asserts on only when the model is parallelised or training starts."""
        return (self._activation_checkpoint_problems() + self._compile_problems() + self._comm_problems()
                + self._profiling_problems() + self._unsupported_switches() + self._seed_problems())

    def _seed_problems(self) -> list[str]:
        """``debug.seed`` is torch's: a negative one is taken modulo 2**64 (another seed than the config
        gives), and one of 2**64 or more fails when the trainer seeds, after the config is read."""
        problem = seed_problem("debug.seed", self.debug.seed, unset="unset (torch's own random seed)")
        return [problem] if problem else []

    def _activation_checkpoint_problems(self) -> list[str]:
        ac, problems = self.activation_checkpoint, []
        option = ac.selective_ac_option
        if ac.mode == "selective" and not (option == "op" or (isinstance(option, str) and option.isdigit()
                                                              and int(option) >= 1)):
            # TorchTitan raises in apply_ac (after the build); "0" would checkpoint every block
            problems.append(f"activation_checkpoint.selective_ac_option: expected 'op' or a positive integer "
                            f"(checkpoint every N-th block), got {option!r}")
        if ac.mode == "memory_budget":
            if not (self.compile.enable and "model" in self.compile.components):
                problems.append("activation_checkpoint.mode: 'memory_budget' needs compile.enable = true with 'model' "
                                "in compile.components (TorchTitan asserts it when the model is parallelised)")
            if not (finite_at_least(ac.memory_budget, 0) and ac.memory_budget <= 1):
                problems.append(f"activation_checkpoint.memory_budget: expected a float in [0, 1], got "
                                f"{ac.memory_budget!r}")
        if ac.mode in ("full", "selective") and ac.determinism_check not in AC_DETERMINISM_CHECKS:
            # torch.utils.checkpoint raises at the first forward
            problems.append(f"activation_checkpoint.determinism_check: expected one of "
                            f"{', '.join(map(repr, AC_DETERMINISM_CHECKS))}, got {ac.determinism_check!r}")
        return problems

    def _compile_problems(self) -> list[str]:
        compile_, problems = self.compile, []
        if not compile_.enable:
            return []
        unknown = [c for c in compile_.components if c not in COMPILE_COMPONENTS]
        if unknown:  # TorchTitan tests membership of 'model' and 'loss' only: anything else compiles nothing
            problems.append(f"compile.components: expected entries from {', '.join(map(repr, COMPILE_COMPONENTS))}, "
                            f"got {unknown!r}")
        import torch._dynamo

        backends = torch._dynamo.list_backends(exclude_tags=())
        if compile_.backend not in backends:  # torch.compile raises when the model is parallelised
            problems.append(f"compile.backend: {compile_.backend!r} is not a torch.compile backend; expected one of "
                            f"{', '.join(map(repr, backends))}")
        return problems

    def _comm_problems(self) -> list[str]:
        comm, problems = self.comm, []
        for key in ("init_timeout_seconds", "train_timeout_seconds"):
            if not positive_int(getattr(comm, key)):
                problems.append(f"comm.{key}: expected a positive integer, got {getattr(comm, key)!r}")
        if not (isinstance(comm.trace_buf_size, int) and comm.trace_buf_size >= 0):
            problems.append(f"comm.trace_buf_size: expected an integer >= 0 (0 = no flight recorder), got "
                            f"{comm.trace_buf_size!r}")
        if comm.mode != "default":
            problems.append(f"comm.mode: expected 'default' (train.py trains with real collectives; TorchTitan's "
                            f"dry-run modes would train on fake ones), got {comm.mode!r}")
        return problems

    def _profiling_problems(self) -> list[str]:
        profiling, problems = self.profiling, []
        if not (profiling.enable_profiling or profiling.enable_memory_snapshot):
            return []
        freq, warmup, active = profiling.profile_freq, profiling.profiler_warmup, profiling.profiler_active
        if profiling.enable_profiling:
            if not positive_int(active):
                problems.append(f"profiling.profiler_active: expected a positive integer, got {active!r}")
            if not (isinstance(warmup, int) and warmup >= 0):
                problems.append(f"profiling.profiler_warmup: expected an integer >= 0, got {warmup!r}")
            elif positive_int(active) and not (isinstance(freq, int) and freq >= warmup + active):
                # TorchTitan asserts it when training starts
                problems.append(f"profiling.profile_freq: expected at least profiling.profiler_warmup + "
                                f"profiling.profiler_active = {warmup} + {active}, got {freq!r}")
        if profiling.enable_memory_snapshot and not positive_int(freq):
            problems.append(f"profiling.profile_freq: expected a positive integer (the memory snapshot period), "
                            f"got {freq!r}")
        return problems

    def _unsupported_switches(self) -> list[str]:
        """Switches TorchTitan's own entry points or MoE models read, and our trainer never does."""
        problems = []
        if self.memory_estimation.enable:
            problems.append("memory_estimation.enable: true is never read by train.py (TorchTitan's separate "
                            "estimation script reads it); expected false")
        if self.memory_estimation.disable_fake_mode:
            problems.append("memory_estimation.disable_fake_mode: true is never read by train.py (TorchTitan's "
                            "separate estimation script reads it); expected false")
        if self.fault_tolerance.enable:
            problems.append("fault_tolerance.enable: true is never read by Parallax-Titan's trainer (TorchTitan "
                            "0.2.2's Trainer builds no TorchFT manager), so the run would not be fault tolerant; "
                            "expected false")
        default_ft = titan.FaultTolerance()
        problems += [f"fault_tolerance.{f.name}: {getattr(self.fault_tolerance, f.name)!r} is never read by "
                     "Parallax-Titan's trainer (TorchTitan's TorchFT manager reads it, which the trainer never "
                     f"builds), so it would be ignored; expected {getattr(default_ft, f.name)!r}"
                     for f in fields(titan.FaultTolerance) if f.name != "enable"
                     and getattr(self.fault_tolerance, f.name) != getattr(default_ft, f.name)]
        if self.debug.deterministic_warn_only and not self.debug.deterministic:
            # TorchTitan passes it to torch.use_deterministic_algorithms under debug.deterministic only
            problems.append("debug.deterministic_warn_only: true is read with debug.deterministic = true only, and "
                            "debug.deterministic = false (it would be ignored: no deterministic algorithms, no "
                            "warnings); expected false, or debug.deterministic = true")
        if self.debug.moe_force_load_balance:
            problems.append("debug.moe_force_load_balance: true applies to MoE layers; Parallax-Titan's models have "
                            "none (it would be ignored); expected false")
        if self.job.save_config_file is not None and not os.path.basename(self.job.save_config_file):
            # TorchTitan opens <dump_folder>/<save_config_file> for writing when the trainer starts
            problems.append(f"job.save_config_file: expected unset or a file name, got {self.job.save_config_file!r}")
        if self.experimental.custom_import and not _importable(self.experimental.custom_import):
            problems.append(f"experimental.custom_import: {self.experimental.custom_import!r} cannot be imported "
                            "here (TorchTitan imports it when the trainer starts); expected a dotted module name "
                            "on the Python path")
        if self.experimental.custom_args_module:
            problems.append(f"experimental.custom_args_module: {self.experimental.custom_args_module!r} is not "
                            "supported (Parallax-Titan's JobConfig is fixed); expected empty")
        return problems

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

        if importlib.util.find_spec("torchao") is None:
            return [f"model.converters: {FLOAT8!r} needs torchao (pip install torchao==0.18.0)"]
        if self.quantize.linear.float8.emulate and self.compile.enable and "model" in self.compile.components:
            return ["quantize.linear.float8.emulate = true does not work with compile.enable = true and 'model' "
                    "in compile.components (TorchTitan's rule); use the hardware float8 path or disable compile"]
        return []

    def _float8_machine_problems(self) -> list[str]:
        """Float8 matmuls need an sm89+ GPU here, unless emulated."""
        if FLOAT8 not in self.model.converters or self.quantize.linear.float8.emulate:
            return []
        import torch

        if not torch.cuda.is_available():
            return [f"model.converters: {FLOAT8!r} on a machine without CUDA needs quantize.linear.float8.emulate = "
                    "true (float8 matmuls need an sm89+ GPU; emulation is for tests)"]
        capability = torch.cuda.get_device_capability()
        if capability < (8, 9):
            return [f"model.converters: {FLOAT8!r} needs an sm89+ GPU (Ada, Hopper); this one is sm"
                    f"{capability[0]}{capability[1]}; quantize.linear.float8.emulate = true emulates it (for tests)"]
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
        problems = self._batch_problems() + self.lr_scheduler.stage_problems(self.training.steps)
        problems += self.lr_scheduler.anneal_problems(self.training.steps, self.optimizer)
        problems += self.lr_scheduler.decay_shape_problems(self.training.steps)
        problems += self._verify_shards_problems() + self._record_policy_problems()
        problems += self._total_steps_problems()
        if self.eval.at_end and not self.checkpoint.enable:
            problems.append("eval.at_end: true needs checkpoint.enable = true (the suite scores the final checkpoint)")
        elif self.eval.at_end and self.checkpoint.load_only:
            problems.append("eval.at_end: true scores the final checkpoint, which checkpoint.load_only = true never "
                            "writes (the suite would fail after training); turn one off")
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

    def _verify_shards_problems(self) -> list[str]:
        """``training.verify_shards`` applies to pre-tokenized shards only (the training data's, and the
        validation data's when enabled); with text datasets alone nothing reads it."""
        sections = [("training", self.training)] + ([("validation", self.validation)] if self.validation.enable else [])
        datasets = [(name, section.dataset) for name, section in sections]
        if self.training.verify_shards == "checksum" or any(is_pretokenized(d) for _, d in datasets):
            return []
        read = " and ".join(f"{name}.dataset = {d!r}" for name, d in datasets)
        return [f"training.verify_shards: {self.training.verify_shards!r} is read with pre-tokenized data only, and "
                f"{read} {'are' if len(datasets) > 1 else 'is'} text (it would be ignored); expected 'checksum'"]

    def _record_policy_problems(self) -> list[str]:
        """``training.max_record_bytes`` and ``reliability.bad_data`` are the policy of the reader of
        local files (``dataset = "local"``, for training, validation or the diagnostics' held-out batch);
        the embedded corpora, the hub and pre-tokenized shards are read without them."""
        # the diagnostics' dataset also when they are off: scripts/analyze turns them on over this config
        datasets = {"training.dataset": self.training.dataset, "diagnostics.dataset": self.diagnostics.dataset}
        if self.validation.enable:
            datasets["validation.dataset"] = self.validation.dataset
        if any(isinstance(d, str) and d.lower() == "local" for d in datasets.values()):
            return []
        read = ", ".join(f"{key} = {d!r}" for key, d in datasets.items() if d)
        policy = [(f"{name}.{key}", getattr(section, key), getattr(type(section)(), key))
                  for name, section, key in (("training", self.training, "max_record_bytes"),
                                             ("reliability", self.reliability, "bad_data"))]
        return [f"{key}: set to {value!r}, but it is read with dataset = 'local' files only, and this run reads "
                f"none ({read}), so it would be ignored; expected the default {default!r}"
                for key, value, default in policy if value != default]

    def _total_steps_problems(self) -> list[str]:
        """TorchTitan's schedule ends at ``lr_scheduler.total_steps``: past it a decay's factor keeps
        falling (a linear decay's lr goes negative) or, without a decay stage, its lambda asserts."""
        total, steps = self.lr_scheduler.total_steps, self.training.steps
        if total is None or not positive_int(steps):
            return []
        if not (positive_int(total) and total >= steps):
            return [f"lr_scheduler.total_steps: expected unset or at least training.steps = {steps} (past total_steps "
                    f"TorchTitan's schedule drives the lr below min_lr_factor, negative for a linear decay, or fails "
                    f"without a decay stage), got {total!r}"]
        return []

    def _never_running_periods(self) -> list[str]:
        """Periodic passes switched on with a period past the last step: they would never run."""
        diagnostics, steps = self.diagnostics, self.training.steps
        spectral_on = diagnostics.enable and diagnostics.spectral
        periods = (("diagnostics.freq", diagnostics.freq, diagnostics.enable),
                   ("diagnostics.spectral_freq", diagnostics.spectral_freq, spectral_on),
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
        if wanted == -1 or training.local_batch_size < 1:  # -1: local batch x degree (TorchTitan's default)
            return []
        degree = data_parallel_degree(self, world)
        per_step = training.local_batch_size * degree
        if degree >= 1 and wanted >= 1 and wanted % per_step == 0:
            return []
        return [f"training.global_batch_size: {wanted} is not a positive multiple of training.local_batch_size x "
                f"data-parallel degree = {training.local_batch_size} x {degree} = {per_step} (on {world} "
                f"rank{'s' if world != 1 else ''}); use a multiple of {per_step}, or -1 for {per_step}"]


def _importable(module: str) -> bool:
    """Whether ``module`` (dotted) can be found on the Python path, without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, or an empty or relative name
        return False


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
CUSTOM_CONFIG_MODULE_FLAGS = ("--job.custom_config_module", "--job.custom-config-module")


def flag_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """Every value ``argv`` gives one of ``flags`` (either ``--k v`` or ``--k=v``), in order."""
    values = []
    for i, arg in enumerate(argv):
        key, sep, value = arg.partition("=")
        if sep and key in flags:
            values.append(value)
        elif arg in flags and i + 1 < len(argv):
            values.append(argv[i + 1])
    return values


def flag_value(argv: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the first of ``flags`` in ``argv``, as TorchTitan's loader reads it; None when
    none is there."""
    values = flag_values(argv, flags)
    return values[0] if values else None


def config_file_from_argv(argv: list[str]) -> str | None:
    """The value of ``--job.config_file`` (or ``--job.config-file``) in ``argv``, if any. ConfigError
    when it is given more than once: TorchTitan reads the first file's TOML and records the last as
    ``job.config_file`` (e.g. a launcher's flag followed by the user's own)."""
    files = flag_values(argv, CONFIG_FILE_FLAGS)
    if len(files) > 1:
        raise ConfigError(f"job.config_file: given {len(files)} times ({', '.join(map(repr, files))}); expected "
                          "one (the first file's values would be used, the others ignored)")
    return files[0] if files else None


def custom_config_module(argv: list[str], data: dict) -> str | None:
    """``job.custom_config_module`` as TorchTitan's ConfigManager finds it: the command line, then the TOML."""
    module = flag_value(argv, CUSTOM_CONFIG_MODULE_FLAGS)
    if module is not None:
        return module
    job = data.get("job", {})
    return job.get("custom_config_module") if isinstance(job, dict) else None


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
    data = read_toml(path) if path is not None else {}
    module = custom_config_module(argv, data)
    if module:  # TorchTitan's parser would import it and merge its sections into ours, unchecked
        raise ConfigError(f"invalid config:\n  job.custom_config_module: {module!r} is not supported (Parallax-Titan's "
                          "JobConfig is fixed and checked key by key); expected empty")
    config = ConfigManager(JobConfig).parse_args(argv)
    problems = config.validate(check_data)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return config
