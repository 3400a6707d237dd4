"""Diagnostics report for one or more checkpoints (markdown + PNG figures + JSON).

    python -m scripts.analyze --config configs/demo_cpu.toml --checkpoint outputs/demo_cpu/checkpoint/step-200 \
        [--compare DIR2 ...] [--compare-config Y.toml ...] [--labels A B ...] [--out report_dir] [--no-verify]

Every checkpoint is evaluated on the same held-out batch (``[diagnostics]`` settings of the config,
or their defaults). A compare checkpoint uses ``--compare-config`` (one per checkpoint, or one for
all) or else the main config with the mixer and gate read from the checkpoint, so a Transformer run
of the same recipe needs no config of its own. Every checkpoint's files are checked against its
checksum manifest before any is analysed (a corrupt or truncated file, or a folder without a
manifest: exit code 4); ``--no-verify`` loads them unchecked. See docs/diagnostics.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

from eval.checkpoint import load_job_config
from parallax_titan.checkpoint_files import (CheckpointError, check_output_folder, has_checkpoint_files, saved_shapes,
                                             verify_before_load)
from parallax_titan.config import ConfigError
from parallax_titan.data import record_policy
from parallax_titan.diagnostics import Diagnostics, collect
from parallax_titan.diagnostics.batch import heldout_tokens, resolve_dataset
from parallax_titan.diagnostics.report import load_checkpoint_model, report_owned, write_report
from parallax_titan.tokenizer import build_tokenizer, tokenizer_sha256
from scripts.bench.results import command_line


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="TOML config of the (first) checkpoint's run")
    parser.add_argument("--checkpoint", required=True, help="DCP checkpoint folder, e.g. <dump>/checkpoint/step-N")
    # extend: a repeated list flag adds to the earlier values (store would drop them without a word)
    parser.add_argument("--compare", nargs="*", action="extend", default=[], help="further checkpoint folders")
    parser.add_argument("--compare-config", nargs="*", action="extend", default=[],
                        help="configs of the --compare checkpoints")
    parser.add_argument("--labels", nargs="*", action="extend", default=[], help="one label per checkpoint")
    parser.add_argument("--out", default="analysis", help="output folder (default: ./analysis)")
    parser.add_argument("--batch-size", type=int, help="override diagnostics.batch_size")
    parser.add_argument("--seq-len", type=int, help="override diagnostics.seq_len")
    parser.add_argument("--max-queries", type=int, help="override diagnostics.max_queries")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="load the checkpoints without checking their files against their checksum manifests")
    args = parser.parse_args(argv)
    n = 1 + len(args.compare)
    if args.compare_config and len(args.compare_config) not in (1, len(args.compare)):
        parser.error(f"--compare-config: {len(args.compare_config)} configs for {len(args.compare)} --compare checkpoints; "
                     "expected one, or one per checkpoint")
    if args.compare_config and not args.compare:
        parser.error(f"--compare-config: {args.compare_config} given without --compare; expected the configs of "
                     "--compare checkpoints (--config is the --checkpoint's)")
    if args.labels and len(args.labels) != n:
        parser.error(f"--labels: {len(args.labels)} labels for {n} checkpoints; expected {n}")
    labels = args.labels or [default_label(c) for c in [args.checkpoint, *args.compare]]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:  # the report keeps one run per label: the others would be dropped
        parser.error(f"--labels: {repeated} would label two checkpoints (labels {labels}); expected one distinct "
                     "label per checkpoint (pass --labels A B ...)")
    try:
        check_output_folder(args.out, "--out", report_owned, "a diagnostics report", "whose files are rewritten")
    except ValueError as exc:
        parser.error(str(exc))
    args.labels = labels
    return args


def diagnostics_settings(job_config, args) -> Diagnostics:
    """The config's ``[diagnostics]`` with the command line's overrides, validated with the job."""
    overrides = {k: v for k, v in (("batch_size", args.batch_size), ("seq_len", args.seq_len),
                                   ("max_queries", args.max_queries)) if v is not None}
    # one pass over a checkpoint, not a periodic one in training: the config's periods do not apply
    job_config.diagnostics = dataclasses.replace(job_config.diagnostics, enable=True, freq=1, spectral_freq=0,
                                                 **overrides)
    problems = job_config.validate(check_data=False)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return job_config.diagnostics


def check_compare_config(path: str, compare, job, seq_len: int) -> None:
    """ValueError naming the ``--compare-config`` file and key when its model cannot read the held-out
    batch that ``--config`` builds: a RoPE table (``training.seq_len``) shorter than its rows of
    ``seq_len`` tokens (TorchTitan's RoPE asserts in the forward, after every checkpoint was hashed),
    or another tokenizer (the batch's token ids would stand for other text)."""
    if compare.training.seq_len < seq_len:
        raise ValueError(f"--compare-config {path!r}: training.seq_len = {compare.training.seq_len} (the model's "
                         f"RoPE table) is shorter than the held-out rows of {seq_len} tokens; expected at least "
                         f"{seq_len}, or pass --seq-len {compare.training.seq_len}")
    if tokenizer_sha256(compare.model.hf_assets_path) != tokenizer_sha256(job.model.hf_assets_path):
        raise ValueError(f"--compare-config {path!r}: model.hf_assets_path = {compare.model.hf_assets_path!r} holds "
                         f"another tokenizer than --config's {job.model.hf_assets_path!r}; expected the same "
                         "tokenizer.json (every checkpoint reads the held-out batch tokenized by --config's)")


def check_checkpoint_folder(checkpoint: str, option: str, verify: bool) -> None:
    """ValueError naming ``option`` when ``checkpoint`` is no DCP checkpoint folder (missing, a file,
    the ``checkpoint`` folder above the steps), else found only when its turn to load came, after
    the checkpoints before it were analysed. A folder with checkpoint files is left to the checksum
    check when ``verify``: its metadata is read only once it matches the manifest."""
    if verify and has_checkpoint_files(checkpoint):
        return
    try:
        saved_shapes(checkpoint)
    except ValueError as exc:
        raise ValueError(f"{option} {exc}") from None


def default_label(checkpoint: str) -> str:
    parts = os.path.normpath(checkpoint).split(os.sep)
    return "/".join(p for p in parts[-3:] if p != "checkpoint")


def main(argv) -> str:
    args = parse_args(argv)
    # the configs and settings first: hashing the checkpoints' files can take minutes
    job = load_job_config(args.config)
    config = diagnostics_settings(job, args)
    seq_len = config.seq_len or job.training.seq_len
    compare_configs = args.compare_config * len(args.compare) if len(args.compare_config) == 1 else args.compare_config
    loaded = {path: load_job_config(path) for path in compare_configs}
    for path, compare in loaded.items():
        check_compare_config(path, compare, job, seq_len)
    checkpoints = [(args.checkpoint, job, "--checkpoint")] + [
        (ckpt, loaded[compare_configs[i]] if compare_configs else job, "--compare")
        for i, ckpt in enumerate(args.compare)
    ]
    for checkpoint, _, option in checkpoints:  # all of them before any work, the cheap check first
        check_checkpoint_folder(checkpoint, option, args.verify)
    # the held-out batch before the checksums: a dataset too short for it is found in seconds
    tokenizer = build_tokenizer(job)
    name, path = resolve_dataset(job, config)
    tokens = heldout_tokens(name, path, tokenizer, config.batch_size, seq_len, record_policy(job))
    for checkpoint, _, option in checkpoints:
        verify_before_load(checkpoint, option, "--no-verify", args.verify)
    labels = args.labels
    runs, sources = {}, {}
    torch.manual_seed(0)
    for label, (checkpoint, job_config, option) in zip(labels, checkpoints):
        # verified above; the settings check names the option too
        model = load_checkpoint_model(job_config, checkpoint, verify=False, who=option)
        print(f"[analyze] {label}: {type(model).__name__} ({model.model_args.mixer}) from {checkpoint}")
        runs[label] = collect(model, tokens, tokenizer, config)
        sources[label] = (checkpoint, f"{model.model_args.mixer}, {job_config.model.flavor}, "
                                      f"{sum(p.numel() for p in model.parameters()):,} params")
    settings = {"dataset": name, "tokens": f"{config.batch_size} x {seq_len}", "max_queries": config.max_queries,
                "corr_ridge": config.corr_ridge, "top_k": config.top_k, "cka_tokens": config.cka_tokens}
    report = write_report(runs, sources, args.out, settings, command_line(__spec__.name, argv))
    print(f"[analyze] wrote {report}")
    return report


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(4)
