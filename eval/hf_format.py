"""Hugging Face format: export our checkpoints as safetensors + config.json, import Qwen3 weights.

Weight names are those of :class:`parallax_titan.hf_adapter.ParallaxStateDictAdapter` (Hugging Face
Qwen3's, plus ``r_proj``, ``r_norm`` and ``r_gate`` for the Parallax weights), the adapter that
TorchTitan's ``checkpoint.last_save_in_hf`` also uses.

``config.json`` is a Qwen3 config; Transformer variants have ``model_type = "qwen3"`` and load in
``transformers.Qwen3ForCausalLM``. Parallax variants have ``model_type = "parallax_qwen3"``, a
``parallax`` block (``rho_rope``, ``gate``, ``attn_mask_type``) and an ``auto_map`` naming the
modeling code exported beside it (``eval/hf_modeling``), so that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads them.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from eval import hf_modeling
from parallax_titan.hf_adapter import PARALLAX_HF_NAMES, ParallaxStateDictAdapter, abstract_name
from parallax_titan.model import ParallaxModelArgs
from parallax_titan.tokenizer import write_tokenizer_config
from parallax_titan.uptrain import zero_probes

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# config.json key -> ParallaxModelArgs field, checked on import.
SHAPE_FIELDS = {
    "vocab_size": "vocab_size", "hidden_size": "dim", "intermediate_size": "hidden_dim",
    "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads", "head_dim": "head_dim",
    "tie_word_embeddings": "enable_weight_tying", "rope_theta": "rope_theta", "rms_norm_eps": "norm_eps",
}


def hf_config(args: ParallaxModelArgs, dtype: torch.dtype, eos_id: int | None = None) -> dict:
    """The ``config.json`` of a model with ``args`` stored in ``dtype`` (eos: the tokenizer's end of document).

    Raises ValueError for a sliding-window model: the Hugging Face modeling code attends to the
    whole causal prefix, so the exported model would compute something else."""
    if getattr(args, "window", 0):
        raise ValueError(f"hf: parallax.window = {args.window} has no Hugging Face form (the exported modeling "
                         "code is full causal attention); export a model without a window")
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": args.vocab_size, "hidden_size": args.dim, "intermediate_size": args.hidden_dim,
        "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim, "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len, "rope_theta": args.rope_theta, "rope_scaling": None,
        "rms_norm_eps": args.norm_eps, "tie_word_embeddings": args.enable_weight_tying,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "use_cache": True, "bos_token_id": None, "eos_token_id": args.eos_id if eos_id is None else eos_id,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if args.mixer == "parallax":
        config["architectures"] = ["ParallaxQwen3ForCausalLM"]
        config["model_type"] = "parallax_qwen3"
        config["parallax"] = {"rho_rope": args.rho_rope, "gate": args.gate, "attn_mask_type": args.attn_mask_type}
        config["auto_map"] = dict(hf_modeling.AUTO_MAP)
        del config["rope_scaling"]  # a Qwen3 key (plain RoPE here); newer transformers warn on it
    return config


@torch.no_grad()
def export_hf(model: torch.nn.Module, output_dir: str, *, dtype: torch.dtype | None = None,
              tokenizer_dir: str | None = None, eos_id: int | None = None) -> str:
    """Write ``model`` as ``model.safetensors`` + ``config.json`` (+ the tokenizer) into ``output_dir``;
    for Parallax variants also the modeling code (``configuration_parallax.py``, ``modeling_parallax.py``).

    dtype: storage dtype (default: the parameters'). eos_id: the tokenizer's end-of-document id
    (default: Qwen3's). Returns ``output_dir``.
    """
    args = model.model_args
    dtype = dtype or next(model.parameters()).dtype
    config = hf_config(args, dtype, eos_id)  # before anything is written: it refuses what HF cannot hold
    hf_state = ParallaxStateDictAdapter(args).to_hf(model.state_dict())
    tensors = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in hf_state.items()}
    os.makedirs(output_dir, exist_ok=True)
    save_file(tensors, os.path.join(output_dir, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(output_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    if args.mixer == "parallax":
        for name in hf_modeling.REMOTE_CODE_FILES:
            shutil.copyfile(os.path.join(hf_modeling.FOLDER, name), os.path.join(output_dir, name))
    if tokenizer_dir:
        shutil.copyfile(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(output_dir, "tokenizer.json"))
        write_tokenizer_config(output_dir)
    return output_dir


def read_hf(hf_dir: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """``config.json`` and every tensor of the ``*.safetensors`` files (sharded or not) in ``hf_dir``."""
    config_path = os.path.join(hf_dir, CONFIG_FILE)
    files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not os.path.isfile(config_path) or not files:
        raise ValueError(f"hf: {hf_dir!r} needs config.json and *.safetensors files (found config: "
                         f"{os.path.isfile(config_path)}, weights: {len(files)} files)")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(path))
    return config, state


def check_hf_config(config: dict, args: ParallaxModelArgs) -> None:
    """ValueError naming the first config.json field that disagrees with the model's ``args``."""
    for hf_key, field_name in SHAPE_FIELDS.items():
        if hf_key in config and config[hf_key] != getattr(args, field_name):
            raise ValueError(
                f"hf config.json: {hf_key} = {config[hf_key]!r}, but the model has {field_name} = "
                f"{getattr(args, field_name)!r}; pick the matching [model] flavor or shape overrides"
            )


def _is_parallax_key(key: str) -> bool:
    return any(name.split("{}")[1] in key for name in PARALLAX_HF_NAMES.values())


@torch.no_grad()
def load_hf_state(model: torch.nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
    """Load Hugging Face (Qwen3 or our export) weights into ``model``.

    A Parallax model given a Qwen3 (Transformer) state dict keeps its initialised W_R and gate and
    gets rho-norm weights 0 (as up-training does), so it computes exactly the Transformer's function.
    ``model`` must be freshly initialised (``eval.checkpoint.build_model``). Raises ValueError for unknown,
    missing or mis-shaped weights.
    """
    adapter = ParallaxStateDictAdapter(model.model_args)
    unknown = sorted(k for k in hf_state if abstract_name(k) not in adapter.from_hf_map)
    if unknown:
        raise ValueError(f"hf: {len(unknown)} weights have no place in this model (e.g. {unknown[:3]})")
    # Entries mapped to None (RoPE inverse frequencies) are recomputed by the model.
    ours = adapter.from_hf({k: v for k, v in hf_state.items() if adapter.from_hf_map[abstract_name(k)] is not None})
    target = model.state_dict()
    unused = sorted(k for k in ours if k not in target)
    if unused:
        raise ValueError(f"hf: weights {unused[:3]} are not in this [model] variant ({len(unused)} in all)")
    missing = sorted(k for k in target if k not in ours)
    if any(not _is_parallax_key(k) for k in missing):
        raise ValueError(f"hf: missing weights {[k for k in missing if not _is_parallax_key(k)][:3]}")
    for key, value in ours.items():
        if tuple(value.shape) != tuple(target[key].shape):
            raise ValueError(f"hf: {key} has shape {tuple(value.shape)}, the model expects {tuple(target[key].shape)}")
        target[key].copy_(value)
    if missing:  # a Transformer checkpoint: start as it, the probes growing from zero (W_R, gate initialised)
        zero_probes(model)
