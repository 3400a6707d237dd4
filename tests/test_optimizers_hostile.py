"""Hostile inputs: misspelled categories and group options are refused when the optimizer is built,
with an error that names the key, the value and what was expected (they used to be ignored
silently, or to fail at the first step with an error from deep inside the step)."""

import math
import re

import pytest
import torch
import torch.nn as nn

from optimizers import DEFAULT_PARAM_RULES, MuonAdamW, RoutingConfig, build_param_groups
from tests._optim_models import TinyParallax


@pytest.mark.parametrize("field,value,match", [
    ("lr_multipliers", {"embeds": 0.3}, r"lr_multipliers: category 'embeds' is produced by no param_rules rule"),
    ("no_decay_categories", ("norms",), r"no_decay_categories: category 'norms' is produced by no param_rules rule"),
    ("muon_categories", ("attn_Q", "mlp"), r"muon_categories: category 'attn_Q' is produced by no param_rules rule"),
    ("spectral_categories", ("attn_V",), r"spectral_categories: category 'attn_V' is produced by no param_rules"),
    ("spectral_categories", ("attn_v", "other"), r"spectral_categories: category 'other' has no S_p power"),
    ("spectral", {"attention": (2, 1e-3)}, r"spectral: module 'attention'; expected 'attn' or 'mlp'"),
])
def test_misspelled_category_is_refused(field, value, match):
    """A category no rule produces (a typo: 'norms', 'attn_V') used to be ignored: the norms were
    decayed, V got no S_p term, the embedding trained at the full lr, all without a word."""
    with pytest.raises(ValueError, match=match):
        build_param_groups(TinyParallax(), RoutingConfig(**{field: value}))


@pytest.mark.parametrize("cfg,match", [
    (RoutingConfig(headwise="HHF", muon_categories=("attn_k", "mlp", "other")),
     r"muon_headwise: 'HHF' asks for per-head updates of \['attn_q', 'attn_r'\], which go to Adam "
     r"\(muon_categories = \['attn_k', 'mlp', 'other'\]\); expected F for them, or them in muon_categories"),
    (RoutingConfig(headwise="FFH", use_muon=False),
     r"per-head updates of \['attn_v'\], which go to Adam \(use_muon is off\)"),
])
def test_headwise_letter_of_an_adam_category_is_refused(cfg, match):
    """An H for a projection that muon_categories leaves to Adam used to be dropped without a word:
    the projection trained with Adam, neither per head nor orthogonalised."""
    with pytest.raises(ValueError, match=match):
        build_param_groups(TinyParallax(), cfg)
    groups = build_param_groups(TinyParallax(), RoutingConfig(headwise="FHF", muon_categories=("attn_k", "mlp"),
                                                              head_dim=4))
    assert {g["name"]: g.get("head_dim", 0) for g in groups}["attn_k"] == 4  # an H of a Muon category is kept


def test_categories_of_custom_and_default_rules_are_accepted():
    """A category of a custom rule is known; so are the default rules' categories when the custom
    rules no longer produce them (the default muon_categories / spectral_categories name them)."""
    rules = ["ffn=feed_forward\\.", *DEFAULT_PARAM_RULES]
    groups = {g["name"]: g for g in build_param_groups(
        TinyParallax(), RoutingConfig(rules=rules, lr=1.0, lr_multipliers={"ffn": 0.5, "embed": 0.3},
                                      muon_categories=("ffn", "other"), no_decay_categories=("ffn",)))}
    assert groups["ffn"]["lr"] == 0.5 and groups["ffn"]["algo"] == "muon" and groups["ffn"]["weight_decay"] == 0.0
    build_param_groups(TinyParallax(), RoutingConfig(rules=["mlp=feed_forward\\."]))


def _param(rows=8, cols=6):
    p = nn.Parameter(torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)))
    p.grad = torch.ones_like(p)
    return p


@pytest.mark.parametrize("algo", ["muon", "adamw"])
@pytest.mark.parametrize("option,value,expected", [
    ("decay_coupling", "independant", "one of ('lr', 'independent')"),
    ("momentum", 1.0, "a float in [0, 1)"),
    ("momentum", math.nan, "a float in [0, 1)"),
    ("nesterov", "no", "a bool"),
    ("betas", (0.9, 1.0), "two floats in [0, 1)"),
    ("eps", 0.0, "a finite float > 0"),
    ("lr", math.inf, "a finite float >= 0"),
    ("weight_decay", math.inf, "a finite float >= 0"),
    ("orthogonalizer", "newton", "one of ['newton_schulz', 'polar_express']"),
    ("ortho_steps", -1, "an int >= 0"),
    ("ortho_dtype", "fp16", "one of ['auto', 'bfloat16', 'float32']"),
    ("update_scale", "rms", "one of ('match_rms_adamw', 'spectral', 'none')"),
    ("sp_power", -1, "an int >= 0"),
    ("sp_power", 2.0, "an int >= 0"),
    ("sp_band", "top_onyl", "one of ('none', 'top', 'bottom', 'top_only', 'bottom_only')"),
    ("msign_steps", 0, "an int >= 1"),
    ("head_dim", -4, "an int >= 0"),
])
def test_bad_group_option_is_named_at_construction(algo, option, value, expected):
    """Each bad value used to be accepted (a misspelled decay_coupling silently meant
    'independent', momentum 1 never forgets, nesterov='no' ran Nesterov) or to fail inside the
    first step with an error that did not name the option."""
    opts = {"sp_coeff": 0.1, "sp_power": 2} if option.startswith("sp_") or option == "msign_steps" else {}
    if option in ("sp_band", "msign_steps"):
        opts.update(sp_band="top", sp_band_tau=1.0)
    with pytest.raises(ValueError, match=re.escape(f"group 'g' {option}={value!r}; expected {expected}")):
        MuonAdamW([{"params": [_param()], "name": "g", "algo": algo, **opts, option: value}])


@pytest.mark.parametrize("algo,key", [("adamw", "eps"), ("normuon", "normuon_eps"), ("aurora", "aurora_eps"),
                                      ("soap", "soap_eps")])
def test_infinite_eps_is_refused(algo, key):
    """An infinite eps used to pass the check (inf > 0): the denominators became inf, every update
    zero, and the group trained nothing without a word (Aurora's row norms floored at inf)."""
    with pytest.raises(ValueError, match=re.escape(f"group 'g' {key}=inf; expected a finite float > 0")):
        MuonAdamW([{"params": [_param()], "name": "g", "algo": algo, key: math.inf}])


@pytest.mark.parametrize("opts,factor,sound", [
    ({"decay_coupling": "independent", "weight_decay": 1.0}, "0", {"lr": 0.01, "weight_decay": 1.0}),
    ({"decay_coupling": "independent", "weight_decay": 0.5, "sp_coeff": 1.5}, "-1",  # p = 1: ordinary decay
     {"decay_coupling": "independent", "weight_decay": 0.5, "sp_coeff": 1.5, "sp_power": 2}),
    ({"lr": 2.0, "weight_decay": 0.75}, "-0.5", {"lr": 2.0, "weight_decay": 0.25}),
])
def test_decay_that_zeroes_or_flips_the_weights_is_refused(opts, factor, sound):
    """A decay scale times the ordinary coefficient of 1 or more used to be accepted: each step
    multiplied the weights by 1 - shrink <= 0 (zeroed, or sign-flipped and growing) without a NaN."""
    with pytest.raises(ValueError, match=re.escape(f"group 'g' weight_decay={opts['weight_decay']!r}; expected "
                                                   "weight_decay") + ".*" + re.escape(f"by {factor})")):
        MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon", **opts}])
    MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon", **sound}])


def test_band_needs_a_positive_tau():
    with pytest.raises(ValueError, match=r"group 'g' sp_band_tau=0.0; expected a finite float > 0 with sp_band='top'"):
        MuonAdamW([{"params": [_param()], "name": "g", "sp_power": 2, "sp_coeff": 0.1, "sp_band": "top"}])


def test_head_dim_must_divide_the_rows_of_a_headwise_group():
    """head_dim 5 on 8 rows used to fail in the first step with a reshape error."""
    with pytest.raises(ValueError, match=r"group 'g' head_dim=5; expected a divisor of the rows of every "
                                         r"parameter \(rows \[8\]\)"):
        MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon", "head_dim": 5}])
    MuonAdamW([{"params": [_param()], "name": "g", "algo": "adamw", "head_dim": 5}])  # AdamW has no heads


def test_unknown_group_key_is_refused():
    """A misspelled key in a group dict (torch keeps unknown keys) used to be ignored."""
    with pytest.raises(ValueError, match=r"group 'g' has unknown options \['momentun'\]; expected keys of "
                                         r"GROUP_DEFAULTS"):
        MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon", "momentun": 0.9}])
    with pytest.raises(ValueError, match=r"unknown options \['weight_decy'\]"):
        MuonAdamW(build_param_groups(TinyParallax(), RoutingConfig(adam={"weight_decy": 0.1})))
