"""What a resumed run does with a setting that differs from its checkpoint's: apply it or refuse.

Every checkpoint holds ``settings.json``: the run's effective settings (every ``[optimizer]``,
``[lr_scheduler]`` and ``[parallax]`` key, ``training.dataset``, ``dataset_path``, the files a local dataset
reads (:data:`DATASET_FILES`), ``steps``, ``max_norm``,
``seq_len``, ``local_batch_size``, the global batch in sequences per step, and the model arguments of
:data:`MODEL_ARGS` as ``model.<name>``). On resume
each key that differs follows one rule (the table in docs/resume.md):

* refused before anything is built, naming the key (:data:`REFUSED`), where applying it would
  change which data a step trains on, the meaning of the step count, or make the saved optimizer
  state not fit the optimizer; ``training.dataset``, its files and ``local_batch_size`` are applied where the
  run does not load the data loader's saved position (``checkpoint.exclude_from_loading =
  ["dataloader"]``);
* ``training.steps``: applied when it is at least the checkpoint's step, refused below it;
* every other key: applied from the first step after the resume, with a log line
  ``optimizer.lr: 0.01 -> 0.05 from step 7``.

Applying needs work after TorchTitan's load: the optimizer's param groups and the LambdaLR state
come back with the checkpoint's values. :func:`reapply` writes the freshly built optimizer's values
(:func:`configured_hyperparameters`, taken before the load) back into the param groups and
recomputes the schedule at the loaded step from the new lr and schedule lengths. With nothing
changed it recomputes the same numbers, so an unchanged resume stays bit-exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, NamedTuple

from optimizers.muon import GROUP_DEFAULTS
from parallax_titan.checkpoint_files import SETTINGS_FILE
from parallax_titan.checksums import write_json_atomic
from parallax_titan.config.job import ROPE_MIXERS, global_batch_size
from parallax_titan.data.build import dataset_files
from parallax_titan.spec import model_args_for

SETTINGS_FORMAT = 1

DATASET_FILES = "training.dataset_files"
"""Settings key: the files a local text dataset reads (:func:`parallax_titan.data.build.dataset_files`),
recorded beside ``training.dataset_path``, which may change (files moved) while they stay the same."""

REFUSED: dict[str, str] = {
    "optimizer.name": "the saved optimizer state holds the other algorithm's buffers (Muon momentum, Adam moments)",
    "optimizer.muon_categories": "it decides which parameters Muon updates, so the saved optimizer state would not fit",
    "optimizer.param_rules": "they decide which parameters Muon updates, so the saved optimizer state would not fit",
    "training.seq_len": "the data loader's saved position counts sequences of the old length, and every step-indexed "
                        "setting (schedule, steps) would mean other numbers of tokens",
    "training.local_batch_size": "the data loader's saved position counts this rank's sequences (data_order = "
                                 "'sharded'; with dataset = 'pretokenized' or data_order = 'global' the position is "
                                 "one global index and the local batch may change with the number of ranks)",
    "training.global_batch_size": "the sequences per step define what a step is: the data of every later step and "
                                  "the tokens behind each step of the schedule would change",
    "training.dataset": "the data loader's saved position (documents read, tokens held back) is in the checkpoint's "
                        "dataset: the run would go on from that offset into another one, or fail in the loader",
    DATASET_FILES: "the data loader's saved position (file, document) is an index into the files the checkpoint's run "
                   "read: with a file added, removed, renamed or changed in size the run would go on from that index "
                   "into another list, repeating or skipping documents",
}
"""Keys a resume refuses to change, with the reason the refusal gives."""

RENAMED: dict[str, str] = {"parallax.hopper_backward": "parallax.hopper_kernels"}
"""Keys a checkpoint may record under an earlier name -> their name now: compared (and a change
logged or refused) as that key."""

GLOBAL_POSITION = "data.global_position"
"""Settings key: the data position is one index over the whole run (pre-tokenized shards or the
global text order), so the local batch may change with the rank count while the global batch stays."""


WAYS_OUT: dict[str, str] = {
    "training.dataset": "set checkpoint.exclude_from_loading = ['dataloader'] to start the new dataset at its first "
                        "document (the model, optimizer and schedule state still load)",
    DATASET_FILES: "set checkpoint.exclude_from_loading = ['dataloader'] to read the files from their first "
                   "document (the model, optimizer and schedule state still load)",
    "training.local_batch_size": "set checkpoint.exclude_from_loading = ['dataloader'] to read the data again from "
                                 "its first document with the new local batch (the model, optimizer and schedule "
                                 "state still load)",
}
"""Keys whose refusal has a way out besides resuming with the old value, and that way."""

RESUME_WITH: dict[str, str] = {DATASET_FILES: "the files the checkpoint's run read (training.dataset_path)"}
"""Refused keys that no config key sets: what resuming with the checkpoint's value means."""

POSITION_ONLY = ("training.dataset", DATASET_FILES, "training.local_batch_size")
"""Refused keys whose one reason is the data loader's saved position: a run that does not load it
(:func:`loads_data_position`) applies them."""


def loads_data_position(cfg) -> bool:
    """Whether a resume with ``cfg`` loads the data loader's saved position: not where
    ``checkpoint.exclude_from_loading`` names ``"dataloader"`` (the loader then starts at the
    beginning of its dataset)."""
    return "dataloader" not in cfg.checkpoint.exclude_from_loading


def refused(key: str, current: dict[str, Any], position_loaded: bool = True) -> bool:
    """Whether a resume refuses to change ``key`` for a run with the settings ``current`` that loads
    the data loader's saved position or not (``position_loaded``)."""
    if key == "training.local_batch_size" and current.get(GLOBAL_POSITION):
        return False
    if key in POSITION_ONLY and not position_loaded:
        return False
    return key in REFUSED

# param-group keys that the config sets (MuonAdamW's options plus the schedule's base lrs); the rest
# of a group (``lr``, ``wd_mult``, counters) is the schedule's or the optimizer's running state
_CONFIGURED_KEYS = (set(GROUP_DEFAULTS) - {"wd_mult"}) | {"base_lr", "initial_lr"}


def run_settings(cfg, world: int) -> dict[str, Any]:
    """The settings a checkpoint records, as JSON values: ``{"optimizer.lr": 0.01, ...}``.

    ``world``: the number of ranks (for the global batch when ``training.global_batch_size`` is -1)."""
    settings = {f"{name}.{f.name}": getattr(section, f.name)
                for name, section in (("optimizer", cfg.optimizer), ("lr_scheduler", cfg.lr_scheduler),
                                      ("parallax", cfg.parallax))
                for f in dataclasses.fields(section)}
    training = cfg.training
    settings.update({"training.dataset": training.dataset, "training.dataset_path": training.dataset_path,
                     DATASET_FILES: dataset_files(training),
                     "training.steps": training.steps, "training.max_norm": training.max_norm,
                     "training.seq_len": training.seq_len, "training.local_batch_size": training.local_batch_size,
                     "training.global_batch_size": global_batch_size(cfg, world),
                     GLOBAL_POSITION: training.dataset == "pretokenized" or training.data_order == "global"})
    args = model_args_for(cfg)
    settings.update({f"model.{name}": getattr(args, name) for name in MODEL_ARGS})
    return json.loads(json.dumps(settings))  # tuples as lists, as they read back


def write_settings(checkpoint_dir: str, step: int, settings: dict[str, Any]) -> None:
    """Write ``checkpoint_dir/settings.json`` atomically."""
    write_json_atomic(os.path.join(checkpoint_dir, SETTINGS_FILE),
                      {"format": SETTINGS_FORMAT, "step": step, "settings": settings})


def read_settings(checkpoint_dir: str) -> dict[str, Any] | None:
    """The settings a checkpoint recorded, keys renamed since under their names now (:data:`RENAMED`);
    None when it has no ``settings.json``.

    Raises ValueError naming the file when it cannot be read (a folder or a broken link of that name
    included: taken for no file, the resume rules would compare nothing)."""
    path = os.path.join(checkpoint_dir, SETTINGS_FILE)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return {RENAMED.get(key, key): value for key, value in data["settings"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # AttributeError: not an object
        raise ValueError(f"{path!r} is not readable ({type(exc).__name__}: {exc})") from None


class Change(NamedTuple):
    """One setting that differs between a checkpoint and this run."""

    key: str
    saved: Any
    current: Any


MODEL_ARGS = ("rope_theta", "norm_eps", "enable_weight_tying")
"""Model arguments that change the function without changing a weight's shape, and that no config
key sets (``model.flavor`` fixes them, so they change only with the code): recorded as
``model.<name>``. A tied checkpoint loads into an untied model and back, its output weight being
its embedding."""

MODEL_SETTINGS: dict[str, str] = {"parallax.rho_rope": "rho_rope", "parallax.gate": "gate",
                                  "parallax.window": "window", "parallax.attn_mask_type": "attn_mask_type",
                                  **{f"model.{name}": name for name in MODEL_ARGS}}
"""Recorded keys -> the model argument they set, where the same weights compute another function
with another value (a resume applies them; a loader for evaluation refuses them: :func:`model_changes`)."""


def _used(field: str, mixer: str) -> bool:
    """Whether a model with ``mixer`` computes with the model argument ``field`` (the config sets the
    probe's switches on the parallax mixer only, and every mixer but softmax takes the mask type)."""
    if field in ("rho_rope", "gate", "window"):
        return mixer == "parallax"
    if field == "attn_mask_type":
        return mixer != "softmax"
    if field == "rope_theta":
        return mixer in ROPE_MIXERS
    return True


def model_changes(saved: dict[str, Any] | None, args) -> list[Change]:
    """The :data:`MODEL_SETTINGS` that the checkpoint's ``saved`` settings (None: none recorded) hold
    with other values than the model arguments ``args``, for the arguments ``args.mixer`` computes
    with. A key the checkpoint does not record (saved before it was recorded) is not compared."""
    return [Change(key, saved[key], getattr(args, field)) for key, field in MODEL_SETTINGS.items()
            if saved and key in saved and _used(field, args.mixer) and saved[key] != getattr(args, field)]


def check_model_settings(checkpoint_dir: str, args, who: str = "checkpoint") -> None:
    """ValueError naming ``who`` (the option that named the folder), the key and both values when
    the checkpoint's ``settings.json`` records a :data:`MODEL_SETTINGS` key with another value than
    the model arguments ``args``: the weights have the same shapes, so they would load and compute
    another function (a ``parallax_norope`` run evaluated with the base config). Every loader of a
    checkpoint for evaluation or analysis calls it; the trainer's resume applies such a change
    instead (:func:`differences`). A checkpoint without the file is not compared."""
    try:
        changes = model_changes(read_settings(checkpoint_dir), args)
    except ValueError as exc:
        raise ValueError(f"{who}: {exc}") from None
    if not changes:
        return
    key, saved, current = changes[0]
    section, name = key.split(".")
    if section == "parallax":
        this, fix = "the config sets", f"use the run's config (or set {name} = {json.dumps(saved)} under [parallax])"
    else:  # no config key: model.flavor fixes it
        this, fix = "the config's model has", (f"no config key sets {name} (model.name and model.flavor fix it): "
                                               "evaluate it with the version of the code that trained it")
    raise ValueError(f"{who}: {key}: {checkpoint_dir!r} was trained with {saved!r} (its {SETTINGS_FILE}) and {this} "
                     f"{current!r}; the weights would compute another function: {fix}")


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    """The keys both record with different values, in ``current``'s order."""
    return [Change(k, saved[k], v) for k, v in current.items() if k in saved and saved[k] != v]


def refusals(changes: list[Change], checkpoint_dir: str, step: int, current: dict[str, Any],
             position_loaded: bool = True) -> list[str]:
    """A message for each change the rules refuse (``position_loaded``: whether the run loads the data
    loader's saved position), and for ``training.steps`` below ``step``."""
    problems = [f"{c.key}: the checkpoint {checkpoint_dir!r} was trained with {c.saved!r} and this run sets "
                f"{c.current!r}; refused on resume because {REFUSED[c.key]}; resume with "
                + (f"{RESUME_WITH[c.key]}, " if c.key in RESUME_WITH else f"{c.key} = {c.saved!r}, ")
                + (f"{WAYS_OUT[c.key]}, " if c.key in WAYS_OUT else "") + "or train into another job.dump_folder"
                for c in changes if refused(c.key, current, position_loaded)]
    steps = current.get("training.steps")
    if isinstance(steps, int) and steps < step:
        problems.append(f"training.steps: {steps} is below the step of the checkpoint {checkpoint_dir!r} ({step}); "
                        f"set it to at least {step}")
    return problems


def applied(changes: list[Change], step: int, current: dict[str, Any], position_loaded: bool = True) -> list[str]:
    """Log lines of the changes a resume applies: ``optimizer.lr: 0.01 -> 0.05 from step 7``
    (``position_loaded``: whether the run loads the data loader's saved position)."""
    return [f"{c.key}: {c.saved!r} -> {c.current!r} from step {step + 1}" for c in changes
            if not refused(c.key, current, position_loaded)]


def configured_hyperparameters(optimizers) -> list[list[dict[str, Any]]]:
    """Per optimizer and param group, the values the config gave it (call before loading a checkpoint)."""
    return [[{k: v for k, v in group.items() if k in _CONFIGURED_KEYS} for group in optimizer.param_groups]
            for optimizer in optimizers]


def reapply(optimizers, lr_schedulers, configured: list[list[dict[str, Any]]]) -> None:
    """Write ``configured`` back into the param groups after a load and recompute the lr schedule
    (and the weight-decay annealing) at the loaded step with those base lrs and the current
    schedule: the step after the load then uses the config's values."""
    for optimizer, groups in zip(optimizers, configured, strict=True):
        for group, values in zip(optimizer.param_groups, groups, strict=True):
            group.update(values)
    for scheduler in lr_schedulers.schedulers:
        scheduler.base_lrs = [group["initial_lr"] for group in scheduler.optimizer.param_groups]
        scheduler.last_epoch -= 1  # step() below comes back to the loaded step, computing its lr
    lr_schedulers.step()
