"""Draft: the column pass with a producer warp (TMA copies) and compute warpgroups: one key tile per program
(`_bwd_dkdv_ws_kernel`), or two adjacent key tiles per program sharing one stream of query tiles
(`_bwd_dkdv_pair_kernel`)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_init, warpgroup_mma_wait)

from kernels.parallax import fused
from kernels.parallax.hopper import (_NO_SPECIALIZE, _column_probabilities, _mma_layout, _retire, _statistic,
                                     _store_tile, _tma_load)


@gluon.jit
def _ws_loads(q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, k_smem, v_smem, q_smem, r_smem, do_smem,
              stat_smem, ready, empty, kv_ready, n0, kv_h, lo, n_per_head, GROUP, T, total,
              D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes)
    _tma_load(k_desc, [n0, kv_h * D], kv_ready, k_smem)
    _tma_load(v_desc, [n0, kv_h * D], kv_ready, v_smem)
    nbytes: gl.constexpr = 3 * q_desc.block_type.nbytes + stats_desc.block_type.nbytes
    h = kv_h * GROUP
    m0 = lo
    end = lo + n_per_head * BM
    for i in range(total):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        _tma_load(q_desc, [m0, h * D], bar, q_smem.index(slot))
        _tma_load(r_desc, [m0, h * D], bar, r_smem.index(slot))
        _tma_load(do_desc, [m0, h * D], bar, do_smem.index(slot))
        _tma_load(stats_desc, [0, h * T + m0], bar, stat_smem.index(slot))
        m0 += BM
        if m0 >= end:
            m0 = lo
            h += 1


@gluon.jit
def _gradients(pt, tt, at, dv, do_tile, stat_smem, slot, scale, BM: gl.constexpr, layout: gl.constexpr,
               a_layout: gl.constexpr, LEAN: gl.constexpr):
    tt = warpgroup_mma_wait(1, deps=(tt, ))
    if LEAN:
        # c scaled by `scale` (dv is divided by it at the end), no negations
        c = scale * (1.0 + _statistic(stat_smem, slot, 1, BM, layout))[None, :] - scale * tt
        dv = warpgroup_mma(gl.convert_layout((pt * c).to(do_tile.dtype), a_layout), do_tile, dv, is_async=True)
        at = warpgroup_mma_wait(1, deps=(at, ))
        beta = _statistic(stat_smem, slot, 3, BM, layout)
        nd = beta[None, :] - at
        sbmt = scale * (beta - _statistic(stat_smem, slot, 2, BM, layout))
        return dv, pt * (sbmt[None, :] - c * nd), pt * nd
    else:
        c = 1.0 + _statistic(stat_smem, slot, 1, BM, layout)[None, :] - tt
        dv = warpgroup_mma(gl.convert_layout((pt * c).to(do_tile.dtype), a_layout), do_tile, dv, is_async=True)
        at = warpgroup_mma_wait(1, deps=(at, ))
        beta = _statistic(stat_smem, slot, 3, BM, layout)
        delta = at - beta[None, :]
        bmt = beta - _statistic(stat_smem, slot, 2, BM, layout)
        return dv, pt * (c * delta + bmt[None, :]) * scale, -pt * delta


@gluon.jit
def _ws_compute(k_smem, v_smem, q_smem, r_smem, do_smem, stat_smem, ready, empty, kv_ready, n0, lo, d_hi, f_hi,
                n_per_head, total, DOCS, T, L, WINDOW, scale, qk_scale, D: gl.constexpr, BM: gl.constexpr,
                BN: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr, KEYS_IN_REGISTERS: gl.constexpr,
                LEAN: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BM)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    keys_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    queries_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    offs_n = n0 + gl.arange(0, BN, layout=keys_layout)
    zero_s = gl.zeros([BN, BM], gl.float32, s_layout)
    dk = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    dv = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    mbarrier.wait(kv_ready, 0)
    if KEYS_IN_REGISTERS:
        keys = k_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        keys = k_smem
    m0 = lo
    end = lo + n_per_head * BM
    for i in range(total):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        q_tile = q_smem.index(slot)
        r_tile = r_smem.index(slot)
        do_tile = do_smem.index(slot)
        st = warpgroup_mma(keys, q_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        tt = warpgroup_mma(keys, r_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        at = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        offs_m = m0 + gl.arange(0, BM, layout=queries_layout)
        st = warpgroup_mma_wait(2, deps=(st, ))
        pt = _column_probabilities(st, stat_smem, slot, qk_scale, offs_n, offs_m, offs_m < T, m0, d_hi, f_hi, DOCS,
                                   T, L, WINDOW, BM, VARLEN, queries_layout)
        dv, g1, g2 = _gradients(pt, tt, at, dv, do_tile, stat_smem, slot, scale, BM, queries_layout, a_layout, LEAN)
        g1 = gl.convert_layout(g1.to(dtype), a_layout)
        g2 = gl.convert_layout(g2.to(dtype), a_layout)
        dk = warpgroup_mma(g1, q_tile, dk, is_async=True)
        dk = warpgroup_mma(g2, r_tile, dk, is_async=True)
        dk, dv = _retire(dk, dv)
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)
        m0 += BM
        if m0 >= end:
            m0 = lo
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    if LEAN:
        dv = dv * (1.0 / scale)
    return dk, dv


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_dkdv_ws_kernel(q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, DK, DV, DOCS, DOCE,
                        T, L, HQ, HKV, GROUP, WINDOW, scale, qk_scale,
                        D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                        VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr,
                        KEYS_IN_REGISTERS: gl.constexpr, LEAN: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    n0, kv_h = fused._tile_order(T, L, HKV, BN, VARLEN, True, GLOBAL_ORDER)
    lo, d_hi, f_hi, hi = fused._column_phases(DOCE, n0, T, L, WINDOW, BM, BN, VARLEN)
    n_per_head = gl.cdiv(hi - lo, BM)
    total = GROUP * n_per_head

    k_smem = gl.allocate_shared_memory(dtype, [BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BN, D], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], r_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], do_desc.layout)
    stat_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 4, BM], stats_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(empty.index(b), count=1)
    mbarrier.init(kv_ready, count=1)

    dk, dv = gl.warp_specialize([
        (_ws_compute, (k_smem, v_smem, q_smem, r_smem, do_smem, stat_smem, ready, empty, kv_ready, n0, lo, d_hi,
                       f_hi, n_per_head, total, DOCS, T, L, WINDOW, scale, qk_scale, D, BM, BN, STAGES, VARLEN,
                       KEYS_IN_REGISTERS, LEAN, num_warps)),
        (_ws_loads, (q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, k_smem, v_smem, q_smem, r_smem, do_smem,
                     stat_smem, ready, empty, kv_ready, n0, kv_h, lo, n_per_head, GROUP, T, total, D, BM, STAGES)),
    ], [1], [24])
    _store_tile(DK, dk, n0, kv_h, T, HKV, D, BN, acc_layout)
    _store_tile(DV, dv, n0, kv_h, T, HKV, D, BN, acc_layout)


# ----------------------------------------------------------------------------- paired key tiles
@gluon.jit
def _pp_loads(q_desc, r_desc, do_desc, stats_desc, q_smem, r_smem, do_smem, stat_smem, ready, empty, kv_h, lo,
              n_per_head, GROUP, T, total, D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr):
    """Producer: the query tiles [lo, lo + n_per_head * BM) of each head of kv head kv_h's group, in turn."""
    nbytes: gl.constexpr = 3 * q_desc.block_type.nbytes + stats_desc.block_type.nbytes
    h = kv_h * GROUP
    m0 = lo
    end = lo + n_per_head * BM
    for i in range(total):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        _tma_load(q_desc, [m0, h * D], bar, q_smem.index(slot))
        _tma_load(r_desc, [m0, h * D], bar, r_smem.index(slot))
        _tma_load(do_desc, [m0, h * D], bar, do_smem.index(slot))
        _tma_load(stats_desc, [0, h * T + m0], bar, stat_smem.index(slot))
        m0 += BM
        if m0 >= end:
            m0 = lo
            h += 1


@gluon.jit
def _pp_compute(k_desc, v_desc, k_smem, v_smem, q_smem, r_smem, do_smem, stat_smem, ready, empty, kv_ready, DK, DV,
                n0, kv_h, lo, n_per_head, total, DOCS, DOCE, T, L, HKV, WINDOW, scale, qk_scale, D: gl.constexpr,
                BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr,
                KEYS_IN_REGISTERS: gl.constexpr, num_warps: gl.constexpr):
    """One consumer warpgroup: dk, dv of key tile [n0, n0 + BN) over the shared query stream; tiles outside
    its own query range are released unread."""
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BM)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    keys_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    queries_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    live = n0 < T
    my_lo, d_hi, f_hi, my_hi = fused._column_phases(DOCE, gl.minimum(n0, T - 1), T, L, WINDOW, BM, BN, VARLEN)
    if not live:
        my_hi = my_lo
    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes, pred=live)
    _tma_load(k_desc, [n0, kv_h * D], kv_ready, k_smem, pred=live)
    _tma_load(v_desc, [n0, kv_h * D], kv_ready, v_smem, pred=live)

    offs_n = n0 + gl.arange(0, BN, layout=keys_layout)
    zero_s = gl.zeros([BN, BM], gl.float32, s_layout)
    dk = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    dv = warpgroup_mma_init(gl.zeros([BN, D], gl.float32, acc_layout))
    mbarrier.wait(kv_ready, 0, pred=live)
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
            q_tile = q_smem.index(slot)
            r_tile = r_smem.index(slot)
            do_tile = do_smem.index(slot)
            st = warpgroup_mma(keys, q_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            tt = warpgroup_mma(keys, r_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            at = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            offs_m = m0 + gl.arange(0, BM, layout=queries_layout)
            st = warpgroup_mma_wait(2, deps=(st, ))
            pt = _column_probabilities(st, stat_smem, slot, qk_scale, offs_n, offs_m, offs_m < T, m0, d_hi, f_hi,
                                       DOCS, T, L, WINDOW, BM, VARLEN, queries_layout)
            dv, g1, g2 = _gradients(pt, tt, at, dv, do_tile, stat_smem, slot, scale, BM, queries_layout, a_layout,
                                    False)
            g1 = gl.convert_layout(g1.to(dtype), a_layout)
            g2 = gl.convert_layout(g2.to(dtype), a_layout)
            dk = warpgroup_mma(g1, q_tile, dk, is_async=True)
            dk = warpgroup_mma(g2, r_tile, dk, is_async=True)
            dk, dv = _retire(dk, dv)
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)
        m0 += BM
        if m0 >= end:
            m0 = lo
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    if live:
        _store_tile(DK, dk, n0, kv_h, T, HKV, D, BN, acc_layout)
        _store_tile(DV, dv, n0, kv_h, T, HKV, D, BN, acc_layout)


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_dkdv_pair_kernel(q_desc, r_desc, do_desc, k_desc, v_desc, stats_desc, DK, DV, DOCS, DOCE,
                          T, L, HQ, HKV, GROUP, WINDOW, scale, qk_scale,
                          D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                          VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr,
                          KEYS_IN_REGISTERS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """Two warpgroups, each the column pass of one of two adjacent key tiles [n0, n0 + 2 BN), reading one
    stream of query tiles that a producer warp copies in (the union of their query ranges)."""
    dtype: gl.constexpr = q_desc.dtype
    n0, kv_h = fused._tile_order(T, L, HKV, 2 * BN, VARLEN, True, GLOBAL_ORDER)
    lo, d_hi, f_hi, hi = fused._column_phases(DOCE, n0, T, L, WINDOW, BM, BN, VARLEN)
    n1 = n0 + BN
    if n1 < T:
        lo1, d_hi1, f_hi1, hi1 = fused._column_phases(DOCE, n1, T, L, WINDOW, BM, BN, VARLEN)
        hi = gl.maximum(hi, hi1)
    n_per_head = gl.cdiv(hi - lo, BM)
    total = GROUP * n_per_head

    k_smem = gl.allocate_shared_memory(dtype, [2, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, BN, D], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], r_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, D], do_desc.layout)
    stat_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 4, BM], stats_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(empty.index(b), count=2)
    for b in gl.static_range(2):
        mbarrier.init(kv_ready.index(b), count=1)

    gl.warp_specialize([
        (_pp_compute, (k_desc, v_desc, k_smem.index(0), v_smem.index(0), q_smem, r_smem, do_smem, stat_smem, ready,
                       empty, kv_ready.index(0), DK, DV, n0, kv_h, lo, n_per_head, total, DOCS, DOCE, T, L, HKV,
                       WINDOW, scale, qk_scale, D, BM, BN, STAGES, VARLEN, KEYS_IN_REGISTERS, num_warps)),
        (_pp_compute, (k_desc, v_desc, k_smem.index(1), v_smem.index(1), q_smem, r_smem, do_smem, stat_smem, ready,
                       empty, kv_ready.index(1), DK, DV, n1, kv_h, lo, n_per_head, total, DOCS, DOCE, T, L, HKV,
                       WINDOW, scale, qk_scale, D, BM, BN, STAGES, VARLEN, KEYS_IN_REGISTERS, num_warps)),
        (_pp_loads, (q_desc, r_desc, do_desc, stats_desc, q_smem, r_smem, do_smem, stat_smem, ready, empty, kv_h, lo,
                     n_per_head, GROUP, T, total, D, BM, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])
