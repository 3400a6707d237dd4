"""Launch configurations of the fused kernels, in one place: training attention
(``kernels/parallax/fused.py``) and decode (``kernels/parallax/decode_fused.py``, the ``DECODE_*`` names).

Attention has three kernels, named ``"fwd"`` (forward), ``"dq"`` (backward row pass: dq, drho) and ``"dkdv"``
(backward column pass: dk, dv). A config is a ``triton.Config`` whose kwargs hold the tile sizes
``BM`` (query rows) and ``BN`` (key rows), the program order ``GLOBAL_ORDER``, for ``"dkdv"``
``ROWS`` (queries on the rows of its score tiles), optionally ``TMA`` (row tiles read through tensor
descriptors where the inputs allow); ``num_warps`` and ``num_stages`` as usual.

* ``SHIPPED[name]``: the short candidate lists the kernels autotune over (the tile winners of the
  H200 sweeps in docs/kernels.md, each in both program orders).
* ``SWEEP[name]``: the wider candidate lists a sweep times to choose ``SHIPPED``.
* Which config a launch runs (``choose``): an explicit config if given; under
  ``TRITON_INTERPRET=1`` ``INTERPRET_CONFIG``; below ``SMALL_WORK`` (or with one candidate) the
  first candidate; else triton's autotuner over the candidates, keyed by ``TUNE_KEY``.
* Choosing configs yourself: per call, ``fused.forward(..., config=)`` and
  ``fused.backward(..., dq_config=, dkdv_config=)`` take a ``triton.Config`` or a dict of launch
  kwargs (``launch_kwargs``); for every launch in a block, also through
  ``kernels.parallax_attention``, ``with tuning.candidates(dkdv=[...]):`` (a list of one config runs
  that config; ``with tuning.candidates(**tuning.SWEEP):`` autotunes over the sweep lists).
* ``autotune_report()``: what the autotuners chose, and their timings, per key; ``autotuner(name)``:
  the autotuner kernel ``name`` launches now.
* The Hopper kernels (``hopper.py``, Gluon) take the place of the ``"fwd"``, ``"dq"`` and ``"dkdv"``
  kernels where they apply, with ``HOPPER_CONFIGS`` (a ``HopperConfig`` per kernel and head dim; ``with
  tuning.hopper_config(name, head_dim, config):`` runs another); ``with tuning.hopper_kernels(False):``
  keeps the Triton kernels (as do explicit configs, and ``candidates`` lists: the forward's for the
  forward, either pass's for the backward).

Decode is not autotuned: a table per head dim gives (block_n, num_warps, num_stages), and
``decode_fused.pick_num_splits`` the split count; ``decode_fused.parallax_decode_triton`` takes
explicit ``block_n``, ``num_warps``, ``num_stages``, ``num_splits`` to override them.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import NamedTuple

import triton

KERNEL_NAMES = ("fwd", "dq", "dkdv")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _config(bm, bn, warps, stages, **flags):
    return triton.Config({"BM": bm, "BN": bn, **flags}, num_warps=warps, num_stages=stages)


def both_orders(tiles, **flags) -> tuple:
    """Configs for (BM, BN, num_warps, num_stages) tiles, each in both program orders (head-major
    and globally heaviest-first, ``GLOBAL_ORDER``), with constexpr ``flags`` (e.g. ``ROWS=True``)."""
    return tuple(_config(*t, GLOBAL_ORDER=g, **flags) for t in tiles for g in (False, True))


# The D=128 and D=64 tile winners of four measured H200 sweeps (bf16), each in both program orders.
# The column pass mostly runs with queries on the rows of its tiles (ROWS): each thread then holds two
# of every per-query statistic instead of eight. At D=128 one stage beats two (two spill inside the
# loop), at D=64 two stages win; keys x queries at 32 x 64 keeps B1 L16384 D128 (docs/kernels.md).
# Row tiles through TMA (``TMA``) were as fast or faster at every tile but the row pass's 128 x 32,
# 2-30% (docs/bench/attention_loops.md); where the inputs' layout does not allow TMA, these configs
# run the same tiles with pointer loads. The forward's 128 x 64 runs in global order only: timed
# interleaved, head-major was 3% slower at B4 L4096 D128 (1-2% faster at B1 L16384), and forward +
# backward 0.8% slower; triton's autotuner, timing each candidate alone for ~100 ms, where the global
# order runs slower, ranked head-major first (docs/bench/attention_autotune.md).
SHIPPED = {
    "fwd": (_config(128, 64, 8, 3, GLOBAL_ORDER=True, TMA=True),) + both_orders([(64, 64, 4, 3)], TMA=True),
    "dq": both_orders([(128, 32, 8, 3)]) + both_orders([(64, 64, 4, 4)], TMA=True),
    "dkdv": both_orders([(64, 64, 4, 1), (64, 64, 4, 2)], ROWS=True, TMA=True) + both_orders([(32, 64, 4, 3)], TMA=True),
}
# Tile shapes around the shipped winners; a config joins SHIPPED when it wins a sweep.
SWEEP = {
    "fwd": both_orders([(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 2),
                        (64, 128, 4, 3)]),
    "dq": both_orders([(128, 32, 8, 3), (64, 64, 4, 4), (64, 32, 4, 4), (64, 64, 4, 2)]),
    "dkdv": both_orders([(64, 64, 4, 1), (64, 64, 4, 2), (32, 128, 8, 1), (32, 128, 8, 2), (32, 64, 4, 1),
                         (64, 32, 4, 2)], ROWS=True)
    + both_orders([(32, 64, 4, 3), (32, 128, 8, 2), (32, 128, 8, 3), (16, 128, 4, 3)]),
}
# The shipped tiles with their row tiles read by TMA tensor descriptors (``TMA``: the K/V tiles of the
# forward and row pass, the Q, rho and dO tiles of the column pass); a sweep times them beside SWEEP's
# pointer loads.
TMA_SWEEP = {
    "fwd": both_orders([(128, 64, 8, 3), (64, 64, 4, 3)], TMA=True),
    "dq": both_orders([(128, 32, 8, 3), (64, 64, 4, 4)], TMA=True),
    "dkdv": both_orders([(64, 64, 4, 1), (64, 64, 4, 2)], ROWS=True, TMA=True)
    + both_orders([(32, 64, 4, 3)], TMA=True),
}
SWEEP = {name: SWEEP[name] + TMA_SWEEP[name] for name in SWEEP}
# Small tiles for the CPU interpreter (large tiles take minutes there).
INTERPRET_CONFIG = {"BM": 16, "BN": 16, "num_warps": 4, "num_stages": 1}
# The autotuner's key (power-of-two buckets of the token count T, the sequence length L and the keys
# per query W, min(window, L)): shapes of one token count (B4 x L4096 vs B1 x L16384) prefer different
# configs, and so may windows; the choice per key is stored by triton's cache (cache_results), a
# restart does not re-tune.
TUNE_KEY = ["D", "VARLEN", "PREC", "TMA_OK", "TUNE_T", "TUNE_L", "TUNE_W"]
# Below this much work (tokens x keys per query x heads x head dim) a kernel runs for microseconds and
# autotuning (compiling and timing every candidate) costs more than it can save: small problems
# (MAD's models, unit tests) take the first candidate. Training shapes are 100x above it.
SMALL_WORK = 2**30


class HopperConfig(NamedTuple):
    """Launch config of a Hopper kernel (kernels/parallax/hopper.py): tile rows ``bm`` (queries) and
    ``bn`` (keys), ``warps``, ``stages`` of the TMA ring, ``maxnreg``, a cap on registers per thread
    (ptxas's; None: no cap) that lets one more program share an SM, and ``keys_in_registers`` (the
    column pass only): its k tile is held in registers as the A operand of the score wgmmas instead of
    being read from shared memory by each of them. The column pass runs two warpgroups of ``warps`` = 4,
    each over its own key tile of ``bn`` rows (a program covers 2 bn keys), and a producer warp; it
    splits its registers itself (``maxnreg`` stays None). ``paired`` (the forward only) runs the forward
    that way too: two consumer warpgroups over adjacent query tiles of ``bm`` rows and a producer warp
    copying the k, v tiles both read, each copied once per 2 bm queries. ``stats_in_shared`` (the row
    pass only) keeps three of its per-query statistics (lse, tbar, beta - tau) in shared memory, read
    where they are used, instead of in registers across its loop, where they spill at D=128. ``pingpong``
    (the warp-specialised kernels: the column pass, a paired forward) makes their two consumers take
    turns, as FA3's ping-pong schedule: one issues its output (or gradient) wgmmas and next score
    wgmmas while the other computes its softmax weights."""

    bm: int
    bn: int
    warps: int
    stages: int
    maxnreg: int | None = None
    keys_in_registers: bool = False
    paired: bool = False
    stats_in_shared: bool = False
    pingpong: bool = False


# The Hopper kernels, per kernel name and head dim: the fastest of the H200 sweeps at B4 L4096
# (docs/bench/attention_hopper.md); the row pass at D=64 with a ring of four stages since the column
# pass reads its statistics with one copy (2% faster than three, interleaved). The forward at D=64
# capped at 168 registers (170 uncapped, no spills either way): three programs per SM instead of two.
# The forward at D=128 pairs its query tiles (two consumer warpgroups share each k, v copy): the same
# bits, 1-5% faster alone; paired at D=64 it is slower (docs/bench/attention_hopper_forward_paired.md).
# The column pass at D=128 keeps k in registers (3-6% off the backward with triton 3.6): its score
# wgmmas have 32 columns, where reading both operands from shared memory asks more bytes per cycle
# than it serves. From triton 3.9 the same kernel needs more registers than its consumers' 240 to
# keep its wgmmas asynchronous (ptxas serialises them all), so k stays in shared memory.
# The column pass at D=64 runs its two consumers in turns (ping-pong): 1-2.3% off the backward on an H200
# and on an H100, the same bits; at D=128 turns are slower (docs/bench/attention_hopper_pingpong.md).
# The row pass at D=128 keeps three statistics in shared memory (13 spills instead of 20): the same
# bits, 0.5-0.6% off the backward at L4096 and L16384, even at B8 L2048 (docs/bench/attention_hopper_row.md).
KEYS_FIT_IN_REGISTERS = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 9)
HOPPER_CONFIGS = {
    "fwd": {128: HopperConfig(64, 64, 4, 2, paired=True), 64: HopperConfig(64, 64, 4, 3, 168)},
    "dq": {128: HopperConfig(64, 64, 4, 2, stats_in_shared=True), 64: HopperConfig(64, 32, 4, 4)},
    "dkdv": {128: HopperConfig(32, 64, 4, 3, keys_in_registers=KEYS_FIT_IN_REGISTERS),
             64: HopperConfig(64, 64, 4, 3, pingpong=True)},
}
_hopper = [True]

# Decode, per head dim: (block_n, num_warps, num_stages), from the H200 sweep (docs/kernels_decode.md).
DECODE_CONFIGS = {64: (128, 4, 3), 128: (64, 4, 3)}
# Several waves of (batch, kv head) groups: more programs per SM (D=128: 2 stages, 3 fit instead
# of 2) or more warps (D=64) hide more latency; measured at B=128 (docs/kernels_decode.md).
DECODE_MANY_GROUPS_CONFIGS = {64: (128, 8, 3), 128: (64, 4, 2)}
DECODE_DEFAULT_CONFIG = (32, 4, 2)  # head dims the sweep did not cover
# Other (block_n, num_warps, num_stages) a decode sweep times beside DECODE_CONFIGS.
DECODE_SWEEP = {128: [(64, 4, 2), (64, 4, 4), (32, 4, 3), (32, 4, 4), (128, 4, 2)],
                64: [(64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 8, 3), (32, 4, 3)]}
# Fewest cache positions one decode split handles: below this the partial writes and the merge cost
# more than the extra parallelism buys.
DECODE_MIN_CHUNK = 128
# Head dims one program of the separate decode merge combines: many short programs (a 0.6B decode
# step at batch 1 has 16 heads) instead of one per (batch, kv head) group walking its heads in turn.
DECODE_MERGE_BLOCK_D = 32

_active: dict[str, tuple] = dict(SHIPPED)
_tuners: dict = {}  # (name, candidate strings) -> triton Autotuner


def launch_kwargs(config) -> dict:
    """A ``triton.Config`` (or a dict of launch kwargs, returned as a copy) as the dict of launch
    kwargs that ``fused.forward``/``fused.backward`` take: its kwargs plus num_warps, num_stages."""
    if isinstance(config, dict):
        return dict(config)
    if not isinstance(config, triton.Config):
        raise TypeError(f"config must be a triton.Config or a dict, got {type(config).__name__}")
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def active(name: str) -> tuple:
    """The candidate configs kernel ``name`` autotunes over now (``SHIPPED`` outside ``candidates``)."""
    _check_name(name)
    return _active[name]


@contextlib.contextmanager
def candidates(**lists):
    """Within the block, kernels ``fwd``, ``dq``, ``dkdv`` (keywords) autotune over the given lists of
    ``triton.Config`` instead of ``SHIPPED``; a list of one config runs that config at every size.
    Process-wide (not per thread); nests; restores the previous lists on exit."""
    for name, configs in lists.items():
        _check_name(name)
        if not configs or not all(isinstance(c, triton.Config) for c in configs):
            raise ValueError(f"candidates({name}=...) must be a non-empty list of triton.Config, got {configs!r}")
    saved = dict(_active)
    _active.update({name: tuple(configs) for name, configs in lists.items()})
    try:
        yield
    finally:
        _active.clear()
        _active.update(saved)


@contextlib.contextmanager
def hopper_kernels(enabled: bool):
    """Within the block, attention runs the Hopper kernels where they apply (``enabled``, the default
    outside any block) or always the Triton kernels. Process-wide; nests."""
    if not isinstance(enabled, bool):
        raise TypeError(f"hopper_kernels(enabled) takes a bool, got {enabled!r}")
    _hopper.append(enabled)
    try:
        yield
    finally:
        _hopper.pop()


def _hopper_config_error(config: HopperConfig) -> str | None:
    """What is wrong with ``config``'s values, or None: tiles powers of two from 16 (wgmma's and TMA's
    shapes), whole warpgroups, a ring of at least two stages (each refills the slot of the tile before)."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in config[:4]):
        return "bm, bn, warps and stages must be ints"
    if any(t < 16 or t & (t - 1) for t in (config.bm, config.bn)):
        return f"bm and bn must be powers of two >= 16, got {config.bm} and {config.bn}"
    if config.warps < 4 or config.warps % 4:
        return f"warps must be a multiple of 4 (whole warpgroups), got {config.warps}"
    if config.stages < 2:
        return f"stages must be at least 2, got {config.stages}"
    cap = config.maxnreg
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or not 24 <= cap <= 255 or cap % 8):
        return f"maxnreg must be None or a multiple of 8 from 24 to 255 (registers per thread), got {cap!r}"
    if not isinstance(config.keys_in_registers, bool):
        return f"keys_in_registers must be a bool, got {config.keys_in_registers!r}"
    return None


def _score_rows_error(name: str, config: HopperConfig) -> str | None:
    """Why kernel ``name`` cannot run ``config``'s score tiles, or None: their rows (bm in the forward
    and the row pass, bn in the column pass) are wgmma's M, a multiple of 64."""
    field = "bn" if name == "dkdv" else "bm"
    rows = getattr(config, field)
    if rows % 64:
        return f"{field} must be a multiple of 64 for {name!r} (the rows of its score tiles, wgmma's M), got {rows}"
    return None


def _specialised_error(name: str, config: HopperConfig) -> str | None:
    """Why a warp-specialised kernel (the column pass; the forward with ``paired``) cannot run ``config``,
    or None: each of its consumer partitions is one warpgroup, and it sets its registers itself
    (hopper.py's split between its partitions). Only the forward pairs query tiles."""
    if not isinstance(config.paired, bool):
        return f"paired must be a bool, got {config.paired!r}"
    if config.paired and name != "fwd":
        return f"paired applies to the forward 'fwd' only, not {name!r}"
    if not isinstance(config.pingpong, bool):
        return f"pingpong must be a bool, got {config.pingpong!r}"
    if config.pingpong and name != "dkdv" and not config.paired:
        return (f"pingpong needs two consumer warpgroups (the column pass 'dkdv' or a paired 'fwd'), "
                f"not an unpaired {name!r}")
    if name != "dkdv" and not config.paired:
        return None
    what = f"{name!r}" if name == "dkdv" else "a paired 'fwd'"
    if config.warps != 4:
        return f"warps must be 4 for {what} (each of its two consumer partitions is one warpgroup), got {config.warps}"
    if config.maxnreg is not None:
        return (f"maxnreg must be None for {what} (it splits its registers between its partitions itself), "
                f"got {config.maxnreg}")
    return None


def _pass_option_error(name: str, config: HopperConfig) -> str | None:
    """Why kernel ``name`` cannot take the option of one pass that ``config`` asks for (k in registers,
    the statistics in shared memory), or None: only the column pass keeps a k tile, only the row pass
    those statistics."""
    if config.keys_in_registers and name != "dkdv":
        return f"keys_in_registers applies to the column pass 'dkdv' only, not {name!r}"
    if not isinstance(config.stats_in_shared, bool):
        return f"stats_in_shared must be a bool, got {config.stats_in_shared!r}"
    if config.stats_in_shared and name != "dq":
        return f"stats_in_shared applies to the row pass 'dq' only, not {name!r}"
    return None


@contextlib.contextmanager
def hopper_config(name: str, head_dim: int, config: HopperConfig):
    """Within the block, Hopper kernel ``name`` ("fwd", "dq" or "dkdv") runs ``config`` at ``head_dim`` (sweeps,
    tests); its values are checked first. Process-wide; nests; restores the previous config on exit."""
    if name not in HOPPER_CONFIGS or head_dim not in HOPPER_CONFIGS[name]:
        raise ValueError(f"no Hopper kernel {name!r} at head dim {head_dim}; expected a name in "
                         f"{sorted(HOPPER_CONFIGS)} and a head dim in {sorted(HOPPER_CONFIGS.get(name, {}))}")
    if not isinstance(config, HopperConfig):
        raise TypeError(f"config must be a tuning.HopperConfig, got {config!r}")
    bad = (_hopper_config_error(config) or _score_rows_error(name, config) or _specialised_error(name, config)
           or _pass_option_error(name, config))
    if bad:
        raise ValueError(f"{config!r}: {bad}")
    saved = HOPPER_CONFIGS[name][head_dim]
    HOPPER_CONFIGS[name][head_dim] = config
    try:
        yield
    finally:
        HOPPER_CONFIGS[name][head_dim] = saved


def hopper_wanted(*names: str) -> bool:
    """Whether kernels ``names`` may run as the Hopper kernels: enabled (``hopper_kernels``), each has a
    Hopper config, and their Triton candidate lists are the shipped ones (a ``candidates`` block asks
    for the Triton kernels under its configs, so it gets them)."""
    return _hopper[-1] and all(name in HOPPER_CONFIGS and active(name) == SHIPPED[name] for name in names)


def choose(name: str, work: int, config=None, *, interpret: bool = INTERPRET) -> dict | None:
    """Launch kwargs kernel ``name`` runs with, or None when the autotuner picks among ``active(name)``.

    work: tokens x keys per query x heads x head dim of the call. An explicit ``config``
    (``triton.Config`` or dict) runs as given, in the global program order unless it says.
    """
    configs = active(name)
    if config is None and interpret:
        config = configs[0] if configs is not SHIPPED[name] else INTERPRET_CONFIG
    if config is None and (work < SMALL_WORK or len(configs) == 1):
        config = configs[0]
    if config is None:
        return None
    return {"GLOBAL_ORDER": True, **launch_kwargs(config)}


def wants_tma(name: str, config=None) -> bool:
    """Whether a launch of kernel ``name`` may run with the ``TMA`` flag: its explicit ``config`` has it,
    or, without one, a candidate of ``active(name)`` does."""
    if config is not None:
        return bool(launch_kwargs(config).get("TMA", False))
    return any(c.kwargs.get("TMA", False) for c in active(name))


def select(name: str, kernel, work: int, config=None):
    """(callable, launch kwargs) for JIT ``kernel`` (fused's kernel ``name``): the kernel with the
    chosen config, or an autotuner over ``active(name)`` (built once per candidate list)."""
    launch = choose(name, work, config)
    if launch is not None:
        return kernel, launch
    configs = active(name)
    key = tuner_key(name, configs)
    if key not in _tuners:
        extra = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
        _tuners[key] = triton.autotune(configs=list(configs), key=TUNE_KEY, **extra)(kernel)
    return _tuners[key], {}


def tuner_key(name: str, configs) -> tuple:
    """The key under which the autotuner of kernel ``name`` over the candidate list ``configs`` is
    kept (one autotuner per list)."""
    return (name, tuple(str(c) for c in configs))


def autotuner(name: str):
    """The triton autotuner kernel ``name`` launches over ``active(name)`` now, or None before its first
    autotuned launch (its ``best_config`` is the last choice, ``cache`` every choice by key)."""
    return _tuners.get(tuner_key(name, active(name)))


def autotune_report() -> dict:
    """Per autotuner used so far: ``{name: [{"candidates": [...], "best": {key: config},
    "last_timings_ms": {config: ms}}]}`` (the timings of the last key it tuned)."""
    out: dict = {name: [] for name in KERNEL_NAMES}
    for (name, configs), tuner in _tuners.items():
        timings = getattr(tuner, "configs_timings", None) or {}
        out[name].append({
            "candidates": list(configs),
            "best": {str(key): str(cfg) for key, cfg in tuner.cache.items()},
            "last_timings_ms": {str(c): (t[0] if isinstance(t, (list, tuple)) else t) for c, t in timings.items()},
        })
    return out


def _check_name(name):
    if name not in KERNEL_NAMES:
        raise ValueError(f"kernel name {name!r} is not one of {KERNEL_NAMES}")
