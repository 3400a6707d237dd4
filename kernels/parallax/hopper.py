"""Hopper (sm_90) kernels of the fused Parallax attention, written in Gluon: the forward, and the
backward's row pass (dq, drho) and column pass (dk, dv). Same formulas, phases, program order and
outputs as ``fused.py``'s Triton kernels (their tile phases, documents' bounds and program order come
from ``fused.py``'s own jit helpers), with the scheduling triton's compiler does not generate for those.

Per program, the tiles the loop does not stream stay in shared memory as wgmma operands (q, rho in
the forward; q, rho, dO in the row pass; k, v in the column pass, which can hold k in registers
instead: ``tuning.HopperConfig.keys_in_registers``); the streamed tiles (k, v; or q,
rho, dO and the four per-query statistics) come through a ring of ``STAGES`` TMA buffers, the next
tiles' copies in flight while a tile is computed. In the forward and the row pass each copy of a slot
signals an mbarrier ring of its own (copies that share an mbarrier get a CTA barrier each from the
compiler). The column pass is warp-specialised: a program covers two adjacent key tiles, one per
consumer warpgroup, and a producer warp copies the query tiles both read (q, rho, dO and the tile's
four statistics, lse, tbar, tau, beta, which the row pass writes into one (4, Hq * T) buffer), so
each query tile is copied once per two key tiles. The forward at D=128 pairs query tiles the same way
(``tuning.HopperConfig.paired``): two consumer warpgroups over adjacent query tiles and a producer
warp copying the k, v tiles both read. A tile's score-shaped
products (s and t; in the backward also dO v^T, or their transposes) are issued together as
asynchronous wgmmas; the softmax weights are computed while the others still run, and the first
output (or gradient) wgmma runs while the next operand is computed. Every wgmma is retired by the end
of its loop iteration: an accumulator in flight across the loop's back edge makes ptxas serialise
every wgmma of the kernel. Deterministic: no atomics.

``unusable`` says why a call cannot take these kernels (then ``fused`` runs its Triton kernels);
``forward`` and ``backward`` launch them with ``tuning.HOPPER_CONFIGS``.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_init, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.parallax import fused, tuning

_NO_SPECIALIZE = ["T", "L", "HQ", "HKV", "GROUP", "WINDOW"]
# A warp-specialised program (the column pass; the paired forward) is 12 warps (two consumer
# warpgroups, a producer warp padded to a warpgroup), one per SM: the launch caps registers at 168
# (65536 / (12 * 32) = 170, in steps of 8) and the partitions re-split them, the producer warp's
# warpgroup down to 24 a thread, each consumer up to (12 * 168 - 4 * 24) / 8 = 240.
_SPECIALISED_MAXNREG = 168
_PRODUCER_REGS = gl.constexpr(24)
_CONSUMER_REGS = (12 * _SPECIALISED_MAXNREG - 4 * _PRODUCER_REGS.value) // 8
# The TMA load's name: async_copy_global_to_shared in triton 3.6 (torch 2.11), async_load later; the
# CTA barrier's: thread_barrier in 3.6, barrier later.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.constexpr_function
def _mma_layout(num_warps, n):
    """Layout of a wgmma accumulator with n columns, its warps stacked along the rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _key_mask(DOCS, offs_m, n0, T, L, WINDOW, BN: gl.constexpr, layout: gl.constexpr, VARLEN: gl.constexpr):
    """[BM, BN] bool in ``layout``: which of keys n0 .. n0 + BN - 1 each query ``offs_m`` reads."""
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    key_lo = fused._first_key(DOCS, offs_m, T, L, WINDOW, VARLEN)
    return (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] >= key_lo[:, None])


@gluon.jit
def _store_tile(PTR, x, t0, h, T, H, D: gl.constexpr, ROWS: gl.constexpr, layout: gl.constexpr):
    """Rows [t0, t0 + ROWS) of head h of a contiguous (T, H, D) tensor from x ([ROWS, D] fp32 in
    ``layout``), in PTR's dtype; rows past T are not written."""
    rows = t0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    at = rows.to(gl.int64)[:, None] * (H * D) + h * D + cols[None, :]
    gl.store(PTR + at, x.to(PTR.dtype.element_ty), mask=(rows < T)[:, None])


@gluon.jit
def _ring(STAGES: gl.constexpr):
    """Initialised mbarriers, one per ring slot, for one TMA copy per slot. Each copy of a slot gets a
    ring of its own: copies that signal one mbarrier each make the compiler put a CTA barrier (bar.sync)
    before every copy, since each copy updates that mbarrier."""
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(bars.index(b), count=1)
    return bars


@gluon.jit
def _once():
    """An initialised mbarrier for the tiles a program loads once."""
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    return bar


@gluon.jit
def _copy_tiles(descs, smems, row, col, bar, pred):
    """TMA copies of the tile at [row, col] of each descriptor of ``descs`` (one block shape) into the
    matching buffer of ``smems``, all signalling ``bar``; nothing when ``pred`` is false."""
    mbarrier.expect(bar, len(descs) * descs[0].block_type.nbytes, pred=pred)
    for i in gl.static_range(len(descs)):
        _tma_load(descs[i], [row, col], bar, smems[i], pred=pred)


@gluon.jit
def _handoff_barriers(STAGES: gl.constexpr):
    """The mbarriers of a warp-specialised program (the column pass, the paired forward): ``ready``
    (a ring slot's copies landed: the producer's expect, count 1), ``empty`` (both consumers released
    the slot: count 2), each [STAGES, 1], and ``own`` ([2, 1], count 1), one per consumer for the tiles
    it copies once itself."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    own = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(empty.index(b), count=2)
    for b in gl.static_range(2):
        mbarrier.init(own.index(b), count=1)
    return ready, empty, own


@gluon.jit
def _wait_slot(rings, slot, phase):
    """Wait until every copy of ring slot ``slot`` (one per ring of ``rings``) landed."""
    for j in gl.static_range(len(rings)):
        mbarrier.wait(rings[j].index(slot), phase)


@gluon.jit
def _retire(acc1, acc2):
    """Wait for every wgmma in flight; the two accumulators back, to be accumulated into again. Done at
    the end of each loop iteration: an accumulator still in flight across the loop's back edge makes
    ptxas serialise every wgmma of the kernel."""
    acc1, acc2 = warpgroup_mma_wait(0, deps=(acc1, acc2))
    return warpgroup_mma_init(acc1), warpgroup_mma_init(acc2)


@gluon.jit
def _turns():
    """The turn mbarriers of a warp-specialised program's two consumers ([2, 1], count 1: the other
    consumer arrives), used when it ping-pongs (``PINGPONG``)."""
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(2):
        mbarrier.init(turns.index(b), count=1)
    return turns


@gluon.jit
def _take_turn(turns, ME: gl.constexpr, j, PINGPONG: gl.constexpr):
    """Ping-pong (``PINGPONG``) between the two consumers of a warp-specialised program: wait, in
    iteration j, until the other consumer issued its output (or gradient) wgmmas of its iteration
    before (consumer 0's first turn is free), so that the two issue theirs in turn and one forms its
    softmax weights while the other's wgmmas run, as FA3's ping-pong schedule does."""
    if PINGPONG:
        mbarrier.wait(turns.index(ME), (j + 1 - ME) & 1)


@gluon.jit
def _pass_turn(turns, ME: gl.constexpr, PINGPONG: gl.constexpr):
    """End consumer ``ME``'s turn (``_take_turn``) once its output (or gradient) wgmmas are issued."""
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - ME), count=1)


@gluon.jit
def _invalidate(rings, loaded, STAGES: gl.constexpr):
    """Invalidate the mbarriers of ``rings`` and the one of the tiles loaded once."""
    for j in gl.static_range(len(rings)):
        for b in gl.static_range(STAGES):
            mbarrier.invalidate(rings[j].index(b))
    mbarrier.invalidate(loaded)


# ----------------------------------------------------------------------------- column pass (dk, dv)
@gluon.jit
def _statistic(stat_smem, slot, j: gl.constexpr, BM: gl.constexpr, layout: gl.constexpr):
    """Statistic ``j`` (0 lse, 1 tbar, 2 tau, 3 beta) of the query tile in ring slot ``slot`` of
    ``stat_smem`` ([STAGES, 4, BM] fp32, unswizzled), as a [BM] tensor in ``layout``."""
    return stat_smem.index(slot).reshape([4 * BM]).slice(j * BM, BM).load(layout)


@gluon.jit
def _column_loads(q_desc, r_desc, do_desc, stats_desc, rows, stat_smem, ready, empty, kv_h, lo, n_per_head, GROUP, T,
                  total, D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr):
    """The producer warp of a column-pass program: copies query tile i (of ``total``: heads kv_h * GROUP ..
    in turn, each from row ``lo`` over ``n_per_head`` tiles of BM rows) into ring slot i % STAGES of
    ``rows`` (q, rho, dO: [STAGES, BM, D] each) and ``stat_smem`` ([STAGES, 4, BM] fp32: lse, tbar, tau,
    beta), signalling ``ready``; a slot is refilled once both consumers released it on ``empty``."""
    nbytes: gl.constexpr = 3 * q_desc.block_type.nbytes + stats_desc.block_type.nbytes
    h = kv_h * GROUP
    m0 = lo
    end = lo + n_per_head * BM
    for i in range(total):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)  # a fresh mbarrier passes parity 1
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        _tma_load(q_desc, [m0, h * D], bar, rows[0].index(slot))
        _tma_load(r_desc, [m0, h * D], bar, rows[1].index(slot))
        _tma_load(do_desc, [m0, h * D], bar, rows[2].index(slot))
        _tma_load(stats_desc, [0, h * T + m0], bar, stat_smem.index(slot))
        m0 += BM
        if m0 >= end:
            m0 = lo
            h += 1


@gluon.jit
def _column_probabilities(st, stat_smem, slot, qk_scale, offs_n, offs_m, ok_m, m0, d_hi, f_hi, DOCS, T, L, WINDOW,
                          BM: gl.constexpr, VARLEN: gl.constexpr, layout: gl.constexpr):
    """p^T ([BN, BM] fp32) from s^T: exp2(qk_scale s - lse) of keys ``offs_n`` and queries ``offs_m``,
    zero outside each query's keys on the masked phases (``fused._column_phases``)."""
    # the statistics are read where they are used: held across the loop body they spill
    pt = gl.exp2(st * qk_scale - _statistic(stat_smem, slot, 0, BM, layout)[None, :])
    if (m0 < d_hi) | (m0 >= f_hi):
        key_lo = fused._first_key(DOCS, offs_m, T, L, WINDOW, VARLEN)
        ok = (offs_n[:, None] <= offs_m[None, :]) & (offs_n[:, None] >= key_lo[None, :]) & ok_m[None, :]
        pt = gl.where(ok, pt, 0.0)
    return pt


@gluon.jit
def _column_gradients(pt, tt, at, dv, do_tile, stat_smem, slot, scale, turns, ME: gl.constexpr, i,
                      PINGPONG: gl.constexpr, BM: gl.constexpr, layout: gl.constexpr, a_layout: gl.constexpr):
    """From p^T and the wgmmas t^T, a^T = (dO v^T)^T in flight: waits for t^T, (``PINGPONG``) for its
    turn of iteration i, issues dv += (p^T (1 + tbar - t^T)) dO, waits for a^T. Returns dv (in flight)
    and g1^T (scaled by ``scale``), g2^T ([BN, BM] fp32); the query tile's tbar, tau, beta from ``stat_smem``."""
    tt = warpgroup_mma_wait(1, deps=(tt, ))
    c = 1.0 + _statistic(stat_smem, slot, 1, BM, layout)[None, :] - tt
    _take_turn(turns, ME, i, PINGPONG)
    dv = warpgroup_mma(gl.convert_layout((pt * c).to(do_tile.dtype), a_layout), do_tile, dv, is_async=True)
    at = warpgroup_mma_wait(1, deps=(at, ))
    beta = _statistic(stat_smem, slot, 3, BM, layout)
    delta = at - beta[None, :]
    bmt = beta - _statistic(stat_smem, slot, 2, BM, layout)
    return dv, pt * (c * delta + bmt[None, :]) * scale, -pt * delta


@gluon.jit
def _column_scores(keys, v_smem, rows, slot, zero_s):
    """The query tile in ring slot ``slot`` of ``rows`` (q, rho, dO) and its score products against a
    column-pass program's key tile (``keys``: k in shared memory or registers; v in ``v_smem``):
    s^T = k q^T, t^T = k rho^T, a^T = v dO^T issued together as asynchronous wgmmas into [BN, BM] fp32
    (``zero_s``'s layout). Returns (q, rho, dO tiles, s^T, t^T, a^T in flight)."""
    q_tile = rows[0].index(slot)
    r_tile = rows[1].index(slot)
    do_tile = rows[2].index(slot)
    st = warpgroup_mma(keys, q_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    tt = warpgroup_mma(keys, r_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    at = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    return q_tile, r_tile, do_tile, st, tt, at


@gluon.jit
def _column_keys(k_desc, v_desc, k_smem, v_smem, rows, stat_smem, ready, empty, kv_ready, turns, DK, DV, n0, kv_h,
                 lo, n_per_head, total, DOCS, DOCE, T, L, HKV, WINDOW, scale, qk_scale, D: gl.constexpr,
                 BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr,
                 KEYS_IN_REGISTERS: gl.constexpr, ME: gl.constexpr, PINGPONG: gl.constexpr,
                 num_warps: gl.constexpr):
    """One consumer warpgroup (``ME``, 0 or 1) of a column-pass program: dk and dv of key tile
    [n0, n0 + BN) of kv head ``kv_h`` (nothing when n0 >= T), written to DK, DV ((T, Hkv, D)). It reads
    the program's stream of query tiles (``_column_loads``: ``total`` tiles in ``rows`` and
    ``stat_smem``), computes the tiles of its own query range (``fused._column_phases``) and releases
    every tile on ``empty`` once its wgmmas retired; k and v ([BN, D] in ``k_smem``, ``v_smem``) it
    copies itself. With ``PINGPONG`` it takes turns with the other consumer on ``turns`` each iteration."""
    dtype: gl.constexpr = rows[0].dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BM)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    keys_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    queries_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    live = n0 < T
    my_lo, d_hi, f_hi, my_hi = fused._column_phases(DOCE, gl.minimum(n0, T - 1), T, L, WINDOW, BM, BN, VARLEN)
    if not live:
        my_hi = my_lo
    _copy_tiles((k_desc, v_desc), (k_smem, v_smem), n0, kv_h * D, kv_ready, live)

    offs_n = n0 + gl.arange(0, BN, layout=keys_layout)
    zero_s = gl.zeros([BN, BM], gl.float32, s_layout)
    dk = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    dv = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    mbarrier.wait(kv_ready, 0, pred=live)
    # k read once into registers as the A operand of two score wgmmas (why: tuning.HOPPER_CONFIGS)
    if KEYS_IN_REGISTERS:
        keys = k_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        keys = k_smem
    m0 = lo
    end = lo + n_per_head * BM
    for i in range(total):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        if (m0 >= my_lo) & (m0 < my_hi):
            q_tile, r_tile, do_tile, st, tt, at = _column_scores(keys, v_smem, rows, slot, zero_s)
            offs_m = m0 + gl.arange(0, BM, layout=queries_layout)
            st = warpgroup_mma_wait(2, deps=(st, ))
            pt = _column_probabilities(st, stat_smem, slot, qk_scale, offs_n, offs_m, offs_m < T, m0, d_hi, f_hi,
                                       DOCS, T, L, WINDOW, BM, VARLEN, queries_layout)
            dv, g1, g2 = _column_gradients(pt, tt, at, dv, do_tile, stat_smem, slot, scale, turns, ME, i,
                                           PINGPONG, BM, queries_layout, a_layout)
            g1 = gl.convert_layout(g1.to(dtype), a_layout)
            g2 = gl.convert_layout(g2.to(dtype), a_layout)
            dk = warpgroup_mma(g1, q_tile, dk, is_async=True)
            dk = warpgroup_mma(g2, r_tile, dk, is_async=True)
            _pass_turn(turns, ME, PINGPONG)
            dk, dv = _retire(dk, dv)
        else:
            _take_turn(turns, ME, i, PINGPONG)
            _pass_turn(turns, ME, PINGPONG)
        fence_async_shared()  # this warpgroup's shared reads of the slot before the next TMA copy into it
        mbarrier.arrive(empty.index(slot), count=1)
        m0 += BM
        if m0 >= end:
            m0 = lo
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    if live:
        _store_tile(DK, dk, n0, kv_h, T, HKV, D, BN, acc_layout)
        _store_tile(DV, dv, n0, kv_h, T, HKV, D, BN, acc_layout)


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_dkdv_hopper_kernel(q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, DK, DV, DOCS, DOCE,
                            T, L, HQ, HKV, GROUP, WINDOW, scale, qk_scale,
                            D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                            VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr,
                            KEYS_IN_REGISTERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr):
    gl.static_assert(num_warps == 4, "each consumer partition is one warpgroup")
    dtype: gl.constexpr = q_desc.dtype
    n0, kv_h = fused._tile_order(T, L, HKV, 2 * BN, VARLEN, True, GLOBAL_ORDER)
    lo, d_hi, f_hi, hi = fused._column_phases(DOCE, n0, T, L, WINDOW, BM, BN, VARLEN)
    n1 = n0 + BN
    if n1 < T:  # the stream covers both key tiles' query ranges
        lo1, d_hi1, f_hi1, hi1 = fused._column_phases(DOCE, n1, T, L, WINDOW, BM, BN, VARLEN)
        hi = gl.maximum(hi, hi1)
    n_per_head = gl.cdiv(hi - lo, BM)
    total = GROUP * n_per_head

    k_smem = gl.allocate_shared_memory(dtype, [2, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, BN, D], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], r_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], do_desc.layout)
    rows = (q_smem, r_smem, do_smem)
    stat_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 4, BM], stats_desc.layout)
    ready, empty, kv_ready = _handoff_barriers(STAGES)
    turns = _turns()

    gl.warp_specialize([
        (_column_keys, (k_desc, v_desc, k_smem.index(0), v_smem.index(0), rows, stat_smem, ready, empty,
                        kv_ready.index(0), turns, DK, DV, n0, kv_h, lo, n_per_head, total, DOCS, DOCE, T, L, HKV,
                        WINDOW, scale, qk_scale, D, BM, BN, STAGES, VARLEN, KEYS_IN_REGISTERS, 0, PINGPONG,
                        num_warps)),
        (_column_keys, (k_desc, v_desc, k_smem.index(1), v_smem.index(1), rows, stat_smem, ready, empty,
                        kv_ready.index(1), turns, DK, DV, n1, kv_h, lo, n_per_head, total, DOCS, DOCE, T, L, HKV,
                        WINDOW, scale, qk_scale, D, BM, BN, STAGES, VARLEN, KEYS_IN_REGISTERS, 1, PINGPONG,
                        num_warps)),
        (_column_loads, (q_desc, r_desc, do_desc, stats_desc, rows, stat_smem, ready, empty, kv_h, lo, n_per_head,
                         GROUP, T, total, D, BM, STAGES)),
    ], [4, 1], [CONSUMER_REGS, _PRODUCER_REGS])


# ----------------------------------------------------------------------------- row pass (dq, drho)
@gluon.jit
def _issue_keys(j, lo, kv_h, k_desc, v_desc, k_smem, v_smem, rings, n_tiles, D: gl.constexpr, BN: gl.constexpr,
                STAGES: gl.constexpr):
    """Start the TMA copies of key tile ``j`` (of ``n_tiles``) into its ring slot, k and v each signalling
    its own ring (``rings``); nothing past the end."""
    go = j < n_tiles
    n0 = lo + j * BN
    slot = j % STAGES
    mbarrier.expect(rings[0].index(slot), k_desc.block_type.nbytes, pred=go)
    mbarrier.expect(rings[1].index(slot), v_desc.block_type.nbytes, pred=go)
    _tma_load(k_desc, [n0, kv_h * D], rings[0].index(slot), k_smem.index(slot), pred=go)
    _tma_load(v_desc, [n0, kv_h * D], rings[1].index(slot), v_smem.index(slot), pred=go)


@gluon.jit
def _query_tile(DOCS, T, L, HQ, GROUP, WINDOW, BM: gl.constexpr, BN: gl.constexpr, VARLEN: gl.constexpr,
                GLOBAL_ORDER: gl.constexpr):
    """This program's query tile in a pass over key tiles (the forward, the row pass): its first row
    m0, head h and kv head, and the key tiles' phases (``fused._row_phases``: lo, a_hi, diag) and
    count from lo."""
    m0, h = fused._tile_order(T, L, HQ, BM, VARLEN, False, GLOBAL_ORDER)
    kv_h = h // GROUP
    lo, a_hi, diag, hi = fused._row_phases(DOCS, m0, T, L, WINDOW, BM, BN, VARLEN)
    n_tiles = gl.cdiv(hi - lo, BN)
    return m0, h, kv_h, lo, a_hi, diag, n_tiles


@gluon.jit
def _key_ring(k_desc, v_desc, D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    """Shared memory for a ring of ``STAGES`` k and v tiles ([STAGES, BN, D] each) and the mbarrier ring
    of each (``_issue_keys`` fills them)."""
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, D], v_desc.layout)
    return k_smem, v_smem, (_ring(STAGES), _ring(STAGES))


@gluon.jit
def _held(value, held, j: gl.constexpr, layout: gl.constexpr):
    """A row-pass statistic ([BM] fp32 in ``layout``): ``value`` kept in registers, or row ``j`` of the
    shared buffer ``held`` ([3, BM] fp32) read here when there is one."""
    if held is not None:
        value = held.index(j).load(layout)
    return value


@gluon.jit
def _row_stats(O, VBAR, STATS, do_smem, m0, h, T, HQ, D: gl.constexpr, BM: gl.constexpr,
               num_warps: gl.constexpr):
    """tau = dO.o and beta = dO.vbar of rows [m0, m0 + BM) of head h ([BM] fp32), stored in STATS's
    planes 2 and 3 ((4, Hq, T) fp32: lse, tbar, tau, beta)."""
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[256 // D, D // 8],
                                            warps_per_cta=[num_warps, 1], order=[1, 0])
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    ok = rows < T
    at = rows.to(gl.int64)[:, None] * (HQ * D) + h * D + cols[None, :]
    do = do_smem.load(layout).to(gl.float32)
    tau = gl.sum(do * gl.load(O + at, mask=ok[:, None], other=0.0).to(gl.float32), 1)
    beta = gl.sum(do * gl.load(VBAR + at, mask=ok[:, None], other=0.0).to(gl.float32), 1)
    stat = h.to(gl.int64) * T + rows
    plane = HQ.to(gl.int64) * T
    gl.store(STATS + 2 * plane + stat, tau, mask=ok)
    gl.store(STATS + 3 * plane + stat, beta, mask=ok)
    return tau, beta


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_dq_hopper_kernel(q_desc, r_desc, do_desc, k_desc, v_desc, O, VBAR, TBAR, LSE, STATS, DQ, DR, DOCS,
                          T, L, HQ, HKV, GROUP, WINDOW, scale, qk_scale,
                          D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                          VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr,
                          STATS_IN_SHARED: gl.constexpr):
    gl.static_assert(STAGES >= 2, "the ring refills the slot of the tile before")
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BN)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    m0, h, kv_h, lo, a_hi, diag, n_tiles = _query_tile(DOCS, T, L, HQ, GROUP, WINDOW, BM, BN, VARLEN, GLOBAL_ORDER)

    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [BM, D], r_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [BM, D], do_desc.layout)
    k_smem, v_smem, rings = _key_ring(k_desc, v_desc, D, BN, STAGES)
    q_ready = _once()

    _copy_tiles((q_desc, r_desc, do_desc), (q_smem, r_smem, do_smem), m0, h * D, q_ready, True)
    for b in gl.static_range(STAGES - 1):
        _issue_keys(b, lo, kv_h, k_desc, v_desc, k_smem, v_smem, rings, n_tiles, D, BN, STAGES)

    offs_m = m0 + gl.arange(0, BM, layout=rows_layout)
    ok_m = offs_m < T
    stat = h.to(gl.int64) * T + offs_m
    lse = gl.load(LSE + stat, mask=ok_m, other=0.0)
    tbar = gl.load(TBAR + stat, mask=ok_m, other=0.0)
    # the column pass reads all four statistics of a query tile with one TMA copy
    gl.store(STATS + stat, lse, mask=ok_m)
    gl.store(STATS + HQ.to(gl.int64) * T + stat, tbar, mask=ok_m)
    mbarrier.wait(q_ready, 0)
    tau, beta = _row_stats(O, VBAR, STATS, do_smem, m0, h, T, HQ, D, BM, num_warps)
    beta = gl.convert_layout(beta, rows_layout)
    bmt = beta - gl.convert_layout(tau, rows_layout)
    held = None
    if STATS_IN_SHARED:  # lse, tbar, beta - tau read where used (tuning.HopperConfig.stats_in_shared)
        held = gl.allocate_shared_memory(gl.float32, [3, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        held.index(0).store(lse)
        held.index(1).store(tbar)
        held.index(2).store(bmt)
        _cta_barrier()  # a row's value may be stored by another thread than those reading it

    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
    dq = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, acc_layout))
    dr = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, acc_layout))
    for j in range(n_tiles):
        slot = j % STAGES
        _wait_slot(rings, slot, (j // STAGES) & 1)
        k_tile = k_smem.index(slot)
        s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        t = warpgroup_mma(r_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        a = warpgroup_mma(do_smem, v_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                 is_async=True)
        s, dq, dr = warpgroup_mma_wait(2, deps=(s, dq, dr))
        _issue_keys(j + STAGES - 1, lo, kv_h, k_desc, v_desc, k_smem, v_smem, rings, n_tiles, D, BN, STAGES)
        p = gl.exp2(s * qk_scale - _held(lse, held, 0, rows_layout)[:, None])
        n0 = lo + j * BN
        if (n0 < a_hi) | (n0 >= diag):
            p = gl.where(_key_mask(DOCS, offs_m, n0, T, L, WINDOW, BN, s_layout, VARLEN), p, 0.0)
        t = warpgroup_mma_wait(1, deps=(t, ))
        c = 1.0 + _held(tbar, held, 1, rows_layout)[:, None] - t
        a = warpgroup_mma_wait(0, deps=(a, ))
        delta = a - beta[:, None]
        g1 = gl.convert_layout((p * (c * delta + _held(bmt, held, 2, rows_layout)[:, None])).to(dtype), a_layout)
        g2 = gl.convert_layout((-p * delta).to(dtype), a_layout)
        dq = warpgroup_mma(g1, k_tile, dq, is_async=True)
        dr = warpgroup_mma(g2, k_tile, dr, is_async=True)
        dq, dr = _retire(dq, dr)

    dq, dr = warpgroup_mma_wait(0, deps=(dq, dr))
    _invalidate(rings, q_ready, STAGES)
    _store_tile(DQ, dq * scale, m0, h, T, HQ, D, BM, acc_layout)
    _store_tile(DR, dr, m0, h, T, HQ, D, BM, acc_layout)


# ----------------------------------------------------------------------------- forward
@gluon.jit
def _fwd_step(s, t, v_tile, offs_m, n0, a_hi, diag, m_i, d1, d2, o1, o2, DOCS, T, L, WINDOW, qk_scale, turns,
              ME: gl.constexpr, j, PINGPONG: gl.constexpr, BN: gl.constexpr, VARLEN: gl.constexpr,
              s_layout: gl.constexpr, acc_rows: gl.constexpr, a_layout: gl.constexpr):
    """Key tile [n0, n0 + BN) of a forward query tile (rows ``offs_m``): from s = q k^T (retired) and
    t = rho k^T (in flight), both [BM, BN] fp32, the online-softmax update of the running max m_i (in
    units of qk_scale * s), the denominators d1 = sum p, d2 = sum p t ([BM]) and o1 += p v, o2 += (p t) v
    ([BM, D] fp32, ``v_tile`` [BN, D] in shared memory); with ``PINGPONG`` (a paired forward on ``turns``) the
    output wgmmas wait for consumer ``ME``'s turn of iteration j. Returns (m_i, d1, d2, o1, o2), every
    wgmma retired."""
    dtype: gl.constexpr = v_tile.dtype
    if (n0 < a_hi) | (n0 >= diag):
        s = gl.where(_key_mask(DOCS, offs_m, n0, T, L, WINDOW, BN, s_layout, VARLEN), s, float("-inf"))
    # m_i in units of qk_scale * s (qk_scale > 0): one FFMA per score instead of a multiply and a subtract
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    d1 = d1 * alpha + gl.sum(p, 1)
    rescale = gl.convert_layout(alpha, acc_rows)[:, None]
    _take_turn(turns, ME, j, PINGPONG)
    o1 = warpgroup_mma(gl.convert_layout(p.to(dtype), a_layout), v_tile, o1 * rescale, is_async=True)
    t = warpgroup_mma_wait(1, deps=(t, ))
    pt = p * t
    d2 = d2 * alpha + gl.sum(pt, 1)
    o2 = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), v_tile, o2 * rescale, is_async=True)
    _pass_turn(turns, ME, PINGPONG)
    o1, o2 = warpgroup_mma_wait(0, deps=(o1, o2))
    return m_new, d1, d2, o1, o2


@gluon.jit
def _fwd_store(O, VBAR, TBAR, LSE, m_i, d1, d2, o1, o2, offs_m, m0, h, T, HQ, D: gl.constexpr, BM: gl.constexpr,
               acc_layout: gl.constexpr):
    """A forward query tile's outputs from its running state (``_fwd_step``): o = (1 + tbar) vbar - o2 / d1
    and vbar = o1 / d1 into O, VBAR ((T, Hq, D)); tbar = d2 / d1 and lse = m_i + log2 d1 into TBAR, LSE
    ((Hq, T) fp32); rows past T are not written."""
    acc_rows: gl.constexpr = gl.SliceLayout(1, acc_layout)
    inv = 1.0 / d1
    tbar = d2 * inv
    inv_rows = gl.convert_layout(inv, acc_rows)[:, None]
    vbar = o1 * inv_rows
    o = (1.0 + gl.convert_layout(tbar, acc_rows))[:, None] * vbar - o2 * inv_rows
    _store_tile(O, o, m0, h, T, HQ, D, BM, acc_layout)
    _store_tile(VBAR, vbar, m0, h, T, HQ, D, BM, acc_layout)
    ok_m = offs_m < T
    stat = h.to(gl.int64) * T + offs_m
    gl.store(TBAR + stat, tbar, mask=ok_m)
    gl.store(LSE + stat, m_i + gl.log2(d1), mask=ok_m)


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _fwd_hopper_kernel(q_desc, r_desc, k_desc, v_desc, O, VBAR, TBAR, LSE, DOCS, T, L, HQ, HKV, GROUP, WINDOW,
                       qk_scale, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                       VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(STAGES >= 2, "the ring refills the slot of the tile before")
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BN)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    acc_rows: gl.constexpr = gl.SliceLayout(1, acc_layout)

    m0, h, kv_h, lo, a_hi, diag, n_tiles = _query_tile(DOCS, T, L, HQ, GROUP, WINDOW, BM, BN, VARLEN, GLOBAL_ORDER)

    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [BM, D], r_desc.layout)
    k_smem, v_smem, rings = _key_ring(k_desc, v_desc, D, BN, STAGES)
    q_ready = _once()

    _copy_tiles((q_desc, r_desc), (q_smem, r_smem), m0, h * D, q_ready, True)
    for b in gl.static_range(STAGES - 1):
        _issue_keys(b, lo, kv_h, k_desc, v_desc, k_smem, v_smem, rings, n_tiles, D, BN, STAGES)

    offs_m = m0 + gl.arange(0, BM, layout=rows_layout)
    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
    m_i = gl.full([BM], -1.0e30, gl.float32, rows_layout)  # finite: fully masked tiles keep alpha = 1, not NaN
    d1 = gl.zeros([BM], gl.float32, rows_layout)
    d2 = gl.zeros([BM], gl.float32, rows_layout)
    o1 = gl.zeros([BM, D], gl.float32, acc_layout)
    o2 = gl.zeros([BM, D], gl.float32, acc_layout)
    mbarrier.wait(q_ready, 0)
    for j in range(n_tiles):
        slot = j % STAGES
        _wait_slot(rings, slot, (j // STAGES) & 1)
        k_tile = k_smem.index(slot)
        s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        t = warpgroup_mma(r_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        # s done; the previous tile's wgmmas retired at its end: its ring slot is free for tile j + STAGES - 1
        s = warpgroup_mma_wait(1, deps=(s, ))
        _issue_keys(j + STAGES - 1, lo, kv_h, k_desc, v_desc, k_smem, v_smem, rings, n_tiles, D, BN, STAGES)
        m_i, d1, d2, o1, o2 = _fwd_step(s, t, v_smem.index(slot), offs_m, lo + j * BN, a_hi, diag, m_i, d1, d2, o1,
                                        o2, DOCS, T, L, WINDOW, qk_scale, None, 0, j, False, BN, VARLEN, s_layout,
                                        acc_rows, a_layout)

    _invalidate(rings, q_ready, STAGES)
    _fwd_store(O, VBAR, TBAR, LSE, m_i, d1, d2, o1, o2, offs_m, m0, h, T, HQ, D, BM, acc_layout)


# ----------------------------------------------------------------------------- forward over paired query tiles
@gluon.jit
def _paired_query_tiles(DOCS, T, L, HQ, GROUP, WINDOW, BM: gl.constexpr, BN: gl.constexpr, VARLEN: gl.constexpr,
                        GLOBAL_ORDER: gl.constexpr):
    """This program's two adjacent query tiles [m0, m0 + 2 BM) of head h: (m0, h, kv head, the first key
    tile ``lo`` of the first query tile and the count of key tiles from lo to the last key of both).
    Document starts and windows only move forward, so the second tile's keys start no earlier."""
    m0, h = fused._tile_order(T, L, HQ, 2 * BM, VARLEN, False, GLOBAL_ORDER)
    lo, a_hi, diag, hi = fused._row_phases(DOCS, m0, T, L, WINDOW, BM, BN, VARLEN)
    if m0 + BM < T:
        lo1, a_hi1, diag1, hi1 = fused._row_phases(DOCS, m0 + BM, T, L, WINDOW, BM, BN, VARLEN)
        hi = hi1
    return m0, h, h // GROUP, lo, gl.cdiv(hi - lo, BN)


@gluon.jit
def _key_loads(k_desc, v_desc, k_smem, v_smem, ready, empty, kv_h, lo, n_tiles, D: gl.constexpr, BN: gl.constexpr,
               STAGES: gl.constexpr):
    """The producer warp of a paired forward: copies key tile j (of ``n_tiles`` from row ``lo`` of kv head
    kv_h) into ring slot j % STAGES of k_smem, v_smem ([STAGES, BN, D]), signalling ``ready``; a slot is
    refilled once both consumers released it on ``empty``."""
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)  # a fresh mbarrier passes parity 1
        _copy_tiles((k_desc, v_desc), (k_smem.index(slot), v_smem.index(slot)), lo + j * BN, kv_h * D,
                    ready.index(slot), True)


@gluon.jit
def _fwd_consumer(q_desc, r_desc, q_smem, r_smem, q_ready, k_smem, v_smem, ready, empty, turns, O, VBAR, TBAR, LSE,
                  DOCS, m0, h, lo, n_tiles, T, L, HQ, WINDOW, qk_scale, D: gl.constexpr, BM: gl.constexpr,
                  BN: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr, ME: gl.constexpr,
                  PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    """One consumer warpgroup (``ME``, 0 or 1) of a paired forward: query tile [m0, m0 + BM) of head h
    (nothing when m0 >= T). It reads the program's stream of key tiles (``_key_loads``: ``n_tiles``
    from ``lo``), computes those of its own key range (``fused._row_phases``) and releases every tile
    on ``empty`` once its wgmmas retired; q and rho ([BM, D] in q_smem, r_smem) it copies itself. With
    ``PINGPONG`` it takes turns with the other consumer on ``turns`` each iteration."""
    s_layout: gl.constexpr = _mma_layout(num_warps, BN)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    acc_rows: gl.constexpr = gl.SliceLayout(1, acc_layout)

    live = m0 < T
    my_lo, a_hi, diag, my_hi = fused._row_phases(DOCS, gl.minimum(m0, T - 1), T, L, WINDOW, BM, BN, VARLEN)
    if not live:
        my_hi = my_lo
    _copy_tiles((q_desc, r_desc), (q_smem, r_smem), m0, h * D, q_ready, live)

    offs_m = m0 + gl.arange(0, BM, layout=rows_layout)
    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
    m_i = gl.full([BM], -1.0e30, gl.float32, rows_layout)  # finite: fully masked tiles keep alpha = 1, not NaN
    d1 = gl.zeros([BM], gl.float32, rows_layout)
    d2 = gl.zeros([BM], gl.float32, rows_layout)
    o1 = gl.zeros([BM, D], gl.float32, acc_layout)
    o2 = gl.zeros([BM, D], gl.float32, acc_layout)
    mbarrier.wait(q_ready, 0, pred=live)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
        n0 = lo + j * BN
        if (n0 >= my_lo) & (n0 < my_hi):
            k_tile = k_smem.index(slot)
            s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            t = warpgroup_mma(r_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            m_i, d1, d2, o1, o2 = _fwd_step(s, t, v_smem.index(slot), offs_m, n0, a_hi, diag, m_i, d1, d2, o1, o2,
                                            DOCS, T, L, WINDOW, qk_scale, turns, ME, j, PINGPONG, BN, VARLEN, s_layout,
                                            acc_rows,
                                            a_layout)
        else:
            _take_turn(turns, ME, j, PINGPONG)
            _pass_turn(turns, ME, PINGPONG)
        fence_async_shared()  # this warpgroup's shared reads of the slot before the next TMA copy into it
        mbarrier.arrive(empty.index(slot), count=1)
    if live:
        _fwd_store(O, VBAR, TBAR, LSE, m_i, d1, d2, o1, o2, offs_m, m0, h, T, HQ, D, BM, acc_layout)


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _fwd_paired_kernel(q_desc, r_desc, k_desc, v_desc, O, VBAR, TBAR, LSE, DOCS, T, L, HQ, HKV, GROUP, WINDOW,
                       qk_scale, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                       VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr,
                       CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr):
    gl.static_assert(num_warps == 4, "each consumer partition is one warpgroup")
    dtype: gl.constexpr = q_desc.dtype
    m0, h, kv_h, lo, n_tiles = _paired_query_tiles(DOCS, T, L, HQ, GROUP, WINDOW, BM, BN, VARLEN, GLOBAL_ORDER)
    q_smem = gl.allocate_shared_memory(dtype, [2, BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [2, BM, D], r_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    ready, empty, q_ready = _handoff_barriers(STAGES)
    turns = _turns()
    gl.warp_specialize([
        (_fwd_consumer, (q_desc, r_desc, q_smem.index(0), r_smem.index(0), q_ready.index(0), k_smem, v_smem, ready,
                         empty, turns, O, VBAR, TBAR, LSE, DOCS, m0, h, lo, n_tiles, T, L, HQ, WINDOW, qk_scale, D,
                         BM, BN, STAGES, VARLEN, 0, PINGPONG, num_warps)),
        (_fwd_consumer, (q_desc, r_desc, q_smem.index(1), r_smem.index(1), q_ready.index(1), k_smem, v_smem, ready,
                         empty, turns, O, VBAR, TBAR, LSE, DOCS, m0 + BM, h, lo, n_tiles, T, L, HQ, WINDOW, qk_scale,
                         D, BM, BN, STAGES, VARLEN, 1, PINGPONG, num_warps)),
        (_key_loads, (k_desc, v_desc, k_smem, v_smem, ready, empty, kv_h, lo, n_tiles, D, BN, STAGES)),
    ], [4, 1], [CONSUMER_REGS, _PRODUCER_REGS])


# ----------------------------------------------------------------------------- launch
_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def unusable(q, total: int, tma_ok: bool, names=("dq", "dkdv"), scale: float = 1.0) -> str | None:
    """Why attention on q (B, L, Hq, D) over ``total`` tokens with softmax ``scale`` cannot run kernels
    ``names`` ("fwd", "dq", "dkdv"), or None. ``tma_ok``: the row tensors' layout allows TMA descriptors
    (``fused._tma_ok``)."""
    if not q.is_cuda:
        return "inputs are not CUDA tensors"
    arch = torch.cuda.get_device_capability(q.device)
    if arch != (9, 0):
        return f"wgmma needs an sm_90 GPU, this one is sm_{arch[0]}{arch[1]}"
    if q.dtype not in _GL_DTYPES:
        return f"dtype {q.dtype} (bf16 or fp16 only)"
    if any(q.shape[-1] not in tuning.HOPPER_CONFIGS[name] for name in names):
        return f"head_dim {q.shape[-1]} has no Hopper config (tuning.HOPPER_CONFIGS)"
    if "fwd" in names and not scale > 0:
        return f"scale {scale}: the forward keeps its running max of unscaled scores (needs scale > 0)"
    if "dkdv" in names and total % 4:
        return f"{total} tokens: the statistics' TMA copies start at 16-byte boundaries (a multiple of 4 tokens)"
    if not tma_ok:
        return "the row tensors' layout does not allow TMA (heads D apart, 16-byte aligned)"
    return None


@functools.cache
def stats_layout():
    """Shared layout of the column pass's (4, BM) fp32 statistics block: unswizzled, so that each
    statistic is a contiguous run of BM values (``_statistic`` slices them)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@functools.cache
def _rows_layout(block_rows: int, d: int, dtype: torch.dtype):
    """Shared layout of a (block_rows, d) tile of ``dtype`` rows. Cached: building it is a sizeable
    part of a launch's host time, and the launches of a training step ask for a handful of them."""
    return gl.NVMMASharedLayout.get_default_for([block_rows, d], _GL_DTYPES[dtype])


def _rows_descriptor(x, stride_t, total, heads, d, block_rows):
    """TMA descriptor over a (T, H, D) tensor with token stride ``stride_t``, viewed as (T, H * D)."""
    return TensorDescriptor(x, [total, heads * d], [stride_t, 1], [block_rows, d], _rows_layout(block_rows, d, x.dtype))


def _query_key_descriptors(q, r, k, v, strides, total, bm, bn):
    """(q, rho, k, v) TMA descriptors: blocks of ``bm`` query rows, ``bn`` key rows."""
    d, hq, hkv = q.shape[-1], q.shape[2], k.shape[2]
    return (_rows_descriptor(q, strides["q"], total, hq, d, bm), _rows_descriptor(r, strides["q"], total, hq, d, bm),
            _rows_descriptor(k, strides["k"], total, hkv, d, bn), _rows_descriptor(v, strides["v"], total, hkv, d, bn))


def _row_descriptors(q, r, k, v, do, strides, total, bm, bn):
    """(q, rho, dO, k, v) TMA descriptors: blocks of ``bm`` query rows, ``bn`` key rows."""
    q_desc, r_desc, k_desc, v_desc = _query_key_descriptors(q, r, k, v, strides, total, bm, bn)
    do_desc = _rows_descriptor(do, strides["do"], total, q.shape[2], q.shape[-1], bm)
    return q_desc, r_desc, do_desc, k_desc, v_desc


def forward(q, r, k, v, outputs, docs, *, strides, total, seq_len, window, qk_scale, varlen):
    """The forward, as ``fused.forward`` calls it (after ``unusable`` returned None for "fwd").

    q, r: (B, L, Hq, D) with token stride ``strides["q"]``; k, v: (B, L, Hkv, D), token strides
    ``strides["k"]``, ``strides["v"]``; bf16 or fp16, heads D apart. ``outputs``: the (o, vbar, tbar,
    lse) buffers written: o, vbar (B, L, Hq, D) contiguous, tbar, lse (Hq, T) fp32. docs: per-token
    document starts (read when ``varlen``); window: the band, at most T; qk_scale: scale * log2(e).
    """
    o, vbar, tbar, lse = outputs
    d, hq, hkv = q.shape[-1], q.shape[2], k.shape[2]
    config = tuning.HOPPER_CONFIGS["fwd"][d]
    descs = _query_key_descriptors(q, r, k, v, strides, total, config.bm, config.bn)
    rows = 2 * config.bm if config.paired else config.bm
    kernel_for("fwd", config)[(triton.cdiv(total, rows) * hq,)](
        *descs, o, vbar, tbar, lse, docs, total, seq_len, hq, hkv, hq // hkv, window, qk_scale,
        **kernel_constexprs("fwd", d, config, varlen))


def backward(q, r, k, v, o, vbar, do, tbar, lse, outputs, docs, doce, *, strides, total, seq_len, window, scale,
             qk_scale, varlen):
    """Both passes, as ``fused.backward`` calls them (after ``unusable`` returned None).

    q, r: (B, L, Hq, D) with token stride ``strides["q"]``; k, v: (B, L, Hkv, D), token strides
    ``strides["k"]``, ``strides["v"]``; o, vbar, do: (B, L, Hq, D) contiguous (``strides["do"]``);
    all bf16 or fp16, heads D apart. tbar, lse: (Hq, T) fp32 from the forward. ``outputs``: the
    (dq, dr, dk, dv) buffers written (contiguous).
    docs, doce: per-token document start/end tables (read when ``varlen``); window: the band, at
    most T; scale: softmax scale; qk_scale: scale * log2(e).
    """
    dq, dr, dk, dv = outputs
    d, hq, hkv = q.shape[-1], q.shape[2], k.shape[2]
    sizes = (total, seq_len, hq, hkv, hq // hkv, window, scale, qk_scale)
    row, column = tuning.HOPPER_CONFIGS["dq"][d], tuning.HOPPER_CONFIGS["dkdv"][d]
    stats = torch.empty((4, hq * total), dtype=torch.float32, device=q.device)  # lse, tbar, tau, beta
    descs = _row_descriptors(q, r, k, v, do, strides, total, row.bm, row.bn)
    kernel_for("dq", row)[(triton.cdiv(total, row.bm) * hq,)](
        *descs, o, vbar, tbar, lse, stats, dq, dr, docs, *sizes, **kernel_constexprs("dq", d, row, varlen))
    descs = _row_descriptors(q, r, k, v, do, strides, total, column.bm, column.bn)
    stats_desc = TensorDescriptor(stats, [4, hq * total], [hq * total, 1], [4, column.bm], stats_layout())
    kernel_for("dkdv", column)[(triton.cdiv(total, 2 * column.bn) * hkv,)](
        *descs, stats_desc, dk, dv, docs, doce, *sizes, **kernel_constexprs("dkdv", d, column, varlen))


def kernel_for(name: str, config: tuning.HopperConfig):
    """The Gluon kernel of pass ``name`` ("fwd", "dq", "dkdv") under ``config``: the forward over paired
    query tiles when ``config.paired``."""
    if name == "fwd":
        return _fwd_paired_kernel if config.paired else _fwd_hopper_kernel
    return {"dq": _bwd_dq_hopper_kernel, "dkdv": _bwd_dkdv_hopper_kernel}[name]


def kernel_constexprs(name: str, d: int, config: tuning.HopperConfig, varlen: bool) -> dict:
    """The constexpr arguments (and num_warps; maxnreg where the config caps registers) of Hopper kernel
    ``name`` ("fwd", "dq", "dkdv") launched with ``config`` at head dim d, in the global program order
    (heaviest tiles first). The warp-specialised kernels (the column pass; the forward when
    ``config.paired``) take their register split besides (the launch's cap and the consumers' share;
    ``tuning`` refuses a cap of the config's own for them), the column pass KEYS_IN_REGISTERS, the row
    pass STATS_IN_SHARED."""
    cap = {} if config.maxnreg is None else {"maxnreg": config.maxnreg}
    out = dict(D=d, BM=config.bm, BN=config.bn, STAGES=config.stages, VARLEN=varlen, GLOBAL_ORDER=True,
               num_warps=config.warps, **cap)
    if name == "dkdv" or config.paired:
        out.update(CONSUMER_REGS=_CONSUMER_REGS, maxnreg=_SPECIALISED_MAXNREG, PINGPONG=config.pingpong)
    if name == "dkdv":
        out["KEYS_IN_REGISTERS"] = config.keys_in_registers
    if name == "dq":
        out["STATS_IN_SHARED"] = config.stats_in_shared
    return out
