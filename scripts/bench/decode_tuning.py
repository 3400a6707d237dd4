"""The decode benchmark's correctness check and launch-configuration sweep (``python -m
scripts.bench.decode --check --sweep``): our kernel against the fp64 reference and the published
kernels, and its time under other block sizes, split counts and merges than the heuristic's."""

from __future__ import annotations

import json

import torch

from kernels import parallax_decode
from kernels.parallax import decode_fused, tuning
from kernels.parallax.decode import parallax_decode_reference
from scripts.bench.decode_timing import DTYPE, HKV, HQ, kv_bytes, log, make_sets, n_sets_for, time_us


def rel_err(out, ref):
    """Relative L2 difference of ``out`` from ``ref``, in fp64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def check(fns):
    """Ours vs the fp64 streaming reference (ragged, GQA 1/2/4, both merges), and
    the competitors vs ours on one shape. Returns rows of results."""
    rows = []
    torch.manual_seed(0)
    for batch, length, hq, hkv, dim, rho in [(4, 4099, 16, 8, 128, 0.5), (3, 5003, 16, 16, 64, 0.5),
                                             (2, 8191, 16, 4, 128, 20.0), (1, 32768, 16, 8, 64, 0.5)]:
        q, r, k, v = make_sets(batch, length, dim, 1, rho, hq, hkv)[0]
        lens = torch.randint(1, length + 1, (batch,), device="cuda", dtype=torch.int32)
        lens[0] = length
        ref = parallax_decode_reference(q.double(), r.double(), k.double(), v.double(), lens, dim**-0.5)
        for fused in (True, False):
            poison = torch.full_like(q, float("nan"))  # the allocator hands this block to the output
            del poison
            out = decode_fused.parallax_decode_triton(q, r, k, v, lens, dim**-0.5, fused_merge=fused)
            rows.append(dict(shape=[batch, length, hq, hkv, dim], rho=rho, fused=fused, err=rel_err(out, ref),
                             finite=bool(torch.isfinite(out).all())))
            log("check", rows[-1])
    q, r, k, v = make_sets(2, 4096, 128, 1)[0]
    ours = parallax_decode(q, r, k, v)
    for name in ("parallax-kernel", "fla"):
        if name in fns:
            rows.append(dict(shape=[2, 4096, HQ, HKV, 128], against=name, err=rel_err(fns[name](q, r, k, v), ours)))
            log("check", rows[-1])
    return rows


SWEEP_SHAPES = [(1, 32768), (32, 16384), (128, 16384)]


def sweep_configs(dim, batch, device):
    """(default, alternatives) (block_n, num_warps, num_stages) of a sweep at head dim ``dim`` and
    ``batch``: the config the kernel picks for batch x HKV groups (``decode_fused.pick_config``), and
    the others of ``tuning.DECODE_CONFIGS`` and ``tuning.DECODE_SWEEP`` for that head dim, each once."""
    default = decode_fused.pick_config(batch * HKV, dim, device)
    alts = [tuning.DECODE_CONFIGS.get(dim), *tuning.DECODE_SWEEP.get(dim, [])]
    return default, [c for c in dict.fromkeys(alts) if c is not None and c != default]


def sweep_trials(dim, batch, length, default, alts):
    """Every trial at one shape as (config (block_n, warps, stages), splits, launch options): each
    config with the heuristic's split count, the default with other split counts (at batch 1 the
    alternative configs too), all as a plan launches by default (separate merge kernel, PDL where the
    plan splits); then the heuristic's launch with the merge inside the split kernel, without PDL and
    with other head dims per merge program. Each launch once: a requested split count that rounds to a
    launch already listed (``decode_fused.split_chunk``) is left out.
    Returns (trials, the heuristic's split count)."""
    trials = []
    for bn, warps, stages in [default] + alts:
        slots = decode_fused.resident_slots(torch.device("cuda"), bn, dim, stages, 2)
        trials.append(((bn, warps, stages), decode_fused.pick_num_splits(batch * HKV, length, bn, slots), {}))
    heur = trials[0][1]
    bn, _, stages = default
    wave = decode_fused.resident_slots(torch.device("cuda"), bn, dim, stages, 2) // (batch * HKV)  # fills a wave
    for splits in sorted({1, 2, max(1, heur // 2), 16, 24, 32, 48, decode_fused.MAX_SPLITS,
                          min(2 * heur, decode_fused.MAX_SPLITS), min(max(wave, 1), decode_fused.MAX_SPLITS)}
                         - {heur}):
        trials.append((default, splits, {}))
        if batch == 1:  # short chunks: a smaller block keeps the pipeline full
            trials += [(alt, splits, {}) for alt in alts]
    if heur > 1:
        trials += [(default, heur, dict(fused_merge=True)), (default, heur, dict(pdl=False))]
        trials += [(default, heur, dict(merge_block_d=dm)) for dm in dict.fromkeys((16, 64, dim))
                   if dm <= dim and dm != decode_fused.pick_merge_block_d(dim)]
    unique = {}  # a requested count can repeat a config's own or round to another's: one trial per launch
    for config, splits, options in trials:
        launch = (config, decode_fused.split_chunk(length, splits, config[0])[1], tuple(options.items()))
        unique.setdefault(launch, (config, splits, options))
    return list(unique.values()), heur


def sweep_shape(dim, batch, length, calls=24, inputs="rotate"):
    """The timed rows of ``sweep_trials`` at one shape (a trial that fails is logged and left out),
    timed as the benchmark table is (``calls`` per graph, ``inputs`` "rotate" or "same"). Each row
    gives the launch its plan made (its split count may round a requested one: ``requested_splits``)."""
    default, alts = sweep_configs(dim, batch, torch.device("cuda"))
    nb = kv_bytes(batch, length, dim)
    sets = make_sets(batch, length, dim, n_sets_for(nb) if inputs == "rotate" else 1)
    trials, heur = sweep_trials(dim, batch, length, default, alts)
    rows = []
    for (bn, warps, stages), splits, options in trials:
        try:
            plan = decode_fused.TritonDecodePlan(batch, HQ, HKV, dim, length, DTYPE, "cuda", scale=dim**-0.5,
                                                 num_splits=splits, block_n=bn, num_warps=warps, num_stages=stages,
                                                 **options)
            us = time_us(plan, sets, min_calls=calls)
        except Exception as exc:
            log("sweep failed", dim, batch, length, bn, warps, stages, repr(exc)[:300])
            continue
        rows.append(dict(D=dim, B=batch, L=length, block_n=bn, warps=warps, stages=stages, splits=plan.num_splits,
                         requested_splits=splits,
                         heuristic=(bn, warps, stages) == default and splits == heur and not options,
                         fused=plan.fused_merge, pdl=plan.pdl, merge_block_d=plan.merge_block_d,
                         us=us, tbps=nb / us / 1e6))
        log("sweep", json.dumps(rows[-1]))
    return rows


def sweep(shapes=SWEEP_SHAPES, calls=24, inputs="rotate"):
    """``sweep_shape`` rows at the (batch, length) ``shapes``, for each head dim of ``tuning.DECODE_SWEEP``."""
    rows = []
    for dim in tuning.DECODE_SWEEP:
        for batch, length in shapes:
            rows += sweep_shape(dim, batch, length, calls, inputs)
            torch.cuda.empty_cache()  # the next shape's input sets need the memory
    return rows
