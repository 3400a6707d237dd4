"""What a run will load must agree with its config: every checkpoint is checked before the build."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from parallax_titan.checkpoint_files import (
    TRAINING_STATES, Shapes, choose_step, describe, has_checkpoint_files, quick_problem, saved_shapes, state_shapes,
    step_dir, weight_mismatches)
from parallax_titan.checksums import MANIFEST_FILE
from parallax_titan.config.job import data_parallel_degree, world_size
from parallax_titan.data.build import resume_problem
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.resume_rules import differences, loads_data_position, read_settings, refusals, run_settings
from parallax_titan.spec import model_args_for
from parallax_titan.uptrain import is_parallax_only, shared_weights


UPTRAIN_KEY = "parallax.init_from_transformer"


def resume_step(cfg) -> int | None:
    """The step this run would resume from in its checkpoint folder (None: none), judged without
    reading tensor files: with ``checkpoint.verify``, steps whose manifest or small files are bad
    are passed over (``on_corrupt = "fallback"``) or stop the run (CheckpointError). The load
    itself checks every file again. Raises ValueError for a ``checkpoint.load_step`` that is not complete."""
    ckpt = cfg.checkpoint
    folder = os.path.join(cfg.job.dump_folder, ckpt.folder)
    problem_of = (lambda step: quick_problem(step_dir(folder, step))) if ckpt.verify else (lambda step: None)
    return choose_step(folder, ckpt.load_step, problem_of, ckpt.on_corrupt == "stop")[0]


def settings_problems(cfg, checkpoint_dir: str, step: int) -> list[str]:
    """The resume rules' refusals (:mod:`parallax_titan.resume_rules`) for resuming ``checkpoint_dir``
    (at ``step``) with ``cfg``; none for step 0 (a seed checkpoint: weights only, any run may start from it)."""
    try:
        saved = read_settings(checkpoint_dir)
    except ValueError as exc:
        return [f"checkpoint.folder: {exc}"]
    if step == 0 or saved is None:
        return []
    current = run_settings(cfg, world_size())
    return refusals(differences(saved, current), checkpoint_dir, step, current, loads_data_position(cfg))


def _data_position_problems(cfg, checkpoint_dir: str, step: int) -> list[str]:
    """Why this run's data loader cannot continue from the position saved in ``checkpoint_dir`` (at
    ``step``): :func:`parallax_titan.data.build.resume_problem` (another ``training.data_order``, or
    another number of data-parallel ranks in the sharded order). Nothing for a position the run does
    not load: step 0 (weights only) or ``checkpoint.exclude_from_loading = ["dataloader"]``."""
    if step == 0 or not loads_data_position(cfg):
        return []
    problem = resume_problem(cfg, data_parallel_degree(cfg, world_size()), checkpoint_dir)
    return [f"checkpoint.folder: {checkpoint_dir!r}: cannot resume the data position: {problem}"] if problem else []


@dataclass(frozen=True)
class CheckpointPlan:
    """What a run loads at its start, chosen once before the build (:func:`checkpoint_plan`).

    resume_step: the step of the run's own checkpoint folder it resumes (None: none).
    loads_transformer: it loads ``parallax.init_from_transformer``: set, and no step to resume (a
    resumed step's weights would replace the Transformer's, so a requeued up-training job neither
    reads nor needs its source again).
    problems: what is wrong with those checkpoints ([]: nothing)."""

    resume_step: int | None = None
    loads_transformer: bool = False
    problems: list[str] = field(default_factory=list)


def checkpoint_problems(cfg) -> list[str]:
    """:func:`checkpoint_plan`'s problems: what is wrong with the checkpoints this run would load."""
    return checkpoint_plan(cfg).problems


def checkpoint_plan(cfg) -> CheckpointPlan:
    """The checkpoints this run would load and what is wrong with them, found before the build.
    Each kind of load gets its own checks:

    * the resume step (``checkpoint.load_step``, else the newest valid one): this model's weights,
      training state (not a model-only save), the resume rules and a data position this run's
      loader can continue (:func:`_data_position_problems`). With ``checkpoint.verify``,
      choosing the step (:func:`resume_step`) checks each step it considers with
      :func:`quick_problem` and passes over an invalid one, or raises CheckpointError where
      ``checkpoint.load_step`` names it or ``checkpoint.on_corrupt = "stop"``.
    * without a complete step in the checkpoint folder (or without that folder), a DCP
      ``checkpoint.initial_load_path``: this model's weights. With
      ``checkpoint.verify`` and a manifest in the folder, it must pass :func:`quick_problem` too; a
      folder without one (another program's checkpoint) loads unchecked.
    * ``parallax.init_from_transformer``, where the run has no step to resume:
      the Transformer part of this model's weights. With
      ``checkpoint.verify`` its folder must pass :func:`quick_problem` (a manifest that its files'
      sizes and small files match), as its load refuses a folder without a manifest.

    A ``checkpoint.folder`` that is a file is refused too (the first save would fail in the run).
    This model's weights: its variant, size and shape overrides. :func:`quick_problem` reads no
    tensor file; each load hashes every file again before it reads them. Call only for a valid config
    (``JobConfig.validate``)."""
    ckpt = cfg.checkpoint
    expected = _model_shapes(cfg)
    errors, step = [], None
    if ckpt.enable:
        folder = os.path.join(cfg.job.dump_folder, ckpt.folder)
        if os.path.lexists(folder) and not os.path.isdir(folder):  # the first save would fail, steps into the run
            return CheckpointPlan(problems=[f"checkpoint.folder: {folder!r} is a file; expected the folder the run's "
                                            "checkpoints are saved in, or none"])
        try:
            step = resume_step(cfg)
        except ValueError as exc:
            return CheckpointPlan(problems=[f"checkpoint.{'load_step' if ckpt.load_step >= 0 else 'folder'}: {exc}"])
        if step is not None:
            errors += _resume_problems(cfg, step_dir(folder, step), step, expected)
        elif ckpt.initial_load_path and not ckpt.initial_load_in_hf:  # loaded where no step is complete
            errors += _weights_folder_problems(cfg, "checkpoint.initial_load_path", ckpt.initial_load_path, expected,
                                               "expected a checkpoint of this model", manifest_required=False)
    loads_transformer = bool(cfg.parallax.init_from_transformer) and step is None
    if loads_transformer:
        errors += _weights_folder_problems(cfg, UPTRAIN_KEY, cfg.parallax.init_from_transformer,
                                           shared_weights(expected), "expected a Transformer checkpoint of this size",
                                           manifest_required=True)
    return CheckpointPlan(step, loads_transformer, errors)


def resume_step_problems(cfg, step: int) -> list[str]:
    """What is wrong with resuming ``step`` of the run's checkpoint folder, checked as
    :func:`checkpoint_plan` checks its resume step (this model's weights, training state, the resume
    rules, the data position); for a step a load chose in place of that one (a fallback past a step
    whose tensor files fail their checksums, which :func:`quick_problem` does not hash)."""
    folder = os.path.join(cfg.job.dump_folder, cfg.checkpoint.folder)
    return _resume_problems(cfg, step_dir(folder, step), step, _model_shapes(cfg))


def _model_shapes(cfg) -> Shapes:
    """This config's model state dict, name -> shape (built on the meta device)."""
    with torch.device("meta"):
        return state_shapes(ParallaxQwen3Model(model_args_for(cfg)).state_dict())


def _weight_problems(cfg, key: str, path: str, weights: Shapes, fix: str) -> tuple[Shapes | None, list[str]]:
    """The tensors saved in the DCP folder ``path`` (name -> shape; None: unreadable) and the problem
    with them, if any: unreadable, or model weights other than ``weights``. ``key``: the config key
    that names ``path``; ``fix``: what to do instead, for the message."""
    try:
        saved = saved_shapes(path)
    except ValueError as exc:
        return None, [f"{key}: {exc}"]
    mismatches = weight_mismatches(saved, weights)
    if not mismatches:
        return saved, []
    model = f"model.name = {cfg.model.name!r}, model.flavor = {cfg.model.flavor!r} with its [model] overrides"
    if key == UPTRAIN_KEY:  # compared with the Transformer part of the Parallax model
        model = f"the Transformer part of {model}"
        if any(is_parallax_only(name) for name in saved):
            fix += (" (it holds the probe's weights: a Parallax checkpoint starts a run through "
                    "checkpoint.initial_load_path)")
    return saved, [f"{key}: {path!r} is from another model than {model}: {describe(mismatches)}; {fix}"]


def _resume_problems(cfg, path: str, step: int, expected: Shapes) -> list[str]:
    """The resume step ``path`` (``step``) must hold ``expected``, training state past step 0,
    settings the resume rules accept and a data position this run can continue."""
    saved, problems = _weight_problems(cfg, "checkpoint.folder", path, expected, "resume with the checkpoint's "
                                       "[model] settings, or use another job.dump_folder for this model")
    if problems:
        return problems
    if step and not any(name.split(".", 1)[0] in TRAINING_STATES for name in saved):
        return [(f"checkpoint.folder: {path!r} holds model weights only (checkpoint.last_save_model_only = true saves "
                 "so at the last step), so training cannot resume from it; set checkpoint.load_step to an earlier "
                 "full checkpoint, or move that folder away")]
    return settings_problems(cfg, path, step) + _data_position_problems(cfg, path, step)


def _weights_folder_problems(cfg, key: str, path: str, weights: Shapes, fix: str,
                             manifest_required: bool) -> list[str]:
    """A folder loaded for its weights alone (``checkpoint.initial_load_path``,
    ``parallax.init_from_transformer``), named by config ``key``: with ``checkpoint.verify`` it must
    pass :func:`quick_problem` where it has a manifest, and have one where ``manifest_required``; then
    it must hold ``weights`` (``fix``: what to do instead). A path without a manifest or DCP metadata
    is no checkpoint at all, which the weights' check names."""
    checked = cfg.checkpoint.verify and has_checkpoint_files(path)
    if checked and (manifest_required or os.path.isfile(os.path.join(path, MANIFEST_FILE))):
        problem = quick_problem(path, off_switch=None)
        if problem:
            return [f"{key}: {path!r} is not a valid checkpoint: {problem}; checkpoint.verify = false loads it "
                    "unchecked"]
    return _weight_problems(cfg, key, path, weights, fix)[1]
