"""torchrun for training jobs that get stopped: ``python -m parallax_titan.launch`` takes torchrun's arguments.

    python -m parallax_titan.launch --nproc_per_node=8 train.py --job.config_file X.toml

It runs ``torch.distributed.run`` (torchrun) as a child process and adds two things:

* SIGTERM sent to this process (what a scheduler sends before it kills a job) goes to the
  training processes only. They finish the step, save a full checkpoint (unless
  ``checkpoint.enable = false``: then they say none was written) and exit 0; torchrun then
  exits 0, and so does this launcher, without a traceback. (torchrun, when it gets SIGTERM
  itself, forwards it the same way, but then exits 1 with a ``SignalException`` traceback,
  whatever its workers did.)
* ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` defaults to :data:`SHUTDOWN_TIMEOUT_S`. When torchrun itself
  gets a signal (Slurm signals every process of a job step), it waits that many seconds for the
  workers (their checkpoint) before it kills them with SIGKILL; its own default is 30 s. torch
  versions whose ``LaunchConfig`` has no ``shutdown_timeout`` ignore the variable and wait 30 s:
  the launcher says so at start.

The exit code is torchrun's (128 + the signal number if torchrun was killed by a signal), or 2
before torchrun starts when ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is not a whole number of seconds, or
``--nproc_per_node``, ``--nnodes`` or the training script is one torchrun would fail on
(:func:`argument_problems`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

SHUTDOWN_TIMEOUT_S = 600
"""Seconds torchrun waits for signalled workers before SIGKILL: a full 1.7B checkpoint save (about
15 GB of weights and optimizer state) plus the step in progress, with a wide margin for slow
shared file systems (measured save times: ``python -m scripts.bench.checkpoint``)."""

SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def torchrun_reads_shutdown_timeout() -> bool:
    """Whether this torch's torchrun honours ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``."""
    from torch.distributed.launcher.api import LaunchConfig

    return "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}


def child_pids(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (read from /proc; [] where there is none)."""
    children = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])  # field 4, after the command name
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            children.append(int(entry))
    return children


def forward_to_workers(torchrun: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to torchrun's worker processes (to torchrun itself while it has none yet)."""
    for pid in child_pids(torchrun.pid) or [torchrun.pid]:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def shutdown_timeout_problem(value: str) -> str | None:
    """Why ``value`` of ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is no timeout torchrun can use (torchrun
    fails on a non-integer with a traceback, and takes a negative one as no wait); None when it is."""
    if value.isdigit():
        return None
    return (f"{SHUTDOWN_TIMEOUT_ENV}: {value!r} is not a whole number of seconds; expected 0 or more "
            f"(unset: {SHUTDOWN_TIMEOUT_S})")


def _nproc_problem(value: str) -> str | None:
    """Why torchrun cannot start ``value`` workers per node (its own reading of the value), or None."""
    from torch.distributed.run import determine_local_world_size

    try:
        count = determine_local_world_size(value)
    except ValueError as exc:
        why = f" ({exc})" if str(exc).endswith("not available.") else ""
    else:
        if count >= 1:
            return None
        why = ""
    return f"--nproc_per_node: {value!r}{why} names no workers; expected a whole number >= 1, or auto, cpu, gpu or xpu"


def _nnodes_problem(value: str) -> str | None:
    """Why torchrun cannot read ``value`` as its node count ``N`` or range ``MIN:MAX``, or None."""
    from torch.distributed.run import parse_min_max_nnodes

    try:
        low, high = parse_min_max_nnodes(value)
    except (ValueError, RuntimeError):
        low, high = 0, 0
    if 1 <= low <= high:
        return None
    return f"--nnodes: {value!r} is no node count; expected N or MIN:MAX, whole numbers with 1 <= MIN <= MAX"


def argument_problems(argv: list[str]) -> list[str]:
    """What torchrun would fail on in ``argv`` after starting (with a traceback on every node, or a
    bare AssertionError for ``--nproc_per_node=0``): ``--nproc_per_node`` (also torchrun's
    ``PET_NPROC_PER_NODE``), ``--nnodes``, and a training script file that does not exist (a ``-m``
    module or ``--no-python`` command is not looked for). Malformed arguments end the process as
    torchrun's argument parser does (usage, exit code 2)."""
    from torch.distributed.run import parse_args

    args = parse_args(argv)
    problems = [p for p in (_nproc_problem(args.nproc_per_node), _nnodes_problem(args.nnodes)) if p]
    if not (args.module or args.no_python) and not os.path.isfile(args.training_script):
        problems.append(f"{args.training_script!r} does not exist; expected the training script (such as train.py), "
                        "relative to this folder or absolute")
    return problems


def main(argv: list[str]) -> int:
    """Run torchrun with ``argv`` until it exits; returns its exit code (2: a bad
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` or :func:`argument_problems`, before torchrun starts)."""
    env = dict(os.environ)
    env.setdefault(SHUTDOWN_TIMEOUT_ENV, str(SHUTDOWN_TIMEOUT_S))
    problems = [p for p in [shutdown_timeout_problem(env[SHUTDOWN_TIMEOUT_ENV])] if p] + argument_problems(argv)
    if problems:
        for problem in problems:
            print(f"parallax_titan.launch: error: {problem}", file=sys.stderr)
        return 2
    if not torchrun_reads_shutdown_timeout():
        print(f"parallax_titan.launch: this torch's torchrun ignores {SHUTDOWN_TIMEOUT_ENV} and kills signalled "
              "workers after 30 s; send SIGTERM to this launcher (it never signals torchrun) to give a save more time",
              file=sys.stderr)
    torchrun = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *argv], env=env)
    signal.signal(signal.SIGTERM, lambda signum, frame: forward_to_workers(torchrun, signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches torchrun and the workers directly
    code = torchrun.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
