"""Task settings of the MAD protocol and of the paper's harder recall sweep; run configs (TOML).

MAD's task configs (athms/mad-lab ``configs/tasks/*.yml``) give a baseline per task and a list
of "changes": each changed value is applied alone to the baseline, one setting per value. A
task's MAD score is the mean over its baseline and changed settings of the best accuracy over
the optimiser sweep. ``sweep = "baseline"`` keeps the baselines only; ``"mad"`` is the full
protocol; ``"hard"`` is the harder ICR/NCR/SC ladder (vocabulary up to 512, context up to 2048).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from typing import Literal

from eval.mad.tasks import READS, TASKS, TaskSetting
from parallax_titan.config.schema import describe, matches

MAD_BASELINES = {
    "compression": dict(vocab_size=16, seq_len=32),
    "in-context-recall": dict(vocab_size=16, seq_len=128),
    "fuzzy-in-context-recall": dict(vocab_size=16, seq_len=128, k_motif_size=3, v_motif_size=3),
    "noisy-in-context-recall": dict(vocab_size=32, seq_len=128, noise_vocab_size=16, frac_noise=0.2),
    "memorization": dict(vocab_size=256, seq_len=32, num_train_examples=256),
    "selective-copying": dict(vocab_size=16, seq_len=256, num_tokens_to_copy=16),
}
_SIZES = [6400, 3200, 1600, 800]
MAD_CHANGES = {
    "compression": dict(vocab_size=[32, 64, 128], seq_len=[64, 128, 256], num_train_examples=_SIZES),
    "in-context-recall": dict(vocab_size=[32, 64, 128], seq_len=[256, 512, 1024], num_train_examples=_SIZES),
    "fuzzy-in-context-recall": dict(vocab_size=[32, 64, 128], seq_len=[256, 512, 1024],
                                    num_train_examples=_SIZES),
    "noisy-in-context-recall": dict(vocab_size=[48, 80, 144], seq_len=[256, 512, 1024],
                                    num_train_examples=_SIZES, frac_noise=[0.4, 0.6, 0.8]),
    "memorization": dict(vocab_size=[512, 1024, 2048, 4096, 8192]),
    "selective-copying": dict(vocab_size=[32, 64, 128], seq_len=[512, 1024], num_train_examples=_SIZES,
                              num_tokens_to_copy=[32, 64, 96]),
}
# The paper gives only the ranges (vocabulary to 512, context to 2048, key-value pairs = seq/2);
# this ladder doubles vocabulary and context together, four levels per task.
HARD_LEVELS = {
    "in-context-recall": [dict(vocab_size=v, seq_len=s) for v, s in
                          [(64, 256), (128, 512), (256, 1024), (512, 2048)]],
    "noisy-in-context-recall": [dict(vocab_size=v, seq_len=s, noise_vocab_size=16, frac_noise=0.2) for v, s in
                                [(64, 256), (128, 512), (256, 1024), (512, 2048)]],
    "selective-copying": [dict(vocab_size=v, seq_len=s, num_tokens_to_copy=n) for v, s, n in
                          [(64, 256, 16), (128, 512, 32), (256, 1024, 64), (512, 2048, 128)]],
}
SWEEPS = ("baseline", "mad", "hard")
# Selective copying in mad-lab's cached benchmark data (generated before commit 35772e8, which first
# passed num_tokens_to_copy to the generator) copies the generator's default, 16 tokens, in every
# setting; seed 001 trained on that cached data.
MAD_LAB_CACHED_COPIES = 16
SELECTIVE_COPY = ("setting", "mad_lab_cached")


def task_settings(task: str, sweep: str, seed: int = 12345, selective_copy: str = "setting",
                  **overrides) -> list[TaskSetting]:
    """The settings of ``task`` in ``sweep``; ``overrides`` (e.g. num_train_examples) apply to all, each
    where the task reads it (``tasks.READS``).

    ``selective_copy``: "setting" copies each setting's num_tokens_to_copy (mad-lab since 35772e8);
    "mad_lab_cached" copies 16 tokens in every setting, as the cached data the paper used.
    """
    if sweep not in SWEEPS:
        raise ValueError(f"sweep={sweep!r}; expected one of {SWEEPS}")
    if task not in TASKS:
        raise ValueError(f"task={task!r}; expected one of {TASKS}")
    if selective_copy not in SELECTIVE_COPY:
        raise ValueError(f"selective_copy={selective_copy!r}; expected one of {SELECTIVE_COPY}")
    fields = {f.name for f in dataclasses.fields(TaskSetting)} - {"task", "seed"}
    if set(overrides) - fields:
        raise ValueError(f"overrides {sorted(set(overrides) - fields)}; expected some of {sorted(fields)}")
    if selective_copy == "mad_lab_cached" and task == "selective-copying" and "tokens_copied" in overrides:
        # the cached data fixes the tokens copied: a tokens_copied of its own would hold in some
        # settings and be replaced in the others
        raise ValueError(f"tokens_copied = {overrides['tokens_copied']!r} ([data]): selective_copy = 'mad_lab_cached' "
                         f"([grid]) copies {MAD_LAB_CACHED_COPIES} tokens in every setting that names another "
                         "num_tokens_to_copy; expected tokens_copied left out, or selective_copy = 'setting'")
    if sweep == "hard":
        params = [dict(p) for p in HARD_LEVELS.get(task, [])]
    else:
        base = MAD_BASELINES[task]
        params = [dict(base)]
        if sweep == "mad":
            params += [{**base, key: v} for key, values in MAD_CHANGES[task].items() for v in values]
    # an override sets the parameters this task reads (e.g. frac_noise is ICR's and NCR's only)
    params = [{**p, **{k: v for k, v in overrides.items() if k in READS[task]}} for p in params]
    if selective_copy == "mad_lab_cached" and task == "selective-copying":
        params = [{**p, "tokens_copied": MAD_LAB_CACHED_COPIES} if p["num_tokens_to_copy"] != MAD_LAB_CACHED_COPIES
                  else p for p in params]
    return [TaskSetting(task=task, seed=seed, **p) for p in params]


@dataclass
class TrainConfig:
    """Training of one run; ``lrs`` x ``weight_decays`` is the optimiser sweep per setting."""

    optimizer: Literal["muon", "adamw"] = "muon"  # MuonAdamW with Muon on hidden matrices, or AdamW
    schedule: Literal["wsd", "cosine"] = "wsd"  # constant then linear decay over decay_frac, or cosine
    decay_frac: float = 0.2
    epochs: int = 60
    batch_size: int = 128  # also the test batch: mad-lab scores per test batch
    lrs: list[float] = field(default_factory=lambda: [5e-3, 1e-3, 5e-4])
    weight_decays: list[float] = field(default_factory=lambda: [0.0, 0.1])  # mad-lab's sweep
    grad_clip: float = 1.0
    min_lr: float = 0.0
    precision: Literal["bf16", "fp32"] = "bf16"  # bf16: autocast, as mad-lab's precision = "bf16"
    max_seconds: float = 0.0  # > 0: shorten each run (and its schedule) to fit this wall time
    compile: bool = False  # torch.compile each block (Inductor) as the trainer does: fewer, fused kernels
    # > 0: each run saves its whole training state this often (seconds) under <out>/partial/, and a
    # rerun continues an unfinished run from it with the same result; 0: off
    checkpoint_seconds: float = 0.0


@dataclass
class ModelConfig:
    """The two-block [mixer, SwiGLU] x 2 model (MAD's SwiGLU inner width at dim 128 is 352).

    ``n_heads`` applies to attention, Parallax and the Parallax family (mad-lab's mh-attention: 16
    heads of 8); the fla mixers are sized by ``parallax_titan.mixers.fla_settings`` with heads of at
    least 16.
    """

    dim: int = 128
    n_heads: int = 16
    hidden_dim: int = 352
    backend: Literal["auto", "reference", "triton"] = "auto"  # Parallax kernel


@dataclass
class RunConfig:
    """A whole grid: tasks, sweep, dataset overrides, training and model settings."""

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    mixers: list[str] = field(default_factory=lambda: ["attention", "parallax"])  # eval.mad.models.MIXERS
    sweep: Literal["baseline", "mad", "hard"] = "mad"
    seed: int = 12345
    selective_copy: Literal["setting", "mad_lab_cached"] = "setting"
    data: dict[str, int | float] = field(default_factory=dict)  # e.g. {"num_test_examples": 256}
    train: TrainConfig = field(default_factory=TrainConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    only_settings: list[str] = field(default_factory=list)  # label fragments, e.g. "seq_len=512"

    def settings(self) -> list[TaskSetting]:
        """Every distinct task setting of the grid, task by task; with ``only_settings``, those whose label
        (``TaskSetting.label()``) contains one of its fragments. ValueError for a fragment that matches
        no setting of the grid, no tasks, a [data] key that no task of the grid reads, and a task listed
        with no setting in the sweep (CMP, FCR, MEM in "hard"; allowed when the grid lists all six)."""
        if not self.tasks:
            raise ValueError(f"tasks = []: expected 'all' or a non-empty list from {TASKS}")
        for key, value in self.data.items():
            readers = [t for t in TASKS if key in READS[t]]
            if not set(readers) & set(self.tasks):
                raise ValueError(f"[data] {key} = {value!r}: no task of the grid {self.tasks} reads it; "
                                 f"expected a grid with one of {readers}")
        per_task = {t: task_settings(t, self.sweep, self.seed, self.selective_copy, **self.data) for t in self.tasks}
        empty = [t for t, settings in per_task.items() if not settings]
        if empty and set(self.tasks) != set(TASKS):
            raise ValueError(f"tasks = {self.tasks!r}: {empty} have no setting in the {self.sweep!r} sweep; "
                             f"expected tasks from {[t for t in TASKS if task_settings(t, self.sweep)]}")
        every = [s for settings in per_task.values() for s in settings]
        # Once each: a num_train_examples override makes MAD's training-size changes equal to the
        # baseline, and a task may be listed twice; a repeat would be planned but never run.
        every = list(dict.fromkeys(every))
        if not self.only_settings:
            return every
        labels = [s.label() for s in every]
        unmatched = [f for f in self.only_settings if not any(f in label for label in labels)]
        if unmatched:
            raise ValueError(f"only_settings = {self.only_settings!r}: {unmatched} match no setting of the grid; "
                             f"its settings are {sorted(set(labels))}")
        return [s for s, label in zip(every, labels) if any(f in label for f in self.only_settings)]


def config_id(cfg: RunConfig) -> str:
    """Short hash of what decides a run's result besides (setting, mixer, lr, wd)."""
    settings = {"train": _floats_as_floats(cfg.train), "model": _floats_as_floats(cfg.model),
                "data": _floats_as_floats(cfg.data, TaskSetting), "seed": cfg.seed}
    for key in ("lrs", "weight_decays"):  # the sweep lists pick runs; they do not change one
        settings["train"].pop(key)
    for key in ("compile", "checkpoint_seconds"):  # how a run executes, not what it computes
        settings["train"].pop(key)
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def _floats_as_floats(section, fields: type | None = None) -> dict:
    """A config section as a dict, TOML's ``1`` for a float key as ``1.0`` (one setting, one id).
    ``section``: a dataclass, or a dict of the fields of the dataclass ``fields`` ([data])."""
    hints = typing.get_type_hints(fields or type(section))
    values = section if fields else dataclasses.asdict(section)
    return {key: float(value) if hints[key] is float and type(value) is int else value
            for key, value in values.items()}


def check_config_id(records: list[dict], cfg: RunConfig, path: str) -> None:
    """ValueError when ``records`` (read from ``path``) hold runs of a config other than ``cfg``: a
    grid would mix them in, a report would score them under ``cfg``'s name."""
    ours = config_id(cfg)
    other = sorted({r.get("config_id", "none") for r in records} - {ours})
    if other:
        raise ValueError(f"--out: {path} holds runs of other configs ({other}; this one is {ours}); "
                         "expected runs of this --config and options: use another --out or move runs.jsonl away")


def check_mixers(mixers: list, where: str, *, installed: bool = True) -> None:
    """Rejects unknown MAD mixers and, with ``installed``, fla mixers when flash-linear-attention
    is missing, naming ``where`` (the TOML key or the CLI option) before any run starts."""
    from eval.mad.models import MIXERS
    from parallax_titan.mixers import FLA_INSTALL, fla_missing

    unknown = [m for m in mixers if m not in MIXERS]
    if unknown or not mixers:
        raise ValueError(f"{where} = {mixers!r}: unknown {unknown}; expected a non-empty list from {sorted(MIXERS)}")
    missing = [m for m in mixers if installed and fla_missing(MIXERS[m][0])]
    if missing:
        raise ValueError(f"{where} = {mixers!r}: {missing} need flash-linear-attention ({FLA_INSTALL}) and CUDA")


def _finite_at_least(low: float, strict: bool = False):
    """A test of a number: finite and >= ``low`` (> ``low`` when ``strict``)."""
    return lambda v: math.isfinite(v) and (v > low if strict else v >= low)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _rates(test):
    """A test of a sweep list: not empty, every value passing ``test``."""
    return lambda v: len(v) > 0 and all(test(x) for x in v)


# Values that type-check but cannot make a run (a zero lr divides by zero, zero epochs would record
# an untrained model's accuracy as a finished run): (test, what is expected) per section and key.
RANGES = {
    "train": {
        "epochs": (_count, "an integer >= 1"),
        "batch_size": (_count, "an integer >= 1"),
        "lrs": (_rates(_finite_at_least(0, strict=True)), "a non-empty list of finite learning rates > 0"),
        "weight_decays": (_rates(_finite_at_least(0)), "a non-empty list of finite weight decays >= 0"),
        "decay_frac": (lambda v: 0 <= v <= 1, "a fraction in [0, 1]"),
        "grad_clip": (_finite_at_least(0), "a finite number >= 0 (0: no clipping)"),
        "min_lr": (_finite_at_least(0), "a finite number >= 0"),
        "max_seconds": (_finite_at_least(0), "a finite number of seconds >= 0 (0: off)"),
    },
    "data": {
        "num_train_examples": (_count, "an integer >= 1"),
        "num_test_examples": (_count, "an integer >= 1"),
    },
    "model": {key: (_count, "an integer >= 1") for key in ("dim", "n_heads", "hidden_dim")},
}


def check_value(section: str, key: str, value, where: str) -> None:
    """Rejects a value of ``[section] key`` outside :data:`RANGES`, naming ``where`` (the TOML key
    or the CLI option)."""
    rule = RANGES[section].get(key)
    if rule is not None and not rule[0](value):
        raise ValueError(f"{where} = {value!r}: expected {rule[1]}")


def check_section(section: str, values: dict, where: str) -> None:
    """:func:`check_value` for every key of a section; ``where``: e.g. ``"c.toml: [train]"``."""
    for key, value in values.items():
        check_value(section, key, value, f"{where} {key}")


def check_checkpoint_seconds(value, where: str) -> None:
    """Rejects a ``checkpoint_seconds`` that is not a finite number >= 0, naming ``where`` (the TOML
    key or the CLI option)."""
    if not (matches(value, float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{where} = {value!r}: expected a finite number of seconds >= 0 (0: off)")


def check_schedule(train: TrainConfig, where: str) -> None:
    """Rejects a [train] key that ``train.schedule`` does not read, and a cosine floor above a learning
    rate (the schedule would raise that run's lr up to it), naming ``where`` (e.g. ``"c.toml:"``).
    Checked once the command line has set the schedule and the lrs."""
    if train.schedule == "wsd" and train.min_lr != 0:  # WSD decays to 0
        raise ValueError(f"{where} [train] min_lr = {train.min_lr!r}: the 'wsd' schedule decays to 0 and does not "
                         "read it; expected 0, or schedule = 'cosine' (--schedule cosine)")
    if train.schedule != "cosine":
        return
    default = TrainConfig.decay_frac
    if train.decay_frac != default:  # WSD's decay stage
        raise ValueError(f"{where} [train] decay_frac = {train.decay_frac!r}: the 'cosine' schedule does not read it; "
                         f"expected the default {default!r}, or schedule = 'wsd' (--schedule wsd)")
    below = [lr for lr in train.lrs if lr < train.min_lr]
    if below:
        raise ValueError(f"{where} [train] min_lr = {train.min_lr!r}: above the learning rates {below} of lrs "
                         f"{train.lrs} (--lrs), which the cosine schedule would raise to it; expected min_lr <= "
                         f"{min(train.lrs)!r}")


def _fill(cls, values: dict, section: str):
    """``cls(**values)`` after checking every key and value type against ``cls``'s annotations."""
    hints = typing.get_type_hints(cls)
    unknown = set(values) - set(hints)
    if unknown:
        raise ValueError(f"[{section}]: unknown keys {sorted(unknown)}; expected some of {sorted(hints)}")
    for key, value in values.items():
        if not dataclasses.is_dataclass(hints[key]) and not matches(value, hints[key]):
            raise ValueError(f"[{section}] {key} = {value!r}: expected {describe(hints[key])}")
    return cls(**values)


def _once(values: list) -> list:
    """``values`` with each value once, in order, as the CLI's --mixers, --lrs and --wds: a repeat
    would be one run planned (and counted in the report) twice but run once."""
    return list(dict.fromkeys(values))


def load_config(path: str) -> RunConfig:
    """Read a TOML run config (sections [grid], [data], [train], [model]; see configs/mad/).

    Repeated values of ``mixers``, ``lrs`` and ``weight_decays`` are kept once (:func:`_once`)."""
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    unknown = set(raw) - {"grid", "data", "train", "model"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}; expected grid, data, train, model")
    grid = dict(raw.get("grid", {}))
    if grid.get("tasks") == "all":
        grid["tasks"] = list(TASKS)
    cfg = _fill(RunConfig, {**grid, "data": dict(raw.get("data", {}))}, "grid")
    unknown = [t for t in cfg.tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"{path}: [grid] tasks = {cfg.tasks!r}: unknown {unknown}; expected 'all' or a list from "
                         f"{TASKS} (the short names CMP, ICR, ... are --tasks's)")
    blank = [f for f in cfg.only_settings if not f.strip()]
    if blank:  # "" is part of every label
        raise ValueError(f"{path}: [grid] only_settings = {cfg.only_settings!r}: an empty fragment is part of every "
                         "label (it would keep every setting); expected label fragments, e.g. 'seq_len=512'")
    cfg.mixers = _once(cfg.mixers)
    check_mixers(cfg.mixers, f"{path}: [grid] mixers", installed=False)  # --mixers may replace them
    fields = {f.name for f in dataclasses.fields(TaskSetting)} - {"task", "seed"}
    unknown = set(cfg.data) - fields
    if unknown:
        raise ValueError(f"{path}: [data] unknown keys {sorted(unknown)}; expected some of {sorted(fields)}")
    check_section("data", cfg.data, f"{path}: [data]")
    cfg.train = _fill(TrainConfig, raw.get("train", {}), "train")
    check_checkpoint_seconds(cfg.train.checkpoint_seconds, f"{path}: [train] checkpoint_seconds")
    check_section("train", dataclasses.asdict(cfg.train), f"{path}: [train]")
    cfg.train.lrs, cfg.train.weight_decays = _once(cfg.train.lrs), _once(cfg.train.weight_decays)
    cfg.model = _fill(ModelConfig, raw.get("model", {}), "model")
    check_section("model", dataclasses.asdict(cfg.model), f"{path}: [model]")
    dim, heads = cfg.model.dim, cfg.model.n_heads
    if dim % heads or dim // heads % 2:  # RoPE rotates pairs of a head's columns
        raise ValueError(f"{path}: [model] n_heads = {heads}: expected a divisor of dim = {dim} that leaves "
                         "heads of an even size")
    return cfg
