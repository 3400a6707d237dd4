"""Up-training: a Transformer checkpoint written by the trainer, loaded into a Parallax model
(rho-norm weights 0, W_R as initialised), gives the Transformer's logits; a damaged one is refused
as ``checkpoint.verify`` says."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp

from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args
from parallax_titan.uptrain import is_parallax_only, load_transformer_weights
from tests._train_runs import run_single, train


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
    converted = parallax.state_dict()
    assert all(torch.equal(converted[name], value) for name, value in transformer.state_dict().items())


def test_wrong_size_checkpoint_is_rejected(transformer_checkpoint):
    args = dataclasses.replace(variant_args("parallax", BASE_FLAVORS["debug"]), n_layers=3, max_seq_len=32)
    with pytest.raises(ValueError, match="parallax.init_from_transformer"):
        load_transformer_weights(ParallaxQwen3Model(args), transformer_checkpoint)


def test_trainer_checks_the_transformer_checkpoint_as_checkpoint_verify_says(transformer_checkpoint, tmp_path):
    """A changed byte stops the run before training (exit code 4) naming the key, the file and the off
    switch; a truncated file is refused with the config, before the build (exit code 2);
    ``--checkpoint.no-verify`` trains from the changed folder."""
    source = str(tmp_path / "transformer")
    shutil.copytree(transformer_checkpoint, source)
    data = os.path.join(source, "__0_0.distcp")
    with open(data, "r+b") as f:
        f.seek(os.path.getsize(data) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    run = ("--training.dataset", "default_corpus", "--training.steps", "1", "--parallax.init_from_transformer", source)
    result = run_single(tmp_path / "corrupt", *run)
    assert result.returncode == 4, result.stderr[-3000:]
    assert (f"error: parallax.init_from_transformer: {source!r} is not a valid checkpoint: {data}: bytes 0-"
            in result.stderr) and "(checkpoint.verify = false loads it unchecked)" in result.stderr
    assert "Training starts" not in result.stdout + result.stderr
    unchecked = run_single(tmp_path / "unchecked", *run, "--checkpoint.no-verify")
    assert unchecked.returncode == 0, unchecked.stderr[-3000:]
    os.truncate(data, 1000)
    result = run_single(tmp_path / "truncated", *run)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (f"parallax.init_from_transformer: {source!r} is not a valid checkpoint: {data}: 1000 bytes, manifest.json "
            "lists") in result.stderr and "checkpoint.verify = false loads it unchecked" in result.stderr


def test_trainer_uptrains_from_transformer(transformer_checkpoint, tmp_path):
    run = ("--training.dataset", "default_corpus", "--parallax.init_from_transformer", transformer_checkpoint)
    first = train(tmp_path, *run, "--training.steps", "1")
    assert "is not loaded" not in first.stdout + first.stderr
    saved = model_of("parallax").state_dict()
    dcp.load(saved, checkpoint_id=str(tmp_path / "checkpoint" / "step-1"))
    reference = model_of("transformer").state_dict()
    dcp.load(reference, checkpoint_id=transformer_checkpoint)
    # One optimizer step from the Transformer's weights: close to them, not re-initialised.
    for key, value in reference.items():
        assert (saved[key] - value).abs().max() < 0.05, key
    assert not any(is_parallax_only(k) for k in reference)
    # requeued: the run's own step replaces the Transformer, which is not read again
    requeued = train(tmp_path, *run, "--training.steps", "2")
    assert (f"parallax.init_from_transformer = {transformer_checkpoint!r} is not loaded: the run resumes step 1 of "
            "its own checkpoint folder") in requeued.stdout + requeued.stderr


def test_initial_load_beside_init_from_transformer_is_refused(tmp_path):
    """TorchTitan's initial load comes after the conversion and replaced the whole model without a word
    (the rho-norm weights came back near 1 instead of 0)."""
    from parallax_titan.config import ConfigError, load_config

    for name in ("transformer", "initial"):
        (tmp_path / name).mkdir()
    with pytest.raises(ConfigError, match=r"parallax.init_from_transformer = '.*transformer' and "
                                          r"checkpoint.initial_load_path / initial_load_in_hf both name the run's "
                                          r"starting weights"):
        load_config(["--job.config_file", "configs/demo_cpu.toml", "--parallax.init_from_transformer",
                     str(tmp_path / "transformer"), "--checkpoint.initial_load_path", str(tmp_path / "initial")])


def test_a_resumed_uptraining_run_does_not_read_its_source_again(transformer_checkpoint, tmp_path):
    """A requeued up-training job resumes its own step, whose weights replace the Transformer's: the
    source is neither checked nor loaded again (a damaged copy used to stop the rerun, exit code 2)."""
    source = str(tmp_path / "transformer")
    shutil.copytree(transformer_checkpoint, source)
    run = ("--training.dataset", "default_corpus", "--parallax.init_from_transformer", source)
    first = run_single(tmp_path / "run", *run, "--training.steps", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    os.truncate(os.path.join(source, "__0_0.distcp"), 1000)
    again = run_single(tmp_path / "run", *run, "--training.steps", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"parallax.init_from_transformer = {source!r} is not loaded" in again.stdout + again.stderr
