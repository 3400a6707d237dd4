"""Up-training: a Transformer checkpoint written by the trainer, loaded into a Parallax model
(rho-norm weights 0, W_R as initialised), gives the Transformer's logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed.checkpoint as dcp

from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args
from parallax_titan.uptrain import is_parallax_only, load_transformer_weights
from tests._train_runs import train


def model_of(variant: str) -> ParallaxQwen3Model:
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), n_layers=2, max_seq_len=32)
    model = ParallaxQwen3Model(args)
    with torch.no_grad():
        model.init_weights()
    return model.eval()


@pytest.fixture(scope="module")
def transformer_checkpoint(tmp_path_factory):
    dump = tmp_path_factory.mktemp("transformer")
    train(dump, "--model.name", "transformer", "--training.dataset", "default_corpus", "--training.steps", "2",
          "--checkpoint.interval", "2")
    return str(dump / "checkpoint" / "step-2")


def test_parallax_from_transformer_checkpoint_has_its_logits(transformer_checkpoint):
    transformer = model_of("transformer")
    state = transformer.state_dict()
    dcp.load(state, checkpoint_id=transformer_checkpoint)
    transformer.load_state_dict(state)

    parallax = model_of("parallax")
    load_transformer_weights(parallax, transformer_checkpoint)
    tokens = torch.randint(0, 4096, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(parallax(tokens), transformer(tokens), rtol=1e-5, atol=1e-5)
        assert all(float(m.weight.abs().max()) == 0 for n, m in parallax.named_modules() if n.endswith("r_norm"))


def test_wrong_size_checkpoint_is_rejected(transformer_checkpoint):
    args = dataclasses.replace(variant_args("parallax", BASE_FLAVORS["debug"]), n_layers=3, max_seq_len=32)
    with pytest.raises(ValueError, match="parallax.init_from_transformer"):
        load_transformer_weights(ParallaxQwen3Model(args), transformer_checkpoint)


def test_trainer_uptrains_from_transformer(transformer_checkpoint, tmp_path):
    train(tmp_path, "--training.dataset", "default_corpus", "--training.steps", "1",
          "--parallax.init_from_transformer", transformer_checkpoint)
    saved = model_of("parallax").state_dict()
    dcp.load(saved, checkpoint_id=str(tmp_path / "checkpoint" / "step-1"))
    reference = model_of("transformer").state_dict()
    dcp.load(reference, checkpoint_id=transformer_checkpoint)
    # One optimizer step from the Transformer's weights: close to them, not re-initialised.
    for key, value in reference.items():
        assert (saved[key] - value).abs().max() < 0.05, key
    assert not any(is_parallax_only(k) for k in reference)
