"""Draft: the forward and the row pass over paired query tiles (two consumer warpgroups, one producer warp
streaming the k, v tiles both read)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_init, warpgroup_mma_wait)

from kernels.parallax import fused
from kernels.parallax.hopper import (_NO_SPECIALIZE, _key_mask, _mma_layout, _retire, _row_stats, _store_tile,
                                     _tma_load)


@gluon.jit
def _kv_loads(k_desc, v_desc, k_smem, v_smem, ready, empty, kv_h, lo, n_tiles, D: gl.constexpr, BN: gl.constexpr,
              STAGES: gl.constexpr):
    nbytes: gl.constexpr = 2 * k_desc.block_type.nbytes
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        _tma_load(k_desc, [lo + j * BN, kv_h * D], bar, k_smem.index(slot))
        _tma_load(v_desc, [lo + j * BN, kv_h * D], bar, v_smem.index(slot))


@gluon.jit
def _pair_setup(DOCS, T, L, HQ, GROUP, WINDOW, BM: gl.constexpr, BN: gl.constexpr, VARLEN: gl.constexpr,
                GLOBAL_ORDER: gl.constexpr):
    m0, h = fused._tile_order(T, L, HQ, 2 * BM, VARLEN, False, GLOBAL_ORDER)
    lo, a_hi, diag, hi = fused._row_phases(DOCS, m0, T, L, WINDOW, BM, BN, VARLEN)
    m1 = m0 + BM
    if m1 < T:
        lo1, a_hi1, diag1, hi1 = fused._row_phases(DOCS, m1, T, L, WINDOW, BM, BN, VARLEN)
        hi = hi1
    return m0, h, h // GROUP, lo, gl.cdiv(hi - lo, BN)


# ----------------------------------------------------------------------------- forward
@gluon.jit
def _fwd_consumer(q_desc, r_desc, q_smem, r_smem, q_ready, k_smem, v_smem, ready, empty, O, VBAR, TBAR, LSE, DOCS,
                  m0, h, lo, n_tiles, T, L, HQ, WINDOW, qk_scale, D: gl.constexpr, BM: gl.constexpr,
                  BN: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BN)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    acc_rows: gl.constexpr = gl.SliceLayout(1, acc_layout)

    live = m0 < T
    my_lo, a_hi, diag, my_hi = fused._row_phases(DOCS, gl.minimum(m0, T - 1), T, L, WINDOW, BM, BN, VARLEN)
    if not live:
        my_hi = my_lo
    mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes, pred=live)
    _tma_load(q_desc, [m0, h * D], q_ready, q_smem, pred=live)
    _tma_load(r_desc, [m0, h * D], q_ready, r_smem, pred=live)

    offs_m = m0 + gl.arange(0, BM, layout=rows_layout)
    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
    m_i = gl.full([BM], -1.0e30, gl.float32, rows_layout)
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
            v_tile = v_smem.index(slot)
            s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            t = warpgroup_mma(r_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s, ))
            if (n0 < a_hi) | (n0 >= diag):
                s = gl.where(_key_mask(DOCS, offs_m, n0, T, L, WINDOW, BN, s_layout, VARLEN), s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s * qk_scale - m_new[:, None])
            d1 = d1 * alpha + gl.sum(p, 1)
            rescale = gl.convert_layout(alpha, acc_rows)[:, None]
            o1 = warpgroup_mma(gl.convert_layout(p.to(dtype), a_layout), v_tile, o1 * rescale, is_async=True)
            t = warpgroup_mma_wait(1, deps=(t, ))
            pt = p * t
            d2 = d2 * alpha + gl.sum(pt, 1)
            o2 = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), v_tile, o2 * rescale, is_async=True)
            o1, o2 = warpgroup_mma_wait(0, deps=(o1, o2))
            m_i = m_new
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)

    if live:
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
def _fwd_pair_kernel(q_desc, r_desc, k_desc, v_desc, O, VBAR, TBAR, LSE, DOCS, T, L, HQ, HKV, GROUP, WINDOW,
                     qk_scale, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                     VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    m0, h, kv_h, lo, n_tiles = _pair_setup(DOCS, T, L, HQ, GROUP, WINDOW, BM, BN, VARLEN, GLOBAL_ORDER)
    q_smem = gl.allocate_shared_memory(dtype, [2, BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [2, BM, D], r_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(empty.index(b), count=2)
    for b in gl.static_range(2):
        mbarrier.init(q_ready.index(b), count=1)
    gl.warp_specialize([
        (_fwd_consumer, (q_desc, r_desc, q_smem.index(0), r_smem.index(0), q_ready.index(0), k_smem, v_smem, ready,
                         empty, O, VBAR, TBAR, LSE, DOCS, m0, h, lo, n_tiles, T, L, HQ, WINDOW, qk_scale, D, BM, BN,
                         STAGES, VARLEN, num_warps)),
        (_fwd_consumer, (q_desc, r_desc, q_smem.index(1), r_smem.index(1), q_ready.index(1), k_smem, v_smem, ready,
                         empty, O, VBAR, TBAR, LSE, DOCS, m0 + BM, h, lo, n_tiles, T, L, HQ, WINDOW, qk_scale, D, BM,
                         BN, STAGES, VARLEN, num_warps)),
        (_kv_loads, (k_desc, v_desc, k_smem, v_smem, ready, empty, kv_h, lo, n_tiles, D, BN, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])


# ----------------------------------------------------------------------------- row pass
@gluon.jit
def _row_consumer(q_desc, r_desc, do_desc, q_smem, r_smem, do_smem, q_ready, k_smem, v_smem, ready, empty, O, VBAR,
                  TBAR, LSE, STATS, DQ, DR, DOCS, m0, h, lo, n_tiles, T, L, HQ, WINDOW, scale, qk_scale,
                  D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr,
                  num_warps: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BN)
    acc_layout: gl.constexpr = _mma_layout(num_warps, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    live = m0 < T
    my_lo, a_hi, diag, my_hi = fused._row_phases(DOCS, gl.minimum(m0, T - 1), T, L, WINDOW, BM, BN, VARLEN)
    if not live:
        my_hi = my_lo
    mbarrier.expect(q_ready, 3 * q_desc.block_type.nbytes, pred=live)
    _tma_load(q_desc, [m0, h * D], q_ready, q_smem, pred=live)
    _tma_load(r_desc, [m0, h * D], q_ready, r_smem, pred=live)
    _tma_load(do_desc, [m0, h * D], q_ready, do_smem, pred=live)

    offs_m = m0 + gl.arange(0, BM, layout=rows_layout)
    ok_m = offs_m < T
    stat = h.to(gl.int64) * T + offs_m
    lse = gl.load(LSE + stat, mask=ok_m, other=0.0)
    tbar = gl.load(TBAR + stat, mask=ok_m, other=0.0)
    gl.store(STATS + stat, lse, mask=ok_m)
    gl.store(STATS + HQ.to(gl.int64) * T + stat, tbar, mask=ok_m)
    mbarrier.wait(q_ready, 0, pred=live)
    tau, beta = _row_stats(O, VBAR, STATS, do_smem, m0, h, T, HQ, D, BM, num_warps)
    beta = gl.convert_layout(beta, rows_layout)
    bmt = beta - gl.convert_layout(tau, rows_layout)

    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
    dq = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, acc_layout))
    dr = warpgroup_mma_init(gl.zeros([BM, D], gl.float32, acc_layout))
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
        n0 = lo + j * BN
        if (n0 >= my_lo) & (n0 < my_hi):
            k_tile = k_smem.index(slot)
            s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            t = warpgroup_mma(r_smem, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            a = warpgroup_mma(do_smem, v_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s, dq, dr = warpgroup_mma_wait(2, deps=(s, dq, dr))
            p = gl.exp2(s * qk_scale - lse[:, None])
            if (n0 < a_hi) | (n0 >= diag):
                p = gl.where(_key_mask(DOCS, offs_m, n0, T, L, WINDOW, BN, s_layout, VARLEN), p, 0.0)
            t = warpgroup_mma_wait(1, deps=(t, ))
            c = 1.0 + tbar[:, None] - t
            a = warpgroup_mma_wait(0, deps=(a, ))
            nd = beta[:, None] - a
            g1 = gl.convert_layout((p * (bmt[:, None] - c * nd)).to(dtype), a_layout)
            g2 = gl.convert_layout((p * nd).to(dtype), a_layout)
            dq = warpgroup_mma(g1, k_tile, dq, is_async=True)
            dr = warpgroup_mma(g2, k_tile, dr, is_async=True)
            dq, dr = _retire(dq, dr)
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)

    dq, dr = warpgroup_mma_wait(0, deps=(dq, dr))
    if live:
        _store_tile(DQ, dq * scale, m0, h, T, HQ, D, BM, acc_layout)
        _store_tile(DR, dr, m0, h, T, HQ, D, BM, acc_layout)


@gluon.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_dq_pair_kernel(q_desc, r_desc, do_desc, k_desc, v_desc, O, VBAR, TBAR, LSE, STATS, DQ, DR, DOCS,
                        T, L, HQ, HKV, GROUP, WINDOW, scale, qk_scale,
                        D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                        VARLEN: gl.constexpr, GLOBAL_ORDER: gl.constexpr, num_warps: gl.constexpr,
                        CONSUMER_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    m0, h, kv_h, lo, n_tiles = _pair_setup(DOCS, T, L, HQ, GROUP, WINDOW, BM, BN, VARLEN, GLOBAL_ORDER)
    q_smem = gl.allocate_shared_memory(dtype, [2, BM, D], q_desc.layout)
    r_smem = gl.allocate_shared_memory(dtype, [2, BM, D], r_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, BM, D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(empty.index(b), count=2)
    for b in gl.static_range(2):
        mbarrier.init(q_ready.index(b), count=1)
    gl.warp_specialize([
        (_row_consumer, (q_desc, r_desc, do_desc, q_smem.index(0), r_smem.index(0), do_smem.index(0),
                         q_ready.index(0), k_smem, v_smem, ready, empty, O, VBAR, TBAR, LSE, STATS, DQ, DR, DOCS, m0,
                         h, lo, n_tiles, T, L, HQ, WINDOW, scale, qk_scale, D, BM, BN, STAGES, VARLEN, num_warps)),
        (_row_consumer, (q_desc, r_desc, do_desc, q_smem.index(1), r_smem.index(1), do_smem.index(1),
                         q_ready.index(1), k_smem, v_smem, ready, empty, O, VBAR, TBAR, LSE, STATS, DQ, DR, DOCS,
                         m0 + BM, h, lo, n_tiles, T, L, HQ, WINDOW, scale, qk_scale, D, BM, BN, STAGES, VARLEN,
                         num_warps)),
        (_kv_loads, (k_desc, v_desc, k_smem, v_smem, ready, empty, kv_h, lo, n_tiles, D, BN, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])
