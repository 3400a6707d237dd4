"""TOML wiring of the Muon family (``[optimizer] name`` NorMuon, Aurora, SOAP and their options) and
of the family mixers' checks: every key reaches the optimizer's groups, bad values are refused by key,
exact LLA's cost bound names the sizes, and a 1-rank training run of each trains."""

from __future__ import annotations

import importlib.util
import math
import os
import tomllib
import typing

import pytest
import torch

from optimizers.directions import GRAM_MODES, ORTHO_KERNELS
from parallax_titan.config import ConfigError, JobConfig, Optimizer, load_config
from parallax_titan.config.schema import toml_problems
from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.optim_builder import build_optimizers
from parallax_titan.spec import model_args_for, register_all
from tests._train_runs import losses, train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")
register_all()

# Non-default values of each algorithm's keys (defaults: optimizers/muon.py GROUP_DEFAULTS), the
# algorithm name the hidden matrices must get, and the group keys they must arrive as.
CASES = {
    "Muon": ("muon", {"ortho_gram": "off", "ortho_kernel": "torch", "muon_compile_momentum": False},
             {"ortho_gram": "off", "ortho_kernel": "torch", "compile_momentum": False}),
    "NorMuon": ("normuon", {"normuon_beta2": 0.9, "normuon_eps": 1e-6}, {"normuon_beta2": 0.9, "normuon_eps": 1e-6}),
    "Aurora": ("aurora", {"aurora_iterations": 3, "aurora_beta": 0.75, "aurora_eps": 1e-6},
               {"aurora_iterations": 3, "aurora_beta": 0.75, "aurora_eps": 1e-6}),
    "SOAP": ("soap", {"soap_beta1": 0.9, "soap_beta2": 0.99, "soap_shampoo_beta": 0.9, "soap_eps": 1e-7,
                      "soap_precondition_frequency": 5},
             {"soap_beta1": 0.9, "soap_beta2": 0.99, "soap_shampoo_beta": 0.9, "soap_eps": 1e-7,
              "soap_precondition_frequency": 5}),
}
HIDDEN = ("attn_q", "attn_k", "attn_v", "attn_o", "attn_r", "mlp")


def toml_text(data: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", CASES)
def test_toml_keys_reach_the_optimizer_groups(name, tmp_path):
    algo, keys, group_values = CASES[name]
    with open(DEMO, "rb") as f:
        data = tomllib.load(f)
    data["optimizer"] = {**data["optimizer"], "name": name, **keys}
    data["model"]["n_layers"] = 1
    path = tmp_path / "job.toml"
    path.write_text(toml_text(data))
    config = load_config(["--job.config_file", str(path)], check_data=False)
    torch.manual_seed(0)
    model = ParallaxQwen3Model(model_args_for(config))
    (optimizer,) = build_optimizers([model], config.optimizer, parallel_dims=None).optimizers
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert set(HIDDEN) <= set(groups)
    for category in HIDDEN:
        group = groups[category]
        assert group["algo"] == algo, category
        assert {k: group[k] for k in group_values} == group_values, category
    assert {g["algo"] for c, g in groups.items() if c not in HIDDEN} == {"adamw"}  # embeddings, norms


def test_gram_choices_are_the_orthogonalisers():
    assert typing.get_args(typing.get_type_hints(Optimizer)["ortho_gram"]) == tuple(GRAM_MODES)
    assert typing.get_args(typing.get_type_hints(Optimizer)["ortho_kernel"]) == tuple(ORTHO_KERNELS)


# (key, bad value, expected text): every new [optimizer] key is checked with its name and value
BAD_VALUES = [
    ("normuon_beta2", 1.0, "optimizer.normuon_beta2: expected a float in [0, 1), got 1.0"),
    ("normuon_eps", 0.0, "optimizer.normuon_eps: expected a float > 0, got 0.0"),
    ("aurora_iterations", 0, "optimizer.aurora_iterations: expected an int >= 1, got 0"),
    ("aurora_beta", 1.5, "optimizer.aurora_beta: expected a float in (0, 1], got 1.5"),
    ("aurora_beta", 0.0, "optimizer.aurora_beta: expected a float in (0, 1], got 0.0"),
    ("aurora_eps", -1e-7, "optimizer.aurora_eps: expected a float > 0, got -1e-07"),
    ("soap_beta1", -0.1, "optimizer.soap_beta1: expected a float in [0, 1), got -0.1"),
    ("soap_beta2", 1.0, "optimizer.soap_beta2: expected a float in [0, 1), got 1.0"),
    ("soap_shampoo_beta", math.nan, "optimizer.soap_shampoo_beta: expected a float in [0, 1), got nan"),
    ("soap_eps", 0.0, "optimizer.soap_eps: expected a float > 0, got 0.0"),
    ("soap_precondition_frequency", 0, "optimizer.soap_precondition_frequency: expected an int >= 1, got 0"),
    ("ortho_gram", "maybe", "optimizer.ortho_gram: expected one of 'off', 'on', got 'maybe'"),
    ("ortho_kernel", "triton", "optimizer.ortho_kernel: expected one of 'auto', 'torch', got 'triton'"),
    ("muon_compile_momentum", "yes", "optimizer.muon_compile_momentum: expected bool, got 'yes'"),
    ("name", "Shampoo", "optimizer.name: expected one of ('Muon', 'NorMuon', 'Aurora', 'SOAP', 'AdamW'), "
                        "got 'Shampoo'"),
]


@pytest.mark.parametrize("key,value,message", BAD_VALUES, ids=[f"{k}={v}" for k, v, _ in BAD_VALUES])
def test_bad_optimizer_values_are_refused_by_key(key, value, message):
    config = load_config(["--job.config_file", DEMO], check_data=False)
    setattr(config.optimizer, key, value)
    assert message in config.validate(check_data=False)


def test_toml_types_of_the_new_keys_are_checked():
    data = {"optimizer": {"aurora_iterations": 2.5, "muon_compile_momentum": 1, "ortho_gram": "never"}}
    problems = toml_problems(data, JobConfig)
    assert "optimizer.aurora_iterations: expected int, got 2.5 (float)" in problems
    assert "optimizer.muon_compile_momentum: expected bool, got 1 (int)" in problems
    assert any(p.startswith("optimizer.ortho_gram: expected one of 'off', 'on'") for p in problems)


def test_soap_refuses_head_wise_updates():
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", DEMO, "--optimizer.name", "SOAP", "--optimizer.muon_headwise", "HHF"],
                    check_data=False)
    assert "optimizer.muon_headwise: expected only F letters with name = 'SOAP'" in str(info.value)
    load_config(["--job.config_file", DEMO, "--optimizer.name", "Aurora", "--optimizer.muon_headwise", "HHF"],
                check_data=False)


NO_FLA = importlib.util.find_spec("fla") is None


@pytest.mark.parametrize("variant", ["exact_lla", "value_averaging", "affine_la", "affine_mesanet",
                                     pytest.param("mamba2", marks=pytest.mark.skipif(NO_FLA, reason="needs fla"))])
def test_block_causal_needs_a_mixer_that_takes_documents(variant):
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", DEMO, "--model.name", variant, "--parallax.attn_mask_type", "block_causal"],
                    check_data=False)
    assert "parallax.attn_mask_type: 'block_causal' needs a mixer that takes packed documents" in str(info.value)
    assert f"model.name '{variant}' supports 'causal' only" in str(info.value)


def test_exact_lla_cost_names_the_sizes_and_the_limit():
    """debug flavor: Hq 8, D 32. B 16, L 512: 16 * 8 * 512 * (512 * 1024 + 32768) = 3.65e10 (under
    2^37 = 1.37e11); B 64 at L 1024: 64 * 8 * 1024 * (1024 * 1024 + 32768) = 5.67e11 (over)."""
    base = ["--job.config_file", DEMO, "--model.name", "exact_lla"]
    load_config([*base, "--training.local_batch_size", "16", "--training.seq_len", "512"], check_data=False)
    with pytest.raises(ConfigError) as info:
        load_config([*base, "--training.local_batch_size", "64", "--training.seq_len", "1024"], check_data=False)
    text = str(info.value)
    assert "model.name: 'exact_lla' costs B*Hq*L*(L*D^2 + D^3) = 5.67e+11 multiply-adds" in text
    assert "training.local_batch_size B = 64, training.seq_len L = 1024, Hq = 8, D = 32" in text
    assert "above the limit 1.37e+11" in text and "MAD and small models" in text
    small = [*base, "--training.local_batch_size", "1", "--training.seq_len", "1024"]
    # the evaluation's shape counts too, at the end or during training, and so does the diagnostics pass's
    for extra, shape in ((["--eval.at_end", "--eval.batch_size", "64"],
                          "for evaluation (eval.batch_size B = 64, eval.max_length L = 1024"),
                         (["--eval.every_n_steps", "100", "--eval.batch_size", "64"],
                          "for evaluation (eval.batch_size B = 64, eval.max_length L = 1024"),
                         (["--diagnostics.enable", "--diagnostics.batch_size", "64", "--diagnostics.freq", "100"],
                          "for diagnostics (diagnostics.batch_size B = 64, diagnostics.seq_len L = 1024")):
        with pytest.raises(ConfigError) as info:
            load_config([*small, *extra], check_data=False)
        assert shape in str(info.value)


# One run per optimizer, each with a family mixer: the trainer builds, parallelises and steps them.
RUNS = [("Muon", "exact_lla"), ("NorMuon", "value_averaging"), ("Aurora", "affine_la"), ("SOAP", "affine_mesanet")]


@pytest.mark.slow
@pytest.mark.parametrize("name,variant", RUNS)
def test_one_rank_training_runs_two_finite_steps(tmp_path, name, variant):
    train(tmp_path, "--training.dataset", "default_corpus", "--training.steps", "2", "--checkpoint.no-enable",
          "--optimizer.name", name, "--optimizer.lr", "5e-3", "--model.name", variant)
    steps = losses(tmp_path)
    assert sorted(steps) == [1, 2] and all(math.isfinite(v) for v in steps.values()), steps


def test_the_gram_side_needs_float32_orthogonalisation():
    """ortho_gram = "on" with a bf16 (or "auto", bf16 on GPUs) orthogonaliser is refused by key before
    the run; with float32 it is accepted."""
    config = load_config(["--job.config_file", DEMO], check_data=False)
    config.optimizer.ortho_gram = "on"
    for dtype in ("auto", "bfloat16"):
        config.optimizer.ortho_dtype = dtype
        assert any(p.startswith("optimizer.ortho_dtype: expected 'float32' with ortho_gram = 'on'") and
                   repr(dtype) in p for p in config.validate(check_data=False))
    config.optimizer.ortho_dtype = "float32"
    assert not any("ortho_dtype" in p for p in config.validate(check_data=False))
