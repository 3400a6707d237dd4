"""Resume rules: a changed setting is applied from the resume step (and logged) or refused by name.

In-process tests check the rules and the re-application after a load against closed forms; the
training runs check the whole path through ``train.py`` against TorchTitan's WSD schedule written
out by hand (warmup 0, ``decay_ratio`` 0.5): lr(step s) = lr x f(s - 1), f(k) = 1 for
k < stable, else 1 - (k + 1 - stable) / decay, with decay = round(steps / 2) and
stable = steps + 1 - decay."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from parallax_titan.config import load_config
from parallax_titan.optim_builder import build_lr_schedulers, build_optimizers
from parallax_titan.resume import checkpoint_problems
from parallax_titan.resume_rules import (
    Change, applied, configured_hyperparameters, differences, read_settings, reapply, refusals, run_settings,
    write_settings)
from parallax_titan.spec import register_all
from tests._optim_models import TinyParallax
from tests._train_runs import TEST_CONFIG, metric_rows, run_single, train

register_all()
ARGS = ["--training.dataset", "default_corpus", "--training.steps", "6", "--checkpoint.interval", "100",
        "--optimizer.name", "Muon", "--lr_scheduler.decay_ratio", "0.5", "--optimizer.weight_decay", "0.1"]
LR = 3e-3  # the test config's


def wsd(step: int, steps: int) -> float:
    """The lr multiplier of training step ``step`` (1-based) in a ``steps``-step run, by hand."""
    decay = round(steps * 0.5)
    stable, k = steps + 1 - decay, step - 1
    return 1.0 if k < stable else 1.0 - (k + 1 - stable) / decay


def test_wsd_by_hand_matches_the_builder():
    """The hand-written schedule above is TorchTitan's (so the run checks below test the resume)."""
    cfg = load_config(["--job.config_file", TEST_CONFIG, *ARGS], check_data=False)
    opt = build_optimizers([TinyParallax()], cfg.optimizer, None)
    sched = build_lr_schedulers(opt, cfg.lr_scheduler, 6)
    for step in range(1, 7):
        assert sched.schedulers[0].get_last_lr()[0] == pytest.approx(LR * wsd(step, 6), rel=1e-12)
        sched.step()


# ---- the rules on their own ------------------------------------------------------------------

def test_differences_applied_and_refused():
    saved = {"optimizer.lr": 0.01, "training.seq_len": 32, "training.steps": 6, "optimizer.betas": [0.9, 0.95]}
    current = {"optimizer.lr": 0.05, "training.seq_len": 64, "training.steps": 6, "optimizer.new_key": 1}
    changes = differences(saved, current)
    assert changes == [Change("optimizer.lr", 0.01, 0.05), Change("training.seq_len", 32, 64)]
    assert applied(changes, 6, current) == ["optimizer.lr: 0.01 -> 0.05 from step 7"]
    (refused,) = refusals(changes, "ck/step-6", 6, current)
    assert refused.startswith("training.seq_len: the checkpoint 'ck/step-6' was trained with 32 and this run sets 64; "
                              "refused on resume because")
    assert refusals([], "ck/step-6", 6, {"training.steps": 5}) == [
        "training.steps: 5 is below the step of the checkpoint 'ck/step-6' (6); set it to at least 6"]
    assert refusals([], "ck/step-6", 6, {"training.steps": 6}) == []  # rerunning a finished run is fine


def test_a_key_recorded_under_its_earlier_name_is_compared_as_the_key_now(tmp_path):
    """A checkpoint from before ``[parallax] hopper_backward`` became ``hopper_kernels``: its value is
    compared with this run's ``hopper_kernels``, so a change is logged."""
    write_settings(str(tmp_path), 6, {"parallax.hopper_backward": False, "optimizer.lr": 0.01})
    saved = read_settings(str(tmp_path))
    assert saved == {"parallax.hopper_kernels": False, "optimizer.lr": 0.01}
    current = {"parallax.hopper_kernels": True, "optimizer.lr": 0.01}
    assert applied(differences(saved, current), 6, current) == ["parallax.hopper_kernels: False -> True from step 7"]


def test_recorded_global_batch_is_the_effective_one():
    cfg = load_config(["--job.config_file", TEST_CONFIG, *ARGS], check_data=False)
    assert run_settings(cfg, 1)["training.global_batch_size"] == 2  # local batch 2 x 1 rank
    assert run_settings(cfg, 4)["training.global_batch_size"] == 8
    json.dumps(run_settings(cfg, 1))  # what settings.json holds


def test_model_arguments_are_recorded_and_a_change_is_logged_on_resume():
    """RoPE theta, the norms' eps and weight tying (fixed by the flavor, no config key) change the
    function without changing a shape: recorded, so that a resume under other values says so."""
    cfg = load_config(["--job.config_file", TEST_CONFIG, *ARGS], check_data=False)
    current = run_settings(cfg, 1)
    assert {k: v for k, v in current.items() if k.startswith("model.")} == {
        "model.rope_theta": 1000000, "model.norm_eps": 1e-6, "model.enable_weight_tying": True}
    changes = differences({**current, "model.rope_theta": 10000}, current)
    assert refusals(changes, "ck/step-6", 6, current) == []
    assert applied(changes, 6, current) == ["model.rope_theta: 10000 -> 1000000 from step 7"]


def _trained(cfg, steps_done: int, schedule_steps: int):
    """Optimizer and schedule of a TinyParallax trained ``steps_done`` steps (with real gradients)."""
    torch.manual_seed(0)
    model = TinyParallax()
    opt = build_optimizers([model], cfg.optimizer, None)
    sched = build_lr_schedulers(opt, cfg.lr_scheduler, schedule_steps)
    for _ in range(steps_done):
        model(torch.randint(0, 32, (2, 8))).square().mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


def _resumed(saved_cfg, new_cfg, steps: int):
    """A fresh optimizer and schedule built from ``new_cfg``, loaded with the state of 4 steps
    under ``saved_cfg``, then :func:`reapply`'d (what the trainer does after a load)."""
    _, opt, sched = _trained(saved_cfg, 4, 6)
    model, fresh_opt, fresh_sched = _trained(new_cfg, 0, steps)
    configured = configured_hyperparameters(fresh_opt)
    fresh_opt.load_state_dict(opt.state_dict())
    fresh_sched.load_state_dict(sched.state_dict())
    before = [dict(g) for g in fresh_opt.optimizers[0].param_groups]
    reapply(fresh_opt, fresh_sched, configured)
    return opt, sched, fresh_opt, fresh_sched, before


def test_reapply_puts_the_new_values_in_force_at_the_loaded_step():
    base = load_config(["--job.config_file", TEST_CONFIG, *ARGS], check_data=False)
    new = load_config(["--job.config_file", TEST_CONFIG, *ARGS, "--optimizer.lr", "6e-3", "--optimizer.weight_decay",
                       "0.02", "--optimizer.spectral_power_mlp", "2", "--optimizer.spectral_coeff_mlp", "0.3",
                       "--lr_scheduler.wd_anneal_gamma", "2", "--training.steps", "8"], check_data=False)
    _, _, opt, sched, before = _resumed(base, new, 8)
    assert before[0]["lr"] == pytest.approx(LR * wsd(5, 6))  # the load brought back the old values
    groups = opt.optimizers[0].param_groups
    for group in groups:
        assert group["lr"] == pytest.approx(6e-3 * wsd(5, 8), rel=1e-12)  # step 5 of an 8-step schedule
        assert group["weight_decay"] == 0.02
        assert group["wd_mult"] == pytest.approx((1 - 0) ** 2)  # 8 steps: step 5 is before the decay stage
    mlp = [g for g in groups if g["name"] == "mlp"]
    assert mlp and all(g["sp_power"] == 2 and g["sp_coeff"] == 0.3 for g in mlp)
    assert sched.schedulers[0].get_last_lr()[0] == pytest.approx(6e-3 * wsd(5, 8), rel=1e-12)
    assert sched.schedulers[0].last_epoch == 4


def test_reapply_changes_nothing_when_nothing_changed():
    base = load_config(["--job.config_file", TEST_CONFIG, *ARGS], check_data=False)
    saved_opt, saved_sched, opt, sched, before = _resumed(base, base, 6)
    assert [dict(g) for g in opt.optimizers[0].param_groups] == before  # bit-identical lrs, decays, multipliers
    assert sched.schedulers[0].get_last_lr() == saved_sched.schedulers[0].get_last_lr()


# ---- through train.py ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A Muon run of 6 steps stopped after step 3."""
    dump = tmp_path_factory.mktemp("stopped")
    train(dump, *ARGS, "--reliability.stop_at_step", "3")
    return dump


@pytest.fixture
def dump(stopped, tmp_path):
    shutil.copytree(stopped, tmp_path / "run")
    return tmp_path / "run"


def rows_after(dump, step: int, key: str) -> dict[int, float]:
    """``key`` of every metrics.jsonl row after ``step`` (the resumed run's)."""
    return {r["step"]: r[key] for r in metric_rows(dump) if r["step"] > step and key in r}


def test_changed_optimizer_and_decay_settings_apply_from_the_resume_step(dump):
    result = train(dump, *ARGS, "--optimizer.lr", "6e-3", "--optimizer.weight_decay", "0.05",
                   "--optimizer.spectral_power_attn", "2", "--optimizer.spectral_coeff_attn", "0.05",
                   "--lr_scheduler.wd_anneal_gamma", "2", "--parallax.window", "8")
    log = result.stdout + result.stderr
    for line in ("optimizer.lr: 0.003 -> 0.006 from step 4", "optimizer.weight_decay: 0.1 -> 0.05 from step 4",
                 "optimizer.spectral_power_attn: 1 -> 2 from step 4",
                 "optimizer.spectral_coeff_attn: 0.0 -> 0.05 from step 4",
                 "lr_scheduler.wd_anneal_gamma: 0.0 -> 2.0 from step 4", "parallax.window: 0 -> 8 from step 4"):
        assert line in log, line
    lrs = rows_after(dump, 3, "lr")  # the lr each step trained with
    assert lrs == pytest.approx({s: 6e-3 * wsd(s, 6) for s in (4, 5, 6)}, rel=1e-12)
    # after step s the schedule sits at step s: WDA (1 - t)^2 with t = (s + 1 - 4) / 3 in the decay stage
    mult = rows_after(dump, 3, "optim/wd_mult")
    assert mult == pytest.approx({4: (2 / 3) ** 2, 5: (1 / 3) ** 2, 6: 0.0}, abs=1e-12)
    # per step: ordinary decay lr x wd_mult x 0.05 (MLP), S_p decay lr x wd_mult x 0.05 (attention)
    for s in (4, 5):
        row = {k: v for r in metric_rows(dump) if r["step"] == s for k, v in r.items()}
        assert row["optim/wd/mlp"] == pytest.approx(row["optim/lr/mlp"] * mult[s] * 0.05, rel=1e-12)
        assert row["optim/sp_decay_p2/attn_q"] == pytest.approx(row["optim/lr/attn_q"] * mult[s] * 0.05, rel=1e-12)
        assert row["optim/wd/attn_q"] == pytest.approx(row["optim/lr/attn_q"] * mult[s] * 0.05, rel=1e-12)


def test_more_steps_extend_the_schedule(dump):
    result = train(dump, *ARGS, "--training.steps", "8")
    assert "training.steps: 6 -> 8 from step 4" in result.stdout + result.stderr
    assert rows_after(dump, 3, "lr") == pytest.approx({s: LR * wsd(s, 8) for s in range(4, 9)}, rel=1e-12)


# (overrides, the start of the refusal)
REFUSED = [
    (["--training.seq_len", "64"], "training.seq_len: the checkpoint '{ck}' was trained with 32 and this run sets 64"),
    (["--optimizer.name", "AdamW"], "optimizer.name: the checkpoint '{ck}' was trained with 'Muon' and this run sets "
                                    "'AdamW'"),
    (["--optimizer.muon_categories", "mlp"], "optimizer.muon_categories: the checkpoint '{ck}' was trained with"),
    (["--training.global_batch_size", "4"], "training.global_batch_size: the checkpoint '{ck}' was trained with 2 "
                                            "and this run sets 4"),
    (["--training.local_batch_size", "1"], "training.local_batch_size: the checkpoint '{ck}' was trained with 2"),
    (["--training.steps", "2"], "training.steps: 2 is below the step of the checkpoint '{ck}' (3)"),
]


@pytest.mark.parametrize("overrides,message", REFUSED)
def test_refused_changes_name_the_key_before_the_build(dump, overrides, message):
    cfg = load_config(["--job.config_file", TEST_CONFIG, "--job.dump_folder", str(dump), *ARGS, *overrides])
    problems = checkpoint_problems(cfg)
    assert any(p.startswith(message.format(ck=dump / "checkpoint" / "step-3")) for p in problems), problems


def test_local_batch_may_change_where_the_data_position_is_global():
    """A global data position (pre-tokenized shards, global text order) does not depend on the local
    batch: it may change with the number of ranks while the global batch stays; a sharded one may not."""
    change = [Change("training.local_batch_size", 4, 2)]
    assert refusals(change, "ck/step-6", 6, {"data.global_position": True}) == []
    assert applied(change, 6, {"data.global_position": True}) == ["training.local_batch_size: 4 -> 2 from step 7"]
    (refused,) = refusals(change, "ck/step-6", 6, {"data.global_position": False})
    assert refused.startswith("training.local_batch_size: the checkpoint 'ck/step-6' was trained with 4")
    assert applied(change, 6, {"data.global_position": False}) == []


def test_unchanged_settings_are_accepted(dump):
    cfg = load_config(["--job.config_file", TEST_CONFIG, "--job.dump_folder", str(dump), *ARGS])
    assert checkpoint_problems(cfg) == []


def test_optimizer_change_exits_2_without_a_low_level_error(dump):
    result = run_single(dump, *ARGS, "--optimizer.name", "AdamW")
    assert result.returncode == 2
    assert "optimizer.name: the checkpoint" in result.stderr and "Missing key" not in result.stderr


def _mixers_without_fla():
    from parallax_titan import mixers

    return ["softmax", "parallax", *mixers.FAMILY_MIXERS]


@pytest.mark.parametrize("mixer", _mixers_without_fla())
def test_rope_mixers_are_the_mixers_whose_output_rope_theta_changes(mixer):
    """ROPE_MIXERS is kept by hand: a tiny model of each mixer, same weights, rope_theta 10000 and 500.
    The outputs differ exactly for the mixers the list names (a new mixer that rotates must be added,
    or a changed rope_theta between checkpoint and evaluation would go unnoticed)."""
    from parallax_titan.model import ParallaxModelArgs, ParallaxQwen3Model
    from parallax_titan.config.job import ROPE_MIXERS

    tokens = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    outputs = []
    for theta in (10000.0, 500.0):
        args = ParallaxModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=64,
                                 hidden_dim=128, max_seq_len=16, mixer=mixer, rope_theta=theta)
        torch.manual_seed(0)
        model = ParallaxQwen3Model(args)
        with torch.no_grad():
            model.init_weights()
            outputs.append(model(tokens))
    assert (not torch.equal(*outputs)) == (mixer in ROPE_MIXERS)
