"""A checkpoint of another model is refused before anything is built: on resume (config validation),
in evaluation (``eval.checkpoint`` and ``python -m eval.lm_eval``) and for up-training. The message
names the first differing weight and both shapes. With ``checkpoint.verify`` config validation also
checks manifests, each kind of load as :func:`parallax_titan.resume.checkpoint_problems` lists."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch
import torch.distributed.checkpoint as dcp

import eval.lm_eval as cli
from eval.checkpoint import load_job_config, load_model
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args
from parallax_titan.uptrain import load_transformer_weights
from parallax_titan.checksums import default_algorithm, digest_files, write_manifest
from parallax_titan.config import ConfigError
from parallax_titan.resume import CheckpointPlan, checkpoint_plan, checkpoint_problems
from tests._train_runs import REPO

# parallax, debug flavor, 2 layers: dim 256, 8 query / 4 kv heads of 32, FFN 768, vocab 4096
CONFIG = os.path.join(REPO, "configs", "test_cpu_2rank.toml")
BASE = ["--training.dataset", "default_corpus"]

# (checkpoint variant and changes, config overrides, first differing weight, its shape in the checkpoint, in the model)
CASES = {
    "fewer layers": (("parallax", {"n_layers": 4}), [], "layers.2.attention.q_norm.weight", "(32,)", "absent"),
    "more layers": (("parallax", {"n_layers": 2}), ["--model.n_layers", "4"],
                    "layers.2.attention.q_norm.weight", "absent", "(32,)"),
    "transformer into parallax": (("transformer", {"n_layers": 2}), [],
                                  "layers.0.attention.wr.weight", "absent", "(256, 256)"),
    "parallax into transformer": (("parallax", {"n_layers": 2}), ["--model.name", "transformer"],
                                  "layers.0.attention.wr.weight", "(256, 256)", "absent"),
    "dagger": (("parallax", {"n_layers": 2}), ["--model.name", "parallax_dagger"],
               "layers.0.attention.q_norm.weight", "(32,)", "(16,)"),
    "dim": (("parallax", {"n_layers": 2}), ["--model.dim", "128"],
            "tok_embeddings.weight", "(4096, 256)", "(4096, 128)"),
    "gate": (("parallax", {"n_layers": 2, "gate": "head"}), [], "layers.0.attention.gate.weight", "(8, 256)", "absent"),
}


def save_checkpoint(path, variant: str = "parallax", **changes) -> str:
    """A DCP folder laid out as the trainer writes it: the model's weights at the top level, plus
    optimizer and train state (whose names mention a layer this model lacks: never compared), and
    a checksum manifest."""
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), **changes)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in ParallaxQwen3Model(args).state_dict().items()}
    state = {k: torch.zeros(shape) for k, shape in shapes.items()}
    state["optimizer"] = {"state": {"layers.9.attention.wq.weight": {"exp_avg": torch.zeros(3)}}}
    state["train_state"] = {"step": 5}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    algorithm = default_algorithm()
    write_manifest(str(path), digest_files(str(path), os.listdir(path), 1, algorithm), algorithm)
    return str(path)


def job(dump, *overrides: str):
    return load_job_config(CONFIG, [*BASE, "--job.dump_folder", str(dump), *overrides])


def first_difference(message: str) -> tuple[str, str, str]:
    name, saved, expected = re.search(r"([\w.]+): checkpoint (absent|\([\d, ]*\)), model (absent|\([\d, ]*\))",
                                      message).groups()
    return name, saved, expected


def config_errors(cfg) -> str:
    problems = checkpoint_problems(cfg)
    assert problems
    return "\n".join(problems)


@pytest.mark.parametrize("case", list(CASES))
def test_resume_from_another_model_is_refused(tmp_path, case):
    (variant, changes), overrides, name, saved, expected = CASES[case]
    path = save_checkpoint(tmp_path / "checkpoint" / "step-5", variant, **changes)
    message = config_errors(job(tmp_path, *overrides))
    assert f"checkpoint.folder: {path!r} is from another model" in message
    assert first_difference(message) == (name, saved, expected)


def test_resume_of_the_same_model_is_accepted(tmp_path):
    save_checkpoint(tmp_path / "checkpoint" / "step-5", "parallax", n_layers=2)
    assert checkpoint_problems(job(tmp_path)) == []
    save_checkpoint(tmp_path / "other" / "step-5", "transformer", n_layers=4, dim=128)
    assert checkpoint_problems(job(tmp_path, "--checkpoint.folder", "other", "--model.name", "transformer",
                                   "--model.n_layers", "4", "--model.dim", "128")) == []


def test_the_step_that_would_load_is_the_one_compared(tmp_path):
    save_checkpoint(tmp_path / "checkpoint" / "step-2", "parallax", n_layers=2)
    save_checkpoint(tmp_path / "checkpoint" / "step-3", "parallax", n_layers=4)
    (tmp_path / "checkpoint" / "step-4").mkdir()  # interrupted save: never loaded
    assert "step-3' is from another model" in config_errors(job(tmp_path))
    assert checkpoint_problems(job(tmp_path, "--checkpoint.load_step", "2")) == []
    assert checkpoint_problems(job(tmp_path, "--checkpoint.no-enable")) == []


def test_missing_load_step_is_a_clear_error(tmp_path):
    save_checkpoint(tmp_path / "checkpoint" / "step-2", "parallax", n_layers=2)
    (tmp_path / "checkpoint" / "step-3").mkdir()
    message = config_errors(job(tmp_path, "--checkpoint.load_step", "4"))
    assert re.search(r"checkpoint.load_step: step 4: '.*step-4' does not exist; complete steps in '.*': 2", message)
    message = config_errors(job(tmp_path, "--checkpoint.load_step", "3"))
    assert re.search(r"checkpoint.load_step: step 3: '.*step-3' has no .metadata", message)


def test_unreadable_checkpoint_metadata_names_the_path(tmp_path):
    """Without checksums the metadata reader names the folder (with them, the manifest check does:
    tests/test_checkpoint_integrity.py)."""
    path = save_checkpoint(tmp_path / "checkpoint" / "step-5", "parallax", n_layers=2)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(b"garbage")
    assert f"checkpoint.folder: {path!r}: cannot read its DCP metadata" in config_errors(
        job(tmp_path, "--checkpoint.no-verify"))


def test_initial_load_path_and_init_from_transformer_are_compared(tmp_path):
    bigger = save_checkpoint(tmp_path / "init4", "parallax", n_layers=4)
    message = config_errors(job(tmp_path, "--checkpoint.initial_load_path", bigger))
    assert f"checkpoint.initial_load_path: {bigger!r} is from another model" in message
    assert first_difference(message) == ("layers.2.attention.q_norm.weight", "(32,)", "absent")
    parallax = save_checkpoint(tmp_path / "parallax2", "parallax", n_layers=2)
    message = config_errors(job(tmp_path, "--parallax.init_from_transformer", parallax))
    assert (f"parallax.init_from_transformer: {parallax!r} is from another model than the Transformer part of "
            "model.name = 'parallax'") in message
    assert "(it holds the probe's weights: a Parallax checkpoint starts a run through checkpoint.initial_load_path)" \
        in message
    assert first_difference(message) == ("layers.0.attention.wr.weight", "(256, 256)", "absent")
    assert checkpoint_problems(job(tmp_path, "--parallax.init_from_transformer",
                                   save_checkpoint(tmp_path / "transformer2", "transformer", n_layers=2))) == []


def test_a_missing_transformer_folder_is_refused_unless_a_step_of_the_run_replaces_it(tmp_path):
    """``parallax.init_from_transformer`` naming no folder stops a fresh run before the build; a
    requeued job resuming a step of its own neither reads nor needs it (it was refused at the config
    check, so a job whose source was cleaned up could not resume)."""
    from parallax_titan.config import load_config

    missing = str(tmp_path / "gone" / "step-1000")
    init = ["--parallax.init_from_transformer", missing]
    load_config(["--job.config_file", CONFIG, *BASE, "--job.dump_folder", str(tmp_path), *init])  # no ConfigError
    fresh = checkpoint_plan(job(tmp_path, *init))
    assert (fresh.resume_step, fresh.loads_transformer) == (None, True)
    [message] = fresh.problems
    assert message.startswith(f"parallax.init_from_transformer: {missing!r} is not a directory; expected a DCP "
                              "checkpoint folder")
    assert "is not a directory" in config_errors(job(tmp_path, *init, "--checkpoint.no-enable"))
    save_checkpoint(tmp_path / "checkpoint" / "step-5", "parallax", n_layers=2)
    assert checkpoint_plan(job(tmp_path, *init)) == CheckpointPlan(resume_step=5, loads_transformer=False)
    assert checkpoint_plan(job(tmp_path)).loads_transformer is False  # no source, nothing to load


def truncate_data(path: str) -> str:
    """Cut the DCP data file of the checkpoint folder ``path`` to 100 bytes; returns the file's path."""
    data = os.path.join(path, next(name for name in os.listdir(path) if name.endswith(".distcp")))
    os.truncate(data, 100)
    return data


def test_each_kind_of_load_gets_its_own_manifest_check(tmp_path):
    """checkpoint.verify: the init_from_transformer folder must have a manifest that its files match;
    a resume step that does not is passed over; an initial_load_path folder must match its manifest
    where it has one. With checkpoint.verify = false no manifest is read."""
    transformer = save_checkpoint(tmp_path / "transformer", "transformer", n_layers=2)
    data = truncate_data(transformer)
    init = ["--parallax.init_from_transformer", transformer]
    [message] = checkpoint_problems(job(tmp_path / "a", *init))
    assert message.startswith(f"parallax.init_from_transformer: {transformer!r} is not a valid checkpoint: {data}: "
                              "100 bytes, manifest.json lists ")
    assert message.endswith("; checkpoint.verify = false loads it unchecked")
    assert checkpoint_problems(job(tmp_path / "a", *init, "--checkpoint.no-verify")) == []
    unlisted = save_checkpoint(tmp_path / "unlisted", "transformer", n_layers=2)
    os.remove(os.path.join(unlisted, "manifest.json"))
    assert "manifest.json' does not exist" in config_errors(job(tmp_path / "a", "--parallax.init_from_transformer",
                                                                unlisted))

    seed = save_checkpoint(tmp_path / "seed", "parallax", n_layers=2)
    seed_data = truncate_data(seed)
    [message] = checkpoint_problems(job(tmp_path / "b", "--checkpoint.initial_load_path", seed))
    assert message.startswith(f"checkpoint.initial_load_path: {seed!r} is not a valid checkpoint: {seed_data}: "
                              "100 bytes, manifest.json lists ")
    assert checkpoint_problems(job(tmp_path / "b", "--checkpoint.initial_load_path", seed,
                                   "--checkpoint.no-verify")) == []
    os.remove(os.path.join(seed, "manifest.json"))  # another program's checkpoint: left to its load
    assert checkpoint_problems(job(tmp_path / "b", "--checkpoint.initial_load_path", seed)) == []

    save_checkpoint(tmp_path / "c" / "checkpoint" / "step-2", "parallax", n_layers=4)
    truncate_data(save_checkpoint(tmp_path / "c" / "checkpoint" / "step-3", "parallax", n_layers=2))
    assert "step-2' is from another model" in config_errors(job(tmp_path / "c"))
    assert checkpoint_problems(job(tmp_path / "c", "--checkpoint.no-verify")) == []


def test_uptraining_loader_refuses_a_parallax_checkpoint(tmp_path):
    args = dataclasses.replace(variant_args("parallax", BASE_FLAVORS["debug"]), n_layers=2)
    with pytest.raises(ValueError, match=r"parallax.init_from_transformer: .* is not a Transformer checkpoint of "
                                         r"this model's size: layers.0.attention.wr.weight: checkpoint \(256, 256\), "
                                         r"model absent"):
        load_transformer_weights(ParallaxQwen3Model(args), save_checkpoint(tmp_path / "p", "parallax", n_layers=2))


def test_hugging_face_last_save_needs_a_model_only_save_of_a_named_variant(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint.last_save_in_hf: true needs checkpoint.last_save_model_only = true"):
        job(tmp_path, "--checkpoint.last_save_in_hf", "--checkpoint.no-last_save_model_only")
    assert checkpoint_problems(job(tmp_path, "--checkpoint.last_save_in_hf", "--checkpoint.last_save_model_only")) == []


@pytest.mark.parametrize("case", list(CASES))
def test_evaluation_of_another_model_is_refused(tmp_path, case):
    (variant, changes), overrides, name, saved, expected = CASES[case]
    path = save_checkpoint(tmp_path / "step-5", variant, **changes)
    with pytest.raises(ValueError) as info:
        load_model(job(tmp_path, *overrides), path, device="cpu")
    assert str(info.value).startswith(f"checkpoint: {path!r} holds another model than the config's")
    assert first_difference(str(info.value)) == (name, saved, expected)


def test_evaluation_loads_its_own_model(tmp_path):
    path = save_checkpoint(tmp_path / "step-5", "parallax", n_layers=2)
    model, _ = load_model(job(tmp_path), path, device="cpu")
    assert all(float(v.abs().max()) == 0 for v in model.state_dict().values())  # the saved zeros, not an init


def test_lm_eval_command_exits_2_naming_the_weight(tmp_path, capsys):
    path = save_checkpoint(tmp_path / "step-5", "parallax", n_layers=4)
    rc = cli.main(["--config", CONFIG, "--checkpoint", path, "--output", str(tmp_path / "out"),
                   "--tasks", "boolq", "--device", "cpu"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error: checkpoint:" in err and "layers.2.attention.q_norm.weight: checkpoint (32,), model absent" in err
    assert not (tmp_path / "out").exists()


def test_model_only_checkpoint_cannot_be_resumed(tmp_path):
    """TorchTitan's last save with checkpoint.last_save_model_only holds no optimizer state; resuming
    from it (e.g. to train more steps) is refused naming the way out, instead of a missing-key error."""
    path = tmp_path / "checkpoint" / "step-5"
    args = dataclasses.replace(variant_args("parallax", BASE_FLAVORS["debug"]), n_layers=2)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in ParallaxQwen3Model(args).state_dict().items()}
    dcp.save({k: torch.zeros(shape) for k, shape in shapes.items()}, checkpoint_id=str(path), no_dist=True)
    write_manifest(str(path), digest_files(str(path), os.listdir(path), 1, "blake2b_128"), "blake2b_128")
    assert f"checkpoint.folder: '{path}' holds model weights only" in config_errors(job(tmp_path))
