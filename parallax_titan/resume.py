"""What a run will load must agree with its config: every checkpoint is checked before the build."""

from __future__ import annotations

import os

import torch


def resume_step(cfg) -> int | None:
    """The step this run would resume from in its checkpoint folder (None: none), judged without
    reading tensor files: with ``checkpoint.verify``, steps whose manifest or small files are bad
    are passed over (``on_corrupt = "fallback"``) or stop the run (CheckpointError). The load
    itself checks every file again. Raises ValueError for a ``checkpoint.load_step`` that is not complete."""
    from parallax_titan.checkpoint_files import choose_step, quick_problem, step_dir

    ckpt = cfg.checkpoint
    folder = os.path.join(cfg.job.dump_folder, ckpt.folder)
    problem_of = (lambda step: quick_problem(step_dir(folder, step))) if ckpt.verify else (lambda step: None)
    return choose_step(folder, ckpt.load_step, problem_of, ckpt.on_corrupt == "stop")[0]


def settings_problems(cfg, checkpoint_dir: str, step: int) -> list[str]:
    """The resume rules' refusals (:mod:`parallax_titan.resume_rules`) for resuming ``checkpoint_dir``
    (at ``step``) with ``cfg``; none for step 0 (a seed checkpoint: weights only, any run may start from it)."""
    from parallax_titan.config.job import world_size
    from parallax_titan.resume_rules import differences, read_settings, refusals, run_settings

    try:
        saved = read_settings(checkpoint_dir)
    except ValueError as exc:
        return [f"checkpoint.folder: {exc}"]
    if step == 0 or saved is None:
        return []
    current = run_settings(cfg, world_size())
    return refusals(differences(saved, current), checkpoint_dir, step, current)


def checkpoint_problems(cfg) -> list[str]:
    """Every checkpoint this run would load must hold exactly this model's weights (variant, size,
    shape overrides): the resume step (``checkpoint.load_step`` or the newest valid one), else
    ``checkpoint.initial_load_path``, and the Transformer part for ``parallax.init_from_transformer``.
    A resume step must also hold training state (not a model-only save) and pass the resume rules;
    with ``checkpoint.verify``, the ``init_from_transformer`` folder needs a manifest that its files'
    sizes and small files match (:func:`quick_problem`; its contents are hashed before the load).
    Call only for a valid config (``JobConfig.validate``). A checkpoint that ``checkpoint.on_corrupt
    = "stop"`` refuses raises CheckpointError."""
    from parallax_titan.checkpoint_files import (
        TRAINING_STATES, describe, has_checkpoint_files, quick_problem, saved_shapes, state_shapes, step_dir,
        weight_mismatches)
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.spec import model_args_for
    from parallax_titan.uptrain import shared_weights

    ckpt, args, errors = cfg.checkpoint, model_args_for(cfg), []
    with torch.device("meta"):
        expected = state_shapes(ParallaxQwen3Model(args).state_dict())
    resume = "resume with the checkpoint's [model] settings, or use another job.dump_folder for this model"
    loads = []  # (config key, DCP folder, the weights it must hold, what to do instead)
    folder = os.path.join(cfg.job.dump_folder, ckpt.folder)
    step = None
    if ckpt.enable:
        try:
            step = resume_step(cfg)
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
        if key == "parallax.init_from_transformer" and ckpt.verify and has_checkpoint_files(path):
            problem = quick_problem(path, off_switch=None)  # the trainer hashes every file before it loads them
            if problem:
                errors.append(f"{key}: {path!r} is not a valid checkpoint: {problem}; checkpoint.verify = false "
                              "loads it unchecked")
                continue
        try:
            saved = saved_shapes(path)
        except ValueError as exc:
            errors.append(f"{key}: {exc}")
            continue
        mismatches = weight_mismatches(saved, weights)
        if mismatches:
            errors.append(f"{key}: {path!r} is from another model than model.name = {cfg.model.name!r}, model.flavor = "
                          f"{cfg.model.flavor!r} with its [model] overrides: {describe(mismatches)}; {fix}")
        elif key == "checkpoint.folder" and step and not any(n.split(".", 1)[0] in TRAINING_STATES for n in saved):
            errors.append(f"checkpoint.folder: {path!r} holds model weights only (checkpoint.last_save_model_only = "
                          "true saves so at the last step), so training cannot resume from it; set "
                          "checkpoint.load_step to an earlier full checkpoint, or move that folder away")
        elif key == "checkpoint.folder":
            errors.extend(settings_problems(cfg, path, step))
    return errors
