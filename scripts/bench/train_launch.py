"""Launching the training benchmark's runs: the torchrun command of one run, and running it logged,
under a time limit, from the repository root (``scripts.bench.train``)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from scripts.bench.gpu_telemetry import Sampler

REPO = str(Path(__file__).resolve().parents[2])
TIMEOUT_EXIT = 124  # the exit status `timeout` reports
# TorchTitan's own trainer and Qwen3 on the Transformer's config (scripts.bench.titan_reference)
REFERENCE = "titan_qwen3"
REFERENCE_MODULE = "scripts.bench.titan_reference"
PROBE_MODULE = "scripts.bench.step_probe"  # train.py under the probes of ``--probe``


def config_args(args: argparse.Namespace, variant: str) -> list[str]:
    """The config file of ``variant`` (and with ``--config``, the model overrides)."""
    if args.config:
        return ["--job.config_file", args.config, "--model.name", variant, "--model.flavor", args.flavor]
    config = "transformer" if variant == REFERENCE else variant
    return ["--job.config_file", os.path.join("configs", "paper", args.flavor, f"{config}_{args.recipe}.toml")]


def train_command(args: argparse.Namespace, variant: str, name: str, nproc: int, *overrides: str) -> list[str]:
    """``torchrun train.py`` (or ``torchrun -m`` the TorchTitan reference) for one benchmark run, to be
    run from the repository root; ``overrides`` come before ``--extra``, and ``--multi-gpu-extra``
    (runs of ``nproc`` > 1 only) after it."""
    if variant == REFERENCE:
        entry = ["-m", REFERENCE_MODULE]
    elif args.probe:
        entry = ["-m", PROBE_MODULE, *shlex.split(args.probe), "--"]
    else:
        entry = ["train.py"]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "--local-ranks-filter=0",
        *entry, *config_args(args, variant),
        "--training.dataset", "default_corpus", "--training.steps", str(args.steps),
        "--training.global_batch_size", "-1", "--training.local_batch_size", str(args.local_batch),
        "--checkpoint.no-enable", "--metrics.log_freq", "5", "--metrics.no-progress-bar",
        "--job.dump_folder", os.path.join(args.out, name), *overrides, *shlex.split(args.extra),
        *(shlex.split(args.multi_gpu_extra) if nproc > 1 else []),
    ]


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL 60 s later if it is still there."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def run_logged(cmd: list[str], log_path: str, timeout: int, env: dict | None = None) -> int:
    """Run ``cmd`` from the repository root with its output in ``log_path``; its exit status.

    After ``timeout`` seconds the run's process group gets SIGTERM (SIGKILL 60 s later) and the
    status is 124, as with ``timeout``. The run has its own session (so the whole torchrun tree can
    be stopped); when this process is itself stopped (SIGTERM, e.g. an outer ``timeout``, or
    Ctrl-C) the run's group is stopped too instead of being left training on the GPU.
    """
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return TIMEOUT_EXIT
        finally:  # past the timeout, or this process stopped: the run must not outlive it
            if proc.poll() is None:
                stop_group(proc)
            signal.signal(signal.SIGTERM, previous)


def bench_run(args: argparse.Namespace, variant: str, name: str, nproc: int, *overrides: str,
              env: dict | None = None, fresh: bool = True) -> str | None:
    """One run into ``OUT/name`` (emptied first unless not ``fresh``: a rerun that resumes), logged to
    ``OUT/name.log`` and its GPUs' clocks and power sampled into ``samples_path(OUT/name)``
    (``gpu_telemetry``; a rerun's into ``name.rerun.log`` and ``name.rerun.gpu.csv``); its folder, or
    None when it logged no step."""
    folder = os.path.join(args.out, name)
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    stem = folder if fresh else folder + ".rerun"
    log_path = stem + ".log"
    with Sampler(samples_path(stem), env):
        status = run_logged(train_command(args, variant, name, nproc, *overrides), log_path, args.run_timeout, env)
    with open(log_path) as f:
        steps = sum("step:" in line for line in f)
    print(f"{name}: exit {status}, {steps} logged steps", flush=True)
    return folder if os.path.isfile(os.path.join(folder, "metrics.jsonl")) else None


def samples_path(run: str) -> str:
    """Where a run's GPU telemetry samples go: beside its folder ``run``."""
    return run + ".gpu.csv"


def one_gpu_env() -> dict:
    """The environment with only the first visible GPU left visible."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    return {**os.environ, "CUDA_VISIBLE_DEVICES": first}
