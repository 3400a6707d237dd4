"""Hugging Face export/import: round trips, Qwen3 naming, Qwen3 -> Parallax starting as the Transformer."""

import dataclasses
import importlib.util
import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from eval.checkpoint import build_model, load_checkpoint, load_job_config, model_args_of
from eval.hf_format import check_hf_config, export_hf, load_hf_state, read_hf
from parallax_titan.checkpoint_files import CheckpointError, folder_problem
from parallax_titan.checkpointing import save_checksummed
from parallax_titan.checksums import read_manifest
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "configs", "test_cpu_2rank.toml")


def tiny_model(variant: str, seed: int, **changes) -> ParallaxQwen3Model:
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), n_layers=2, max_seq_len=32, **changes)
    torch.manual_seed(seed)
    model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # norms start at 1: make their export observable
                param.uniform_(0.5, 1.5)
    return model.eval()


def logits(model, seed=1):
    tokens = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(tokens)


def qwen3_names(n_layers: int, tied: bool) -> set[str]:
    """Hugging Face Qwen3ForCausalLM weight names, written out independently of the adapter."""
    names = {"model.embed_tokens.weight", "model.norm.weight"} | (set() if tied else {"lm_head.weight"})
    per_layer = [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm",
    ]
    return names | {f"model.layers.{i}.{p}.weight" for i in range(n_layers) for p in per_layer}


@pytest.mark.parametrize("variant, changes", [
    ("transformer", {}), ("transformer", {"enable_weight_tying": False}), ("parallax", {}),
    ("parallax", {"gate": "head", "rho_rope": False}), ("parallax_dagger", {}),
])
def test_export_then_import_round_trips_logits_exactly(tmp_path, variant, changes):
    source = tiny_model(variant, seed=0, **changes)
    export_hf(source, str(tmp_path))
    config, state = read_hf(str(tmp_path))
    target = tiny_model(variant, seed=1, **changes)
    assert not torch.equal(logits(source), logits(target))
    check_hf_config(config, target.model_args)
    load_hf_state(target, state)
    assert torch.equal(logits(source), logits(target))
    extra = {k for k in state if ".r_proj." in k or ".r_norm." in k or ".r_gate." in k}
    assert set(state) - extra == qwen3_names(2, source.model_args.enable_weight_tying)
    assert config["model_type"] == ("qwen3" if variant.startswith("transformer") else "parallax_qwen3")
    assert (config["hidden_size"], config["head_dim"], config["intermediate_size"]) == (
        source.model_args.dim, source.model_args.head_dim, source.model_args.hidden_dim)
    assert len(extra) == (0 if variant.startswith("transformer") else 2 * (2 + (changes.get("gate") == "head")))


def test_qwen3_weights_into_parallax_give_the_transformers_logits(tmp_path):
    transformer = tiny_model("transformer", seed=0)
    export_hf(transformer, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    config, state = read_hf(str(tmp_path))
    assert set(state) == qwen3_names(2, tied=True)
    parallax = tiny_model("parallax", seed=1)
    check_hf_config(config, parallax.model_args)
    load_hf_state(parallax, state)
    fresh = tiny_model("parallax", seed=1)
    for name, module in parallax.named_modules():
        if name.endswith("attention.r_norm"):  # the probe starts at zero through its norm's weight
            assert float(module.weight.detach().abs().max()) == 0.0
        if name.endswith("attention.wr"):  # W_R keeps its initialisation, so the probe can grow
            assert torch.equal(module.weight, dict(fresh.named_modules())[name].weight)
    torch.testing.assert_close(logits(parallax), logits(transformer), rtol=1e-5, atol=1e-5)
    assert (logits(parallax) - logits(tiny_model("parallax", seed=1))).abs().max() > 1e-2


def test_import_rejects_mismatched_weights(tmp_path):
    export_hf(tiny_model("transformer", seed=0), str(tmp_path))
    config, state = read_hf(str(tmp_path))
    wide = tiny_model("transformer", seed=0, dim=128)
    with pytest.raises(ValueError, match="hidden_size"):
        check_hf_config(config, wide.model_args)
    with pytest.raises(ValueError, match="shape"):
        load_hf_state(wide, state)
    with pytest.raises(ValueError, match="no place"):
        load_hf_state(tiny_model("transformer", seed=0), {**state, "model.layers.0.mlp.extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="missing"):
        load_hf_state(tiny_model("transformer", seed=0), {k: v for k, v in state.items() if "q_proj" not in k})
    with pytest.raises(ValueError, match="config.json"):
        read_hf(str(tmp_path / "nothing"))


def test_some_parallax_weights_missing_is_refused_not_zeroed(tmp_path):
    """A Parallax export lacking some of its probe weights (a lost shard; an ungated export into a
    gated model) loaded as a Qwen3 state dict: every rho norm, the loaded ones too, was set to zero
    and the model silently computed the Transformer's function."""
    export_hf(tiny_model("parallax", seed=0), str(tmp_path))
    _, state = read_hf(str(tmp_path))
    target = tiny_model("parallax", seed=1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    lost = {k: v for k, v in state.items() if k != "model.layers.1.self_attn.r_norm.weight"}
    with pytest.raises(ValueError, match=r"missing Parallax weights \['layers\.1\.attention\.r_norm\.weight'\] "
                                         r"\(1 of the 4\), while the others are there"):
        load_hf_state(target, lost)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    with pytest.raises(ValueError, match=r"missing Parallax weights \['layers\.0\.attention\.gate\.weight', "
                                         r"'layers\.1\.attention\.gate\.weight'\] \(2 of the 6\)"):
        load_hf_state(tiny_model("parallax", seed=1, gate="head"), state)


def load_script():
    spec = importlib.util.spec_from_file_location("export_hf", os.path.join(REPO, "scripts", "export_hf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_export_and_import_through_dcp(tmp_path):
    """DCP folder (trainer layout) -> export -> import -> DCP folder: same weights, same logits; the
    imported folder carries a checksum manifest of its files, as the trainer's saves do."""
    args = model_args_of(load_job_config(CONFIG))
    model = build_model(args, torch.device("cpu"))
    save_checksummed(model.state_dict(), str(tmp_path / "step-5"))
    script = load_script()
    assert script.main(["export", "--config", CONFIG, "--checkpoint", str(tmp_path / "step-5"),
                        "--output", str(tmp_path / "hf")]) == 0
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path / "hf"))
    assert "model.layers.1.self_attn.r_proj.weight" in load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert script.main(["import", "--config", CONFIG, "--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "back")]) == 0
    back = str(tmp_path / "back")
    assert set(read_manifest(back).files) == {".metadata", "__0_0.distcp"} and folder_problem(back) is None
    reloaded = build_model(args, torch.device("cpu"))
    load_checkpoint(reloaded, back)
    assert torch.equal(logits(model), logits(reloaded))
    with open(os.path.join(back, "__0_0.distcp"), "r+b") as f:  # the manifest covers the tensor data
        f.seek(os.path.getsize(f.name) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=r"__0_0.distcp: bytes 0-\d+ differ"):
        load_checkpoint(reloaded, back)
    assert script.main(["import", "--config", CONFIG, "--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "x"),
                        "--model.n_layers", "3"]) == 2


def test_float16_export_that_would_overflow_is_refused_before_writing(tmp_path):
    """A weight above float16's 65504 would be stored as inf: refused naming the weight and its largest
    magnitude, and nothing is written; an earlier export stays as it was."""
    model = tiny_model("parallax", seed=0)
    with torch.no_grad():
        model.layers["1"].feed_forward.w2.weight[3, 5] = -1.0e5
    earlier = export_hf(model, str(tmp_path / "earlier"))  # float32 holds it
    before = load_file(os.path.join(earlier, "model.safetensors"))
    for folder in (earlier, str(tmp_path / "new")):
        with pytest.raises(ValueError, match=r"dtype: float16 cannot hold model\.layers\.1\.mlp\.down_proj\.weight: "
                                             r"its largest magnitude is 100000, above float16's largest finite "
                                             r"value 65504; .* nothing was written"):
            export_hf(model, folder, dtype=torch.float16)
    assert not os.path.exists(tmp_path / "new")
    after = load_file(os.path.join(earlier, "model.safetensors"))
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert json.loads((tmp_path / "earlier" / "config.json").read_text())["torch_dtype"] == "float32"


def test_export_refuses_a_tokenizer_folder_that_is_not_an_earlier_export(tmp_path):
    """tokenizer.json and tokenizer_config.json are export files too: a tokenizer's own folder (the
    tiny tokenizer's holds just those) passed for an earlier export and was replaced whole."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"output: .* holds \['tokenizer.json', 'tokenizer_config.json'\] but not "
                                         r"\['config.json', 'model.safetensors'\], so it is not a Hugging Face export"):
        export_hf(tiny_model("transformer", seed=0), str(folder))
    assert sorted(os.listdir(folder)) == ["tokenizer.json", "tokenizer_config.json"]
    earlier = export_hf(tiny_model("transformer", seed=0), str(tmp_path / "export"))
    export_hf(tiny_model("transformer", seed=1), earlier)  # an earlier export is still replaced


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, torch.bool])
def test_export_refuses_a_storage_dtype_other_than_the_float_ones(tmp_path, dtype):
    """int8 wrote weights truncated to integers (finite, so nothing refused them); the command line
    offers the three float types only, the Python API took any dtype."""
    with pytest.raises(ValueError, match=f"dtype: got {dtype!r}; expected one of"):
        export_hf(tiny_model("transformer", seed=0), str(tmp_path / "out"), dtype=dtype)
    assert not os.path.exists(tmp_path / "out")


def test_non_finite_weights_are_not_exported(tmp_path):
    model = tiny_model("transformer", seed=0)
    with torch.no_grad():
        model.norm.weight[0] = float("nan")
    with pytest.raises(ValueError, match=r"hf: model\.norm\.weight holds 1 non-finite values .* nothing was written"):
        export_hf(model, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_script_float16_overflow_is_refused_naming_the_flag(tmp_path, capsys):
    """scripts/export_hf.py reads the checkpoint in float32 and casts at the export, so the refusal names
    --dtype, the weight and its magnitude (exit code 2), and writes nothing."""
    model = build_model(model_args_of(load_job_config(CONFIG)), torch.device("cpu"))
    with torch.no_grad():
        model.tok_embeddings.weight[7, 0] = 7.0e4
    save_checksummed(model.state_dict(), str(tmp_path / "step-5"))
    export = ["export", "--config", CONFIG, "--checkpoint", str(tmp_path / "step-5"), "--output", str(tmp_path / "hf")]
    assert load_script().main([*export, "--dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert "--dtype: float16 cannot hold model.embed_tokens.weight: its largest magnitude is 70000" in err
    assert not os.path.exists(tmp_path / "hf")


def test_model_only_bf16_checkpoint_loads(tmp_path):
    """TorchTitan's last_save_model_only + export_dtype: a bf16 model-only folder loads into fp32."""
    args = model_args_of(load_job_config(CONFIG))
    saved = {k: v.to(torch.bfloat16) for k, v in build_model(args, torch.device("cpu")).state_dict().items()}
    save_checksummed(saved, str(tmp_path))
    model = build_model(args, torch.device("cpu"))
    load_checkpoint(model, str(tmp_path))
    for key, value in model.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, saved[key].float()), key


@pytest.mark.parametrize("tied", [True, False])
def test_exported_transformer_loads_in_transformers_qwen3(tmp_path, tied):
    """The export is a real Qwen3 checkpoint: transformers' Qwen3ForCausalLM gives our logits."""
    transformers = pytest.importorskip("transformers")
    model = tiny_model("transformer", seed=3, enable_weight_tying=tied)
    export_hf(model, str(tmp_path))
    hf = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    tokens = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, logits(model), rtol=1e-5, atol=1e-5)


def test_sliding_window_models_are_not_exported(tmp_path):
    """The exported modeling code is full causal attention: a windowed model would change its function."""
    with pytest.raises(ValueError, match="parallax.window = 8 has no Hugging Face form"):
        export_hf(tiny_model("parallax", seed=0, window=8), str(tmp_path))
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("command", ["export", "import"])
def test_script_output_under_a_file_is_refused_before_reading(tmp_path, capsys, command):
    """An --output whose parent is a file passed the folder check and failed with a traceback from
    makedirs after the whole checkpoint (or Hugging Face folder) had been read."""
    (tmp_path / "blocker").write_text("a file where a folder would go")
    script = load_script()

    def read(*args, **kwargs):
        raise AssertionError("weights were read before --output was checked")

    script.load_model = script.read_hf_config = read
    source = ["--checkpoint", str(tmp_path / "step-5")] if command == "export" else ["--hf", str(tmp_path / "hf")]
    assert script.main([command, "--config", CONFIG, *source, "--output", str(tmp_path / "blocker" / "out")]) == 2
    err = capsys.readouterr().err
    assert "--output: cannot create or write" in err and "'" + str(tmp_path / "blocker") + "'" in err


@pytest.mark.parametrize("damage, cause", [("truncated", r"EOFError \(a truncated file\?\)"),
                                           ("missing", r"FileNotFoundError: .*__0_0\.distcp'")])
def test_script_unreadable_checkpoint_unchecked_is_an_error_not_a_traceback(tmp_path, capsys, damage, cause):
    """With --no-verify, a truncated or missing data file ended the export in a traceback: DCP raises a
    CheckpointException, a BaseException; now exit code 4 naming --checkpoint, the folder and the cause."""
    model = build_model(model_args_of(load_job_config(CONFIG)), torch.device("cpu"))
    folder = str(tmp_path / "step-5")
    save_checksummed(model.state_dict(), folder)
    data = os.path.join(folder, "__0_0.distcp")
    if damage == "truncated":
        os.truncate(data, os.path.getsize(data) // 2)
    else:
        os.remove(data)
    export = ["export", "--config", CONFIG, "--checkpoint", folder, "--output", str(tmp_path / "hf"), "--no-verify"]
    assert load_script().main(export) == 4
    err = capsys.readouterr().err
    assert re.search(f"error: --checkpoint: {re.escape(repr(folder))} cannot be read: {cause}; it was loaded without "
                     "checking its checksums", err), err
    assert not os.path.exists(tmp_path / "hf")


@pytest.mark.parametrize("nested", ["rope_parameters", "rope_scaling"])
def test_import_refuses_a_config_json_with_two_rope_thetas(tmp_path, nested):
    """rope_theta matched the model while rope_parameters (or rope_scaling) gave another theta, which
    transformers 5 computes with: the check passed a Qwen3 of another RoPE, whose weights then gave
    other logits in our model."""
    model = tiny_model("transformer", seed=0)
    export_hf(model, str(tmp_path / "hf"))
    config, _ = read_hf(str(tmp_path / "hf"))
    config[nested] = {"rope_theta": 10000.0, "rope_type": "default"}
    with pytest.raises(ValueError, match=rf"hf config.json: rope_theta = 1000000, {nested}.rope_theta = 10000.0 "
                                         r"disagree; expected one RoPE theta"):
        check_hf_config(config, model.model_args)
    config[nested]["rope_theta"] = 1.0e6  # the same theta twice is one
    check_hf_config(config, model.model_args)


@pytest.mark.parametrize("value, message", [
    (float("nan"), r"hf: model\.layers\.0\.mlp\.down_proj\.weight holds 1 non-finite values \(of 196608\)"),
    (float("-inf"), r"hf: model\.layers\.0\.mlp\.down_proj\.weight holds 1 non-finite values \(of 196608\)"),
    (torch.int32, r"hf: model\.layers\.0\.mlp\.down_proj\.weight is stored as torch\.int32; expected floating-point"),
], ids=["nan", "inf", "int32"])
def test_import_refuses_weights_that_are_not_finite_floats(tmp_path, capsys, value, message):
    """A Hugging Face folder whose weights hold NaN or inf, or integers, was imported without a word:
    the DCP folder written (checksummed, so trusted) held NaN, or integer weights cast to floats.
    Now refused naming the weight, before the model is changed or --output is written (exit code 2)."""
    model = build_model(model_args_of(load_job_config(CONFIG)), torch.device("cpu"))
    save_checksummed(model.state_dict(), str(tmp_path / "step-5"))
    script = load_script()
    hf = str(tmp_path / "hf")
    assert script.main(["export", "--config", CONFIG, "--checkpoint", str(tmp_path / "step-5"), "--output", hf]) == 0
    tensors = load_file(os.path.join(hf, "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    if isinstance(value, float):
        tensors[name][3, 5] = value
    else:
        tensors[name] = tensors[name].to(value)
    save_file(tensors, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
    target = build_model(model.model_args, torch.device("cpu"))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        load_hf_state(target, read_hf(hf)[1])
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    assert script.main(["import", "--config", CONFIG, "--hf", hf, "--output", str(tmp_path / "back")]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "back")


def test_block_causal_export_with_an_end_of_document_outside_the_vocabulary_is_refused(tmp_path):
    """A block-causal model exported without eos_id got Qwen3's <|endoftext|> id, 151643, as its
    eos_token_id, a token that a 4096-token model never sees: the exported model never ended a
    document and silently attended across the ones training kept apart. Refused before anything is
    written; the tokenizer's id exports."""
    model = tiny_model("parallax", seed=0, attn_mask_type="block_causal")
    for eos_id, shown in [(None, "151643"), (4096, "4096"), (-1, "-1"), ("7", "'7'")]:
        with pytest.raises(ValueError, match=rf"eos_id: {shown} is not a token id of this model \(vocab_size 4096\), "
                                             r"and attn_mask_type = 'block_causal' ends a document after it"):
            export_hf(model, str(tmp_path / "hf"), eos_id=eos_id)
    assert not os.path.exists(tmp_path / "hf")
    export_hf(model, str(tmp_path / "hf"), eos_id=7)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 7
    export_hf(tiny_model("parallax", seed=0), str(tmp_path / "causal"))  # a causal model computes without it
