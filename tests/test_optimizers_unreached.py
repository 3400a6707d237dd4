"""Options that were accepted and then reached nothing: ``muon_categories`` under ``name = "AdamW"``
(every group is Adam, so the list routes no parameter), an ``lr_multipliers`` category that holds no
parameter of the model (``head`` on a model whose output projection is tied to the embedding), and
an S_p coefficient whose ``spectral_categories`` hold no matrix of the model (``attn_r`` on a model
without W_R). Each would train as if the option were not set, so each is refused by key."""

from __future__ import annotations

import os

import pytest

from optimizers import RoutingConfig, check_reached
from parallax_titan.config import ConfigError, Optimizer, load_config
from parallax_titan.optim_builder import build_optimizers
from parallax_titan.spec import register_all
from tests._optim_models import TinyParallax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "configs", "demo_cpu.toml")
register_all()


def without_probe() -> TinyParallax:
    """TinyParallax without W_R (a softmax model's attention: no ``attn_r`` parameter)."""
    model = TinyParallax()
    for layer in model.layers.values():
        layer.attention.wr = None
    return model


def test_muon_categories_under_adamw_are_refused():
    with pytest.raises(ConfigError, match=r"optimizer\.muon_categories: \['mlp'\] is read with name = 'Muon' or "
                                          r"'NorMuon' or 'Aurora' or 'SOAP' only, not with name = 'AdamW'"):
        load_config(["--job.config_file", DEMO, "--optimizer.name", "AdamW", "--optimizer.muon_categories", "mlp"],
                    check_data=False)


@pytest.mark.parametrize("name", ["Muon", "SOAP"])
def test_muon_categories_of_the_muon_family_pass(name):
    config = load_config(["--job.config_file", DEMO, "--optimizer.name", name, "--optimizer.muon_categories", "mlp"],
                         check_data=False)
    assert config.optimizer.muon_categories == ["mlp"]


def test_muon_categories_that_hold_no_matrix_are_refused():
    """["norm"] routes only vectors to the matrix optimizer's categories: every parameter went to AdamW."""
    with pytest.raises(ValueError, match=r"muon_categories: \['norm'\] hold no matrix of the model, so the matrix "
                                         r"optimizer would update nothing and every parameter would go to AdamW; "
                                         r"expected some of the model's matrix categories \['attn_k', .*'mlp'"):
        build_optimizers([TinyParallax()], Optimizer(name="Muon", muon_categories=["norm"]), None)
    (opt,) = build_optimizers([TinyParallax()], Optimizer(name="Muon", muon_categories=["norm", "mlp"]),
                              None).optimizers
    assert {g["name"]: g["algo"] for g in opt.param_groups}["mlp"] == "muon"


def test_lr_multiplier_of_a_tied_head_is_refused():
    """The tied output.weight is the embedding's Parameter, routed once as 'embed': 'head=2' changed no lr."""
    with pytest.raises(ValueError, match=r"lr_multipliers: category 'head' holds no trainable parameter of the "
                                         r"model .*expected one of \['attn_k', .*'embed', .*'norm'"):
        build_optimizers([TinyParallax()], Optimizer(lr_multipliers=["embed=0.3", "head=2"]), None)


def test_lr_multiplier_of_an_untied_head_reaches_it():
    (opt,) = build_optimizers([TinyParallax(tied=False)], Optimizer(lr_multipliers=["head=2"]), None).optimizers
    assert {g["name"]: g["lr"] for g in opt.param_groups}["head"] == pytest.approx(2 * Optimizer().lr)


def test_sp_coefficient_that_reaches_no_matrix_is_refused():
    config = Optimizer(spectral_categories=["attn_r"], spectral_power_attn=2, spectral_coeff_attn=1e-3)
    with pytest.raises(ValueError, match=r"spectral_coeff_attn: 0.001 reaches no matrix of the model: "
                                         r"spectral_categories \['attn_r'\] hold none"):
        build_optimizers([without_probe()], config, None)
    (opt,) = build_optimizers([TinyParallax()], config, None).optimizers  # W_R there: its group gets S_2
    assert {g["name"]: (g["sp_power"], g["sp_coeff"]) for g in opt.param_groups}["attn_r"] == (2, 1e-3)


def test_reach_is_checked_over_all_model_parts():
    """A category one part lacks is reached through another (the parts make one model)."""
    cfg = RoutingConfig(lr_multipliers={"attn_r": 0.5})
    check_reached([without_probe(), TinyParallax()], cfg)
    with pytest.raises(ValueError, match="lr_multipliers: category 'attn_r'"):
        check_reached([without_probe(), without_probe()], cfg)

