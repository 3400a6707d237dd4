"""One Hugging Face mapping: TorchTitan's ``checkpoint.last_save_in_hf`` (through the adapter in every
TrainSpec) writes the same tensors as ``eval.hf_format.export_hf``, and a Transformer's save is a
Qwen3 checkpoint that ``transformers`` runs with our logits."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from safetensors.torch import load_file
from torchtitan.protocols.train_spec import get_train_spec

from eval.checkpoint import load_job_config, load_model
from eval.hf_format import export_hf, hf_config
from parallax_titan.hf_adapter import ParallaxStateDictAdapter
from parallax_titan.spec import BASE_FLAVORS, VARIANTS, register_all, variant_args
from tests._train_runs import TEST_CONFIG, train

RUN = ["--training.dataset", "default_corpus", "--training.steps", "2", "--checkpoint.interval", "100",
       "--checkpoint.last_save_model_only"]
VARIANT_ARGS = {"transformer": ["--model.name", "transformer"], "parallax": ["--parallax.gate", "head"]}


def test_every_train_spec_has_the_adapter():
    register_all()
    for variant in VARIANTS:
        assert get_train_spec(variant).state_dict_adapter is ParallaxStateDictAdapter, variant


def test_weights_without_hugging_face_names_are_refused():
    args = variant_args("parallax", BASE_FLAVORS["debug"])
    fla_weight = "layers.0.attention.layer.q_proj.weight"  # an fla mixer's weight
    with pytest.raises(ValueError, match=f"no Hugging Face name .*{fla_weight}"):
        ParallaxStateDictAdapter(args).to_hf({"tok_embeddings.weight": torch.zeros(1), fla_weight: torch.zeros(1)})


@pytest.fixture(scope="module", params=list(VARIANT_ARGS))
def runs(request, tmp_path_factory):
    """The same 2-step run twice: last save in Hugging Face format, and as a DCP checkpoint."""
    variant = request.param
    hf_dump, dcp_dump = tmp_path_factory.mktemp(f"{variant}_hf"), tmp_path_factory.mktemp(f"{variant}_dcp")
    train(hf_dump, *RUN, *VARIANT_ARGS[variant], "--checkpoint.last_save_in_hf")
    train(dcp_dump, *RUN, *VARIANT_ARGS[variant])
    job_config = load_job_config(TEST_CONFIG, VARIANT_ARGS[variant])
    model, args = load_model(job_config, str(dcp_dump / "checkpoint" / "step-2"), device="cpu", dtype="float32")
    return variant, str(hf_dump / "checkpoint" / "step-2"), model, args


def read_safetensors(folder: str) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        tensors.update(load_file(path))
    return tensors


@pytest.mark.slow
def test_trainer_hugging_face_save_equals_our_export(runs, tmp_path):
    variant, hf_dir, model, _ = runs
    saved, exported = read_safetensors(hf_dir), read_safetensors(export_hf(model, str(tmp_path)))
    assert saved.keys() == exported.keys()
    assert any(".r_gate." in k for k in saved) == (variant == "parallax")
    for key, value in exported.items():
        assert saved[key].dtype == torch.float32 and torch.equal(saved[key], value), key


@pytest.mark.slow
def test_trainer_hugging_face_save_runs_in_transformers_qwen3(runs):
    transformers = pytest.importorskip("transformers")
    variant, hf_dir, model, args = runs
    if variant != "transformer":
        pytest.skip("only the Transformer variants are Qwen3 checkpoints")
    with open(os.path.join(hf_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(args, torch.float32), f)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=1e-5, atol=1e-5)
