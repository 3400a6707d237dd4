"""Bad configs fail before anything is built, with a message naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from parallax_titan.config import ConfigError, JobConfig, load_config
from parallax_titan.config.schema import toml_problems
from parallax_titan.resume import checkpoint_problems
from parallax_titan.spec import register_all
from parallax_titan.trainer import ParallaxTrainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")
register_all()


def demo_dict() -> dict:
    with open(DEMO, "rb") as f:
        return tomllib.load(f)


# (section, key, bad value, text the message must contain)
TOML_CASES = [
    ("model", "flavr", "debug", "model.flavr: unknown key"),
    ("training", "steps", "abc", "training.steps: expected int"),
    ("training", "seq_len", 1.5, "training.seq_len: expected int"),
    ("parallax", "gate", "sigmoid", "parallax.gate: expected one of"),
    ("parallax", "rho_rope", "yes", "parallax.rho_rope: expected bool"),
    ("parallax", "fused_norm_rope", 1, "parallax.fused_norm_rope: expected bool"),
    ("parallax", "hopper_kernels", "on", "parallax.hopper_kernels: expected bool"),
    ("parallax", "hopper_backward", True, "parallax.hopper_backward: unknown key; valid keys here:"),  # renamed
    ("optimizer", "lr", "fast", "optimizer.lr: expected float"),
    ("nosuchsection", "x", 1, "nosuchsection: unknown key"),
    ("parallax", "attn_backend", "cuda", "parallax.attn_backend: expected one of"),
    ("reliability", "nonfinite", "ignore", "reliability.nonfinite: expected one of"),
    ("model", "n_layers", "4", "model.n_layers: expected int"),
    ("metrics", "progress_bar", 1, "metrics.progress_bar: expected bool"),
    ("training", "dataset", 3, "training.dataset: expected str"),
    ("optimizer", "lr_multipliers", "embed=0.3", "optimizer.lr_multipliers: expected a list of str"),
    ("checkpoint", "interval", 10.5, "checkpoint.interval: expected int"),
    ("lr_scheduler", "wd_anneal_gamma", "1", "lr_scheduler.wd_anneal_gamma: expected float"),
    ("training", "local_batch_size", True, "training.local_batch_size: expected int"),
    ("training", "data_order", "random", "training.data_order: expected one of 'sharded', 'global', got 'random'"),
    ("checkpoint", "on_corrupt", "skip", "checkpoint.on_corrupt: expected one of 'fallback', 'stop'"),
    ("checkpoint", "verify", "yes", "checkpoint.verify: expected bool"),
]


@pytest.mark.parametrize("section,key,value,message", TOML_CASES)
def test_toml_keys_and_types_are_checked(section, key, value, message):
    data = demo_dict()
    data.setdefault(section, {})[key] = value
    errors = toml_problems(data, JobConfig)
    assert any(message in e for e in errors), errors


def test_demo_config_is_clean():
    assert toml_problems(demo_dict(), JobConfig) == []


# CLI overrides on top of the demo config, and the key the error must name.
SEMANTIC_CASES = [
    (["--model.name", "gpt2"], "model.name"),
    (["--model.flavor", "7B"], "model.flavor"),
    (["--model.n_heads", "6"], "model.n_heads: 6 query heads is not a multiple of model.n_kv_heads = 4"),
    (["--model.hf_assets_path", "/no/such/tokenizer"], "model.hf_assets_path"),
    (["--training.dataset", "local"], "training.dataset_path"),
    (["--training.dataset", "local", "--training.dataset_path", "/no/such.jsonl"], "/no/such.jsonl"),
    (["--training.steps", "0"], "training.steps"),
    (["--parallelism.tensor_parallel_degree", "2"], "parallelism.tensor_parallel_degree"),
    (["--model.name", "transformer", "--parallax.attn_mask_type", "block_causal"], "parallax.attn_mask_type"),
    (["--model.name", "transformer", "--parallax.init_from_transformer", "/tmp"], "is not Parallax"),
    (["--model.n_kv_heads", "-2"], "model.n_kv_heads: expected a positive integer"),
    (["--training.seq_len", "0"], "training.seq_len"),
    (["--training.local_batch_size", "0"], "training.local_batch_size"),
    (["--training.max_norm", "0"], "training.max_norm"),
    (["--parallelism.pipeline_parallel_degree", "2"], "parallelism.pipeline_parallel_degree"),
    (["--optimizer.lr", "-1"], "optimizer.lr"),
    (["--optimizer.muon_momentum", "1.5"], "optimizer.muon_momentum"),
    (["--optimizer.muon_headwise", "HXF"], "optimizer.muon_headwise"),
    (["--optimizer.spectral_power_attn", "-1"], "optimizer.spectral_power_attn"),
    (["--optimizer.spectral_coeff_mlp", "1e-4", "--optimizer.spectral_power_mlp", "1000"],
     "optimizer.spectral_power_mlp: expected an int from 0 to 16 (sigma^p overflows fp32 above it), got 1000"),
    (["--optimizer.spectral_band", "top", "--optimizer.spectral_band_tau", "0"], "optimizer.spectral_band_tau"),
    (["--optimizer.lr_multipliers", "embed:0.3"], "optimizer.lr_multipliers"),
    (["--optimizer.name", "SGD"], "optimizer.name"),
    (["--lr_scheduler.wd_anneal_gamma", "-1"], "lr_scheduler.wd_anneal_gamma"),
    (["--validation.enable", "--validation.dataset", "local"], "validation.dataset_path"),
    (["--training.dataloader.num_workers", "4"], "training.dataloader.num_workers: expected 0"),
    (["--model.converters", "quantize.linear.fp4"], "model.converters: 'quantize.linear.fp4' is not a TorchTitan"),
    (["--model.converters", "quantize.linear.float8"], "needs quantize.linear.float8.emulate = true"),
    (["--training.dataloader.prefetch_factor", "2"], "training.dataloader.prefetch_factor: expected unset"),
    (["--training.dataloader.persistent_workers"],
     "training.dataloader.persistent_workers: true keeps worker processes alive between epochs, but num_workers = 0 "
     "starts none (it would be ignored); expected false, or num_workers = 1"),
    (["--training.global_batch_size", "12"],
     "training.global_batch_size: 12 is not a positive multiple of training.local_batch_size x data-parallel degree "
     "= 8 x 1 = 8 (on 1 rank)"),
    (["--training.global_batch_size", "-8"],  # TorchTitan ran any negative as -1
     "training.global_batch_size: -8 is not a positive multiple of training.local_batch_size x data-parallel degree "
     "= 8 x 1 = 8 (on 1 rank); use a multiple of 8, or -1 for 8"),
    (["--checkpoint.keep_latest_k", "1"], "checkpoint.keep_latest_k: expected 0 (keep all) or an integer >= 2"),
]


@pytest.mark.parametrize("overrides,message", SEMANTIC_CASES)
def test_bad_config_fails_before_the_model_is_built(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", DEMO, *overrides])
    assert message in str(info.value)


def test_global_batch_is_checked_with_the_world_size(monkeypatch):
    """Under torchrun WORLD_SIZE gives the data-parallel degree: 8 x 2 ranks does not divide 24."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"training.global_batch_size: 24 is not a positive multiple of training"
                                          r".local_batch_size x data-parallel degree = 8 x 2 = 16 \(on 2 ranks\)"):
        load_config(["--job.config_file", DEMO, "--training.global_batch_size", "24"])
    config = load_config(["--job.config_file", DEMO, "--training.global_batch_size", "32"])
    assert config.training.global_batch_size == 32


def test_values_set_in_code_are_checked():
    """A value set in code (past the TOML and command-line checks) is rejected by name."""
    config = load_config(["--job.config_file", DEMO])
    assert config.validate() == []
    config.training.data_order = "random"
    config.parallax.gate = "sigmoid"
    problems = config.validate()
    assert "training.data_order: expected one of 'sharded', 'global', got 'random'" in problems
    assert "parallax.gate: expected one of 'none', 'token', 'head', got 'sigmoid'" in problems


def test_checkpoint_of_another_variant_is_rejected(tmp_path, monkeypatch):
    """Resuming a Parallax run from a Transformer's checkpoint folder fails before the build."""
    import torch
    import torch.distributed.checkpoint as dcp

    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.spec import BASE_FLAVORS, variant_args

    with torch.device("meta"):
        shapes = ParallaxQwen3Model(variant_args("transformer", BASE_FLAVORS["debug"])).state_dict()
    state = {k: torch.zeros(v.shape) for k, v in shapes.items()}
    state["optimizer"] = {"state": {"output.weight": {"exp_avg": torch.zeros(1)}}}  # full, not weights only
    dcp.save(state, checkpoint_id=str(tmp_path / "checkpoint" / "step-5"))
    # No LOCAL_RANK and no process group: getting past the check would fail differently.
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    # written without a manifest: checked as it is (tests/test_checkpoint_integrity.py has the checksums)
    config = load_config(["--job.config_file", DEMO, "--job.dump_folder", str(tmp_path), "--checkpoint.no-verify"])
    with pytest.raises(ConfigError, match="checkpoint.folder: .* is from another model"):
        ParallaxTrainer(config)
    ok = load_config(["--job.config_file", DEMO, "--job.dump_folder", str(tmp_path), "--model.name", "transformer",
                      "--checkpoint.no-verify"])
    assert checkpoint_problems(ok) == []


def test_command_line_reports_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(open(DEMO).read().replace('flavor = "debug"', 'flavor = "debug"\nflavr = "x"'))
    result = subprocess.run(
        [sys.executable, "train.py", "--job.config_file", str(bad)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "model.flavr: unknown key" in result.stderr


def test_entry_point_sets_allocator_and_tokenizer_defaults_the_user_can_override():
    code = "import os, train; print(os.environ['PYTORCH_CUDA_ALLOC_CONF'], os.environ['TOKENIZERS_PARALLELISM'])"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "TOKENIZERS_PARALLELISM")}
    run = lambda extra: subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, **extra},  # noqa: E731
                                       capture_output=True, text=True, check=True).stdout.split()
    assert run({}) == ["expandable_segments:True", "false"]
    assert run({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})[0] == "max_split_size_mb:64"


def test_fla_hopper_blocker_stops_the_run_before_the_model_is_built(monkeypatch):
    import parallax_titan.mixers as mixers

    monkeypatch.setattr(mixers, "fla_missing", lambda name: None)
    monkeypatch.setattr(mixers, "fla_hopper_blocker",
                        lambda name: f"model.name = {name!r} cannot train on this GPU" if name == "gated_deltanet" else None)
    with pytest.raises(ConfigError, match="model.name = 'gated_deltanet' cannot train on this GPU"):
        load_config(["--job.config_file", DEMO, "--model.name", "gated_deltanet"])
