"""A one-pass Parallax backward on Hopper, timed beside the shipped two-pass backward: why
``kernels/parallax/hopper.py`` computes dq and drho in a row pass of their own.

The one-pass backward recomputes the three score products once per (key tile, query tile) pair
instead of twice (8 L x L x D matmul passes instead of 11). Its column pass must then add each key
tile's partial dq and drho of a query tile to those of the other key tiles. Here: 8 warps, two
warpgroups of 64 keys each (key tiles of 128, query tiles of 32); per query tile the pass forms
g1, g2 as the shipped column pass does, stores them to shared memory and computes
``dq^T = K^T g1^T`` and ``drho^T = K^T g2^T`` ([D, 32] fp32, D split over the warpgroups). The
partials of query tile (h, m) are summed in fp32 in global memory:

- ``ordered`` (deterministic): in ascending key-tile order. A counter per (h, m) says how many key
  tiles added theirs; a tile waits for its turn, the first stores, the middle ones add
  (``red.global.add.f32``), the last adds the sum it loads and writes the bf16 result. Programs
  start heaviest first, i.e. in ascending key-tile order, so a tile only waits for tiles already
  running. A tile releases its counter one query tile later (after a CTA barrier and a release
  fence), so that the fence finds its adds done.
- ``unordered``: every tile adds as soon as it is done (not deterministic), the reduction's cost
  without the ordering.
- ``no partials``: the same pass without the dq and drho partials, the cost of its structure.

    python -m scripts.bench.attention_one_pass --out docs/bench/attention_hopper_one_pass

Kept as a benchmark, not as a kernel: measured on an H200 it is slower than the two passes (the
results page); ``check`` holds its gradients to fp64 and its ordered sums to the same bits on a rerun.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_init, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.parallax import fused, hopper, naive
from kernels.parallax.hopper import (_NO_SPECIALIZE, _column_gradients, _column_probabilities, _column_scores,
                                     _invalidate, _mma_layout, _once, _ring, _tma_load, _wait_slot)

# The CTA barrier's name: thread_barrier in triton 3.6 (torch 2.11), barrier from 3.9.
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# partials modes: how each key tile's dq, drho partials reach the sum over key tiles
NO_PARTIALS, UNORDERED, ORDERED = 0, 1, 2
MODES = {"no partials": NO_PARTIALS, "unordered": UNORDERED, "ordered": ORDERED}
BM, BN, STAGES, WARPS = 32, 128, 3, 8
SHAPES = [(4, 4096, 16, 8), (1, 16384, 16, 8), (8, 2048, 16, 8)]  # B, L, Hq, Hkv (D = 128)
CHECK_SHAPES = [(2, 1000, 4, 2), (4, 4096, 16, 8)]


# ----------------------------------------------------------------------------- the column pass's loop
# One key tile per program, the query tiles' copies issued from the loop: the column pass hopper.py
# shipped before its paired key tiles, which this one-pass kernel extends.
@gluon.jit
def _issue_rows(i, n_per_head, lo, kv_h, GROUP, T, row_descs, stats_desc, row_smem, stat_smem, rings,
                total, D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copies of query tile ``i`` (of ``total``) into its ring slot: the q, rho, dO rows and
    the tile's lse, tbar, tau, beta (one copy of a (4, BM) block), each copy signalling its own ring
    (``rings``); nothing past the end."""
    go = i < total
    h = kv_h * GROUP + i // n_per_head
    m0 = lo + (i % n_per_head) * BM
    slot = i % STAGES
    for j in gl.static_range(3):
        mbarrier.expect(rings[j].index(slot), row_descs[j].block_type.nbytes, pred=go)
    mbarrier.expect(rings[3].index(slot), stats_desc.block_type.nbytes, pred=go)
    for j in gl.static_range(3):
        _tma_load(row_descs[j], [m0, h * D], rings[j].index(slot), row_smem[j].index(slot), pred=go)
    _tma_load(stats_desc, [0, h * T + m0], rings[3].index(slot), stat_smem.index(slot), pred=go)


@gluon.jit
def _column_start(q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, n0, kv_h, lo, n_per_head, GROUP, T,
                  D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    """Shared memory of a column-pass program over key tile [n0, n0 + BN) of kv head ``kv_h``, with the
    copies of its k and v tiles and of its first STAGES - 1 query tiles started: (k_smem, v_smem,
    row_smem (q, rho, dO rings of [STAGES, BM, D]), stat_smem ([STAGES, 4, BM] fp32), rings (the
    mbarrier rings of the row and statistics copies), kv_ready (k and v's mbarrier))."""
    dtype: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, [BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BN, D], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], r_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], do_desc.layout)
    row_smem = (q_smem, r_smem, do_smem)
    stat_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 4, BM], stats_desc.layout)
    rings = (_ring(STAGES), _ring(STAGES), _ring(STAGES), _ring(STAGES))
    kv_ready = _once()

    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes)
    _tma_load(k_desc, [n0, kv_h * D], kv_ready, k_smem)
    _tma_load(v_desc, [n0, kv_h * D], kv_ready, v_smem)
    for b in gl.static_range(STAGES - 1):
        _issue_rows(b, n_per_head, lo, kv_h, GROUP, T, (q_desc, r_desc, do_desc), stats_desc, row_smem, stat_smem,
                    rings, GROUP * n_per_head, D, BM, STAGES)
    return k_smem, v_smem, row_smem, stat_smem, rings, kv_ready


@gluon.jit
def _column_tile(i, keys, v_smem, row_smem, rings, zero_s, lo, n_per_head, kv_h, GROUP, T, BM: gl.constexpr,
                 STAGES: gl.constexpr, layout: gl.constexpr):
    """Query tile ``i`` of a column-pass program (``keys``: its k tile in shared memory or registers):
    waits for the tile's copies and issues s^T = k q^T, t^T = k rho^T and a^T = v dO^T as asynchronous
    wgmmas. Returns (ring slot, q, rho, dO tiles, the three wgmmas in flight, head, first query row,
    the rows ([BM] in ``layout``) and which of them are < T)."""
    slot = i % STAGES
    _wait_slot(rings, slot, (i // STAGES) & 1)
    q_tile, r_tile, do_tile, st, tt, at = _column_scores(keys, v_smem, row_smem, slot, zero_s)
    h = kv_h * GROUP + i // n_per_head
    m0 = lo + (i % n_per_head) * BM
    offs_m = m0 + gl.arange(0, BM, layout=layout)
    return slot, q_tile, r_tile, do_tile, st, tt, at, h, m0, offs_m, offs_m < T


@gluon.jit
def _relaxed_load(ptr):
    """The int32 at ``ptr`` (a scalar pointer), read at L2 without ordering."""
    return gl.inline_asm_elementwise("ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _acquire(x):
    """x back, after an acquire fence: what follows sees what the counter's writer wrote before it."""
    return gl.inline_asm_elementwise("fence.acq_rel.gpu;\n mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _red_add(addresses, x):
    """Add x (fp32) at ``addresses`` (int64) without reading back: gl.atomic_add compiles to ATOMG with
    a result register, which ptxas waits on."""
    return gl.inline_asm_elementwise("red.relaxed.gpu.global.add.f32 [$1], $2;\n mov.b32 $0, 0;", "=r,l,f",
                                     [addresses, x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _add_partial(ACC, OUT, x, h, m0, T, HQ, first, last, D: gl.constexpr, BM: gl.constexpr, layout: gl.constexpr):
    """Add a key tile's partial x ([D, BM] fp32 in ``layout``, x[d, m] of query m0 + m, head h) to the
    fp32 sum ACC ((T, HQ, D)): store it (first), add it (middle), or add it to the sum and write OUT
    ((T, HQ, D), OUT's dtype; last)."""
    d = gl.arange(0, D, layout=gl.SliceLayout(1, layout))
    m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    at = m.to(gl.int64)[None, :] * (HQ * D) + h * D + d[:, None]
    mask = (m < T)[None, :] & (d < D)[:, None]
    if last:
        if not first:
            x = x + gl.load(ACC + at, mask=mask, other=0.0, cache_modifier=".cg")
        gl.store(OUT + at, x.to(OUT.dtype.element_ty), mask=mask)
    elif first:
        gl.store(ACC + at, x, mask=mask)
    else:
        # masked rows (past T) add 0.0 to ACC[0] (inline asm takes no mask): query tile 0's, whose one key
        # tile writes its result without reading ACC
        _red_add((ACC + gl.where(mask, at, 0)).to(gl.int64, bitcast=True), gl.where(mask, x, 0.0))


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_one_pass_kernel(q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, DK, DV, DQ, DR, DQ_SUM, DR_SUM, TURNS,
                         DOCS, DOCE, T, L, HQ, HKV, GROUP, WINDOW, scale, qk_scale,
                         D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                         VARLEN: gl.constexpr, num_warps: gl.constexpr, PARTIALS: gl.constexpr):
    gl.static_assert(BN == D, "dq^T shares the score tiles' layout: BN rows of keys, D rows of dq^T")
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BM)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    keys_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    queries_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    g_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)

    n0, kv_h = fused._tile_order(T, L, HKV, BN, VARLEN, True, True)
    lo, d_hi, f_hi, hi = fused._column_phases(DOCE, n0, T, L, WINDOW, BM, BN, VARLEN)
    n_per_head = gl.cdiv(hi - lo, BM)
    total = GROUP * n_per_head
    n_query_tiles = gl.cdiv(T, BM)

    k_smem, v_smem, row_smem, stat_smem, rings, kv_ready = _column_start(
        q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, n0, kv_h, lo, n_per_head, GROUP, T, D, BM, BN, STAGES)
    # g1^T, g2^T of two query tiles: a warpgroup may store tile i + 1's while the other still reads tile i's
    g1_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], g_layout)
    g2_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], g_layout)

    offs_n = n0 + gl.arange(0, BN, layout=keys_layout)
    zero_s = gl.zeros([BN, BM], gl.float32, s_layout)
    dk = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    dv = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    keys_t = k_smem.permute((1, 0))
    held = TURNS  # the counter of the query tile whose partials were added last, released one tile later
    holding = n0 < 0
    mbarrier.wait(kv_ready, 0)
    for i in range(total):
        slot, q_tile, r_tile, do_tile, st, tt, at, h, m0, offs_m, ok_m = _column_tile(
            i, k_smem, v_smem, row_smem, rings, zero_s, lo, n_per_head, kv_h, GROUP, T, BM, STAGES, queries_layout)
        # this key tile's place among the key tiles of query tile (h, m0); its counter read early
        rank = (n0 - fused._row_phases(DOCS, m0, T, L, WINDOW, BM, BN, VARLEN)[0]) // BN
        last = n0 == (m0 // BN) * BN
        turn_ptr = TURNS + h * n_query_tiles + m0 // BM
        turn = _relaxed_load(turn_ptr)

        st = warpgroup_mma_wait(2, deps=(st, ))
        pt = _column_probabilities(st, stat_smem, slot, qk_scale, offs_n, offs_m, ok_m, m0, d_hi, f_hi, DOCS, T, L,
                                   WINDOW, BM, VARLEN, queries_layout)
        dv, g1, g2 = _column_gradients(pt, tt, at, dv, do_tile, stat_smem, slot, scale, None, 0, 0, False, BM,
                                       queries_layout, a_layout)
        g1 = g1.to(dtype)
        g2 = g2.to(dtype)
        g1_tile = g1_smem.index(i % 2)
        g2_tile = g2_smem.index(i % 2)
        g1_tile.store(g1)
        g2_tile.store(g2)
        dk = warpgroup_mma(gl.convert_layout(g1, a_layout), q_tile, dk, is_async=True)
        dk = warpgroup_mma(gl.convert_layout(g2, a_layout), r_tile, dk, is_async=True)
        fence_async_shared()
        # both warpgroups stored their keys' g rows and finished tile i - 1: its ring slot is free, its adds issued
        _cta_barrier()
        if (PARTIALS == 2) and holding:
            gl.atomic_add(held, 1, sem="release", scope="gpu")
        _issue_rows(i + STAGES - 1, n_per_head, lo, kv_h, GROUP, T, (q_desc, r_desc, do_desc), stats_desc,
                    row_smem, stat_smem, rings, total, D, BM, STAGES)
        dqt = warpgroup_mma(keys_t, g1_tile, zero_s, use_acc=False, is_async=True)
        drt = warpgroup_mma(keys_t, g2_tile, zero_s, use_acc=False, is_async=True)
        dk, dv, dqt, drt = warpgroup_mma_wait(0, deps=(dk, dv, dqt, drt))
        dk = warpgroup_mma_init(dk)
        dv = warpgroup_mma_init(dv)
        if PARTIALS != 0:
            if PARTIALS == 2:
                while turn != rank:
                    turn = _relaxed_load(turn_ptr)
                turn = _acquire(turn)
            _add_partial(DQ_SUM, DQ, dqt, h, m0, T, HQ, rank == 0, last, D, BM, s_layout)
            _add_partial(DR_SUM, DR, drt, h, m0, T, HQ, rank == 0, last, D, BM, s_layout)
        held = turn_ptr
        holding = not last

    _cta_barrier()
    if (PARTIALS == 2) and holding:
        gl.atomic_add(held, 1, sem="release", scope="gpu")
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    _invalidate(rings, kv_ready, STAGES)
    hopper._store_tile(DK, dk, n0, kv_h, T, HKV, D, BN, acc_layout)
    hopper._store_tile(DV, dv, n0, kv_h, T, HKV, D, BN, acc_layout)


@triton.jit
def _statistics_kernel(O, VBAR, DO, TBAR, LSE, STATS, T, HQ, D: tl.constexpr, BT: tl.constexpr):
    """The column pass's statistics of BT rows of one head: STATS ((4, HQ, T) fp32) planes lse, tbar,
    tau = dO.o, beta = dO.vbar (the two-pass backward's row pass writes them)."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    h = tl.program_id(1)
    ok = rows < T
    at = rows.to(tl.int64)[:, None] * (HQ * D) + h * D + tl.arange(0, D)[None, :]
    do = tl.load(DO + at, mask=ok[:, None], other=0.0).to(tl.float32)
    tau = tl.sum(do * tl.load(O + at, mask=ok[:, None], other=0.0).to(tl.float32), 1)
    beta = tl.sum(do * tl.load(VBAR + at, mask=ok[:, None], other=0.0).to(tl.float32), 1)
    stat = h.to(tl.int64) * T + rows
    plane = HQ.to(tl.int64) * T
    tl.store(STATS + stat, tl.load(LSE + stat, mask=ok), mask=ok)
    tl.store(STATS + plane + stat, tl.load(TBAR + stat, mask=ok), mask=ok)
    tl.store(STATS + 2 * plane + stat, tau, mask=ok)
    tl.store(STATS + 3 * plane + stat, beta, mask=ok)


def one_pass_backward(do, q, r, k, v, o, vbar, tbar, lse, scale, mode: str = "ordered"):
    """dq, dr (B, L, Hq, D) and dk, dv (B, L, Hkv, D) of causal Parallax attention, bf16, D = 128, in one
    column pass (``mode``: a key of ``MODES``; "no partials" leaves dq and dr unwritten).

    do, q, r, o, vbar: (B, L, Hq, D) contiguous; k, v: (B, L, Hkv, D) contiguous; tbar, lse: (Hq, B * L)
    fp32 from ``fused.forward``; scale: the softmax scale."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {sorted(MODES)}")
    b, n, hq, d = q.shape
    hkv, total = k.shape[2], b * n
    if d != BN or q.dtype != torch.bfloat16 or not q.is_cuda:
        raise ValueError(f"one_pass_backward: bf16 CUDA tensors with head dim {BN} only, got {q.dtype} D={d}")
    dq, dr, dk, dv = (torch.empty_like(x) for x in (q, r, k, v))
    stats = torch.empty((4, hq * total), dtype=torch.float32, device=q.device)
    _statistics_kernel[(triton.cdiv(total, 64), hq)](o, vbar, do, tbar, lse, stats, total, hq, D=d, BT=64)
    sums = [torch.empty((total, hq, d), dtype=torch.float32, device=q.device) for _ in range(2)]
    turns = torch.zeros(hq * triton.cdiv(total, BM), dtype=torch.int32, device=q.device)
    strides = {"q": hq * d, "do": hq * d, "k": hkv * d, "v": hkv * d}
    descs = hopper._row_descriptors(q, r, k, v, do, strides, total, BM, BN)
    stats_desc = TensorDescriptor(stats, [4, hq * total], [hq * total, 1], [4, BM], hopper.stats_layout())
    docs = torch.empty(1, dtype=torch.int32, device=q.device)  # read only for packed documents
    _bwd_one_pass_kernel[(triton.cdiv(total, BN) * hkv,)](
        *descs, stats_desc, dk, dv, dq, dr, *sums, turns, docs, docs, total, n, hq, hkv, hq // hkv, total, scale,
        scale * 1.4426950408889634, D=d, BM=BM, BN=BN, STAGES=STAGES, VARLEN=False, num_warps=WARPS,
        PARTIALS=MODES[mode])
    return dq, dr, dk, dv


def compiled(mode: str = "ordered"):
    """The one-pass kernel in ``mode`` compiled for sm_90 (no GPU needed), for resource and SASS checks."""
    from scripts.bench import kernel_resources

    sums = {"DQ_SUM": "*fp32", "DR_SUM": "*fp32", "TURNS": "*i32"}
    types = {**kernel_resources.hopper_descriptor_types(BM, BN, BN), **sums}
    constexprs = dict(D=BN, BM=BM, BN=BN, STAGES=STAGES, VARLEN=False, num_warps=WARPS, PARTIALS=MODES[mode])
    return kernel_resources.compile_gluon(_bwd_one_pass_kernel, constexprs, types, pointers=set(sums))


def _problem(shape, seed=0):
    """Random bf16 inputs of ``shape`` (B, L, Hq, Hkv; D = 128), dO, and the forward's saved tensors."""
    from scripts.bench.attention import make_inputs

    q, r, k, v = make_inputs(*shape, BN, seed)
    do = torch.randn_like(q)
    scale = BN ** -0.5
    return (do, q, r, k, v, *fused.forward(q, r, k, v, scale)), scale


def _relative(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def check(shape) -> dict:
    """At ``shape``: the one-pass gradients (ordered) against the two-pass ones, against fp64 autograd
    through ``naive`` (at most 4096 tokens), and whether a rerun and the unordered sums give its bits."""
    args, scale = _problem(shape)
    names = ("dq", "dr", "dk", "dv")
    one = one_pass_backward(*args, scale)
    two = fused.backward(*args, scale)
    row = {"B": shape[0], "L": shape[1], "Hq": shape[2], "Hkv": shape[3],
           "rerun_same_bits": all(torch.equal(a, b) for a, b in zip(one, one_pass_backward(*args, scale))),
           "unordered_same_bits": all(torch.equal(a, b) for a, b in zip(one, one_pass_backward(*args, scale,
                                                                                              "unordered"))),
           "vs_two_pass": {n: _relative(a, b) for n, a, b in zip(names, one, two)}}
    if shape[0] * shape[1] <= 4096:
        do, q, r, k, v = args[:5]
        x = [t.detach().double().requires_grad_() for t in (q, r, k, v)]
        exact = torch.autograd.grad(naive.parallax_attention_naive(*x, scale=scale), x, do.double())
        row["one_pass_vs_fp64"] = {n: _relative(a, b) for n, a, b in zip(names, one, exact)}
        row["two_pass_vs_fp64"] = {n: _relative(a, b) for n, a, b in zip(names, two, exact)}
    return row


def timings(shape, rounds: int = 5) -> dict:
    """ms of the two-pass backward and of the one pass in each mode at ``shape``, interleaved: ``rounds``
    rounds, each a triton.testing.do_bench median per candidate; the median of the rounds."""
    from scripts.bench.attention_autotune import do_bench_ms, interleaved_ms

    args, scale = _problem(shape)
    fns = {"two passes (shipped)": lambda: fused.backward(*args, scale),
           **{f"one pass, {mode}": lambda mode=mode: one_pass_backward(*args, scale, mode) for mode in
              ("ordered", "unordered", "no partials")}}
    for fn in fns.values():
        fn()  # compiles outside the timing
    ms = interleaved_ms(fns, rounds, 1, do_bench_ms)
    return {"B": shape[0], "L": shape[1], "Hq": shape[2], "Hkv": shape[3], "ms": ms}


MEASURED = ("backward time (bf16, causal, D=128) of the shipped two-pass backward (fused.backward) and of a "
            "one-pass backward (scripts/bench/attention_one_pass.py) with dq and drho summed over key tiles in order "
            "(deterministic), unordered, or not at all, on one forward's outputs, timed interleaved (5 rounds, "
            "each a triton.testing.do_bench median per candidate; the median of the rounds); and the one pass's "
            "gradients against the two passes' and fp64")


def report_markdown(checks: list[dict], rows: list[dict]) -> str:
    from scripts.bench.results import table

    names = list(rows[0]["ms"])
    timing = table(["B", "L", "Hq/Hkv", *[f"{n} ms" for n in names], "ordered / two passes"],
                   ((r["B"], r["L"], f"{r['Hq']}/{r['Hkv']}", *[f"{r['ms'][n]:.3f}" for n in names],
                     f"{r['ms']['one pass, ordered'] / r['ms'][names[0]]:.2f}") for r in rows))
    fmt = lambda d: ", ".join(f"{k} {v:.1e}" for k, v in d.items()) if d else "-"  # noqa: E731
    agree = table(["B", "L", "Hq/Hkv", "vs two passes (max rel.)", "one pass vs fp64", "two passes vs fp64",
                   "rerun: same bits", "unordered: the ordered bits"],
                  ((c["B"], c["L"], f"{c['Hq']}/{c['Hkv']}", fmt(c["vs_two_pass"]), fmt(c.get("one_pass_vs_fp64")),
                    fmt(c.get("two_pass_vs_fp64")), "yes" if c["rerun_same_bits"] else "no",
                    "yes" if c["unordered_same_bits"] else "no") for c in checks))
    return "\n".join(["## Time", "", *timing, "", "## Agreement", "", *agree]) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Check and time the one pass, write the page and its JSON (``--out``), print the page."""
    from scripts.bench.results import command_line, describe, write_results

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.attention_one_pass", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/bench/attention_hopper_one_pass",
                        help="output path without extension (default %(default)s)")
    args = parser.parse_args(argv)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        raise SystemExit("scripts.bench.attention_one_pass needs an sm_90 GPU (H100, H200)")
    checks = [check(shape) for shape in CHECK_SHAPES]
    rows = [timings(shape) for shape in SHAPES]
    meta = describe("A one-pass backward on Hopper beside the two passes", MEASURED, command_line(__spec__.name, argv))
    print(write_results(args.out, meta, report_markdown(checks, rows), {"checks": checks, "rows": rows}))


if __name__ == "__main__":
    main()
