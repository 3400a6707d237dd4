"""SM clock, power draw and clock-limit reasons of the GPUs while a benchmark run trains.

An H200 at its power limit lowers its SM clock, so two runs of one invocation can run at different
clocks: a step's time is then set by its energy as much as by its work. ``Sampler`` polls
``nvidia-smi`` every ``interval_ms`` into a CSV file while a run trains; ``summarize`` reduces the
samples taken under load (power draw at least ``LOADED_SHARE`` of the limit: the training steps,
not start-up or compilation) to the median SM clock, median power, the power limit and the shares
of samples whose clocks were held down by the power cap or by anything else (thermal slowdown,
power brake). Without ``nvidia-smi`` a sampler records nothing and ``summarize`` gives None.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from dataclasses import dataclass

QUERY = "clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active"
LOADED_SHARE = 0.5
# bits of clocks_throttle_reasons.active (NVML's nvmlClocksEventReasons)
IDLE, POWER_CAP = 0x1, 0x4
SLOWDOWNS = 0x8 | 0x20 | 0x40 | 0x80  # hardware slowdown, software and hardware thermal, power brake


@dataclass(frozen=True)
class Sample:
    """One GPU's reading: SM clock (MHz), power draw and limit (W), clock-limit reason bits."""

    sm_mhz: float
    power_w: float
    limit_w: float
    reasons: int


def visible_gpu_indices(env: dict | None = None) -> list[str]:
    """``nvidia-smi -i`` indices of the GPUs a run sees: ``CUDA_VISIBLE_DEVICES`` when it lists
    indices, else all GPUs (an empty list)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return parts if parts and all(p.isdigit() for p in parts) else []


def parse_line(line: str) -> Sample | None:
    """A sample from one CSV line of ``QUERY`` (noheader, nounits); None for a line nvidia-smi could
    not fill (``[N/A]``, ``[Not Supported]``) or a cut-off last line."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 4:
        return None
    try:
        return Sample(float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3], 16))
    except ValueError:
        return None


def summarize(lines: list[str]) -> dict | None:
    """The samples under load reduced to ``samples``, ``sm_mhz`` and ``power_w`` (medians),
    ``limit_w``, ``power_capped`` and ``slowed`` (shares of the samples with those reason bits);
    None when no sample was under load."""
    samples = [s for s in map(parse_line, lines) if s is not None]
    loaded = [s for s in samples if s.limit_w > 0 and s.power_w >= LOADED_SHARE * s.limit_w]
    if not loaded:
        return None
    return {
        "samples": len(loaded),
        "sm_mhz": statistics.median(s.sm_mhz for s in loaded),
        "power_w": statistics.median(s.power_w for s in loaded),
        "limit_w": max(s.limit_w for s in loaded),
        "power_capped": sum(bool(s.reasons & POWER_CAP) for s in loaded) / len(loaded),
        "slowed": sum(bool(s.reasons & SLOWDOWNS) for s in loaded) / len(loaded),
    }


def summarize_file(path: str) -> dict | None:
    """``summarize`` of a sampler's CSV file; None when the file is missing."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return summarize(f.readlines())


class Sampler:
    """``with Sampler(path, env):`` polls ``nvidia-smi`` into ``path`` while the block runs (every
    ``interval_ms``, the GPUs ``env``'s ``CUDA_VISIBLE_DEVICES`` lists); without ``nvidia-smi`` it
    writes an empty file."""

    def __init__(self, path: str, env: dict | None = None, interval_ms: int = 250):
        if interval_ms < 1:
            raise ValueError(f"interval_ms = {interval_ms}: expected an int >= 1")
        self.path, self.env, self.interval_ms = path, env, interval_ms
        self._proc = self._file = None

    def command(self) -> list[str]:
        """The ``nvidia-smi`` polling command."""
        indices = visible_gpu_indices(self.env)
        select = ["-i", ",".join(indices)] if indices else []
        return ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                f"-lms={self.interval_ms}", *select]

    def __enter__(self) -> "Sampler":
        self._file = open(self.path, "w")
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(self.command(), stdout=self._file, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._file.close()
