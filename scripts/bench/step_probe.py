"""train.py under probes that ask where a training step's time goes, for ``scripts.bench.train --probe``.

    torchrun ... -m scripts.bench.step_probe [PROBES] -- --job.config_file ... (train.py's arguments)

- ``--cuda-profile-step N``: step N under the PyTorch profiler recording GPU activity only (no CPU
  ops, so the host runs at nearly its unprofiled speed), the trace written to
  ``<job.dump_folder>/gpu_profile/rank<R>_step<N>.json`` (``--trace-dir`` instead of that folder;
  ``scripts.bench.trace_summary`` reads it: the GPU's idle time is then what an unprofiled step
  loses to the host); the step's host wall time is logged.
- ``--gpu-sleep-ms X``: the GPU spins about X ms (``torch.cuda._sleep``, calibrated once) before
  every forward, timed by CUDA events and logged. The step lengthens by X unless the GPU was
  waiting on the host or held below its clock by its power limit: both let the sleep be absorbed.
- ``--host-delay-us U``: the host spins U us before every attention forward and backward call
  (``kernels.parallax.fused``; 2 x 28 calls per 0.6B step). The step lengthens only if the GPU
  catches up with the host there.

Every probe changes what is measured; the runs are for these questions, not for throughput rows.
"""

from __future__ import annotations

import argparse
import math
import os
import runpy
import sys
import time
from pathlib import Path

from parallax_titan.launch_env import set_defaults  # imports no torch

set_defaults()  # as train.py does, before torch

import torch  # noqa: E402

from scripts.bench.results import positive_int  # noqa: E402

TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "train.py")


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0")
    return value


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The probes (before ``--``) and train.py's arguments (after it); argparse errors name the bad value."""
    if "--" not in argv:
        raise SystemExit("scripts.bench.step_probe: expected PROBES -- TRAIN_ARGS")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="scripts.bench.step_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--cuda-profile-step", type=positive_int, help="step profiled (GPU activity only)")
    parser.add_argument("--trace-dir",
                        help="folder of the profile's trace (default: the run's dump folder's gpu_profile)")
    parser.add_argument("--gpu-sleep-ms", type=_non_negative_float, default=0.0, help="GPU spin before each forward")
    parser.add_argument("--host-delay-us", type=_non_negative_float, default=0.0,
                        help="host spin before each attention call")
    args = parser.parse_args(argv[:split])
    if args.trace_dir is not None and args.cuda_profile_step is None:
        parser.error("--trace-dir without --cuda-profile-step: no step is profiled")
    return args, argv[split + 1:]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def delay_attention_calls(delay_us: float) -> None:
    """Spin the host ``delay_us`` before every ``kernels.parallax.fused`` forward and backward."""
    from kernels.parallax import fused

    def delayed(fn):
        def call(*args, **kwargs):
            _spin(delay_us * 1e-6)
            return fn(*args, **kwargs)
        return call

    fused.forward, fused.backward = delayed(fused.forward), delayed(fused.backward)


def sleep_cycles(ms: float) -> int:
    """``torch.cuda._sleep`` cycles that spin about ``ms`` on the current GPU (timed at its clock now)."""
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return max(1, int(probe * ms / start.elapsed_time(end)))


def sleep_before_forward(trainer_cls, ms: float) -> None:
    """Spin the GPU about ``ms`` before every micro-batch's forward; each spin's time is logged."""
    original = trainer_cls.forward_backward_step
    state = {"cycles": None, "pending": None}

    def forward_backward_step(self, **kwargs):
        if state["cycles"] is None:
            state["cycles"] = sleep_cycles(ms)
        if state["pending"] is not None:  # the last spin ran (the step that queued it has ended)
            a, b = state["pending"]
            print(f"[step_probe] step {self.step}: GPU sleep before the last forward {a.elapsed_time(b):.2f} ms",
                  file=sys.stderr)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(state["cycles"])
        b.record()
        state["pending"] = (a, b)
        return original(self, **kwargs)

    trainer_cls.forward_backward_step = forward_backward_step


def profile_step(trainer_cls, step: int, trace_dir: str | None) -> None:
    """Step ``step`` under the profiler with GPU activity only; trace to ``trace_dir`` (None: the
    run's ``<job.dump_folder>/gpu_profile``)."""
    from torch.profiler import ProfilerActivity, profile

    original, original_train = trainer_cls.train_step, trainer_cls.train

    def train(self):
        if self.job_config.training.steps < step:
            raise SystemExit(f"scripts.bench.step_probe: --cuda-profile-step {step} is past training.steps = "
                             f"{self.job_config.training.steps}: no step would be profiled")
        return original_train(self)

    def train_step(self, data_iterator):
        if self.step != step:
            return original(self, data_iterator)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            original(self, data_iterator)
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - start) * 1e3
        folder = trace_dir or os.path.join(self.job_config.job.dump_folder, "gpu_profile")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{int(os.environ.get('RANK', '0'))}_step{step}.json")
        prof.export_chrome_trace(path)
        print(f"[step_probe] step {step}: GPU-only profile, host wall {wall_ms:.1f} ms, trace {path}", file=sys.stderr)

    trainer_cls.train, trainer_cls.train_step = train, train_step


def main(argv: list[str] | None = None) -> None:
    """Install the probes, then run train.py on the arguments after ``--``."""
    args, train_args = parse_args(sys.argv[1:] if argv is None else argv)
    if (args.cuda_profile_step or args.gpu_sleep_ms) and not torch.cuda.is_available():
        raise SystemExit("scripts.bench.step_probe: --cuda-profile-step and --gpu-sleep-ms need a CUDA GPU")
    print(f"[step_probe] {vars(args)}", file=sys.stderr)
    from parallax_titan.trainer import ParallaxTrainer

    if args.host_delay_us:
        delay_attention_calls(args.host_delay_us)
    if args.gpu_sleep_ms:
        sleep_before_forward(ParallaxTrainer, args.gpu_sleep_ms)
    if args.cuda_profile_step:
        profile_step(ParallaxTrainer, args.cuda_profile_step, args.trace_dir and os.path.abspath(args.trace_dir))
    # run as its own script (nothing imports the entry point): its exit codes come with it
    sys.argv = [TRAIN_SCRIPT, *train_args]
    runpy.run_path(TRAIN_SCRIPT, run_name="__main__")


if __name__ == "__main__":
    main()
