"""Up-training: start a Parallax model from a Transformer checkpoint.

The Transformer's weights fill every shared parameter; the rho-norm weights are set to zero and
W_R keeps its initialisation (normal, like W_Q), so the converted model computes exactly the
Transformer's logits at step 0 and the probe grows smoothly: its size is the rho-norm weight,
which the first optimizer step moves by about that parameter's lr. (With W_R = 0 and weights 1
instead, the first step's tiny W_R passes through the RMSNorm at full strength, an O(1) jump.)
"""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from parallax_titan.checkpoint_files import describe, saved_shapes, state_shapes, weight_mismatches
from parallax_titan.checkpointing import verify_on_every_rank

PARALLAX_ONLY = (".attention.wr.", ".attention.r_norm.", ".attention.gate.")


def is_parallax_only(fqn: str) -> bool:
    """True for parameters a Transformer checkpoint does not have (W_R, rho norm, gate)."""
    return any(part in f".{fqn}" for part in PARALLAX_ONLY)


def shared_weights(state: dict) -> dict:
    """The entries of a Parallax model's ``state`` that the Transformer of the same size also has."""
    return {name: value for name, value in state.items() if not is_parallax_only(name)}


@torch.no_grad()
def load_transformer_weights(model: torch.nn.Module, checkpoint_dir: str, verify: bool = True) -> None:
    """Load a TorchTitan DCP checkpoint of a Transformer into a Parallax ``model`` (FSDP or not).

    ``verify`` (the run's ``checkpoint.verify``): first check every file against the folder's
    manifest, each rank of a ``torch.distributed`` job hashing its share
    (:func:`parallax_titan.checkpointing.verify_on_every_rank`; every rank calls this function, as
    ``dcp.load`` needs). Raises CheckpointError naming ``parallax.init_from_transformer``,
    the file and ``checkpoint.verify = false`` for a corrupt or truncated file or a folder without a
    manifest, before any weight is read; ValueError naming that key when the folder is not a
    readable DCP checkpoint or its model weights are not exactly this model's Transformer part (a
    weight missing, extra or of another shape: another size, or a Parallax checkpoint).
    """
    verify_on_every_rank(checkpoint_dir, "parallax.init_from_transformer", "checkpoint.verify = false", verify)
    state = shared_weights(get_model_state_dict(model))
    try:
        mismatches = weight_mismatches(saved_shapes(checkpoint_dir), state_shapes(state))
    except ValueError as exc:
        raise ValueError(f"parallax.init_from_transformer: {exc}") from None
    if mismatches:
        raise ValueError(f"parallax.init_from_transformer: {checkpoint_dir!r} is not a Transformer checkpoint of "
                         f"this model's size: {describe(mismatches)}")
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_model_state_dict(model, state, options=StateDictOptions(strict=False))
    zero_probes(model)


@torch.no_grad()
def zero_probes(model: torch.nn.Module) -> None:
    """Set every rho-norm weight to zero: each Parallax layer then computes exactly softmax attention,
    and its probe grows from there (W_R and the gate keep their values)."""
    for name, module in model.named_modules():
        if name.endswith("attention.r_norm"):
            module.weight.zero_()
