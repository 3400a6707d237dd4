"""Hostile inputs: misspelled categories, group options and parameters that are not real floats are
refused when the optimizer is built, sparse gradients before a step writes anything, a state_dict
that does not fit before anything is loaded, and bad arguments of the orthogonalisers, spectral
maps and schedules by name: each with an error that names the key, the value and what was
expected (they used to be ignored silently, or to fail at the first step with an error from deep
inside the step)."""

import math
import re

import pytest
import torch
import torch.nn as nn

from optimizers import (DEFAULT_PARAM_RULES, MuonAdamW, RoutingConfig, band_projectors, build_param_groups,
                        check_reached, msign, newton_schulz, polar_express, spectral_power)
from optimizers.schedules import SchedulePhases, wd_anneal_factor
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


@pytest.mark.parametrize("field,value,match", [
    ("use_muon", "no", "use_muon='no'; expected a bool"),
    ("spectral", {"attn": 1e-3}, "spectral['attn']=0.001; expected a (power, coeff) pair"),
    ("spectral", {"mlp": (2, 1e-3, 1)}, "spectral['mlp']=(2, 0.001, 1); expected a (power, coeff) pair"),
    ("lr_multipliers", {"embed": None}, "lr_multipliers['embed']=None; expected a finite number >= 0"),
    ("lr_multipliers", {"embed": "0.3"}, "lr_multipliers['embed']='0.3'; expected a finite number >= 0"),
    ("lr_multipliers", ["embed"], "lr_multipliers=['embed']; expected a dict"),
    ("lr", "0.1", "lr='0.1'; expected a finite number >= 0"),
    ("head_dim", "4", "head_dim='4'; expected an int >= 0"),
    ("muon_categories", "mlp", "muon_categories='mlp'; expected a list of names"),
    ("rules", "mlp=feed_forward", "rules='mlp=feed_forward'; expected a list of names"),
    ("adam", None, "adam=None; expected a dict"),
])
def test_routing_values_of_the_wrong_kind_are_named(field, value, match):
    """use_muon='no' is truthy and sent the matrices to Muon without a word; a bare string of categories
    or rules was read letter by letter ("category 'm' is produced by no rule"); an S_p value that is not
    a (power, coeff) pair, an lr multiplier or lr that is not a number, a string head_dim or a None
    option dict failed with a TypeError naming neither the field nor the value."""
    cfg = RoutingConfig(**{field: value, **({"headwise": "HHF"} if field == "head_dim" else {})})
    with pytest.raises(ValueError, match=re.escape(match)):
        build_param_groups(TinyParallax(), cfg)
    if field in ("spectral", "lr_multipliers"):  # read by check_reached too
        with pytest.raises(ValueError, match=re.escape(match)):
            check_reached([TinyParallax()], cfg)

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
    ("sp_power", 17, "an int from 0 to 16 (sigma^p overflows fp32 above it)"),
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


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64])
@pytest.mark.parametrize("algo", ["muon", "adamw"])
def test_parameters_that_are_not_real_floats_are_refused(algo, dtype):
    """A complex or integer parameter failed inside the first step (the momentum's cast, Adam's fused
    kernel) with an error that named neither the group nor the parameter."""
    p = nn.Parameter(torch.ones(4, 3, dtype=dtype), requires_grad=False)
    with pytest.raises(ValueError, match=rf"group 'g' holds parameters of dtype {dtype}; expected one of "
                                         r"\['torch.float16', 'torch.bfloat16', 'torch.float32', 'torch.float64'\]"):
        MuonAdamW([{"params": [p], "name": "g", "algo": algo}])


@pytest.mark.parametrize("algo", ["muon", "adamw"])
def test_a_parameter_listed_twice_in_a_group_is_refused(algo):
    """torch only warns about it, and each step updated the parameter twice (Adam's step count 2)."""
    p = _param()
    with pytest.raises(ValueError, match="MuonAdamW: group 'g' lists a parameter more than once"):
        MuonAdamW([{"params": [p, _param(), p], "name": "g", "algo": algo}])


def test_a_non_matrix_in_a_muon_group_is_named_by_its_shape():
    with pytest.raises(ValueError, match=r"group 'g' is muon but holds parameters of shapes \[\(2, 3, 4\), \(4,\)\]; "
                                         r"expected 2-D matrices \(route the others to an 'adamw' group\)"):
        MuonAdamW([{"params": [_param(), nn.Parameter(torch.ones(4)), nn.Parameter(torch.ones(2, 3, 4))],
                    "name": "g", "algo": "muon"}])


@pytest.mark.parametrize("extra,match", [
    ({"algo": "muon", "momentum": 1.5}, "MuonAdamW: group 'h' momentum=1.5; expected a float in [0, 1)"),
    ({"algo": "muon", "momentun": 0.9}, "MuonAdamW: group 'h' has unknown options ['momentun']"),
    ({"algo": "muon", "params": [nn.Parameter(torch.ones(2, 3, 4))]},
     "MuonAdamW: group 'h' is muon but holds parameters of shapes [(2, 3, 4)]; expected 2-D matrices"),
    ({"algo": "adamw", "lr": math.nan}, "MuonAdamW: group 'h' lr=nan; expected a finite float >= 0"),
])
def test_add_param_group_checks_the_group_as_the_constructor_does(extra, match):
    """A group added after construction skipped every check: momentum 1.5 and a misspelled key were
    taken, a 3-D parameter in a Muon group got momentum but never an update, all without a word."""
    opt = MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon"}], lr=0.01)
    with pytest.raises(ValueError, match=re.escape(match)):
        opt.add_param_group({"params": [_param()], "name": "h", **extra})
    assert [g["name"] for g in opt.param_groups] == ["g"]  # the refused group is not added


@pytest.mark.parametrize("extra", [{"algo": "soap"}, {"algo": "muon", "decay_coupling": "independent",
                                                      "weight_decay": 0.1}])
def test_an_added_group_steps_like_a_constructed_one(extra):
    """An added SOAP group failed in the first step with KeyError: 'soap_calls', an added group with
    decay_coupling='independent' with KeyError: 'base_lr'."""
    added = MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon"}], lr=0.01)
    added.add_param_group({"params": [_param(8, 4)], "name": "h", **extra})
    built = MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon"},
                       {"params": [_param(8, 4)], "name": "h", **extra}], lr=0.01)
    for opt in (added, built):
        opt.step(), opt.step()
    for a, b in zip(added.param_groups, built.param_groups):
        assert {k: v for k, v in a.items() if k != "params"} == {k: v for k, v in b.items() if k != "params"}
        assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"]))


@pytest.mark.parametrize("algo", ["muon", "adamw"])
def test_sparse_gradients_are_refused_before_any_write(algo):
    """A sparse gradient (nn.Embedding(sparse=True)) failed inside the momentum's add or Adam's fused
    kernel, naming neither the group nor the parameter."""
    dense, sparse = _param(), _param()
    sparse.grad = torch.ones(8, 6).to_sparse()
    before = [dense.detach().clone(), sparse.detach().clone()]
    opt = MuonAdamW([{"params": [dense, sparse], "name": "g", "algo": algo}], lr=0.1)
    with pytest.raises(ValueError, match=r"MuonAdamW.step: group 'g' has sparse gradients for parameters of shapes "
                                         r"\[\(8, 6\)\]; expected dense"):
        opt.step()
    assert torch.equal(dense, before[0]) and torch.equal(sparse, before[1]) and not opt.state


@pytest.mark.parametrize("option,value,expected", [
    ("wd_mult", math.nan, "a finite float >= 0"),
    ("wd_mult", -1.0, "a finite float >= 0"),
    ("base_lr", math.nan, "a finite float >= 0"),
    ("lr", "0.1", "a finite float >= 0"),
    ("momentum", "0.9", "a float in [0, 1)"),
    ("lr", 1 + 2j, "a finite float >= 0"),
])
def test_decay_scales_and_numbers_given_as_strings_are_refused(option, value, expected):
    """A NaN wd_mult or base_lr made the decay factor NaN (every weight NaN at the first step); a string
    lr passed float("0.1") and ran the Adam groups with it, then failed in a Muon step's arithmetic."""
    with pytest.raises(ValueError, match=re.escape(f"group 'g' {option}={value!r}; expected {expected}")):
        MuonAdamW([{"params": [_param()], "name": "g", "algo": "muon", "weight_decay": 0.1, option: value}])


def _stepped(shape=(8, 6), algo="muon", **opts):
    """An optimizer over one parameter of ``shape``, after one step (so it has state)."""
    p = _param(*shape)
    opt = MuonAdamW([{"params": [p], "name": "g", "algo": algo, **opts}], lr=0.01)
    opt.step()
    return opt


def _loads(opt, state_dict):
    """Load ``state_dict`` into ``opt``; the error, and whether opt's state and groups were left as they were."""
    before = (repr(opt.param_groups), {k: v.clone() for s in opt.state.values() for k, v in s.items()})
    with pytest.raises(ValueError) as raised:
        opt.load_state_dict(state_dict)
    after = (repr(opt.param_groups), {k: v for s in opt.state.values() for k, v in s.items()})
    untouched = before[0] == after[0] and all(torch.equal(before[1][k], after[1][k]) for k in before[1])
    return str(raised.value), untouched


@pytest.mark.parametrize("algo,saved_shape,buffer", [("muon", (6, 8), "momentum_buffer"),
                                                      ("adamw", (1, 6), "exp_avg")])
def test_load_state_dict_refuses_buffers_of_another_shape(algo, saved_shape, buffer):
    """torch's load checks counts only: a transposed momentum failed inside the next step, not naming
    the parameter, and Adam moments of shape (1, 6) loaded for an (8, 6) parameter made the fused
    kernel read and write past them (heap corruption, the process aborted)."""
    message, untouched = _loads(_stepped(algo=algo), _stepped(saved_shape, algo=algo).state_dict())
    assert message == (f"MuonAdamW.load_state_dict: group 0 ('g') parameter 0 of shape (8, 6) has {buffer} of shape "
                       f"{saved_shape} in the state_dict; expected the parameter's shape (a state_dict of another "
                       "model, or of parameters in another order?)")
    assert untouched


def test_load_state_dict_refuses_another_algorithm():
    """An AdamW group's state loaded into a Muon group turned the group into AdamW without a word."""
    message, untouched = _loads(_stepped(algo="muon"), _stepped(algo="adamw").state_dict())
    assert message == ("MuonAdamW.load_state_dict: group 0 ('g') is algo='adamw' in the state_dict and 'muon' here; "
                       "its state holds the other algorithm's buffers")
    assert untouched


def test_load_state_dict_checks_the_saved_options():
    """A saved option out of range (edited, or from a buggy writer) was loaded as is."""
    state_dict = _stepped().state_dict()
    state_dict["param_groups"][0]["momentum"] = 1.5
    message, untouched = _loads(_stepped(), state_dict)
    assert message == "MuonAdamW.load_state_dict: group 'g' momentum=1.5; expected a float in [0, 1)" and untouched


def test_load_state_dict_refuses_another_optimizers_state():
    """torch.optim.AdamW's state_dict loaded, and the next step failed with KeyError: 'algo'."""
    p = _param()
    torch_adamw = torch.optim.AdamW([p])
    torch_adamw.step()
    message, untouched = _loads(_stepped(algo="adamw"), torch_adamw.state_dict())
    assert message.startswith("MuonAdamW.load_state_dict: group 'g' has unknown options ['amsgrad', 'capturable'")
    assert untouched


def test_load_state_dict_refuses_partial_adam_state():
    """Adam moments without their step count loaded, and the next step failed with KeyError: 'step'."""
    state_dict = _stepped(algo="adamw").state_dict()
    del state_dict["state"][0]["step"]
    message, untouched = _loads(_stepped(algo="adamw"), state_dict)
    assert message == ("MuonAdamW.load_state_dict: group 0 ('g') parameter 0 of shape (8, 6) lacks Adam's ['step'] in "
                       "the state_dict; expected all of ['step', 'exp_avg', 'exp_avg_sq'] or none") and untouched


@pytest.mark.parametrize("algo,edit,message", [
    ("soap", None, "has soap_L of shape (6, 6) in the state_dict; expected shape (8, 8)"),
    ("normuon", lambda s: s.update(normuon_v=torch.zeros(6, 1)),
     "has normuon_v of shape (6, 1) in the state_dict; expected shape (8, 1)"),
    ("adamw", lambda s: s.update(step=torch.tensor([1.0, 2.0])),
     "has step of shape (2,) in the state_dict; expected shape ()"),
    ("adamw", lambda s: s.update(step=3), "has step of type int in the state_dict; expected shape ()"),
    ("soap", lambda s: s.pop("soap_QR"), "lacks SOAP's ['soap_QR'] in the state_dict; expected all of"),
])
def test_load_state_dict_refuses_per_matrix_state_of_another_shape(algo, edit, message):
    """SOAP's bases of a transposed matrix loaded, and the next step failed inside a matmul ("The size of
    tensor a (6) must match the size of tensor b (8)"), not naming the parameter; an edited NorMuon v,
    an Adam step count of shape (2,) ("a Tensor with 2 elements cannot be converted to Scalar") or an
    int one (AttributeError) and SOAP state lacking a basis (KeyError) failed the same way."""
    opt = _stepped(algo=algo)
    opt.step()
    source = _stepped((6, 8) if edit is None else (8, 6), algo=algo)
    source.step()
    state_dict = source.state_dict()
    if edit is not None:
        edit(state_dict["state"][0])
    got, untouched = _loads(opt, state_dict)
    assert got.startswith("MuonAdamW.load_state_dict: group 0 ('g') parameter 0 of shape (8, 6) ") and message in got
    assert untouched


def test_load_state_dict_keeps_the_value_of_an_option_it_lacks():
    """A state_dict from before an option existed loads, and the group keeps its value of that option
    (torch's load replaced the group with the saved one: the step then failed with a KeyError)."""
    saved = _stepped(msign_steps=7)
    state_dict = saved.state_dict()
    del state_dict["param_groups"][0]["msign_steps"]
    opt = _stepped(msign_steps=9, momentum=0.5)
    opt.load_state_dict(state_dict)
    group = opt.param_groups[0]
    assert group["msign_steps"] == 9 and group["momentum"] == 0.95  # the saved momentum, the kept msign_steps
    assert torch.equal(opt.state[group["params"][0]]["momentum_buffer"],
                       saved.state[saved.param_groups[0]["params"][0]]["momentum_buffer"])
    opt.step()


@pytest.mark.parametrize("gamma", [math.nan, math.inf, -0.5, "1"])
def test_wd_anneal_factor_refuses_a_gamma_that_is_not_a_finite_number(gamma):
    """A NaN gamma passed the `gamma < 0` check and gave NaN decay multipliers once the decay stage began."""
    with pytest.raises(ValueError, match=re.escape(f"wd_anneal_gamma={gamma!r}; expected a finite number >= 0")):
        wd_anneal_factor(6, SchedulePhases(2, 3, 4), gamma)


@pytest.mark.parametrize("step", [math.nan, 5.5, True])
def test_wd_anneal_factor_refuses_a_step_that_is_not_an_int(step):
    """A NaN step compared False with the decay stage's start and gave the factor 1; 5.5 was interpolated."""
    with pytest.raises(ValueError, match=re.escape(f"step={step!r}; expected an int (the scheduler's step count)")):
        wd_anneal_factor(step, SchedulePhases(2, 3, 4), 1.0)


@pytest.mark.parametrize("phases", [(2, 3, -4), (-1, 3, 4), (2, 3.5, 4), (True, 3, 4)])
def test_schedule_phases_are_step_counts(phases):
    """decay_steps=-4 gave a decay progress of -0.75 and a WDA factor of 1.75 (more decay than none)."""
    with pytest.raises(ValueError, match=r"SchedulePhases: \w+_steps=.*; expected an int >= 0"):
        SchedulePhases(*phases)


ORTHOGONALISERS = {"polar_express": polar_express, "newton_schulz": newton_schulz}


@pytest.mark.parametrize("name", ["polar_express", "newton_schulz"])
@pytest.mark.parametrize("kwargs,match", [
    (dict(G=torch.ones(5, 3, dtype=torch.int64)), "G has dtype torch.int64; expected one of"),
    (dict(G=torch.ones(5, 3, dtype=torch.complex64)), "G has dtype torch.complex64; expected one of"),
    (dict(steps=True), "steps must be an int >= 0; got True"),
    (dict(dtype=torch.int32), "dtype=torch.int32; expected None or one of"),
    (dict(dtype="float32"), "dtype='float32'; expected None or one of"),
    (dict(gram="yes"), "gram='yes'; expected a bool"),
    (dict(kernel=None), "kernel=None; expected a bool"),
])
def test_orthogonalisers_refuse_what_they_would_cast_or_misread(name, kwargs, match):
    """An integer G came back as integers (the polar factor rounded to garbage), a complex one without
    its imaginary part; steps=True ran one step, gram='yes' the Gram iteration; a dtype that is no
    float dtype failed inside with "Invalid device string" or a vector_norm error."""
    args = {"G": torch.ones(5, 3), **kwargs}
    with pytest.raises(ValueError, match=re.escape(f"{name}: {match}")):
        ORTHOGONALISERS[name](**args)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 0)])
def test_orthogonalising_a_matrix_without_entries_gives_it_back(shape):
    """A (0, 3) matrix failed in a reshape ("the unspecified dimension size -1 can be any value")."""
    for fn in ORTHOGONALISERS.values():
        out = fn(torch.ones(shape))
        assert out.shape == shape and out.dtype == torch.float32


@pytest.mark.parametrize("call,match", [
    (lambda: spectral_power(torch.ones(5, 3, dtype=torch.int64), 3),
     "spectral_power: W has dtype torch.int64; expected one of"),
    (lambda: spectral_power(torch.ones(5, 3), 2, polar=torch.ones(3, 5)),
     r"spectral_power: polar must be None or a tensor of W's shape \(5, 3\); got \(3, 5\)"),
    (lambda: msign(torch.ones(3, 3), steps=-1), "msign: steps=-1; expected an int >= 0"),
    (lambda: msign(torch.ones(3, 4)), r"msign: A must be square \(..., n, n\); got \(3, 4\)"),
    (lambda: msign(torch.zeros(3, 3), eps=0.0), "msign: eps=0.0; expected a finite number > 0"),
    (lambda: band_projectors(torch.ones(5, 3), math.nan),
     "band_projectors: tau=nan; expected a finite number > 0"),
    (lambda: band_projectors(torch.ones(5, 3), -1.0),
     "band_projectors: tau=-1.0; expected a finite number > 0"),
])
def test_spectral_maps_refuse_bad_arguments_by_name(call, match):
    """An integer W came back rounded, a polar factor of another shape failed in a matmul, negative msign
    steps ran none (A / ||A||, not its sign), eps=0 made a zero A NaN, a NaN tau gave NaN projectors and
    a negative one the band of |tau|."""
    with pytest.raises(ValueError, match=match):
        call()
