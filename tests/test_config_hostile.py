"""Hostile configs: each was accepted and then ignored, or failed only after the model was built or
training ran, or crashed with a raw traceback; now :func:`load_config` refuses it by key."""

from __future__ import annotations

import os

import pytest

from parallax_titan.config import ConfigError, load_config
from parallax_titan.spec import register_all

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")
register_all()


def refused(*overrides: str, config: str = DEMO, flag: str = "--job.config_file") -> str:
    """The ConfigError message of the demo config (or ``config``) with ``overrides``."""
    with pytest.raises(ConfigError) as info:
        load_config([flag, config, *overrides], check_data=False)
    return str(info.value)


def test_config_file_named_with_a_hyphen_is_checked(tmp_path):
    """TorchTitan reads ``--job.config-file`` too: its keys used to reach TorchTitan's loader
    unchecked (a raw ValueError for an unknown key)."""
    bad = tmp_path / "bad.toml"
    bad.write_text(open(DEMO).read().replace('flavor = "debug"', 'flavor = "debug"\nflavr = "x"'))
    assert "model.flavr: unknown key" in refused(config=str(bad), flag="--job.config-file")
    with pytest.raises(ConfigError, match="model.flavr: unknown key"):
        load_config([f"--job.config-file={bad}"], check_data=False)


def test_unreadable_config_file_is_named(tmp_path):
    """A folder and a file that is not UTF-8 used to raise IsADirectoryError / UnicodeDecodeError."""
    assert "job.config_file: " + repr(str(tmp_path)) + " cannot be read" in refused(config=str(tmp_path))
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'[job]\ndescription = "\xff\xfe"\n')
    assert f"job.config_file: {str(binary)!r} is not valid TOML" in refused(config=str(binary))


# overrides of the demo config, and the text the refusal must contain
CASES = [
    # TorchTitan's assert inside the parser: a raw AssertionError that named no key
    (["--validation.steps", "0"],
     "validation.steps: expected a positive integer or -1 (the whole validation set), got 0"),
    (["--validation.steps", "-3"], "validation.steps: expected a positive integer or -1"),
    # validation rows longer than the RoPE table failed at the first validation, after training steps
    (["--validation.seq_len", "512"], "validation.seq_len: expected at most training.seq_len = 256"),
    (["--validation.seq_len", "0"], "validation.seq_len: expected a positive integer, got 0"),
    # probe switches on a model without a probe were dropped without a word
    (["--model.name", "transformer", "--parallax.gate", "head"],
     "parallax.gate: 'head' configures the probe rho of Parallax attention, but model.name 'transformer' has none"),
    (["--model.name", "transformer", "--parallax.probe_init", "zero"], "parallax.probe_init: 'zero' configures"),
    (["--model.name", "value_averaging", "--parallax.no-rho_rope"], "parallax.rho_rope: False configures"),
    # a misspelled category named no parameter: the norms were decayed after all
    (["--optimizer.no_decay_categories", "norms"],
     "optimizer.no_decay_categories: category 'norms' is produced by no param_rules rule"),
    (["--optimizer.lr_multipliers", "embd=0.3"], "optimizer.lr_multipliers: category 'embd' is produced by no"),
    # failed only when the final evaluation started, after training
    (["--eval.device", "gpu"],
     "eval.device: expected empty (CUDA when available), 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    (["--eval.at_end", "--checkpoint.last_save_model_only", "--checkpoint.last_save_in_hf"],
     "checkpoint.last_save_in_hf: true writes the final step as Hugging Face safetensors, which eval.at_end"),
    # the held-out batch was read after the model was built (a raw ValueError)
    (["--diagnostics.dataset", "nosuch"], "diagnostics.dataset = 'nosuch' is not a known dataset"),
    (["--validation.dataset", "pretokenized", "--validation.dataset_path", "/tmp"],
     "(taken from validation.dataset; set diagnostics.dataset to a text dataset"),
    # TorchTitan asserted these when the trainer built its device mesh (a raw AssertionError)
    (["--parallelism.data_parallel_replicate_degree", "0"],
     "parallelism.data_parallel_replicate_degree: expected a positive integer, got 0"),
    (["--parallelism.data_parallel_shard_degree", "0"],
     "parallelism.data_parallel_shard_degree: expected -1 (the ranks left) or a positive integer, got 0"),
    # stopped "with a checkpoint saved" that was never written
    (["--reliability.stop_at_step", "5", "--checkpoint.no-enable"],
     "reliability.stop_at_step: 5 saves a checkpoint to resume from, which needs checkpoint.enable = true"),
    # a stop after the last step never came: the run ended without the interruption it was meant to test
    (["--reliability.stop_at_step", "201"],
     "reliability.stop_at_step: expected at most training.steps = 200 (the run ends there, so the stop would never "
     "come), got 201"),
    # periodic passes past the last step were switched on and never ran
    (["--diagnostics.freq", "300"],
     "diagnostics.freq: expected at most training.steps = 200 (the pass runs after every freq-th step, so it "
     "would never run), got 300"),
    (["--diagnostics.spectral_freq", "400"], "diagnostics.spectral_freq: expected at most training.steps = 200"),
    (["--eval.every_n_steps", "250", "--eval.data_dir", "/tmp"],
     "eval.every_n_steps: expected at most training.steps = 200 (the pass runs after every every_n_steps-th step"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_hostile_value_is_refused_before_the_build(overrides, message):
    assert message in refused(*overrides)


@pytest.mark.parametrize("overrides", [
    ["--validation.steps", "-1"],
    ["--validation.seq_len", "128"],
    ["--validation.no-enable", "--validation.seq_len", "4096"],  # not used: not checked
    ["--model.name", "transformer", "--parallax.attn_backend", "reference"],  # applies to every mixer
    ["--eval.device", "cuda:1"],
    ["--eval.device", "cpu"],
    ["--optimizer.no_decay_categories", "norm,bias,other"],
    ["--diagnostics.dataset", "default_corpus"],
    ["--reliability.stop_at_step", "5"],
    ["--reliability.stop_at_step", "200"],  # the last step: stops there with its checkpoint, as the run would end
    ["--diagnostics.freq", "200"],  # runs once, after the last step
    ["--diagnostics.no-enable", "--diagnostics.freq", "1000"],  # off: its period is not used
    ["--diagnostics.no-spectral", "--diagnostics.spectral_freq", "400"],
])
def test_sound_values_next_to_the_refused_ones_pass(overrides):
    load_config(["--job.config_file", DEMO, *overrides], check_data=False)


def test_wrong_types_set_in_code_are_named():
    """A value set in code skips the TOML and command-line type checks; [diagnostics] and [model]
    compared it with a number and crashed with a TypeError instead of naming it."""
    config = load_config(["--job.config_file", DEMO], check_data=False)
    config.diagnostics.freq = "5"
    config.model.n_layers = "4"
    config.validation.seq_len = "256"
    problems = config.validate(check_data=False)
    assert "diagnostics.freq: expected int, got '5'" in problems
    assert "model.n_layers: expected int, got '4'" in problems
    assert "validation.seq_len: expected int, got '256'" in problems
