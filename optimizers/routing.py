"""Parameter routing: FQN -> category -> param group of MuonAdamW.

Categories come from ordered ``"category=regex"`` rules (first match wins,
``re.search`` on the FQN with wrapper prefixes such as ``_orig_mod.`` and
``_checkpoint_wrapped_module.`` removed); unmatched parameters are ``other``.
Attention projections are ``attn_q``/``attn_k``/``attn_v``/``attn_o``/``attn_r``
(module "attn"), the MLP is ``mlp`` (module "mlp"). The flash-linear-attention mixers
(``attention.layer.*``, parallax_titan/mixers.py) add ``conv`` (short-convolution filters),
``ssm`` (A_log, dt_bias, D, lambda: per-head decay/step parameters) and their decay/beta gate
projections under ``gate``: all three go to AdamW. Their large projections (q/k/v/o/g_proj,
in_proj/out_proj) stay ``other`` and so go to Muon by default.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from kernels.checks import is_finite_number

__all__ = ["DEFAULT_PARAM_RULES", "RoutingConfig", "parse_rules", "categorize", "build_param_groups",
           "parse_headwise", "check_values", "check_categories", "check_reached", "ATTN_CATEGORIES", "MODULE_OF"]

DEFAULT_PARAM_RULES: tuple[str, ...] = (
    r"embed=(^|\.)tok_embeddings\.",
    r"head=(^|\.)output\.",
    r"norm=norm\.weight$",
    r"gate=(^|\.)gate\.",
    r"bias=\.bias$",
    r"conv=(^|\.)attention\.layer\.\w*conv1d\.",
    r"ssm=(^|\.)attention\.(layer\.)?(A_log|dt_bias|D|lambda_params)$",
    r"gate=(^|\.)attention\.layer\.(a_proj|b_proj|f_proj\.\d+)\.weight$",
    r"attn_q=(^|\.)attention\.wq\.weight$",
    r"attn_k=(^|\.)attention\.wk\.weight$",
    r"attn_v=(^|\.)attention\.wv\.weight$",
    r"attn_o=(^|\.)attention\.wo\.weight$",
    r"attn_r=(^|\.)attention\.wr\.weight$",
    r"mlp=(^|\.)feed_forward\.w[123]\.weight$",
)
ATTN_CATEGORIES = ("attn_q", "attn_k", "attn_v", "attn_o", "attn_r")
MODULE_OF = {**{c: "attn" for c in ATTN_CATEGORIES}, "mlp": "mlp"}
_WRAPPERS = re.compile(r"(_orig_mod\.|_checkpoint_wrapped_module\.|_fsdp_wrapped_module\.)")
_HEADWISE = re.compile(r"^[HF]{3,4}$")


def parse_rules(rules) -> list[tuple[str, re.Pattern]]:
    """``["cat=regex", ...]`` -> [(cat, compiled)]; errors name the bad rule."""
    out = []
    for rule in rules:
        cat, sep, pattern = str(rule).partition("=")
        if not sep or not cat.strip():
            raise ValueError(f"param_rules: rule {rule!r}; expected 'category=regex'")
        try:
            out.append((cat.strip(), re.compile(pattern)))
        except re.error as e:
            raise ValueError(f"param_rules: rule {rule!r} has an invalid regex: {e}") from e
    return out


def parse_headwise(spec: str) -> dict[str, bool]:
    """``"HHF"`` -> per-head flags for attn_q/k/v(/r); R follows Q when omitted."""
    if not isinstance(spec, str) or not _HEADWISE.match(spec):
        raise ValueError(f"muon_headwise: {spec!r}; expected 3 or 4 letters from H/F for Q,K,V(,R), e.g. 'HHF'")
    letters = spec + (spec[0] if len(spec) == 3 else "")
    return {c: l == "H" for c, l in zip(("attn_q", "attn_k", "attn_v", "attn_r"), letters)}


def categorize(fqn: str, rules) -> str:
    clean = _WRAPPERS.sub("", fqn)
    for cat, pattern in rules:
        if pattern.search(clean):
            return cat
    return "other"


@dataclass
class RoutingConfig:
    """Everything needed to split a model into MuonAdamW param groups."""

    use_muon: bool = True
    rules: list = field(default_factory=lambda: list(DEFAULT_PARAM_RULES))
    muon_categories: tuple = ATTN_CATEGORIES + ("mlp", "other")
    lr: float = 1e-3
    lr_multipliers: dict = field(default_factory=dict)
    weight_decay: float = 0.0
    no_decay_categories: tuple = ()
    muon: dict = field(default_factory=dict)  # options of the matrix groups; "algo" picks the family member
    adam: dict = field(default_factory=dict)
    headwise: str = "FFF"
    head_dim: int = 0
    spectral: dict = field(default_factory=dict)  # module -> (power, coeff)
    spectral_categories: tuple = ATTN_CATEGORIES + ("mlp",)
    decay: dict = field(default_factory=dict)  # decay_coupling, sp_band, sp_band_tau, msign_steps


def check_values(cfg: RoutingConfig) -> None:
    """Raise a ValueError naming the field, the value and what was expected when a field of ``cfg`` has
    the wrong kind of value: ``use_muon="no"`` is truthy (the matrices would go to Muon without a
    word), a bare string of categories or rules would be read letter by letter ("category 'm' is
    produced by no rule"), and a ``spectral`` value that is no (power, coeff) pair, an lr or lr
    multiplier that is no number, a string ``head_dim`` or a None option dict would fail with a
    TypeError naming none of them. The values themselves (powers, coefficients, options) are
    ``MuonAdamW``'s checks, per group."""
    def bad(key, value, expected):
        raise ValueError(f"{key}={value!r}; expected {expected}")

    if not isinstance(cfg.use_muon, bool):
        bad("use_muon", cfg.use_muon, "a bool")
    for key in ("rules", "muon_categories", "no_decay_categories", "spectral_categories"):
        if isinstance(getattr(cfg, key), str):
            bad(key, getattr(cfg, key), "a list of names, not one string")
    for key in ("lr_multipliers", "muon", "adam", "spectral", "decay"):
        if not isinstance(getattr(cfg, key), Mapping):
            bad(key, getattr(cfg, key), "a dict")
    for key, value in (("lr", cfg.lr), ("weight_decay", cfg.weight_decay),
                       *((f"lr_multipliers[{name!r}]", m) for name, m in cfg.lr_multipliers.items())):
        if not is_finite_number(value) or value < 0:
            bad(key, value, "a finite number >= 0")
    if isinstance(cfg.head_dim, bool) or not isinstance(cfg.head_dim, int) or cfg.head_dim < 0:
        bad("head_dim", cfg.head_dim, "an int >= 0")
    for module, pair in cfg.spectral.items():
        if isinstance(pair, str) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
            bad(f"spectral[{module!r}]", pair, "a (power, coeff) pair")


def check_categories(cfg: RoutingConfig) -> None:
    """Raise a ValueError naming the option and the category when a category option of ``cfg``
    names a category that no rule produces (a typo such as ``"norms"`` would otherwise be ignored
    without a word: the norms decayed, the embedding at the full lr, V without its S_p term).

    Known categories: those of ``cfg.rules``, of ``DEFAULT_PARAM_RULES`` (the default category
    lists name them, also when custom rules no longer produce them) and ``other``. S_p powers exist
    per module only, so ``spectral_categories`` must be categories of ``MODULE_OF``. An ``H`` in
    ``headwise`` must name a category that Muon updates.
    """
    known = {cat for cat, _ in parse_rules([*cfg.rules, *DEFAULT_PARAM_RULES])} | {"other"}
    for key, names in (("lr_multipliers", cfg.lr_multipliers), ("no_decay_categories", cfg.no_decay_categories),
                       ("muon_categories", cfg.muon_categories), ("spectral_categories", cfg.spectral_categories)):
        for name in names:
            if name not in known:
                raise ValueError(f"{key}: category {name!r} is produced by no param_rules rule; expected one of "
                                 f"{sorted(known)}")
    for name in cfg.spectral_categories:
        if name not in MODULE_OF:
            raise ValueError(f"spectral_categories: category {name!r} has no S_p power (powers are set per "
                             f"module); expected categories of {sorted(MODULE_OF)}")
    for module in cfg.spectral:
        if module not in ("attn", "mlp"):
            raise ValueError(f"spectral: module {module!r}; expected 'attn' or 'mlp'")
    # an H for a projection that muon_categories leaves to Adam would be dropped (Adam has no heads)
    adam = [c for c, per_head in parse_headwise(cfg.headwise).items()
            if per_head and not (cfg.use_muon and c in cfg.muon_categories)]
    if adam:
        why = f"muon_categories = {list(cfg.muon_categories)}" if cfg.use_muon else "use_muon is off"
        raise ValueError(f"muon_headwise: {cfg.headwise!r} asks for per-head updates of {adam}, which go to Adam "
                         f"({why}); expected F for them, or them in muon_categories")


def check_reached(models: list[nn.Module], cfg: RoutingConfig) -> None:
    """Raise a ValueError naming the option when an ``lr_multipliers`` category holds no trainable
    parameter of ``models`` (the parts of one model), when ``muon_categories`` (with ``use_muon``)
    hold no matrix (an AdamW run under a matrix optimizer's name), or when an S_p coefficient > 0
    reaches no matrix (none of its module's ``spectral_categories`` holds one). Each would otherwise train
    as if the option were not there: e.g. ``head`` on a model whose output projection is tied to the
    embedding (the shared Parameter is routed once, as ``embed``), or ``attn_r`` on a model without
    W_R. ``check_categories`` checks the names against the rules; this checks them against the model.
    """
    check_values(cfg)
    rules = parse_rules(cfg.rules)
    ndims = defaultdict(set)  # category -> ndims of its trainable parameters
    for model in models:
        for fqn, p in model.named_parameters():
            if p.requires_grad:
                ndims[categorize(fqn, rules)].add(p.ndim)
    for name in cfg.lr_multipliers:
        if name not in ndims:
            raise ValueError(f"lr_multipliers: category {name!r} holds no trainable parameter of the model (a "
                             "Parameter shared with an earlier name, such as a tied output.weight, takes that "
                             f"name's category), so its multiplier would change no lr; expected one of "
                             f"{sorted(ndims)}")
    matrices = sorted(c for c in ndims if 2 in ndims[c])
    if cfg.use_muon and not any(c in matrices for c in cfg.muon_categories):
        raise ValueError(f"muon_categories: {list(cfg.muon_categories)} hold no matrix of the model, so the "
                         "matrix optimizer would update nothing and every parameter would go to AdamW; expected "
                         f"some of the model's matrix categories {matrices}, or optimizer.name = 'AdamW'")
    for module, (_, coeff) in cfg.spectral.items():
        mine = [c for c in cfg.spectral_categories if MODULE_OF.get(c) == module]
        if coeff and not any(2 in ndims.get(c, ()) for c in mine):
            raise ValueError(f"spectral_coeff_{module}: {coeff!r} reaches no matrix of the model: spectral_categories "
                             f"{mine} hold none; expected 0, or categories of the model's {module} matrices "
                             f"({sorted(c for c in ndims if MODULE_OF.get(c) == module and 2 in ndims[c])})")


def _group_options(cat: str, is_matrix: bool, cfg: RoutingConfig) -> dict[str, Any]:
    base = cat.split(":")[0]
    muon = cfg.use_muon and is_matrix and base in cfg.muon_categories
    opts: dict[str, Any] = {"name": cat, "algo": "muon" if muon else "adamw",
                            "lr": cfg.lr * cfg.lr_multipliers.get(base, 1.0),
                            "weight_decay": 0.0 if base in cfg.no_decay_categories else cfg.weight_decay,
                            **cfg.decay, **(cfg.muon if muon else cfg.adam)}
    flags = parse_headwise(cfg.headwise)
    if muon and flags.get(cat):
        if cfg.head_dim <= 0:
            raise ValueError(f"muon_headwise: {cfg.headwise!r} needs a head_dim > 0; got {cfg.head_dim}")
        opts["head_dim"] = cfg.head_dim
    module = MODULE_OF.get(cat)
    if is_matrix and module in cfg.spectral and cat in cfg.spectral_categories:
        opts["sp_power"], opts["sp_coeff"] = cfg.spectral[module]
    return opts


def build_param_groups(model: nn.Module, cfg: RoutingConfig) -> list[dict[str, Any]]:
    """Param groups (one per category; non-2-D params of a matrix category split off).

    Shared (tied) parameters appear once: ``named_parameters`` de-duplicates them and
    they take the category of their first name (``tok_embeddings`` before ``output``).
    Raises ValueError for a value of the wrong kind (``check_values``) or an unknown category in
    ``cfg`` (``check_categories``).
    """
    check_values(cfg)
    check_categories(cfg)
    rules = parse_rules(cfg.rules)
    groups: dict[str, dict[str, Any]] = {}
    for fqn, p in model.named_parameters():
        if not p.requires_grad:
            continue
        cat = categorize(fqn, rules)
        key = cat if p.ndim == 2 or cat not in cfg.muon_categories else f"{cat}:vector"
        if key not in groups:
            groups[key] = {"params": [], "fqns": [], **_group_options(key, p.ndim == 2, cfg)}
        groups[key]["params"].append(p)
        groups[key]["fqns"].append(fqn)
    for key, g in groups.items():
        if g.get("head_dim"):
            bad = [f for f, p in zip(g["fqns"], g["params"]) if p.shape[0] % g["head_dim"]]
            if bad:
                raise ValueError(f"head_dim={g['head_dim']} does not divide the rows of {bad}")
    return [{k: v for k, v in g.items() if k != "fqns"} for g in groups.values()]
