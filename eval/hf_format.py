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
from eval.checkpoint import DTYPES
from parallax_titan.checkpoint_files import check_output_folder, replaced_folder
from parallax_titan.hf_adapter import PARALLAX_HF_NAMES, ParallaxStateDictAdapter, abstract_name
from parallax_titan.model import ParallaxModelArgs
from parallax_titan.tokenizer import write_tokenizer_config
from parallax_titan.uptrain import zero_probes

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"  # a sharded folder's weight name -> file map
# config.json key -> ParallaxModelArgs field, checked on import.
SHAPE_FIELDS = {
    "vocab_size": "vocab_size", "hidden_size": "dim", "intermediate_size": "hidden_dim",
    "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads", "head_dim": "head_dim",
    "tie_word_embeddings": "enable_weight_tying", "rope_theta": "rope_theta", "rms_norm_eps": "norm_eps",
}
# config.json keys whose other values the model does not compute (checked where present).
FIXED_FIELDS = {"hidden_act": "silu", "attention_bias": False, "use_sliding_window": False}
MODEL_TYPES = ("qwen3", "parallax_qwen3")
PARALLAX_FIELDS = ("rho_rope", "gate", "attn_mask_type")  # a Parallax export's ``parallax`` block
# Files an export writes: an --output holding anything else is refused (never replaced).
EXPORT_FILES = (CONFIG_FILE, WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json", *hf_modeling.REMOTE_CODE_FILES)
# every export holds these: a folder of tokenizer files alone is a tokenizer's, not an earlier export
EXPORT_REQUIRED = (CONFIG_FILE, WEIGHTS_FILE)


def hf_config(args: ParallaxModelArgs, dtype: torch.dtype, eos_id: int | None = None) -> dict:
    """The ``config.json`` of a model with ``args`` stored in ``dtype`` (eos: the tokenizer's end of document).

    Raises ValueError for a sliding-window model: the Hugging Face modeling code attends to the
    whole causal prefix, so the exported model would compute something else; and for a
    block-causal model whose end-of-document id is not one of its tokens (the default, Qwen3's,
    for a model of a smaller vocabulary): its documents would never end, while training ended them
    at the tokenizer's ``<|endoftext|>``."""
    if getattr(args, "window", 0):
        raise ValueError(f"hf: parallax.window = {args.window} has no Hugging Face form (the exported modeling "
                         "code is full causal attention); export a model without a window")
    eos = args.eos_id if eos_id is None else eos_id
    if args.mixer == "parallax" and args.attn_mask_type == "block_causal" and (
            isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < args.vocab_size):
        raise ValueError(f"eos_id: {eos!r} is not a token id of this model (vocab_size {args.vocab_size}), and "
                         "attn_mask_type = 'block_causal' ends a document after it; expected the id of "
                         "<|endoftext|> in the tokenizer the model was trained with (PretrainTokenizer(...).eos_id)")
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": args.vocab_size, "hidden_size": args.dim, "intermediate_size": args.hidden_dim,
        "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim, "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len, "rope_theta": args.rope_theta, "rope_scaling": None,
        "rms_norm_eps": args.norm_eps, "tie_word_embeddings": args.enable_weight_tying,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "use_cache": True, "bos_token_id": None, "eos_token_id": eos,
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
              tokenizer_dir: str | None = None, eos_id: int | None = None, key: str = "output",
              dtype_key: str = "dtype") -> str:
    """Write ``model`` as ``model.safetensors`` + ``config.json`` (+ the tokenizer) into ``output_dir``;
    for Parallax variants also the modeling code (``configuration_parallax.py``, ``modeling_parallax.py``).

    dtype: storage dtype, float32, bfloat16 or float16 (default: the parameters'). eos_id: the tokenizer's
    end-of-document id (default: Qwen3's; a block-causal model refuses one outside its vocabulary,
    :func:`hf_config`). Returns ``output_dir``.

    Atomic: the files go into a folder beside ``output_dir`` that then replaces it whole, so a failed
    export leaves an earlier one there as it was, and no file of an earlier export stays behind.
    ``output_dir`` must be new, empty or an earlier export (:func:`check_export_folder`; ValueError
    naming ``key``, the option that named it, before anything is written). A weight that is not
    finite in ``dtype`` (float16 overflows above 65504) raises ValueError naming ``dtype_key``, the
    weight and its largest magnitude, also before anything is written (:func:`_stored_tensors`).
    """
    args = model.model_args
    dtype = dtype or next(model.parameters()).dtype
    if dtype not in DTYPES.values():  # an int8 cast would write truncated weights, finite and wrong
        raise ValueError(f"{dtype_key}: got {dtype!r}; expected one of {list(DTYPES.values())}")
    config = hf_config(args, dtype, eos_id)  # before anything is written: it refuses what HF cannot hold
    hf_state = ParallaxStateDictAdapter(args).to_hf(model.state_dict())
    tensors = _stored_tensors(hf_state, dtype, dtype_key)
    with replaced_folder(output_dir, key, _export_owned, "a Hugging Face export", EXPORT_REQUIRED) as stage:
        save_file(tensors, os.path.join(stage, WEIGHTS_FILE), metadata={"format": "pt"})
        with open(os.path.join(stage, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        if args.mixer == "parallax":
            for name in hf_modeling.REMOTE_CODE_FILES:
                shutil.copyfile(os.path.join(hf_modeling.FOLDER, name), os.path.join(stage, name))
        if tokenizer_dir:
            shutil.copyfile(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(stage, "tokenizer.json"))
            write_tokenizer_config(stage)
    return output_dir


def _stored_tensors(hf_state: dict[str, torch.Tensor], dtype: torch.dtype, dtype_key: str) -> dict[str, torch.Tensor]:
    """``hf_state`` on the CPU in ``dtype``; ValueError naming the first weight with a value that is
    not finite once cast (:func:`_nonfinite_problem`). An export holding inf or NaN loads without
    complaint and computes garbage, so none is written."""
    tensors = {}
    for name, value in hf_state.items():
        stored = value.detach().to("cpu", dtype).contiguous().clone()
        if stored.is_floating_point() and not bool(torch.isfinite(stored).all()):
            raise ValueError(f"{_nonfinite_problem(name, value, dtype, dtype_key)}; nothing was written")
        tensors[name] = stored
    return tensors


def _nonfinite_problem(name: str, value: torch.Tensor, dtype: torch.dtype, dtype_key: str) -> str:
    """Why weight ``name`` is not finite in ``dtype``: inf/NaN of its own (a diverged checkpoint), or
    a magnitude above ``dtype``'s range (float16: 65504), which the cast turned into inf."""
    source = value.detach().float()
    problem = _nonfinite_values(name, source)
    if problem:
        return f"{problem} in the model itself"
    short = str(dtype).removeprefix("torch.")
    return (f"{dtype_key}: {short} cannot hold {name}: its largest magnitude is {float(source.abs().max()):.6g}, "
            f"above {short}'s largest finite value {torch.finfo(dtype).max:.6g}; use {dtype_key} bfloat16 or float32")


def _nonfinite_values(name: str, value: torch.Tensor) -> str | None:
    """How many values of weight ``name`` (a float tensor) are inf or NaN, as a message; None: none."""
    if bool(torch.isfinite(value).all()):
        return None
    return f"hf: {name} holds {int((~torch.isfinite(value)).sum())} non-finite values (of {value.numel()})"


def _export_owned(name: str) -> bool:
    return name in EXPORT_FILES


def check_export_folder(output_dir: str, key: str = "output") -> None:
    """ValueError (naming ``key``) unless ``output_dir`` is new, empty or an earlier export, which
    :func:`export_hf` replaces whole; call it before the work whose result goes there."""
    check_output_folder(output_dir, key, _export_owned, "a Hugging Face export", required=EXPORT_REQUIRED)


def read_hf_config(hf_dir: str) -> dict:
    """``config.json`` of the Hugging Face folder ``hf_dir``; ValueError naming the file when the
    folder lacks it or its weights, or it is not a JSON object."""
    config_path = os.path.join(hf_dir, CONFIG_FILE)
    files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not os.path.isfile(config_path) or not files:
        raise ValueError(f"hf: {hf_dir!r} needs config.json and *.safetensors files (found config: "
                         f"{os.path.isfile(config_path)}, weights: {len(files)} files)")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"hf: {config_path!r} is not readable JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"hf: {config_path!r} holds a {type(config).__name__}; expected a JSON object")
    return config


def _check_shard_index(hf_dir: str) -> None:
    """ValueError naming the shards that ``hf_dir``'s ``model.safetensors.index.json`` maps weights to
    and the folder lacks (a download or copy cut short: the weights would read as missing weights,
    not as a missing file), or an index that is not a weight map; no index: nothing to check."""
    path = os.path.join(hf_dir, SHARD_INDEX)
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            shards = set(json.load(f)["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"hf: {path!r} is not a shard index with a weight_map ({type(exc).__name__}: {exc})") from None
    missing = sorted(name for name in shards if not os.path.isfile(os.path.join(hf_dir, str(name))))
    if missing:
        raise ValueError(f"hf: {hf_dir!r} lacks {missing[:3]} ({len(missing)} of the {len(shards)} shards its "
                         f"{SHARD_INDEX} lists); a download or copy cut short?")


def read_hf_state(hf_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files (sharded or not) in ``hf_dir``.

    Raises ValueError naming the file that cannot be read (a truncated or foreign file), a shard that
    ``model.safetensors.index.json`` lists and the folder lacks, and a tensor that two files hold (a
    stale shard beside the weights: which copy won would depend on the names)."""
    _check_shard_index(hf_dir)
    state: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors"))):
        try:
            tensors = load_file(path)
        except Exception as exc:  # safetensors raises its own SafetensorError (no ValueError) for a bad header
            raise ValueError(f"hf: {path!r} is not a readable safetensors file ({type(exc).__name__}: {exc}); "
                             "a truncated or interrupted copy?") from None
        twice = sorted(set(tensors) & set(state))
        if twice:
            raise ValueError(f"hf: {twice[0]} is in both {source[twice[0]]!r} and {path!r} ({len(twice)} tensors in "
                             "two files); keep one set of weights in the folder")
        state.update(tensors)
        source.update(dict.fromkeys(tensors, path))
    return state


def read_hf(hf_dir: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """``config.json`` and every tensor of the ``*.safetensors`` files (sharded or not) in ``hf_dir``
    (:func:`read_hf_config`, :func:`read_hf_state`)."""
    return read_hf_config(hf_dir), read_hf_state(hf_dir)


def _rope(config: dict) -> tuple[object, object]:
    """(theta, rope type) of a config.json: ``rope_theta`` and ``rope_scaling`` (transformers 4), or
    ``rope_parameters`` (transformers 5 writes it instead). None where absent.

    Raises ValueError when two of them give different thetas: transformers 5 computes with the
    theta of ``rope_parameters`` (or ``rope_scaling``) over ``rope_theta``, so a check of either
    one alone passes a model of another RoPE."""
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    thetas = {"rope_theta": config.get("rope_theta")}
    for name, part in (("rope_parameters", parameters), ("rope_scaling", scaling)):
        if isinstance(part, dict):
            thetas[f"{name}.rope_theta"] = part.get("rope_theta")
    thetas = {key: value for key, value in thetas.items() if value is not None}
    theta = next(iter(thetas.values()), None)
    if any(value != theta for value in thetas.values()):
        given = ", ".join(f"{key} = {value!r}" for key, value in thetas.items())
        raise ValueError(f"hf config.json: {given} disagree; expected one RoPE theta (transformers 5 computes with "
                         "the nested one, transformers 4 with rope_theta: which one the weights were trained with "
                         "is unclear)")
    kinds = [part.get("rope_type", part.get("type")) if isinstance(part, dict) else part
             for part in (scaling, parameters) if part]
    return theta, next((kind for kind in kinds if kind not in (None, "default")), "default")


def _parallax_problem(config: dict, args: ParallaxModelArgs) -> str | None:
    """What disagrees between a config.json's ``model_type`` and ``parallax`` block and ``args``."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        return f"model_type = {model_type!r}; expected one of {MODEL_TYPES} (Qwen3 or a Parallax export)"
    if model_type == "qwen3":
        return None  # a Transformer: loads into any variant (Parallax starts at zero probes)
    if args.mixer != "parallax":
        return (f"model_type = 'parallax_qwen3' (a Parallax export), but the config builds mixer {args.mixer!r}; "
                "import it with a parallax* config")
    block = config.get("parallax")
    for key in PARALLAX_FIELDS:
        value = block.get(key) if isinstance(block, dict) else None
        if value != getattr(args, key):
            return (f"parallax.{key} = {value!r}, but the model has {key} = {getattr(args, key)!r}; set "
                    f"[parallax] {key} to the export's value (the weights are the same, the function not)")
    return None


def check_hf_config(config: dict, args: ParallaxModelArgs) -> None:
    """ValueError naming the first config.json field that disagrees with the model's ``args``, or that
    is missing (then the model would silently take the config's value, e.g. another RoPE theta): the
    shape keys (:data:`SHAPE_FIELDS`), RoPE theta (one, where ``rope_parameters`` or ``rope_scaling``
    gives one too) and type, the keys that must keep Qwen3's values
    (:data:`FIXED_FIELDS`), ``model_type`` and a Parallax export's ``parallax`` block."""
    theta, rope_type = _rope(config)
    values = {**config, "rope_theta": theta}
    for hf_key, field_name in SHAPE_FIELDS.items():
        if values.get(hf_key) is None:
            raise ValueError(f"hf config.json: {hf_key} is missing; expected {getattr(args, field_name)!r} "
                             f"(the model's {field_name}), as every Qwen3 config.json has it")
        if values[hf_key] != getattr(args, field_name):
            raise ValueError(
                f"hf config.json: {hf_key} = {values[hf_key]!r}, but the model has {field_name} = "
                f"{getattr(args, field_name)!r}; pick the matching [model] flavor or shape overrides"
            )
    if rope_type != "default":
        raise ValueError(f"hf config.json: rope_scaling / rope_parameters has rope_type = {rope_type!r}; the model "
                         "has plain RoPE (expected none or 'default')")
    for hf_key, expected in FIXED_FIELDS.items():
        if config.get(hf_key, expected) != expected:
            raise ValueError(f"hf config.json: {hf_key} = {config[hf_key]!r}; the model computes with {expected!r}")
    problem = _parallax_problem(config, args)
    if problem:
        raise ValueError(f"hf config.json: {problem}")


def _is_parallax_key(key: str) -> bool:
    return any(name.split("{}")[1] in key for name in PARALLAX_HF_NAMES.values())


def _check_tied_head(hf_state: dict[str, torch.Tensor], tied: bool) -> None:
    """A tied model's output weight is its embedding: ValueError when the embedding is missing
    (TorchTitan's adapter would fail on a bare assert) or an ``lm_head.weight`` differs from it (it
    would silently overwrite the embedding, both being one tensor in the model)."""
    if not tied:
        return
    embedding, head = hf_state.get("model.embed_tokens.weight"), hf_state.get("lm_head.weight")
    if embedding is None:
        raise ValueError("hf: missing weights ['tok_embeddings.weight'] (model.embed_tokens.weight); the model ties "
                         "its output to the embedding, so it is needed")
    if head is not None and not torch.equal(head, embedding):
        raise ValueError("hf: lm_head.weight differs from model.embed_tokens.weight, but the model ties them "
                         "(tie_word_embeddings = true): which one is meant? Leave lm_head.weight out, or import "
                         "into a config with untied embeddings")


def _check_weight_values(hf_state: dict[str, torch.Tensor]) -> None:
    """ValueError naming the first weight that is not floating point (integers of a quantized or
    foreign file would be cast to other values without a word) or that holds inf or NaN (the model
    would compute NaN from its first step, after the folder it was written to had been trusted)."""
    for name, value in hf_state.items():
        if not value.is_floating_point():
            raise ValueError(f"hf: {name} is stored as {value.dtype}; expected floating-point weights (float32, "
                             "bfloat16 or float16), as Qwen3 checkpoints hold them (a quantized checkpoint?)")
        problem = _nonfinite_values(name, value)
        if problem:
            raise ValueError(f"{problem}; a diverged or damaged checkpoint? Nothing was loaded")


@torch.no_grad()
def load_hf_state(model: torch.nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
    """Load Hugging Face (Qwen3 or our export) weights into ``model``.

    A Parallax model given a Qwen3 (Transformer) state dict keeps its initialised W_R and gate and
    gets rho-norm weights 0 (as up-training does), so it computes exactly the Transformer's function.
    ``model`` must be freshly initialised (``eval.checkpoint.build_model``). Raises ValueError for unknown,
    missing or mis-shaped weights, and for weights that are not floating point or not finite
    (:func:`_check_weight_values`), before ``model`` is changed; a state dict with some of the Parallax
    weights (W_R, rho norm, gate) but not all is missing weights too.
    """
    adapter = ParallaxStateDictAdapter(model.model_args)
    unknown = sorted(k for k in hf_state if abstract_name(k) not in adapter.from_hf_map)
    if unknown:
        raise ValueError(f"hf: {len(unknown)} weights have no place in this model (e.g. {unknown[:3]})")
    _check_tied_head(hf_state, model.model_args.enable_weight_tying)
    # Entries mapped to None (RoPE inverse frequencies) are recomputed by the model.
    weights = {k: v for k, v in hf_state.items() if adapter.from_hf_map[abstract_name(k)] is not None}
    _check_weight_values(weights)
    ours = adapter.from_hf(weights)
    target = model.state_dict()
    unused = sorted(k for k in ours if k not in target)
    if unused:
        raise ValueError(f"hf: weights {unused[:3]} are not in this [model] variant ({len(unused)} in all)")
    missing = sorted(k for k in target if k not in ours)
    if any(not _is_parallax_key(k) for k in missing):
        raise ValueError(f"hf: missing weights {[k for k in missing if not _is_parallax_key(k)][:3]}")
    probes = sorted(k for k in target if _is_parallax_key(k))
    if missing and len(missing) < len(probes):
        # only a Transformer state dict, holding none of them, starts at zero probes: zeroing them all
        # would silently discard the Parallax weights that are there
        raise ValueError(f"hf: missing Parallax weights {missing[:3]} ({len(missing)} of the {len(probes)}), while "
                         "the others are there: a shard lost or truncated, or an export of another [parallax] gate?")
    for key, value in ours.items():
        if tuple(value.shape) != tuple(target[key].shape):
            raise ValueError(f"hf: {key} has shape {tuple(value.shape)}, the model expects {tuple(target[key].shape)}")
        target[key].copy_(value)
    if missing:  # a Transformer checkpoint: start as it, the probes growing from zero (W_R, gate initialised)
        zero_probes(model)
