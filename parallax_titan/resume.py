"""What a resumed run must agree with: the checkpoint it will load."""

from __future__ import annotations

import os

import torch


def checkpoint_problems(cfg) -> list[str]:
    """Problems of resuming ``cfg``'s run from its newest (or ``checkpoint.load_step``) checkpoint:
    the checkpoint must hold this model's weights (same variant and size). Empty when nothing
    would be loaded."""
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.spec import model_args_for

    ckpt = cfg.checkpoint
    folder = os.path.join(cfg.job.dump_folder, ckpt.folder)
    steps = sorted(
        int(name.split("-")[1]) for name in (os.listdir(folder) if os.path.isdir(folder) else [])
        if name.startswith("step-") and name.split("-")[1].isdigit()
        and os.path.isfile(os.path.join(folder, name, ".metadata"))
    )
    if not ckpt.enable or not steps:
        return []
    import torch.distributed.checkpoint as dcp

    step = ckpt.load_step if ckpt.load_step > 0 else steps[-1]
    saved = dcp.FileSystemReader(os.path.join(folder, f"step-{step}")).read_metadata().state_dict_metadata
    with torch.device("meta"):
        expected = ParallaxQwen3Model(model_args_for(cfg)).state_dict()
    missing = [k for k in expected if k not in saved]
    wrong = [k for k in expected if k in saved and tuple(saved[k].size) != tuple(expected[k].shape)]
    if not missing and not wrong:
        return []
    detail = f"missing {missing[:2]}" if missing else f"shape differs for {wrong[:2]}"
    return [
        f"checkpoint.folder: {os.path.join(folder, f'step-{step}')!r} is from another model than "
        f"model.name = {cfg.model.name!r}, model.flavor = {cfg.model.flavor!r} ({detail}); "
        "use another job.dump_folder or the matching model"
    ]
