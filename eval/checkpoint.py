"""Build a model from a run's TOML config and load a DCP checkpoint written by the trainer.

The trainer's checkpoint folder (``<dump_folder>/checkpoint/step-N``) is a DCP checkpoint whose
model weights sit at the top level under the model's own names (``layers.0.attention.wq.weight``);
optimizer, lr-schedule and data-loader entries may sit beside them and are ignored here. Before
reading any weight, the folder's files are checked against its checksum manifest
(:func:`parallax_titan.checkpoint_files.verify_before_load`), unless ``verify`` is false, and the
[parallax] switches and model arguments its ``settings.json`` records are compared with the config's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from parallax_titan.checkpoint_files import (
    CheckpointError, describe, saved_shapes, state_shapes, verify_before_load, weight_mismatches)
from parallax_titan.config import JobConfig, load_config
from parallax_titan.model import ParallaxModelArgs, ParallaxQwen3Model
from parallax_titan.resume_rules import check_model_settings
from parallax_titan.spec import model_args_for

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_job_config(config_path: str, overrides: Sequence[str] = ()) -> JobConfig:
    """Load and validate a training TOML (plus ``--section.key value`` overrides) as training does,
    except that its data sources need not be readable here."""
    if not os.path.isfile(config_path):
        raise ValueError(f"config: {config_path!r} is not a file; expected a training TOML")
    return load_config(["--job.config_file", config_path, *overrides], check_data=False)


def model_args_of(job_config: JobConfig, max_length: int = 0) -> ParallaxModelArgs:
    """The model arguments the trainer builds for ``job_config`` (variant, flavor, overrides).

    ``max_length`` > 0 replaces the training sequence length as the RoPE table size.
    """
    args = model_args_for(job_config)
    if max_length < 0:
        raise ValueError(f"max_length: got {max_length}; expected 0 (training seq_len) or a positive length")
    if max_length:
        args.max_seq_len = max_length
    return args


def resolve_device(device: str | torch.device | None, key: str = "device") -> torch.device:
    """``None``/``""``/``"auto"`` -> CUDA when available, else CPU; otherwise the CPU or a CUDA device
    of this machine. ValueError naming ``key`` (the option that gave ``device``) for another name, or a
    CUDA device that is not here (torch would fail on it only when the model is built, after the
    checkpoints' checksums were read)."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    expected = "expected 'cpu', 'cuda' or 'cuda:N' (or none: CUDA when available)"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{key}: got {device!r}; {expected}") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"{key}: got {device!r}; {expected}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if resolved.type == "cuda" and (resolved.index or 0) >= count:
        raise ValueError(f"{key}: got {device!r}, but this machine has {count} CUDA device(s); {expected}")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"`` -> bfloat16 on CUDA, float32 elsewhere; otherwise one of :data:`DTYPES`."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype: got {dtype!r}; expected 'auto' or one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def build_model(args: ParallaxModelArgs, device: torch.device) -> ParallaxQwen3Model:
    """An fp32 model on ``device`` with freshly initialised weights (then overwritten by a load)."""
    with torch.device("meta"):
        model = ParallaxQwen3Model(args)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)  # also re-ties tied embeddings and builds RoPE
    return model.eval()


def check_checkpoint(model: torch.nn.Module, checkpoint_dir: str) -> None:
    """ValueError naming ``checkpoint`` unless ``checkpoint_dir`` is a readable DCP checkpoint of
    ``model`` (on any device, the meta device included): the first weight the model or the checkpoint
    lacks, or holds in another shape, with both shapes; or a [parallax] switch or model argument that
    the checkpoint's ``settings.json`` records with another value
    (:func:`parallax_titan.resume_rules.check_model_settings`). Reads no weight."""
    try:
        saved = saved_shapes(checkpoint_dir)
    except ValueError as exc:
        raise ValueError(f"checkpoint: {exc}") from None
    mismatches = weight_mismatches(saved, state_shapes(model.state_dict()))
    if mismatches:
        raise ValueError(f"checkpoint: {checkpoint_dir!r} holds another model than the config's "
                         f"({describe(mismatches)}); was it written for another [model] name, flavor or shape?")
    check_model_settings(checkpoint_dir, model.model_args)


@dataclass(frozen=True)
class CheckedCheckpoint:
    """The verdict of :func:`check_job_checkpoint`: the folder ``path`` holds the model of ``args``.

    :func:`load_model` takes it instead of reading the folder's metadata and ``settings.json`` again."""

    path: str
    args: ParallaxModelArgs


def check_job_checkpoint(job_config: JobConfig, checkpoint_dir: str, max_length: int = 0) -> CheckedCheckpoint:
    """:func:`check_checkpoint` for the model ``job_config`` builds, without building it (meta device):
    whether :func:`load_model` would accept the checkpoint, in the time of reading its metadata."""
    return _check_args(model_args_of(job_config, max_length), checkpoint_dir)


def _check_args(args: ParallaxModelArgs, checkpoint_dir: str) -> CheckedCheckpoint:
    """:func:`check_checkpoint` for the model of ``args``, built on the meta device; its verdict."""
    with torch.device("meta"):
        model = ParallaxQwen3Model(args)
    check_checkpoint(model, checkpoint_dir)
    return CheckedCheckpoint(checkpoint_dir, args)


def _check_or_take(args: ParallaxModelArgs, checkpoint_dir: str, checked: CheckedCheckpoint | None) -> None:
    """Refuse ``checkpoint_dir`` unless it holds the model of ``args``: checked now (:func:`_check_args`)
    or, given ``checked``, by that verdict (no file read). ValueError naming ``checked`` for a verdict
    on another folder or model."""
    if checked is None:
        _check_args(args, checkpoint_dir)
    elif checked != CheckedCheckpoint(checkpoint_dir, args):
        raise ValueError(f"checked: a verdict on {checked.path!r} for another folder or model than this load's; "
                         f"expected check_job_checkpoint's verdict on {checkpoint_dir!r} with this config and "
                         "max_length")


def model_keys(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without the tied output weight (it is the embedding itself)."""
    state = model.state_dict()
    if getattr(model.model_args, "enable_weight_tying", False):
        state.pop("output.weight", None)
    return state


def load_checkpoint(model: torch.nn.Module, checkpoint_dir: str, verify: bool = True, *, who: str = "checkpoint",
                    off_switch: str = "verify=False") -> None:
    """Load the model weights of a DCP checkpoint folder into ``model`` (single process).

    Works for checkpoints with or without optimizer state, written by any number of ranks, in any
    dtype. ``verify``: first check every file against the folder's checksum manifest (written by the
    trainer with ``checkpoint.verify``, and by ``scripts/export_hf.py import``); a corrupt or
    truncated file, or a folder without a manifest, raises CheckpointError naming ``who`` (the
    option that named the folder), the file and ``off_switch`` (how the caller loads it unchecked),
    before any weight is read. Raises ValueError naming ``checkpoint`` for a missing or unreadable
    folder, for a checkpoint of another model: the first weight the model or the checkpoint
    lacks, or holds in another shape, with both shapes; and for a [parallax] switch or model argument
    that the checkpoint's ``settings.json`` records with another value
    (:func:`parallax_titan.resume_rules.check_model_settings`). A file that cannot be read then (a
    missing or truncated one, loaded with ``verify`` false) raises CheckpointError naming ``who``,
    the folder and the cause (:func:`_read_weights`).
    """
    verify_before_load(checkpoint_dir, who, off_switch, verify)
    check_checkpoint(model, checkpoint_dir)
    _read_weights(model, checkpoint_dir, who, verify)


@torch.no_grad()
def _read_weights(model: torch.nn.Module, checkpoint_dir: str, who: str, verified: bool) -> None:
    """The checkpoint's model weights into ``model`` (checked to fit by the caller). CheckpointError
    naming ``who``, the folder and the cause when a file cannot be read: DCP raises a
    ``CheckpointException``, a BaseException that no ``except Exception`` of a command catches, so
    the command would end in a traceback instead of its exit code."""
    state = model_keys(model)
    try:
        # no_dist: load on this process only, also when called inside a torchrun job.
        dcp.load(state, checkpoint_id=checkpoint_dir, no_dist=True)
    except (OSError, CheckpointException) as exc:
        unchecked = "" if verified else "; it was loaded without checking its checksums, which name the damaged file"
        raise CheckpointError(f"{who}: {checkpoint_dir!r} cannot be read: {_read_failure(exc)}{unchecked}") from None
    model.load_state_dict(state, strict=False)


def _read_failure(exc: BaseException) -> str:
    """The error behind a failed DCP read, as ``Type: message`` (a CheckpointException wraps each
    rank's; the first is shown)."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} (a truncated file?)"


def load_model(job_config, checkpoint_dir: str, device=None, dtype="auto", max_length: int = 0,
               verify: bool = True, *, who: str = "checkpoint", off_switch: str = "verify=False",
               checked: CheckedCheckpoint | None = None):
    """Config + checkpoint -> (model in eval mode on ``device`` in ``dtype``, its model args).

    ``verify``, ``who``, ``off_switch``: the checksum check of :func:`load_checkpoint`. Then the
    checkpoint is checked against the config's model on the meta device (the errors of
    :func:`load_checkpoint`), unless ``checked`` is :func:`check_job_checkpoint`'s verdict on it
    (:func:`_check_or_take`); both before the model is built. A file that cannot be read raises
    CheckpointError naming ``who`` (:func:`_read_weights`)."""
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    args = model_args_of(job_config, max_length)
    verify_before_load(checkpoint_dir, who, off_switch, verify)
    _check_or_take(args, checkpoint_dir, checked)
    model = build_model(args, device)
    _read_weights(model, checkpoint_dir, who, verify)
    rope_cache = model.rope_cache  # kept in fp32, as under FSDP mixed precision in training
    model.to(dtype)
    model.rope_cache = rope_cache
    return model, args
