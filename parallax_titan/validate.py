"""Config validation that runs before anything expensive (model build, data download).

Two layers: :func:`check_config_dict` checks a TOML dict's keys and value types against the
JobConfig dataclasses (TorchTitan accepts a string where an int belongs and fails much later);
:func:`validate_job_config` checks meaning: variant and flavor, head counts, tokenizer and data
paths, optimizer keys, parallelisms this model supports. Every message names the key.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from typing import Any, Literal

import torch


class ConfigError(ValueError):
    """A config problem; the message lists every offending key with its value."""


def _describe(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"a list of {_describe(inner)}"
    return getattr(tp, "__name__", str(tp))


def _matches(value, tp) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if origin is list:
        args = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value) if args else isinstance(value, list)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def check_config_dict(data: dict, cls, prefix: str = "") -> list[str]:
    """Errors for unknown keys and wrongly typed values of ``data`` against dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    errors = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in fields:
            errors.append(f"{name}: unknown key; valid keys here: {', '.join(sorted(fields))}")
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                errors.append(f"{name}: expected a [{name}] table, got {value!r}")
            else:
                errors.extend(check_config_dict(value, tp, f"{name}."))
        elif not _matches(value, tp):
            errors.append(f"{name}: expected {_describe(tp)}, got {value!r} ({type(value).__name__})")
    return errors


def _model_errors(cfg) -> list[str]:
    from parallax_titan.mixers import fla_hopper_blocker, fla_missing
    from parallax_titan.model import SHAPE_KEYS
    from parallax_titan.spec import BASE_FLAVORS, VARIANTS, model_args_for

    name, flavor = cfg.model.name, cfg.model.flavor
    if name not in VARIANTS:
        return [f"model.name: {name!r} is not a Parallax-Titan variant; expected one of {', '.join(VARIANTS)}"]
    if flavor not in BASE_FLAVORS:
        return [f"model.flavor: {flavor!r} is unknown; expected one of {', '.join(BASE_FLAVORS)}"]
    # before any model build: the fla mixers are an optional install, and fla 0.6.0's GDN backward
    # stops on Hopper with triton < 3.7.1 unless tilelang is there (after minutes of compiling)
    missing = fla_missing(name) or fla_hopper_blocker(name)
    if missing:
        return [missing]
    errors = [f"model.{k}: expected a positive integer, got {getattr(cfg.model, k)!r}"
              for k in SHAPE_KEYS if getattr(cfg.model, k) < 0]
    if errors:
        return errors
    args = model_args_for(cfg)
    if args.n_heads % args.n_kv_heads:
        errors.append(
            f"model.n_heads: {args.n_heads} query heads is not a multiple of model.n_kv_heads = "
            f"{args.n_kv_heads} (model {name!r}, flavor {flavor!r})"
        )
    if args.mixer == "softmax" and cfg.parallax.attn_mask_type == "block_causal":
        errors.append(
            f"parallax.attn_mask_type: 'block_causal' needs a Parallax model; {name!r} supports 'causal' only"
        )
    if cfg.parallax.init_from_transformer:
        path = cfg.parallax.init_from_transformer
        if args.mixer != "parallax":
            errors.append(f"parallax.init_from_transformer: set to {path!r}, but model.name {name!r} is not Parallax")
        elif not os.path.isdir(path):
            errors.append(f"parallax.init_from_transformer: {path!r} is not a checkpoint folder")
    return errors


def _checkpoint_errors(cfg) -> list[str]:
    """Every checkpoint this run would load must hold exactly this model's weights (variant, size,
    shape overrides): the resume step (``checkpoint.load_step`` or the newest complete one), else
    ``checkpoint.initial_load_path``, and the Transformer part for ``parallax.init_from_transformer``.
    A Hugging Face last save needs a model-only save of a variant with Hugging Face names.
    Call only for a config without model errors."""
    from parallax_titan.checkpoint_files import (
        describe, saved_shapes, state_shapes, step_dir, step_to_load, weight_mismatches)
    from parallax_titan.hf_adapter import HF_MIXERS
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.spec import model_args_for
    from parallax_titan.uptrain import shared_weights

    ckpt, args, errors = cfg.checkpoint, model_args_for(cfg), []
    if ckpt.enable and ckpt.last_save_in_hf and not ckpt.last_save_model_only:
        errors.append("checkpoint.last_save_in_hf: true needs checkpoint.last_save_model_only = true "
                      "(the Hugging Face format holds the model weights only)")
    if ckpt.enable and ckpt.last_save_in_hf and args.mixer not in HF_MIXERS:
        errors.append(f"checkpoint.last_save_in_hf: model.name = {cfg.model.name!r} has no Hugging Face weight "
                      "names; only the transformer and parallax variants have them")
    with torch.device("meta"):
        expected = state_shapes(ParallaxQwen3Model(args).state_dict())
    resume = "resume with the checkpoint's [model] settings, or use another job.dump_folder for this model"
    loads = []  # (config key, DCP folder, the weights it must hold, what to do instead)
    folder = os.path.join(cfg.job.dump_folder, ckpt.folder)
    if ckpt.enable:
        try:
            step = step_to_load(folder, ckpt.load_step)
        except ValueError as exc:
            return errors + [f"checkpoint.{'load_step' if ckpt.load_step >= 0 else 'folder'}: {exc}"]
        if step is not None:
            loads.append(("checkpoint.folder", step_dir(folder, step), expected, resume))
        elif not os.path.exists(folder) and ckpt.initial_load_path and not ckpt.initial_load_in_hf:
            # TorchTitan reads initial_load_path only while the checkpoint folder does not exist
            loads.append(("checkpoint.initial_load_path", ckpt.initial_load_path, expected,
                          "expected a checkpoint of this model"))
    if cfg.parallax.init_from_transformer:
        loads.append(("parallax.init_from_transformer", cfg.parallax.init_from_transformer, shared_weights(expected),
                      "expected a Transformer checkpoint of this size"))
    for key, path, weights, fix in loads:
        try:
            mismatches = weight_mismatches(saved_shapes(path), weights)
        except ValueError as exc:
            errors.append(f"{key}: {exc}")
            continue
        if mismatches:
            errors.append(f"{key}: {path!r} is from another model than model.name = {cfg.model.name!r}, model.flavor = "
                          f"{cfg.model.flavor!r} with its [model] overrides: {describe(mismatches)}; {fix}")
    return errors


def _training_errors(cfg) -> list[str]:
    from parallax_titan.config import Training

    t, errors = cfg.training, []
    for key in ("steps", "seq_len", "local_batch_size"):
        if getattr(t, key) < 1:
            errors.append(f"training.{key}: expected a positive integer, got {getattr(t, key)!r}")
    if t.max_norm <= 0:
        errors.append(f"training.max_norm: expected > 0, got {t.max_norm!r}")
    orders = typing.get_args(Training.__annotations__["data_order"])
    if t.data_order not in orders:
        errors.append(f"training.data_order: {t.data_order!r} is not one of {', '.join(map(repr, orders))}")
    loader = t.dataloader
    if loader.num_workers not in (0, 1):
        # every worker would replay the whole stream: our datasets are split by rank, not by worker
        errors.append(f"training.dataloader.num_workers: expected 0 (load in the training process) or 1 "
                      f"(one background process), got {loader.num_workers!r}")
    if loader.prefetch_factor is not None and (loader.num_workers == 0 or loader.prefetch_factor < 1):
        errors.append(f"training.dataloader.prefetch_factor: expected unset with num_workers = 0, or a positive "
                      f"integer with num_workers = 1; got {loader.prefetch_factor!r} with num_workers = "
                      f"{loader.num_workers!r}")
    if cfg.eval.at_end and not cfg.checkpoint.enable:
        errors.append("eval.at_end: true needs checkpoint.enable = true (the suite scores the final checkpoint)")
    from eval.suite import PAPER_SUITE

    unknown = [t for t in cfg.eval.tasks if t not in PAPER_SUITE]
    if unknown:
        errors.append(f"eval.tasks: unknown {unknown}; expected names from {list(PAPER_SUITE)}")
    p = cfg.parallelism
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree"):
        if getattr(p, key) != 1:
            errors.append(f"parallelism.{key}: {getattr(p, key)} is not supported yet; use FSDP (data_parallel_*)")
    return errors


FLOAT8 = "quantize.linear.float8"


def _converter_errors(cfg) -> list[str]:
    """``model.converters`` (TorchTitan's model converters, e.g. float8 linears through torchao)."""
    from torchtitan.protocols.model_converter import _registry_model_converter_cls as registry

    import torchtitan.components.quantization  # noqa: F401  (registers the quantization converters)

    errors = [f"model.converters: {name!r} is not a TorchTitan model converter; expected one of "
              f"{', '.join(map(repr, sorted(registry)))}" for name in cfg.model.converters if name not in registry]
    if FLOAT8 in cfg.model.converters:
        errors += _float8_errors(cfg)
    return errors


def _float8_errors(cfg) -> list[str]:
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return [f"model.converters: {FLOAT8!r} needs torchao (pip install torchao==0.18.0)"]
    emulate = cfg.quantize.linear.float8.emulate
    if not torch.cuda.is_available():
        return [] if emulate else [
            f"model.converters: {FLOAT8!r} on a machine without CUDA needs quantize.linear.float8.emulate = "
            "true (float8 matmuls need an sm89+ GPU; emulation is for tests)"]
    capability = torch.cuda.get_device_capability()
    if capability < (8, 9) and not emulate:
        return [f"model.converters: {FLOAT8!r} needs an sm89+ GPU (Ada, Hopper); this one is sm"
                f"{capability[0]}{capability[1]}; quantize.linear.float8.emulate = true emulates it (for tests)"]
    if emulate and cfg.compile.enable and "model" in cfg.compile.components:
        return ["quantize.linear.float8.emulate = true does not work with compile.enable = true and 'model' "
                "in compile.components (TorchTitan's rule); use the hardware float8 path or disable compile"]
    return []


def _component_errors(cfg) -> list[str]:
    from parallax_titan.data import check_dataset_config
    from parallax_titan.diagnostics.runner import validate_diagnostics
    from parallax_titan.optim_config import validate_optim_config
    from parallax_titan.tokenizer import check_tokenizer_path

    errors, skip_bad = [], cfg.reliability.bad_data == "skip"
    for check in (
        lambda: check_tokenizer_path(cfg.model.hf_assets_path),
        lambda: check_dataset_config(cfg.training, skip_bad=skip_bad),
        lambda: cfg.validation.enable and check_dataset_config(cfg.validation, "validation", skip_bad),
        lambda: validate_optim_config(cfg.optimizer, cfg.lr_scheduler),
        lambda: validate_diagnostics(cfg.diagnostics, cfg.training.seq_len),
    ):
        try:
            check()
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def validate_job_config(cfg) -> None:
    """Raise :class:`ConfigError` listing every problem of a parsed JobConfig."""
    model_errors = _model_errors(cfg)
    errors = model_errors + _training_errors(cfg) + _converter_errors(cfg) + _component_errors(cfg)
    if not model_errors:
        errors += _checkpoint_errors(cfg)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
