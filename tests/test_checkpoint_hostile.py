"""Files a user hands us that are wrong in ways the other checkpoint tests do not cover: Hugging
Face folders with missing or other config.json keys, truncated or doubled safetensors, outputs
that would overwrite what is already there, an evaluation config other than the run's, and
manifest or settings files edited by hand."""

import importlib.util
import json
import os
import re

import pytest
import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException

from eval.checkpoint import build_model, load_checkpoint, load_job_config, model_args_of
from eval.hf_format import check_hf_config, export_hf, load_hf_state, read_hf
from parallax_titan.checkpoint_files import CheckpointError, folder_problem, quick_problem, verify_before_load
from parallax_titan.checkpointing import save_checksummed
from parallax_titan.checksums import MANIFEST_FILE, read_manifest
from parallax_titan.diagnostics.report import load_checkpoint_model
from parallax_titan.resume_rules import read_settings, run_settings, write_settings
from test_eval_hf import CONFIG, REPO, logits, tiny_model


def exported(tmp_path, variant="transformer", name="hf", **changes) -> str:
    folder = str(tmp_path / name)
    export_hf(tiny_model(variant, seed=0, **changes), folder)
    return folder


def snapshot(folder) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def load_script():
    spec = importlib.util.spec_from_file_location("export_hf", os.path.join(REPO, "scripts", "export_hf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- config.json --------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["rope_theta", "rms_norm_eps", "tie_word_embeddings", "hidden_size"])
def test_config_json_without_a_key_is_refused(tmp_path, key):
    """A key that is absent cannot be compared: the model would silently use the config's value
    (a RoPE theta or norm eps other than the weights were trained with)."""
    config, _ = read_hf(exported(tmp_path))
    del config[key]
    with pytest.raises(ValueError, match=f"config.json.*{key}.*missing"):
        check_hf_config(config, tiny_model("transformer", seed=0).model_args)


def test_rope_of_a_transformers_5_config_is_compared(tmp_path):
    """transformers 5 writes ``rope_parameters`` instead of ``rope_theta``."""
    config, _ = read_hf(exported(tmp_path))
    args = tiny_model("transformer", seed=0).model_args
    del config["rope_theta"], config["rope_scaling"]
    config["rope_parameters"] = {"rope_theta": args.rope_theta, "rope_type": "default"}
    check_hf_config(config, args)
    config["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    with pytest.raises(ValueError, match="rope_theta = 10000.0"):
        check_hf_config(config, args)
    config["rope_parameters"] = {"rope_theta": args.rope_theta, "rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type = 'yarn'"):
        check_hf_config(config, args)


def test_rope_scaling_and_other_architectures_are_refused(tmp_path):
    config, _ = read_hf(exported(tmp_path))
    args = tiny_model("transformer", seed=0).model_args
    with pytest.raises(ValueError, match="rope_scaling"):
        check_hf_config({**config, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, args)
    with pytest.raises(ValueError, match="model_type = 'llama'"):
        check_hf_config({**config, "model_type": "llama"}, args)
    with pytest.raises(ValueError, match="use_sliding_window"):
        check_hf_config({**config, "use_sliding_window": True}, args)


def test_parallax_export_with_other_switches_is_refused(tmp_path):
    """Same weights, another function: a rho_rope = false export into a rho_rope = true model."""
    source = tiny_model("parallax", seed=0, rho_rope=False)
    export_hf(source, str(tmp_path))
    config, state = read_hf(str(tmp_path))
    with pytest.raises(ValueError, match=r"parallax.rho_rope = False.*rho_rope = True"):
        check_hf_config(config, tiny_model("parallax", seed=1).model_args)
    with pytest.raises(ValueError, match="parallax_qwen3.*softmax"):
        check_hf_config(config, tiny_model("transformer", seed=1).model_args)
    target = tiny_model("parallax", seed=1, rho_rope=False)
    check_hf_config(config, target.model_args)
    load_hf_state(target, state)
    assert torch.equal(logits(source), logits(target))


# ---- tensors ------------------------------------------------------------------------------------

def test_missing_embedding_of_a_tied_model_is_named(tmp_path):
    _, state = read_hf(exported(tmp_path))
    state.pop("model.embed_tokens.weight")
    with pytest.raises(ValueError, match="missing weights.*tok_embeddings"):
        load_hf_state(tiny_model("transformer", seed=1), state)


def test_lm_head_other_than_the_tied_embedding_is_refused(tmp_path):
    """Tied: the output is the embedding; a different lm_head.weight would silently replace it."""
    _, state = read_hf(exported(tmp_path))
    model = tiny_model("transformer", seed=1)
    load_hf_state(model, {**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()})  # equal: fine
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
        load_hf_state(tiny_model("transformer", seed=1),
                      {**state, "lm_head.weight": torch.zeros_like(state["model.embed_tokens.weight"])})


def test_truncated_safetensors_file_is_named(tmp_path):
    folder = exported(tmp_path)
    path = os.path.join(folder, "model.safetensors")
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(ValueError, match="model.safetensors.*not a readable safetensors file"):
        read_hf(folder)


def test_unreadable_config_json_is_named(tmp_path):
    folder = exported(tmp_path)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write('{"vocab_size": 40')
    with pytest.raises(ValueError, match="config.json.*not readable JSON"):
        read_hf(folder)


def test_tensor_in_two_safetensors_files_is_refused(tmp_path):
    """A stale shard beside the weights: which copy wins would depend on the file names."""
    folder = exported(tmp_path)
    save_file({"model.norm.weight": torch.zeros(256)}, os.path.join(folder, "old.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight.*model.safetensors.*old.safetensors"):
        read_hf(folder)


def test_shard_that_the_index_lists_and_the_folder_lacks_is_named(tmp_path):
    """A sharded folder cut short: its weights read as "missing weights", not as the missing file."""
    import json

    from safetensors.torch import load_file

    folder = exported(tmp_path)
    weights = load_file(os.path.join(folder, "model.safetensors"))
    names = sorted(weights)
    first, second = names[: len(names) // 2], names[len(names) // 2:]
    os.remove(os.path.join(folder, "model.safetensors"))
    save_file({k: weights[k] for k in first}, os.path.join(folder, "model-00001-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {**dict.fromkeys(first, "model-00001-of-00002.safetensors"),
                                            **dict.fromkeys(second, "model-00002-of-00002.safetensors")}}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    with pytest.raises(ValueError, match=r"lacks \['model-00002-of-00002.safetensors'\] \(1 of the 2 shards"):
        read_hf(folder)
    save_file({k: weights[k] for k in second}, os.path.join(folder, "model-00002-of-00002.safetensors"))
    _, state = read_hf(folder)  # complete: the two shards read as the one file
    assert sorted(state) == names and all(torch.equal(state[k], weights[k]) for k in names)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        f.write("[]")
    with pytest.raises(ValueError, match="is not a shard index with a weight_map"):
        read_hf(folder)


# ---- outputs ------------------------------------------------------------------------------------

def test_failed_export_leaves_the_earlier_export_as_it_was(tmp_path):
    folder = exported(tmp_path)
    before = snapshot(folder)
    with pytest.raises(FileNotFoundError):  # the tokenizer copy fails after the weights are written
        export_hf(tiny_model("transformer", seed=5), folder, tokenizer_dir=str(tmp_path / "no_tokenizer"))
    assert snapshot(folder) == before
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_export_replaces_an_earlier_export_whole(tmp_path):
    folder = exported(tmp_path, "parallax")
    export_hf(tiny_model("transformer", seed=0), folder)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]  # no stale modeling code


def test_export_refuses_a_folder_it_did_not_write(tmp_path):
    folder = tmp_path / "run"
    (folder / "checkpoint" / "step-5").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"'checkpoint', 'notes.txt'"):
        export_hf(tiny_model("transformer", seed=0), str(folder))
    assert sorted(os.listdir(folder)) == ["checkpoint", "notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["run"]


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle")


def test_failed_save_leaves_the_earlier_checkpoint_intact(tmp_path):
    folder = str(tmp_path / "init")
    save_checksummed({"w": torch.ones(4)}, folder)
    before = snapshot(folder)
    with pytest.raises(CheckpointException):  # DCP's own error: not an Exception subclass
        save_checksummed({"w": torch.zeros(4), "bad": Unpicklable()}, folder)
    assert snapshot(folder) == before and folder_problem(folder) is None
    assert sorted(os.listdir(tmp_path)) == ["init"]


def test_import_refuses_to_overwrite_a_training_checkpoint_before_reading_anything(tmp_path, capsys):
    step = tmp_path / "checkpoint" / "step-5"
    save_checksummed({"w": torch.ones(4)}, str(step))
    write_settings(str(step), 5, {"optimizer.lr": 0.1})
    before = snapshot(step)
    script = load_script()
    script.read_hf_config = script.read_hf_state = lambda path: pytest.fail("--hf was read before --output was checked")
    assert script.main(["import", "--config", CONFIG, "--hf", str(tmp_path / "hf"), "--output", str(step)]) == 2
    err = capsys.readouterr().err
    assert "--output" in err and "settings.json" in err
    assert snapshot(step) == before


def test_export_checks_tokenizer_and_output_before_loading_the_checkpoint(tmp_path, capsys):
    script = load_script()
    script.load_model = lambda *a, **k: pytest.fail("the checkpoint was loaded before the tokenizer was checked")
    argv = ["export", "--config", CONFIG, "--checkpoint", str(tmp_path / "step-1"), "--output", str(tmp_path / "o")]
    assert script.main([*argv, "--model.hf_assets_path", str(tmp_path / "none")]) == 2
    assert "hf_assets_path" in capsys.readouterr().err
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    assert script.main(argv) == 2
    assert "--output" in capsys.readouterr().err


# ---- an evaluation config other than the run's ----------------------------------------------------

def test_evaluating_with_other_parallax_switches_is_refused(tmp_path):
    """The run trained with rho_rope = false (parallax_norope_*); the base config would evaluate
    the same weights as another function."""
    job = load_job_config(CONFIG, ["--parallax.no-rho-rope"])
    model = build_model(model_args_of(job), torch.device("cpu"))
    folder = str(tmp_path / "step-3")
    save_checksummed(model.state_dict(), folder)
    write_settings(folder, 3, run_settings(job, 1))
    load_checkpoint(build_model(model_args_of(job), torch.device("cpu")), folder, verify=False)
    other = build_model(model_args_of(load_job_config(CONFIG)), torch.device("cpu"))
    with pytest.raises(ValueError, match=r"parallax.rho_rope: .* was trained with False .*config sets True.*rho_rope = false under \[parallax\]"):
        load_checkpoint(other, folder, verify=False)


SMALL = ["--model.dim", "64", "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.head_dim", "16",
         "--model.hidden_dim", "96"]  # keeps each load fast


def _saved_with_settings(tmp_path, job, **changed) -> str:
    """A checkpoint of ``job``'s model whose settings.json records ``job``'s settings with ``changed``
    (key -> value; None drops the key, as a checkpoint from before it was recorded)."""
    model = build_model(model_args_of(job), torch.device("cpu"))
    folder = str(tmp_path / "step-3")
    save_checksummed(model.state_dict(), folder)
    settings = {**run_settings(job, 1), **changed}
    write_settings(folder, 3, {k: v for k, v in settings.items() if v is not None})
    return folder


def _load_for_eval(job, folder):
    load_checkpoint(build_model(model_args_of(job), torch.device("cpu")), folder, verify=False)


def _load_for_analysis(job, folder):
    load_checkpoint_model(job, folder, verify=False)


LOADERS = {"eval.checkpoint": ("checkpoint", _load_for_eval),
           "diagnostics load_checkpoint_model": ("--checkpoint", _load_for_analysis)}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("key,saved", [("model.rope_theta", 10000), ("model.norm_eps", 1e-5),
                                       ("model.enable_weight_tying", False)])
def test_evaluating_with_other_model_arguments_is_refused(tmp_path, loader, key, saved):
    """RoPE theta, the norms' eps and weight tying change the function without changing a shape:
    a checkpoint trained with other values (another version of the flavor) loaded silently."""
    who, load = LOADERS[loader]
    job = load_job_config(CONFIG, SMALL)
    current = run_settings(job, 1)[key]
    folder = _saved_with_settings(tmp_path, job, **{key: saved})
    with pytest.raises(ValueError, match=rf"^{who}: {key}: .* was trained with {saved!r} .*the config's model has "
                                         rf"{current!r}; the weights would compute another function: no config key"):
        load(job, folder)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_checkpoint_without_the_model_arguments_loads(tmp_path, loader):
    """settings.json written before the model arguments were recorded: nothing to compare."""
    job = load_job_config(CONFIG, SMALL)
    keys = [k for k in run_settings(job, 1) if k.startswith("model.")]
    assert keys == ["model.rope_theta", "model.norm_eps", "model.enable_weight_tying"]
    LOADERS[loader][1](job, _saved_with_settings(tmp_path, job, **dict.fromkeys(keys)))


def test_analysis_with_other_parallax_switches_is_refused(tmp_path):
    """scripts/analyze.py's loader ran no settings check: a parallax_norope run analysed with the
    base config loaded as another function."""
    folder = _saved_with_settings(tmp_path, load_job_config(CONFIG, [*SMALL, "--parallax.no-rho-rope"]))
    _load_for_analysis(load_job_config(CONFIG, [*SMALL, "--parallax.no-rho-rope"]), folder)
    with pytest.raises(ValueError, match=r"^--checkpoint: parallax.rho_rope: .* was trained with False .*config sets "
                                         r"True.*rho_rope = false under \[parallax\]"):
        _load_for_analysis(load_job_config(CONFIG, SMALL), folder)


# ---- hand-edited manifest and settings ------------------------------------------------------------

def test_manifest_with_fewer_digests_than_chunks_is_refused(tmp_path):
    save_checksummed({"w": torch.ones(4)}, str(tmp_path / "c"))
    path = tmp_path / "c" / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["files"]["__0_0.distcp"]["digests"] = []  # nothing of the file would be checked
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"0 digests for __0_0.distcp.*expected 1"):
        read_manifest(str(tmp_path / "c"))
    data["chunk_bytes"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="chunk_bytes"):
        read_manifest(str(tmp_path / "c"))
    assert "manifest" in folder_problem(str(tmp_path / "c"))


def test_settings_file_with_a_wrong_structure_is_named(tmp_path):
    (tmp_path / "settings.json").write_text('{"format": 1, "step": 3, "settings": null}')
    with pytest.raises(ValueError, match="settings.json.*not readable"):
        read_settings(str(tmp_path))


@pytest.mark.parametrize("dropped", [["__0_0.distcp"], [".metadata"], ["__0_0.distcp", ".metadata"]])
def test_manifest_that_leaves_out_a_checkpoint_file_is_refused(tmp_path, dropped):
    """A manifest that did not list a DCP file (another save's, or edited) passed every check, and
    that file loaded unchecked; with an empty list the whole checkpoint did."""
    folder = str(tmp_path / "c")
    save_checksummed({"w": torch.ones(4)}, folder)
    data = json.loads((tmp_path / "c" / MANIFEST_FILE).read_text())
    for name in dropped:
        del data["files"][name]
    (tmp_path / "c" / MANIFEST_FILE).write_text(json.dumps(data))
    first = os.path.join(folder, sorted(dropped)[0])
    expected = f"{first}: not listed in {MANIFEST_FILE}, so it cannot be checked"
    assert quick_problem(folder).startswith(expected) and folder_problem(folder).startswith(expected)
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        verify_before_load(folder, "--checkpoint", "--no-verify")


def test_settings_file_that_is_a_folder_is_named(tmp_path):
    """It was taken for no settings.json: a resume compared no setting, and an evaluation no model
    argument."""
    (tmp_path / "settings.json").mkdir()
    with pytest.raises(ValueError, match=r"settings\.json' is not readable \(IsADirectoryError"):
        read_settings(str(tmp_path))


def test_checkpoint_folder_that_is_a_file_is_refused_before_the_build(tmp_path):
    """It passed as a folder without checkpoints: the run trained, and its first save failed
    checkpoint.interval steps in."""
    from parallax_titan.resume import checkpoint_problems

    (tmp_path / "checkpoint").write_text("not a folder")
    cfg = load_job_config(CONFIG, ["--job.dump_folder", str(tmp_path), "--training.dataset", "default_corpus"])
    assert checkpoint_problems(cfg) == [f"checkpoint.folder: {str(tmp_path / 'checkpoint')!r} is a file; expected the "
                                        "folder the run's checkpoints are saved in, or none"]
