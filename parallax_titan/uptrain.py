"""Up-training: start a Parallax model from a Transformer checkpoint.

The Transformer's weights fill every shared parameter; W_R is set to zero and the rho-norm
weights to one, so the converted model computes exactly the Transformer's logits at step 0.
"""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

PARALLAX_ONLY = (".attention.wr.", ".attention.r_norm.", ".attention.gate.")


def is_parallax_only(fqn: str) -> bool:
    """True for parameters a Transformer checkpoint does not have (W_R, rho norm, gate)."""
    return any(part in f".{fqn}" for part in PARALLAX_ONLY)


@torch.no_grad()
def load_transformer_weights(model: torch.nn.Module, checkpoint_dir: str) -> None:
    """Load a TorchTitan DCP checkpoint of a Transformer into a Parallax ``model`` (FSDP or not).

    Raises ValueError naming ``parallax.init_from_transformer`` when a shared weight is missing.
    """
    state = {k: v for k, v in get_model_state_dict(model).items() if not is_parallax_only(k)}
    metadata = dcp.FileSystemReader(checkpoint_dir).read_metadata()
    missing = sorted(k for k in state if k not in metadata.state_dict_metadata)
    if missing:
        raise ValueError(
            f"parallax.init_from_transformer: checkpoint {checkpoint_dir!r} lacks {len(missing)} "
            f"weights of this model (e.g. {missing[:3]}); is it from another size?"
        )
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_model_state_dict(model, state, options=StateDictOptions(strict=False))
    for name, module in model.named_modules():
        if name.endswith("attention.wr"):
            module.weight.zero_()
        elif name.endswith("attention.r_norm"):
            module.weight.fill_(1.0)
