"""Hostile configs: each was accepted and then ignored, or failed only after the model was built or
training ran, or crashed with a raw traceback; now :func:`load_config` refuses it by key."""

from __future__ import annotations

import os

import pytest
import torch

from parallax_titan.config import ConfigError, Training, load_config
from parallax_titan.data import check_dataset_config
from parallax_titan.generation import SamplingParams
from parallax_titan.spec import register_all

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")
CORPUS = os.path.join(REPO, "parallax_titan", "assets", "corpus", "validation.jsonl.gz")  # as local files
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


OP_SAC = ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"]
PRETOKENIZED = ["--training.dataset", "pretokenized", "--training.dataset_path", "/tmp"]
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
    # kernel switches on a model whose mixer never reads them were dropped without a word
    (["--model.name", "transformer", "--parallax.attn_backend", "reference"],
     "parallax.attn_backend: 'reference' configures the kernels of Parallax attention and Affine Linear Attention, "
     "but model.name 'transformer' has none (it would be ignored); use model.name parallax, parallax_dagger or "
     "affine_la, or keep the default 'auto'"),
    (["--model.name", "exact_lla", "--parallax.attn_backend", "triton"], "parallax.attn_backend: 'triton' configures"),
    (["--model.name", "transformer_dagger", "--parallax.no-fused_norm_rope"],
     "parallax.fused_norm_rope: False configures the norm and RoPE kernels of Parallax attention's input projection, "
     "but model.name 'transformer_dagger' has none (it would be ignored); use model.name parallax or parallax_dagger, "
     "or keep the default True"),
    (["--model.name", "affine_la", "--parallax.no-fused_norm_rope"], "parallax.fused_norm_rope: False configures"),
    (["--model.name", "affine_la", "--parallax.no-hopper_kernels"],
     "parallax.hopper_kernels: False configures the sm_90 Gluon kernels of Parallax attention, but model.name "
     "'affine_la' has none (it would be ignored)"),
    (["--model.name", "value_averaging", "--parallax.no-hopper_kernels"], "parallax.hopper_kernels: False configures"),
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
    # TorchTitan keys accepted and then ignored, or failing only once the trainer ran (a raw traceback)
    (["--training.gc_freq", "0"], "training.gc_freq: expected a positive integer, got 0"),
    (["--lr_scheduler.total_steps", "100"],
     "lr_scheduler.total_steps: expected unset or at least training.steps = 200"),
    (["--parallelism.expert_parallel_degree", "2"],
     "parallelism.expert_parallel_degree: expected 1 (Parallax-Titan's models have no experts), got 2"),
    (["--optimizer.implementation", "foreach"],
     "optimizer.implementation: expected 'fused' (MuonAdamW's Adam group always runs torch's fused AdamW kernel; "
     "TorchTitan's 'for-loop' and 'foreach' would be ignored), got 'foreach'"),
    (["--parallelism.enable_async_tensor_parallel"],
     "parallelism.enable_async_tensor_parallel: set to True, but tensor_parallel_degree = 1 (Parallax-Titan trains "
     "with data parallelism only), so it would be ignored; expected False"),
    (["--parallelism.pipeline_parallel_schedule", "GPipe"],
     "parallelism.pipeline_parallel_schedule: set to 'GPipe', but pipeline_parallel_degree = 1"),
    (["--parallelism.context_parallel_rotate_method", "alltoall"],
     "parallelism.context_parallel_rotate_method: set to 'alltoall', but context_parallel_degree = 1"),
    (["--parallelism.expert_parallel_comm_backend", "deepep"],
     "parallelism.expert_parallel_comm_backend: set to 'deepep', but expert_parallel_degree = 1"),
    (["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "every2"],
     "activation_checkpoint.selective_ac_option: expected 'op' or a positive integer (checkpoint every N-th block), "
     "got 'every2'"),
    (OP_SAC + ["--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "attention.wqkv"],
     "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns: 'attention.wqkv' is part of no module name "
     "'layers.<i>.<module>' (it would be ignored); a block's Linear modules are attention.wk, attention.wo, "
     "attention.wq, attention.wr, attention.wv, feed_forward.w1"),
    (OP_SAC + ["--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "layers.9.feed_forward.w1"],
     "'layers.9.feed_forward.w1' is part of no module name"),  # the demo model has 4 layers
    (OP_SAC + ["--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "feed_forward"],
     "'feed_forward' matches 'layers.0.feed_forward', which is not a Linear (TorchTitan raises when it applies AC)"),
    (OP_SAC + ["--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "attention.wr"],
     "'attention.wr' names only modules of the fused input projection (attention.wk, attention.wq, attention.wr, "
     "attention.wv: one matmul of their concatenated weights"),
    (["--activation_checkpoint.mode", "memory_budget"],
     "activation_checkpoint.mode: 'memory_budget' needs compile.enable = true with 'model' in compile.components"),
    (["--activation_checkpoint.mode", "full", "--activation_checkpoint.determinism_check", "off"],
     "activation_checkpoint.determinism_check: expected one of 'default', 'none', got 'off'"),
    # every 8-th of the demo model's 4 blocks: TorchTitan wrapped none, the run trained without AC
    (["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "8"],
     "activation_checkpoint.selective_ac_option: '8' checkpoints every 8-th block, but the model has 4 blocks "
     "(model.n_layers), so no block would be checkpointed; expected at most 4, or activation_checkpoint.mode = "
     "'none'"),
    # RoPE rotates pairs of channels: an odd head_dim failed a raw assert at the first forward, after the build
    (["--model.head_dim", "7"],
     "model.head_dim: 7 is odd, but model.name 'parallax' applies RoPE to its heads, which rotates pairs of "
     "channels (the first forward would fail); expected an even head_dim"),
    (["--model.name", "transformer", "--model.head_dim", "33"], "model.head_dim: 33 is odd, but model.name "
     "'transformer' applies RoPE"),
    (["--model.name", "exact_lla", "--model.head_dim", "7"], "model.head_dim: 7 is odd, but model.name 'exact_lla'"),
    (["--compile.enable", "--compile.components", "modle"],
     "compile.components: expected entries from 'model', 'loss', got ['modle']"),
    (["--compile.enable", "--compile.backend", "indcutor"],
     "compile.backend: 'indcutor' is not a torch.compile backend"),
    (["--checkpoint.exclude_from_loading", "optimiser"],
     "checkpoint.exclude_from_loading: expected entries from 'model', 'optimizer', 'lr_scheduler', 'dataloader', "
     "'train_state', got ['optimiser']"),
    (["--checkpoint.load_step", "-5"], "checkpoint.load_step: expected -1 (the newest step) or a step >= 0, got -5"),
    (["--checkpoint.no-enable", "--checkpoint.create_seed_checkpoint"],
     "checkpoint.create_seed_checkpoint: true writes nothing with checkpoint.enable = false"),
    (["--checkpoint.no-enable", "--checkpoint.initial_load_path", "/tmp"],
     "checkpoint.initial_load_path: set to '/tmp', but checkpoint.enable = false loads nothing"),
    (["--checkpoint.initial_load_in_hf", "--checkpoint.no-initial_load_model_only"],
     "checkpoint.initial_load_in_hf: true needs checkpoint.initial_load_model_only = true"),
    (["--eval.at_end", "--checkpoint.load_only"],
     "eval.at_end: true scores the final checkpoint, which checkpoint.load_only = true never writes"),
    (["--validation.dataloader.num_workers", "4"], "validation.dataloader.num_workers: expected 0"),
    (["--comm.train_timeout_seconds", "0"], "comm.train_timeout_seconds: expected a positive integer, got 0"),
    (["--comm.mode", "local_tensor"],
     "comm.mode: expected 'default' (train.py trains with real collectives; TorchTitan's dry-run modes"),
    (["--profiling.enable_profiling", "--profiling.profile_freq", "2"],
     "profiling.profile_freq: expected at least profiling.profiler_warmup + profiling.profiler_active = 3 + 1, got 2"),
    (["--memory_estimation.enable"], "memory_estimation.enable: true is never read by train.py"),
    (["--fault_tolerance.enable"], "fault_tolerance.enable: true is never read by Parallax-Titan's trainer"),
    (["--debug.moe_force_load_balance"], "debug.moe_force_load_balance: true applies to MoE layers"),
    (["--debug.seed", "-1"],
     "debug.seed: expected an integer in [0, 2**64) or unset (torch's own random seed), got -1"),
    (["--debug.seed", str(2**64)],
     f"debug.seed: expected an integer in [0, 2**64) or unset (torch's own random seed), got {2**64}"),
    (["--model.converters", "quantize.grouped_mm.float8"],
     "model.converters: 'quantize.grouped_mm.float8' converts MoE expert layers"),
    (["--checkpoint.export_dtype", "bfloat16", "--checkpoint.no-last_save_model_only"],
     "checkpoint.export_dtype: 'bfloat16' applies to the model-only last save"),
    (["--quantize.linear.float8.emulate"],
     "quantize.linear.float8.emulate: set to True, but 'quantize.linear.float8' is not in model.converters (it would "
     "be ignored)"),
    (["--job.save_config_file", ""], "job.save_config_file: expected unset or a file name, got ''"),
    (["--job.save_config_file", "configs/"], "job.save_config_file: expected unset or a file name, got 'configs/'"),
    (["--experimental.custom_import", "no.such.module"],
     "experimental.custom_import: 'no.such.module' cannot be imported here"),
    (["--job.custom_config_module", "no_such_module"],
     "job.custom_config_module: 'no_such_module' is not supported"),
    # keys nothing on train.py's path reads: accepted, then ignored
    (["--memory_estimation.disable_fake_mode"],
     "memory_estimation.disable_fake_mode: true is never read by train.py (TorchTitan's separate estimation script "
     "reads it); expected false"),
    (["--fault_tolerance.replica_id", "2"],
     "fault_tolerance.replica_id: 2 is never read by Parallax-Titan's trainer (TorchTitan's TorchFT manager reads it, "
     "which the trainer never builds), so it would be ignored; expected 0"),
    (["--fault_tolerance.semi_sync_method", "diloco"],
     "fault_tolerance.semi_sync_method: 'diloco' is never read by Parallax-Titan's trainer"),
    (["--checkpoint.no-enable_ft_dataloader_checkpoints"],
     "checkpoint.enable_ft_dataloader_checkpoints: False is never read by Parallax-Titan's trainer"),
    # keys read only under another key's setting, set while it is off
    (["--debug.deterministic_warn_only"],
     "debug.deterministic_warn_only: true is read with debug.deterministic = true only, and debug.deterministic = "
     "false (it would be ignored"),
    (["--lr_scheduler.decay_ratio", "0", "--lr_scheduler.decay_type", "cosine"],
     "lr_scheduler.decay_type: 'cosine' shapes the lr decay stage, which has 0 of 200 steps (lr_scheduler."
     "warmup_steps = 0, lr_scheduler.decay_ratio = 0.0), so no trained step reads it (it would be ignored); "
     "expected the default 'linear'"),
    (["--lr_scheduler.decay_ratio", "0.005", "--lr_scheduler.min_lr_factor", "0.1"],  # round(1.0): 1 step
     "lr_scheduler.min_lr_factor: 0.1 shapes the lr decay stage, which has 1 of 200 steps"),
    (["--checkpoint.no-enable", "--checkpoint.initial_load_in_hf"],
     "checkpoint.initial_load_in_hf: set to True, but checkpoint.enable = false loads nothing (it would be ignored)"),
    (["--checkpoint.no-enable", "--checkpoint.no-initial_load_model_only"],
     "checkpoint.initial_load_model_only: set to False, but checkpoint.enable = false loads nothing"),
    (["--checkpoint.no-enable", "--checkpoint.last_save_model_only", "--checkpoint.last_save_in_hf"],
     "checkpoint.last_save_in_hf: set to True, but checkpoint.enable = false writes no checkpoint (it would be "
     "ignored)"),
    (["--checkpoint.no-enable", "--checkpoint.enable_first_step_checkpoint"],
     "checkpoint.enable_first_step_checkpoint: set to True, but checkpoint.enable = false writes no checkpoint"),
    (["--checkpoint.no-enable", "--checkpoint.last_save_model_only", "--checkpoint.export_dtype", "bfloat16"],
     "checkpoint.export_dtype: set to 'bfloat16', but checkpoint.enable = false writes no checkpoint"),
    (["--metrics.save_for_all_ranks", "--metrics.no-enable_tensorboard", "--diagnostics.no-figures"],
     "metrics.save_for_all_ranks: true writes the TensorBoard and W&B logs of every rank, but "
     "metrics.enable_tensorboard and enable_wandb are false"),
    (["--training.verify_shards", "size"],
     "training.verify_shards: 'size' is read with pre-tokenized data only, and training.dataset = 'default_corpus' "
     "and validation.dataset = 'default_corpus_validation' are text (it would be ignored); expected 'checksum'"),
    # TorchTitan's loader keys beside pre-tokenized data, which its own loader reads in the training process
    (PRETOKENIZED + ["--training.dataloader.num_workers", "2"],
     "training.dataloader.num_workers: expected 0 (load in the training process) or 1 (one background reader), got 2"),
    (PRETOKENIZED + ["--training.dataloader.num_workers", "1", "--training.dataloader.persistent_workers"],
     "training.dataloader.persistent_workers: true keeps worker processes alive between epochs, but "
     "training.dataset = 'pretokenized' (read ahead on a thread) starts none (it would be ignored); expected false"),
    (["--validation.dataset", "pretokenized", "--validation.dataset_path", "/tmp", "--diagnostics.dataset",
      "default_corpus_validation", "--validation.dataloader.num_workers", "1",
      "--validation.dataloader.persistent_workers"],
     "validation.dataloader.persistent_workers: true keeps worker processes alive between epochs, but "
     "validation.dataset = 'pretokenized' (read ahead on a thread)"),
    # the record policy of local files, with no local file read
    (["--training.max_record_bytes", "1024"],
     "training.max_record_bytes: set to 1024, but it is read with dataset = 'local' files only, and this run reads "
     "none (training.dataset = 'default_corpus', validation.dataset = 'default_corpus_validation'), so it would be "
     "ignored; expected the default 67108864"),
    (PRETOKENIZED + ["--reliability.bad_data", "skip"],
     "reliability.bad_data: set to 'skip', but it is read with dataset = 'local' files only, and this run reads none "
     "(training.dataset = 'pretokenized', validation.dataset = 'default_corpus_validation')"),
]


# what a machine without CUDA lacks: refused when training loads the config, not by tools that only
# build the model (evaluation, export, the launcher), which may run elsewhere
MACHINE_CASES = [
    (["--profiling.enable_profiling"], "profiling.enable_profiling: true needs a CUDA device"),
    (["--profiling.enable_memory_snapshot"], "profiling.enable_memory_snapshot: true needs a CUDA device"),
    (["--model.converters", "quantize.linear.mx"],
     "model.converters: 'quantize.linear.mx' needs an sm100+ GPU (MXFP8); this machine has no CUDA"),
    (["--activation_checkpoint.mode", "memory_budget", "--compile.enable"],
     "activation_checkpoint.mode: 'memory_budget' needs torch.compile, which train.py switches off"),
    # an evaluation on the CPU of a run trained with float8 linears refused to load its config
    (["--model.converters", "quantize.linear.float8"],
     "model.converters: 'quantize.linear.float8' on a machine without CUDA needs quantize.linear.float8.emulate"),
]


@pytest.mark.parametrize("world, overrides, message", [
    ("1", ["--parallelism.data_parallel_shard_degree", "2"],
     "parallelism.data_parallel_replicate_degree x data_parallel_shard_degree = 1 x 2: expected a product equal to "
     "the 1 rank this run has (WORLD_SIZE)"),
    ("4", ["--parallelism.data_parallel_replicate_degree", "3"],
     "= 3 x -1: expected a divisor of the 4 ranks this run has (WORLD_SIZE)"),
])
def test_parallel_degrees_against_the_ranks_started(monkeypatch, world, overrides, message):
    """TorchTitan asserted the product when the trainer built its mesh (a raw AssertionError); tools
    that load the config without torchrun (no WORLD_SIZE) do not check it."""
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", DEMO, *overrides, "--training.global_batch_size", "-1"])
    assert message in str(info.value)
    monkeypatch.delenv("WORLD_SIZE")
    load_config(["--job.config_file", DEMO, *overrides, "--training.global_batch_size", "-1"], check_data=False)
    monkeypatch.setenv("WORLD_SIZE", "6")
    load_config(["--job.config_file", DEMO, "--parallelism.data_parallel_replicate_degree", "3",
                 "--training.global_batch_size", "-1"])


def test_cpu_offload_without_sharding_is_refused(monkeypatch):
    """With one shard TorchTitan built the model on the CPU for the offload and nothing moved it."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    offload = ["--job.config_file", DEMO, "--training.enable_cpu_offload", "--training.global_batch_size", "-1"]
    with pytest.raises(ConfigError, match="training.enable_cpu_offload: true offloads FSDP-sharded parameters, but "
                                          r"the shard degree is 1 on 2 ranks"):
        load_config([*offload, "--parallelism.data_parallel_replicate_degree", "2"])
    load_config(offload)  # two shards


@pytest.mark.parametrize("seed", [-1, 2**64, True])
def test_the_64_bit_seeds_of_three_layers_are_checked_alike(seed):
    """``debug.seed`` (config), ``training.data_seed`` (data) and generation's ``seed``: one range check,
    one wording (key, value, [0, 2**64)); the largest seed passes each."""
    config = load_config(["--job.config_file", DEMO], check_data=False)
    config.debug.seed = seed
    assert [p for p in config.validate(check_data=False) if "seed" in p] == [
        f"debug.seed: expected an integer in [0, 2**64) or unset (torch's own random seed), got {seed!r}"]
    with pytest.raises(ValueError) as data:
        check_dataset_config(Training(dataset="pretokenized", data_seed=seed))
    assert str(data.value) == f"training.data_seed: expected an integer in [0, 2**64), got {seed!r}"
    with pytest.raises(ValueError) as sampling:
        SamplingParams(seed=seed)
    assert str(sampling.value) == f"seed: expected an integer in [0, 2**64) or None (a fresh random seed), got {seed!r}"
    config.debug.seed = 2**64 - 1
    assert not [p for p in config.validate(check_data=False) if "seed" in p]
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1


@pytest.mark.parametrize("world, overrides, ranks", [
    ("1", [], "1 rank"),
    ("2", ["--parallelism.data_parallel_replicate_degree", "2"], "2 ranks"),  # DDP across the two replicas
])
def test_fsdp_reshard_without_sharding_is_refused(monkeypatch, world, overrides, ranks):
    """TorchTitan applies FSDP only with a shard degree above 1: on one rank, or with DDP, the reshard
    setting was ignored without a word. The ranks are known at launch only (WORLD_SIZE): tools that
    load the config without torchrun do not check it."""
    never = ["--job.config_file", DEMO, "--parallelism.fsdp_reshard_after_forward", "never",
             "--training.global_batch_size", "-1", *overrides]
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(ConfigError, match=r"parallelism.fsdp_reshard_after_forward: set to 'never', but the shard "
                                          rf"degree is 1 on {ranks} \(FSDP is not applied: nothing is gathered to "
                                          r"reshard\), so it would be ignored; expected the default 'default'"):
        load_config(never)
    load_config([*never[:3], "default", *never[4:]])
    monkeypatch.setenv("WORLD_SIZE", str(2 * int(world)))
    load_config(never)  # two shards
    monkeypatch.delenv("WORLD_SIZE")
    load_config(never, check_data=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the checks of a machine without CUDA")
@pytest.mark.parametrize("overrides,message", MACHINE_CASES, ids=[" ".join(o) for o, _ in MACHINE_CASES])
def test_what_this_machine_lacks_is_refused_when_training_loads_the_config(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", DEMO, *overrides])
    assert message in str(info.value)
    load_config(["--job.config_file", DEMO, *overrides], check_data=False)


@pytest.mark.parametrize("overrides,message", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_hostile_value_is_refused_before_the_build(overrides, message):
    assert message in refused(*overrides)


@pytest.mark.parametrize("overrides", [
    ["--validation.steps", "-1"],
    ["--validation.seq_len", "128"],
    ["--validation.no-enable", "--validation.seq_len", "4096"],  # not used: not checked
    ["--model.name", "parallax_dagger", "--parallax.attn_backend", "reference", "--parallax.no-fused_norm_rope",
     "--parallax.no-hopper_kernels", "--parallax.gate", "head"],
    ["--model.name", "affine_la", "--parallax.attn_backend", "reference"],  # the family kernel's backend
    ["--model.name", "transformer", "--parallax.attn_backend", "auto", "--parallax.fused_norm_rope"],  # defaults
    ["--eval.device", "cuda:1"],
    ["--eval.device", "cpu"],
    ["--optimizer.no_decay_categories", "norm,bias,other"],
    ["--diagnostics.dataset", "default_corpus"],
    ["--reliability.stop_at_step", "5"],
    ["--reliability.stop_at_step", "200"],  # the last step: stops there with its checkpoint, as the run would end
    ["--diagnostics.freq", "200"],  # runs once, after the last step
    ["--diagnostics.no-enable", "--diagnostics.freq", "1000"],  # off: its period is not used
    ["--diagnostics.no-spectral", "--diagnostics.spectral_freq", "400"],
    ["--lr_scheduler.total_steps", "400"],  # a schedule longer than the run: it stops part-way
    ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"],
    ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "2"],
    ["--activation_checkpoint.selective_ac_option", "every2"],  # mode "none": not used
    ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "4"],  # the last block
    ["--activation_checkpoint.selective_ac_option", "8"],  # mode "none": not used
    ["--model.name", "value_averaging", "--model.head_dim", "7"],  # no RoPE: any head_dim
    # TorchTitan's default option (every 2nd block) on one block: no checkpointing asked for
    ["--activation_checkpoint.mode", "selective", "--model.n_layers", "1"],
    ["--model.head_dim", "16"],
    ["--compile.enable", "--compile.components", "loss"],
    ["--metrics.no-enable_tensorboard", "--diagnostics.no-figures"],
    ["--metrics.no-enable_tensorboard", "--diagnostics.no-enable"],
    OP_SAC + ["--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
              "feed_forward.w1,layers.3.attention.wo"],
    OP_SAC + ["--model.name", "transformer", "--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
              "attention.wq"],  # TorchTitan's attention calls its projections one by one
    ["--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "nothing"],  # no op-level AC: not used
    ["--checkpoint.exclude_from_loading", "dataloader,lr_scheduler"],
    ["--checkpoint.load_only"],
    ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate"],
    ["--job.save_config_file", "config.json"],
    ["--experimental.custom_import", "parallax_titan.metrics"],
    ["--debug.deterministic", "--debug.deterministic_warn_only"],
    ["--lr_scheduler.decay_ratio", "0.01", "--lr_scheduler.decay_type", "cosine", "--lr_scheduler.min_lr_factor",
     "0.1"],  # a 2-step decay: the last step trains at its first value
    ["--lr_scheduler.total_steps", "400", "--lr_scheduler.decay_type", "cosine"],  # decay past the run: resumes
    ["--checkpoint.no-enable"],  # what the benchmarks pass: interval, keep_latest_k, last_save_model_only stay
    ["--metrics.save_for_all_ranks"],  # TensorBoard on
    ["--training.verify_shards", "size", "--training.dataset", "pretokenized", "--training.dataset_path", "/tmp"],
    PRETOKENIZED + ["--validation.dataloader.num_workers", "1"],  # text validation data: its loader reads it
    # the paper configs' loader settings: shards are read ahead on a thread, into pinned memory
    PRETOKENIZED + ["--training.dataloader.num_workers", "1", "--training.dataloader.prefetch_factor", "2",
                    "--training.dataloader.pin_memory"],
    ["--validation.no-enable", "--validation.dataset", "pretokenized", "--validation.dataloader.pin_memory"],  # off
    ["--training.dataset", "local", "--training.dataset_path", CORPUS, "--training.max_record_bytes", "1024",
     "--reliability.bad_data", "skip"],
    ["--diagnostics.dataset", "local", "--diagnostics.dataset_path", CORPUS, "--reliability.bad_data", "skip"],
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


def test_every_option_of_another_parallelism_is_checked():
    """Each [parallelism] key is a degree, a data-parallel setting, or an option of a parallelism
    whose degree must stay 1: an option TorchTitan adds would otherwise be ignored unchecked."""
    from dataclasses import fields

    from torchtitan.config.job_config import Parallelism

    from parallax_titan.config.sections import PARALLELISM_OPTIONS

    data_parallel = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward"}
    degrees = {f.name for f in fields(Parallelism) if f.name.endswith("_degree")} - data_parallel
    assert set(PARALLELISM_OPTIONS.values()) <= degrees
    assert {f.name for f in fields(Parallelism)} == data_parallel | degrees | set(PARALLELISM_OPTIONS)


def test_diagnostics_figures_need_tensorboard_when_training_loads_the_config():
    """The demo config runs diagnostics with figures, which the trainer draws into TensorBoard only:
    with TensorBoard off they were dropped without a word. Tools that load the config without
    training (scripts.analyze writes PNG files) are not refused."""
    off = ["--job.config_file", DEMO, "--metrics.no-enable_tensorboard"]
    with pytest.raises(ConfigError, match=r"diagnostics.figures: true draws the depth figures into TensorBoard, but "
                                          r"metrics.enable_tensorboard = false \(they would be dropped\)"):
        load_config(off)
    load_config(off, check_data=False)
    load_config([*off, "--diagnostics.no-figures"])


@pytest.mark.parametrize("second", [["--job.config_file", DEMO], [f"--job.config-file={DEMO}"]])
def test_a_second_config_file_is_refused_by_every_tool(second):
    """TorchTitan read the first file's TOML and recorded the last as job.config_file (train.py, the
    Slurm state command, export and evaluation all load configs through load_config)."""
    with pytest.raises(ConfigError, match=r"job.config_file: given 2 times \('configs/test_cpu_2rank.toml', '.*demo_"
                                          r"cpu.toml'\); expected one"):
        load_config(["--job.config_file", "configs/test_cpu_2rank.toml", *second], check_data=False)
