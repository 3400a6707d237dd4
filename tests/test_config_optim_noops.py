"""[optimizer] / [lr_scheduler] values that were accepted and then did nothing, or something else: a
``muon_head_dim`` that is not the model's, WDA without a decay stage (or without decay), a category
given twice in ``lr_multipliers``, keys of another optimizer name, and an S_p coefficient that no
category receives. Each is refused by key (and value) before the model is built."""

from __future__ import annotations

import os

import pytest

from parallax_titan.config import ConfigError, LRScheduler, Optimizer, load_config
from parallax_titan.config.optim import parse_multipliers, titan_decay_steps
from parallax_titan.optim_builder import build_lr_schedulers, build_optimizers
from parallax_titan.spec import register_all
from tests._optim_models import TinyParallax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")  # parallax debug: head_dim 32; 200 steps, decay_ratio 0.2
register_all()


def refused(*overrides: str) -> str:
    """The ConfigError message of the demo config with ``overrides``."""
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", DEMO, *overrides], check_data=False)
    return str(info.value)


CASES = [
    # blocks of 16 rows: every head of 32 split in two, the row-divisibility check passed
    (["--optimizer.muon_headwise", "HHF", "--optimizer.muon_head_dim", "16"],
     "optimizer.muon_head_dim: 16 is not the model's head_dim 32 (per-head updates would orthogonalise blocks "
     "of 16 rows, not heads); expected 0 (the model's) or 32"),
    # WDA runs over the lr decay stage only: none, so the decay never annealed
    (["--lr_scheduler.wd_anneal_gamma", "1", "--lr_scheduler.decay_ratio", "0"],
     "lr_scheduler.wd_anneal_gamma: 1.0 anneals the decay over the lr decay stage, which has 0 of 200 steps "
     "(lr_scheduler.warmup_steps = 0, lr_scheduler.decay_ratio = 0.0)"),
    # a warmup longer than the run is the one problem named (not also WDA's missing decay stage)
    (["--lr_scheduler.wd_anneal_gamma", "2", "--lr_scheduler.warmup_steps", "500"],
     "lr_scheduler.warmup_steps: 500 warmup steps do not fit the schedule's 200 steps (training.steps); expected "
     "at most 200 (TorchTitan would cut the warmup to 200)"),
    (["--lr_scheduler.wd_anneal_gamma", "2", "--lr_scheduler.decay_ratio", "0.001"],  # round(0.2) = 0 steps
     "which has 0 of 200 steps"),
    (["--lr_scheduler.wd_anneal_gamma", "0.5", "--optimizer.weight_decay", "0"],
     "lr_scheduler.wd_anneal_gamma: 0.5 anneals the weight decay, but optimizer.weight_decay, spectral_coeff_attn "
     "and spectral_coeff_mlp are all 0"),
    # a dict kept the last value
    (["--optimizer.lr_multipliers", "embed=0.3,embed=0.5"],
     "optimizer.lr_multipliers: category 'embed' given twice ('embed=0.3' and 'embed=0.5'); expected each "
     "category once"),
    # keys of another name: plain Muon / AdamW / SOAP trained, the key ignored
    (["--optimizer.normuon_beta2", "0.9"],
     "optimizer.normuon_beta2: 0.9 is read with name = 'NorMuon' only, not with name = 'Muon'; expected the "
     "default 0.95 or no key"),
    (["--optimizer.name", "AdamW", "--optimizer.muon_momentum", "0.9"],
     "optimizer.muon_momentum: 0.9 is read with name = 'Muon' or 'NorMuon' or 'Aurora' only, not with name = "
     "'AdamW'"),
    (["--optimizer.name", "SOAP", "--optimizer.muon_update_scale", "spectral"],
     "optimizer.muon_update_scale: 'spectral' is read with name = 'Muon' or 'NorMuon' or 'Aurora' only"),
    (["--optimizer.name", "Aurora", "--optimizer.soap_precondition_frequency", "5"],
     "optimizer.soap_precondition_frequency: 5 is read with name = 'SOAP' only, not with name = 'Aurora'"),
    (["--optimizer.name", "AdamW", "--optimizer.muon_headwise", "HHF"],
     "optimizer.muon_headwise: expected only F letters with name = 'AdamW'"),
    # Q and K left to Adam: their H letters were dropped, the projections trained with Adam whole
    (["--optimizer.muon_headwise", "HHF", "--optimizer.muon_categories", "attn_v,attn_o,mlp,other"],
     "optimizer.muon_headwise: 'HHF' asks for per-head updates of ['attn_q', 'attn_k', 'attn_r'], which go to "
     "Adam (muon_categories = ['attn_v', 'attn_o', 'mlp', 'other']); expected F for them, or them in "
     "muon_categories"),
    # S_p settings no S_p term reads: plain weight decay trained, the key ignored
    (["--optimizer.spectral_power_attn", "2"],
     "optimizer.spectral_power_attn: 2 is read with spectral_coeff_attn > 0 only, and spectral_coeff_attn = 0; "
     "expected spectral_coeff_attn > 0, or the default 1"),
    (["--optimizer.spectral_power_mlp", "0", "--optimizer.spectral_coeff_attn", "1e-3"],
     "optimizer.spectral_power_mlp: 0 is read with spectral_coeff_mlp > 0 only"),
    (["--optimizer.spectral_band", "top", "--optimizer.spectral_band_tau", "0.5"],
     "optimizer.spectral_band: 'top' selects the band of the S_p term, and spectral_coeff_attn = "
     "spectral_coeff_mlp = 0"),
    (["--optimizer.spectral_band_tau", "0.5", "--optimizer.spectral_coeff_attn", "1e-3"],
     "optimizer.spectral_band_tau: 0.5 is read with a spectral_band only, and spectral_band = 'none'"),
    (["--optimizer.msign_steps", "10"],
     "optimizer.msign_steps: 10 is read with a spectral_band only"),
    # the MLP coefficient with spectral_categories naming attention only
    (["--optimizer.spectral_categories", "attn_v", "--optimizer.spectral_coeff_mlp", "1e-4"],
     "optimizer.spectral_coeff_mlp: 0.0001 reaches no parameter: spectral_categories = ['attn_v'] has none of "
     "['mlp']"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_no_op_value_is_refused_by_key(overrides, message):
    assert message in refused(*overrides)


@pytest.mark.parametrize("name", ["Muon", "NorMuon", "Aurora", "SOAP"])
def test_a_matrix_optimizer_without_muon_categories_is_refused(name, tmp_path):
    """``muon_categories = []`` (only a TOML file can give an empty list) sent every parameter to the
    Adam group: an AdamW run under the name of a matrix optimizer, whose keys it never read."""
    config = tmp_path / "no_matrices.toml"
    text = open(DEMO).read().replace('name = "Muon"', f'name = "{name}"')
    config.write_text(text.replace('orthogonalizer = "polar_express"\n',
                                   'orthogonalizer = "polar_express"\nmuon_categories = []\n'))
    with pytest.raises(ConfigError) as info:
        load_config(["--job.config_file", str(config)], check_data=False)
    assert (f"optimizer.muon_categories: expected at least one category with name = {name!r} (empty: every "
            f"parameter goes to the Adam group, so {name} would update nothing; name = 'AdamW' trains with Adam "
            "alone), got []") in str(info.value)


def test_a_warmup_longer_than_the_run_is_not_also_a_missing_decay_stage():
    assert "wd_anneal_gamma" not in refused("--lr_scheduler.wd_anneal_gamma", "2", "--lr_scheduler.warmup_steps", "500")


@pytest.mark.parametrize("overrides", [
    ["--optimizer.muon_headwise", "HHF", "--optimizer.muon_head_dim", "32"],
    ["--optimizer.muon_headwise", "HHF"],
    ["--lr_scheduler.wd_anneal_gamma", "1"],
    ["--lr_scheduler.wd_anneal_gamma", "1", "--lr_scheduler.warmup_steps", "100", "--lr_scheduler.decay_ratio", "0.5"],
    ["--lr_scheduler.decay_ratio", "0"],  # WDA off: a schedule without decay is fine
    ["--optimizer.lr_multipliers", "embed=0.3,norm=0.015"],
    ["--optimizer.name", "NorMuon", "--optimizer.normuon_beta2", "0.9"],
    ["--optimizer.name", "AdamW", "--optimizer.muon_headwise", "FFFF"],
    ["--optimizer.muon_headwise", "FHF", "--optimizer.muon_categories", "attn_k,mlp,other"],
    ["--optimizer.spectral_categories", "attn_v,mlp", "--optimizer.spectral_coeff_mlp", "1e-4"],
    ["--optimizer.spectral_categories", "attn_v", "--optimizer.spectral_coeff_attn", "7e-5"],
    ["--optimizer.spectral_power_attn", "2", "--optimizer.spectral_coeff_attn", "1e-3"],
    ["--optimizer.spectral_band", "top", "--optimizer.spectral_band_tau", "0.5", "--optimizer.msign_steps", "10",
     "--optimizer.spectral_coeff_mlp", "1e-3"],
])
def test_sound_values_next_to_the_refused_ones_pass(overrides):
    load_config(["--job.config_file", DEMO, *overrides], check_data=False)


def test_parse_multipliers_refuses_a_category_given_twice():
    with pytest.raises(ValueError, match=r"category 'embed' given twice \('embed=0.3' and ' embed = 0.5'\)"):
        parse_multipliers(["embed=0.3", "norm=0.015", " embed = 0.5"])


@pytest.mark.parametrize("total,warmup,ratio,expected", [
    (200, 0, 0.2, 40), (200, 0, 0.0, 0), (200, 200, None, 0), (200, 160, 0.2, 40), (200, 10, None, 190),
    (200, 0, 0.001, 0), (200, 0, 1.0, 200),
])
def test_decay_steps_are_torchtitans(total, warmup, ratio, expected):
    """The config check's count agrees with the schedule TorchTitan builds (read back by the builder)."""
    assert titan_decay_steps(total, warmup, ratio) == expected
    opt = build_optimizers([TinyParallax()], Optimizer(), None)
    sched = build_lr_schedulers(opt, LRScheduler(warmup_steps=warmup, decay_ratio=ratio), total)
    assert sched.phases.decay_steps == expected
    assert sched.phases.warmup_steps == warmup


@pytest.mark.parametrize("steps,overrides,message", [
    (100, ["--lr_scheduler.warmup_steps", "101"],
     r"lr_scheduler.warmup_steps: 101 warmup steps do not fit the schedule's 100 steps \(training.steps\); "
     r"expected at most 100 \(TorchTitan would cut the warmup to 100\)"),
    (100, ["--lr_scheduler.warmup_steps", "90", "--lr_scheduler.decay_ratio", "0.2"],
     r"lr_scheduler.decay_ratio: 0.2 of 100 steps \(training.steps\) is a 20-step decay, which with "
     r"lr_scheduler.warmup_steps = 90 exceeds the 100 steps; expected warmup_steps \+ round\(100 \* decay_ratio\) "
     r"<= 100 \(TorchTitan would cut the decay to 10 steps\)"),
    (100, ["--lr_scheduler.total_steps", "120", "--lr_scheduler.warmup_steps", "100", "--lr_scheduler.decay_ratio",
           "0.5"], r"lr_scheduler.decay_ratio: 0.5 of 120 steps \(lr_scheduler.total_steps\) is a 60-step decay"),
])
def test_stages_that_do_not_fit_the_run_are_refused(steps, overrides, message):
    """TorchTitan shortens them with a log warning: the run's lr would not follow its config."""
    with pytest.raises(ValueError, match=message):
        load_config(["--job.config_file", DEMO, "--training.steps", str(steps), *overrides], check_data=False)


@pytest.mark.parametrize("total,warmup,ratio", [(200, 500, 0.2), (200, 201, None), (200, 190, 0.2)])
def test_builder_refuses_stages_that_do_not_fit(total, warmup, ratio):
    opt = build_optimizers([TinyParallax()], Optimizer(), None)
    with pytest.raises(ValueError, match=r"lr_scheduler\.(warmup_steps|decay_ratio): .* \(TorchTitan would cut"):
        build_lr_schedulers(opt, LRScheduler(warmup_steps=warmup, decay_ratio=ratio), total)


def test_builders_refuse_what_validation_refuses():
    """Callers that build without ``load_config`` (scripts, tests) get the same refusals."""
    with pytest.raises(ValueError, match="optimizer.muon_head_dim: 2 is not the model's head_dim 4"):
        build_optimizers([TinyParallax()], Optimizer(name="Muon", muon_headwise="HHF", muon_head_dim=2), None)
    opt = build_optimizers([TinyParallax()], Optimizer(name="Muon", muon_headwise="HHF", muon_head_dim=4), None)
    with pytest.raises(ValueError, match=r"lr_scheduler.wd_anneal_gamma: 1.0 anneals over the lr decay stage, "
                                         r"which has 0 of 50 steps .*decay_ratio = 0.0"):
        build_lr_schedulers(opt, LRScheduler(warmup_steps=0, decay_ratio=0.0, wd_anneal_gamma=1.0), 50)
