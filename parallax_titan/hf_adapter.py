"""Hugging Face weight names of the model family: TorchTitan's Qwen3 mapping plus the Parallax weights.

:class:`ParallaxStateDictAdapter` is registered in every TrainSpec (``parallax_titan.spec``), so
TorchTitan's ``checkpoint.last_save_in_hf = true`` writes these names, and ``eval.hf_format``
(``scripts/export_hf.py``) exports and imports with the same adapter. Besides Hugging Face Qwen3's
names, layer ``i`` of a Parallax model has:

=========================================== =====================================================
``model.layers.i.self_attn.r_proj.weight``  W_R, (Hq * D, d_model): the probe projection
``model.layers.i.self_attn.r_norm.weight``  (D,): RMSNorm weight on each rho head (before RoPE)
``model.layers.i.self_attn.r_gate.weight``  (1 or Hq, d_model): sigmoid gate on rho (gated runs only)
=========================================== =====================================================

The fla mixers' weights have no Hugging Face names; converting them raises.
"""

from __future__ import annotations

import os
import re

from torchtitan.models.qwen3.model.state_dict_adapter import Qwen3StateDictAdapter

from parallax_titan.model import ParallaxModelArgs

# Mixers whose every weight has a Hugging Face name.
HF_MIXERS = ("softmax", "parallax")
PARALLAX_HF_NAMES = {
    "model.layers.{}.self_attn.r_proj.weight": "layers.{}.attention.wr.weight",
    "model.layers.{}.self_attn.r_norm.weight": "layers.{}.attention.r_norm.weight",
    "model.layers.{}.self_attn.r_gate.weight": "layers.{}.attention.gate.weight",
}
SAFETENSORS_INDEX = "model.safetensors.index.json"


def abstract_name(name: str) -> str:
    """The mapping's form of a weight name: its first number (the layer) becomes ``{}``."""
    return re.sub(r"\d+", "{}", name, count=1)


class ParallaxStateDictAdapter(Qwen3StateDictAdapter):
    """TorchTitan's Qwen3 name mapping plus the Parallax probe, rho-norm and gate weights.

    ``to_hf`` / ``from_hf`` convert whole state dicts (name -> tensor, any dtype, DTensors too);
    ``from_hf_map`` maps each Hugging Face name pattern to ours (``{}``: the layer index).
    """

    def __init__(self, model_args: ParallaxModelArgs, hf_assets_path: str | None = None):
        # TorchTitan reads the safetensors index in hf_assets_path to shard a Hugging Face save,
        # and warns on every run when the folder has none; ours usually holds only a tokenizer,
        # and without an index the save is one model.safetensors file.
        has_index = bool(hf_assets_path) and os.path.isfile(os.path.join(hf_assets_path, SAFETENSORS_INDEX))
        super().__init__(model_args, hf_assets_path if has_index else None)
        self.hf_assets_path = hf_assets_path
        self.from_hf_map.update(PARALLAX_HF_NAMES)

    def to_hf(self, state_dict: dict) -> dict:
        """Our state dict -> Hugging Face names (the tied output weight is the embedding's).

        Raises ValueError naming the weights that have no Hugging Face name (TorchTitan's mapping
        would leave them out of the save).
        """
        ours = {name for name in self.from_hf_map.values() if name is not None}
        unnamed = [name for name in state_dict if abstract_name(name) not in ours]
        if unnamed:
            raise ValueError(f"hf: {len(unnamed)} weights have no Hugging Face name (e.g. {unnamed[:3]}); the format "
                             f"covers the transformer and parallax variants, not mixer {self.model_args.mixer!r}")
        return super().to_hf(state_dict)
