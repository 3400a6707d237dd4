"""What a run will load must agree with its config: every checkpoint is checked before the build."""

from __future__ import annotations

import os

import torch


def checkpoint_problems(cfg) -> list[str]:
    """Every checkpoint this run would load must hold exactly this model's weights (variant, size,
    shape overrides): the resume step (``checkpoint.load_step`` or the newest complete one), else
    ``checkpoint.initial_load_path``, and the Transformer part for ``parallax.init_from_transformer``.
    Call only for a valid config (``JobConfig.validate``)."""
    from parallax_titan.checkpoint_files import (
        describe, saved_shapes, state_shapes, step_dir, step_to_load, weight_mismatches)
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.spec import model_args_for
    from parallax_titan.uptrain import shared_weights

    ckpt, args, errors = cfg.checkpoint, model_args_for(cfg), []
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
