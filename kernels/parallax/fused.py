"""Fused Triton kernels for causal Parallax attention (forward, backward), packed layout.

All kernels see the batch as one packed token axis of length T = B * L (tensors viewed as
(T, H, D)); a token's document starts at ``doc_start`` (``(tok // L) * L`` without
cu_seqlens, a per-token table with them). Keys j may serve query i when
``first_key(i) <= j <= i``, ``first_key(i) = max(doc_start(i), i - WINDOW + 1)`` (WINDOW = T
without a sliding window). Tiles never need to align with documents or the band: each program
runs its KV (or Q) tiles in three phases, masked / unmasked / masked, only tiles that cross a
document start, the band's lower edge or the diagonal pay for the mask, and tiles wholly
outside the band are never visited.

Forward (one pass over KV tiles, SPEC's streaming form): running max m and four accumulators
d1, O1, d2, O2 sharing one rescale; saves o, vbar (input dtype), tbar and lse (fp32, log2
units of the scaled logits). Backward (SPEC closed form): a row pass (dq, drho; it also writes
tau = dO.o and beta = dO.vbar) and a column pass (dk, dv) that loops over the GQA group's
query heads inside one program, so K/V tiles are loaded once per group and no atomics are needed.
Matmuls take the input dtype and accumulate in fp32 (fp32 inputs use IEEE fp32 dots). With the
``TMA`` launch flag the tiles the loops stream (K/V in the forward and row pass; q, rho, dO in the
column pass) are read through in-kernel tensor descriptors where the host found the layout allows
(``TMA_OK``: heads D apart, 16-byte alignment); otherwise by masked pointer loads.
Every kernel runs on a 1-D grid of (tile, head) programs in one of two orders (``_tile_order``):
head-major or globally heaviest-first; the autotuner picks per shape (launch configs: tuning.py).
On sm_90 GPUs the forward and the backward's two passes give way to ``hopper.py``'s (Gluon:
asynchronous wgmma, TMA rings) where those apply (``hopper_unusable``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import launcher
from kernels.parallax import cu_seqlens as offsets
from kernels.parallax import tuning

LOG2E = 1.4426950408889634
# sizes vary between calls: one compiled kernel for all of them (strides stay specialised)
_NO_SPECIALIZE = ["T", "L", "HQ", "GROUP", "WINDOW", "TUNE_T", "TUNE_L", "TUNE_W"]


# ----------------------------------------------------------------------------- helpers
@triton.jit
def _doc_start(DOCS, tok, T, L, VARLEN: tl.constexpr):
    if VARLEN:
        return tl.load(DOCS + tl.minimum(tok, T - 1))
    else:
        return (tok // L) * L


@triton.jit
def _doc_end(DOCE, tok, T, L, VARLEN: tl.constexpr):
    if VARLEN:
        return tl.load(DOCE + tl.minimum(tok, T - 1))
    else:
        return (tok // L) * L + L


@triton.jit
def _first_key(DOCS, tok, T, L, WINDOW, VARLEN: tl.constexpr):
    """The earliest key query ``tok`` reads: its document's start, or the band's lower edge."""
    return tl.maximum(_doc_start(DOCS, tok, T, L, VARLEN), tok - WINDOW + 1)


@triton.jit
def _row_phases(DOCS, m0, T, L, WINDOW, BM: tl.constexpr, BN: tl.constexpr, VARLEN: tl.constexpr):
    """KV tile bounds for query tile [m0, m0+BM): masked [lo, a_hi), full [a_hi, diag), masked [diag, hi).
    Key tiles before the first row's first key are skipped; from the last row's first key on, every
    key up to the diagonal serves every row of the tile."""
    last = tl.minimum(m0 + BM, T) - 1
    lo = (_first_key(DOCS, m0, T, L, WINDOW, VARLEN) // BN) * BN
    diag = (m0 // BN) * BN
    a_hi = tl.minimum(tl.cdiv(_first_key(DOCS, last, T, L, WINDOW, VARLEN), BN) * BN, diag)
    return lo, a_hi, diag, last + 1


@triton.jit
def _column_phases(DOCE, n0, T, L, WINDOW, BM: tl.constexpr, BN: tl.constexpr, VARLEN: tl.constexpr):
    """Query tiles of key tile [n0, n0 + BN): masked diagonal [lo, d_hi), full [d_hi, f_hi) (same
    document as n0 and inside the band of every key of the tile), masked tail [f_hi, hi); queries past
    the last key's band are skipped."""
    end_full = tl.minimum(_doc_end(DOCE, n0, T, L, VARLEN), n0 + WINDOW)
    last_n = tl.minimum(n0 + BN, T) - 1
    hi = tl.minimum(_doc_end(DOCE, last_n, T, L, VARLEN), last_n + WINDOW)
    lo = (n0 // BM) * BM
    d_hi = tl.minimum(tl.cdiv(n0 + BN, BM) * BM, hi)
    f_hi = d_hi + tl.maximum(end_full - d_hi, 0) // BM * BM
    return lo, d_hi, f_hi, hi


@triton.jit
def _tile_order(T, L, NH, TILE: tl.constexpr, VARLEN: tl.constexpr, FIRST_HEAVY: tl.constexpr,
                GLOBAL: tl.constexpr):
    """(tile start, head) of this program on a 1-D grid of cdiv(T, TILE) * NH programs.

    Under causal masking a query tile costs its position in its document (latest heaviest) and a
    key tile the rest of its document (earliest heaviest, FIRST_HEAVY). Head-major order (GLOBAL
    False) runs each head's tiles together, latest-first along the packed axis, so a head's K/V
    stay in L2. GLOBAL launches the costliest tiles of all documents and heads first (longest
    processing time first, a short tail), for equal documents whose length is a multiple of TILE;
    which wins depends on the shape (measured, docs/kernels.md), so the autotuner picks.
    """
    pid = tl.program_id(0)
    if GLOBAL and (not VARLEN) and (L % TILE == 0):
        per_doc = L // TILE
        rank = pid // (NH * (T // L))
        rest = pid % (NH * (T // L))
        head = rest % NH
        j = rank if FIRST_HEAVY else per_doc - 1 - rank
        return ((rest // NH) * per_doc + j) * TILE, head
    n_tiles = tl.cdiv(T, TILE)
    tile = pid % n_tiles
    return (tile if FIRST_HEAVY else n_tiles - 1 - tile) * TILE, pid // n_tiles


@triton.jit
def _load_rows(PTR, offs_t, h, stride_t, stride_h, offs_d, ok):
    ptrs = PTR + offs_t.to(tl.int64)[:, None] * stride_t + h * stride_h + offs_d[None, :]
    return tl.load(ptrs, mask=ok[:, None], other=0.0)


@triton.jit
def _rows_source(PTR, T, H, stride_t, BT: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """What ``_tile_rows`` reads tiles of BT rows of a (T, H, D) tensor from: a TMA tensor descriptor
    over its (T, H * D) view (TMA: the host checked the head stride is D and the alignments), else
    the pointer itself."""
    if TMA:
        return tl.make_tensor_descriptor(PTR, shape=[T, H * D], strides=[stride_t, 1], block_shape=[BT, D])
    else:
        return PTR


@triton.jit
def _tile_rows(SRC, t0, offs_t, h, stride_t, stride_h, offs_d, ok, D: tl.constexpr, TMA: tl.constexpr):
    """Rows offs_t = t0 + arange(BT) of head h from ``_rows_source``'s SRC: one bulk tensor copy (rows
    past T read as zeros, as the masked load gives) or a masked pointer load."""
    if TMA:
        return SRC.load([t0, h * D])
    else:
        return _load_rows(SRC, offs_t, h, stride_t, stride_h, offs_d, ok)


@triton.jit
def _store_rows(PTR, val, offs_t, h, stride_t, stride_h, offs_d, ok):
    ptrs = PTR + offs_t.to(tl.int64)[:, None] * stride_t + h * stride_h + offs_d[None, :]
    tl.store(ptrs, val.to(PTR.dtype.element_ty), mask=ok[:, None])


# ----------------------------------------------------------------------------- forward
@triton.jit
def _fwd_tiles(m_i, d1, d2, o1, o2, q, r, K, V, kv_h, skt, skh, svt, svh, lo, hi, offs_m, key_lo, T, qk_scale,
               D: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr):
    offs_d = tl.arange(0, D)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        ok_n = offs_n < T
        k = _tile_rows(K, n0, offs_n, kv_h, skt, skh, offs_d, ok_n, D, TMA)
        v = _tile_rows(V, n0, offs_n, kv_h, svt, svh, offs_d, ok_n, D, TMA)
        kt = tl.trans(k)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale
        t = tl.dot(r, kt, input_precision=PREC)
        if MASKED:
            ok = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] >= key_lo[:, None])
            s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        pt = p * t
        d1 = d1 * alpha + tl.sum(p, 1)
        d2 = d2 * alpha + tl.sum(pt, 1)
        o1 = o1 * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        o2 = o2 * alpha[:, None] + tl.dot(pt.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    return m_i, d1, d2, o1, o2


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _fwd_kernel(Q, R, K, V, O, VBAR, TBAR, LSE, DOCS, T, L, HQ, sqt, sqh, skt, skh, svt, svh, qk_scale,
                WINDOW, TUNE_T, TUNE_L, TUNE_W, GROUP, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                VARLEN: tl.constexpr, PREC: tl.constexpr, GLOBAL_ORDER: tl.constexpr, TMA_OK: tl.constexpr = False,
                TMA: tl.constexpr = False):
    m0, h = _tile_order(T, L, HQ, BM, VARLEN, False, GLOBAL_ORDER)
    kv_h = h // GROUP
    USE_TMA: tl.constexpr = TMA and TMA_OK
    KS = _rows_source(K, T, HQ // GROUP, skt, BN, D, USE_TMA)
    VS = _rows_source(V, T, HQ // GROUP, svt, BN, D, USE_TMA)
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    ok_m = offs_m < T
    q = _load_rows(Q, offs_m, h, sqt, sqh, offs_d, ok_m)
    r = _load_rows(R, offs_m, h, sqt, sqh, offs_d, ok_m)
    key_lo = _first_key(DOCS, offs_m, T, L, WINDOW, VARLEN)
    lo, a_hi, diag, hi = _row_phases(DOCS, m0, T, L, WINDOW, BM, BN, VARLEN)

    m_i = tl.full([BM], -1.0e30, tl.float32)  # finite: fully masked tiles keep alpha = 1, not NaN
    d1 = tl.zeros([BM], tl.float32)
    d2 = tl.zeros([BM], tl.float32)
    o1 = tl.zeros([BM, D], tl.float32)
    o2 = tl.zeros([BM, D], tl.float32)
    m_i, d1, d2, o1, o2 = _fwd_tiles(m_i, d1, d2, o1, o2, q, r, KS, VS, kv_h, skt, skh, svt, svh, lo, a_hi,
                                     offs_m, key_lo, T, qk_scale, D, BN, True, PREC, USE_TMA)
    m_i, d1, d2, o1, o2 = _fwd_tiles(m_i, d1, d2, o1, o2, q, r, KS, VS, kv_h, skt, skh, svt, svh, a_hi, diag,
                                     offs_m, key_lo, T, qk_scale, D, BN, False, PREC, USE_TMA)
    m_i, d1, d2, o1, o2 = _fwd_tiles(m_i, d1, d2, o1, o2, q, r, KS, VS, kv_h, skt, skh, svt, svh, diag, hi,
                                     offs_m, key_lo, T, qk_scale, D, BN, True, PREC, USE_TMA)

    inv = 1.0 / d1
    tbar = d2 * inv
    vbar = o1 * inv[:, None]
    o = (1.0 + tbar)[:, None] * vbar - o2 * inv[:, None]
    _store_rows(O, o, offs_m, h, HQ * D, D, offs_d, ok_m)
    _store_rows(VBAR, vbar, offs_m, h, HQ * D, D, offs_d, ok_m)
    stat = h.to(tl.int64) * T + offs_m
    tl.store(TBAR + stat, tbar, mask=ok_m)
    tl.store(LSE + stat, m_i + tl.log2(d1), mask=ok_m)


# ----------------------------------------------------------------------------- backward, row pass
@triton.jit
def _row_stats(O, VBAR, do, TAU, BETA, offs_m, h, T, HQ, D: tl.constexpr, ok_m):
    """tau = dO.o and beta = dO.vbar of rows offs_m of head h (fp32, [BM]), stored head-major; also
    returns the rows' statistics index (head-major offsets into the (Hq, T) buffers)."""
    offs_d = tl.arange(0, D)
    o = _load_rows(O, offs_m, h, HQ * D, D, offs_d, ok_m).to(tl.float32)
    vbar = _load_rows(VBAR, offs_m, h, HQ * D, D, offs_d, ok_m).to(tl.float32)
    tau = tl.sum(do.to(tl.float32) * o, 1)
    beta = tl.sum(do.to(tl.float32) * vbar, 1)
    stat = h.to(tl.int64) * T + offs_m
    tl.store(TAU + stat, tau, mask=ok_m)
    tl.store(BETA + stat, beta, mask=ok_m)
    return tau, beta, stat


@triton.jit
def _dq_tiles(dq, dr, q, r, do, lse, tbar, beta, bmt, K, V, kv_h, skt, skh, svt, svh, lo, hi, offs_m, key_lo, T,
              qk_scale, D: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr, PREC: tl.constexpr,
              TMA: tl.constexpr):
    offs_d = tl.arange(0, D)
    for n0 in range(lo, hi, BN):
        offs_n = n0 + tl.arange(0, BN)
        ok_n = offs_n < T
        k = _tile_rows(K, n0, offs_n, kv_h, skt, skh, offs_d, ok_n, D, TMA)
        v = _tile_rows(V, n0, offs_n, kv_h, svt, svh, offs_d, ok_n, D, TMA)
        kt = tl.trans(k)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale
        t = tl.dot(r, kt, input_precision=PREC)
        a = tl.dot(do, tl.trans(v), input_precision=PREC)
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            ok = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] >= key_lo[:, None])
            p = tl.where(ok, p, 0.0)
        delta = a - beta[:, None]
        c = 1.0 + tbar[:, None] - t
        g1 = p * (c * delta + bmt[:, None])
        g2 = -p * delta
        dq += tl.dot(g1.to(k.dtype), k, input_precision=PREC)
        dr += tl.dot(g2.to(k.dtype), k, input_precision=PREC)
    return dq, dr


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_dq_kernel(Q, R, K, V, O, VBAR, DO, TBAR, LSE, TAU, BETA, DQ, DR, DOCS, T, L, HQ,
                   sqt, sqh, skt, skh, svt, svh, scale, qk_scale, WINDOW, TUNE_T, TUNE_L, TUNE_W,
                   GROUP, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   VARLEN: tl.constexpr, PREC: tl.constexpr, GLOBAL_ORDER: tl.constexpr,
                   TMA_OK: tl.constexpr = False, TMA: tl.constexpr = False):
    m0, h = _tile_order(T, L, HQ, BM, VARLEN, False, GLOBAL_ORDER)
    kv_h = h // GROUP
    USE_TMA: tl.constexpr = TMA and TMA_OK
    KS = _rows_source(K, T, HQ // GROUP, skt, BN, D, USE_TMA)
    VS = _rows_source(V, T, HQ // GROUP, svt, BN, D, USE_TMA)
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    ok_m = offs_m < T
    q = _load_rows(Q, offs_m, h, sqt, sqh, offs_d, ok_m)
    r = _load_rows(R, offs_m, h, sqt, sqh, offs_d, ok_m)
    do = _load_rows(DO, offs_m, h, HQ * D, D, offs_d, ok_m)
    tau, beta, stat = _row_stats(O, VBAR, do, TAU, BETA, offs_m, h, T, HQ, D, ok_m)
    lse = tl.load(LSE + stat, mask=ok_m, other=0.0)
    tbar = tl.load(TBAR + stat, mask=ok_m, other=0.0)
    bmt = beta - tau
    key_lo = _first_key(DOCS, offs_m, T, L, WINDOW, VARLEN)
    lo, a_hi, diag, hi = _row_phases(DOCS, m0, T, L, WINDOW, BM, BN, VARLEN)

    dq = tl.zeros([BM, D], tl.float32)
    dr = tl.zeros([BM, D], tl.float32)
    dq, dr = _dq_tiles(dq, dr, q, r, do, lse, tbar, beta, bmt, KS, VS, kv_h, skt, skh, svt, svh, lo, a_hi,
                       offs_m, key_lo, T, qk_scale, D, BN, True, PREC, USE_TMA)
    dq, dr = _dq_tiles(dq, dr, q, r, do, lse, tbar, beta, bmt, KS, VS, kv_h, skt, skh, svt, svh, a_hi, diag,
                       offs_m, key_lo, T, qk_scale, D, BN, False, PREC, USE_TMA)
    dq, dr = _dq_tiles(dq, dr, q, r, do, lse, tbar, beta, bmt, KS, VS, kv_h, skt, skh, svt, svh, diag, hi,
                       offs_m, key_lo, T, qk_scale, D, BN, True, PREC, USE_TMA)
    _store_rows(DQ, dq * scale, offs_m, h, HQ * D, D, offs_d, ok_m)
    _store_rows(DR, dr, offs_m, h, HQ * D, D, offs_d, ok_m)


# ----------------------------------------------------------------------------- backward, column pass
@triton.jit
def _query_tile(Q, R, DO, TBAR, LSE, TAU, BETA, h, sqt, sqh, HQ, m0, T, D: tl.constexpr, BM: tl.constexpr,
                TMA: tl.constexpr):
    """What the column pass reads per query tile [m0, m0 + BM) of head h: positions, their mask, the
    q, rho and dO rows, and the per-query statistics lse, tbar, tau, beta ([BM] fp32)."""
    offs_m = m0 + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    ok_m = offs_m < T
    do = _tile_rows(DO, m0, offs_m, h, HQ * D, D, offs_d, ok_m, D, TMA)
    stat = h.to(tl.int64) * T + offs_m
    lse = tl.load(LSE + stat, mask=ok_m, other=0.0)
    tbar = tl.load(TBAR + stat, mask=ok_m, other=0.0)
    tau = tl.load(TAU + stat, mask=ok_m, other=0.0)
    beta = tl.load(BETA + stat, mask=ok_m, other=0.0)
    q = _tile_rows(Q, m0, offs_m, h, sqt, sqh, offs_d, ok_m, D, TMA)
    r = _tile_rows(R, m0, offs_m, h, sqt, sqh, offs_d, ok_m, D, TMA)
    return offs_m, ok_m, q, r, do, lse, tbar, tau, beta


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, R, DO, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, lo, hi, offs_n,
                T, L, WINDOW, scale, qk_scale, D: tl.constexpr, BM: tl.constexpr, MASKED: tl.constexpr,
                VARLEN: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr):
    for m0 in range(lo, hi, BM):
        offs_m, ok_m, q, r, do, lse, tbar, tau, beta = _query_tile(Q, R, DO, TBAR, LSE, TAU, BETA, h, sqt, sqh,
                                                                   HQ, m0, T, D, BM, TMA)
        # transposed orientation (keys x queries): the results feed dk, dv without transposes
        st = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
        tt = tl.dot(k, tl.trans(r), input_precision=PREC)
        at = tl.dot(v, tl.trans(do), input_precision=PREC)
        pt = tl.exp2(st - lse[None, :])
        if MASKED:
            key_lo = _first_key(DOCS, offs_m, T, L, WINDOW, VARLEN)
            ok = (offs_n[:, None] <= offs_m[None, :]) & (offs_n[:, None] >= key_lo[None, :]) & ok_m[None, :]
            pt = tl.where(ok, pt, 0.0)
        delta = at - beta[None, :]
        c = 1.0 + tbar[None, :] - tt
        dv += tl.dot((pt * c).to(do.dtype), do, input_precision=PREC)
        g1 = (pt * (c * delta + (beta - tau)[None, :]) * scale).to(q.dtype)
        g2 = (-pt * delta).to(r.dtype)
        dk += tl.dot(g1, q, input_precision=PREC)
        dk += tl.dot(g2, r, input_precision=PREC)
    return dk, dv


@triton.jit
def _dkdv_rows_tiles(dk, dv, k, v, Q, R, DO, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, lo, hi, offs_n,
                     T, L, WINDOW, scale, qk_scale, D: tl.constexpr, BM: tl.constexpr, MASKED: tl.constexpr,
                     VARLEN: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr):
    """The column pass with queries on the rows (M) of the score tiles: the per-query statistics are
    row vectors (few per thread) and dk, dv take the transposed gradient tiles."""
    kt = tl.trans(k)
    vt = tl.trans(v)
    for m0 in range(lo, hi, BM):
        offs_m, ok_m, q, r, do, lse, tbar, tau, beta = _query_tile(Q, R, DO, TBAR, LSE, TAU, BETA, h, sqt, sqh,
                                                                   HQ, m0, T, D, BM, TMA)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            key_lo = _first_key(DOCS, offs_m, T, L, WINDOW, VARLEN)
            ok = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] >= key_lo[:, None]) & ok_m[:, None]
            p = tl.where(ok, p, 0.0)
        c = 1.0 + tbar[:, None] - tl.dot(r, kt, input_precision=PREC)
        dv += tl.dot(tl.trans((p * c).to(do.dtype)), do, input_precision=PREC)
        delta = tl.dot(do, vt, input_precision=PREC) - beta[:, None]
        g1 = (p * (c * delta + (beta - tau)[:, None]) * scale).to(q.dtype)
        g2 = (-p * delta).to(r.dtype)
        dk += tl.dot(tl.trans(g1), q, input_precision=PREC)
        dk += tl.dot(tl.trans(g2), r, input_precision=PREC)
    return dk, dv


@triton.jit
def _dkdv_span(dk, dv, k, v, Q, R, DO, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, lo, hi, offs_n,
               T, L, WINDOW, scale, qk_scale, D: tl.constexpr, BM: tl.constexpr, MASKED: tl.constexpr,
               VARLEN: tl.constexpr, PREC: tl.constexpr, ROWS: tl.constexpr, TMA: tl.constexpr):
    """Query tiles [lo, hi) of head h in one of the two orientations (ROWS: queries on the rows)."""
    if ROWS:
        dk, dv = _dkdv_rows_tiles(dk, dv, k, v, Q, R, DO, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, lo, hi,
                                  offs_n, T, L, WINDOW, scale, qk_scale, D, BM, MASKED, VARLEN, PREC, TMA)
    else:
        dk, dv = _dkdv_tiles(dk, dv, k, v, Q, R, DO, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, lo, hi,
                             offs_n, T, L, WINDOW, scale, qk_scale, D, BM, MASKED, VARLEN, PREC, TMA)
    return dk, dv


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _bwd_dkdv_kernel(Q, R, K, V, DO, TBAR, LSE, TAU, BETA, DK, DV, DOCS, DOCE, T, L, HQ, HKV,
                     sqt, sqh, skt, skh, svt, svh, scale, qk_scale, WINDOW, TUNE_T, TUNE_L, TUNE_W,
                     GROUP, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     VARLEN: tl.constexpr, PREC: tl.constexpr, GLOBAL_ORDER: tl.constexpr,
                     ROWS: tl.constexpr = False, TMA_OK: tl.constexpr = False, TMA: tl.constexpr = False):
    n0, kv_h = _tile_order(T, L, HKV, BN, VARLEN, True, GLOBAL_ORDER)
    USE_TMA: tl.constexpr = TMA and TMA_OK
    QS = _rows_source(Q, T, HQ, sqt, BM, D, USE_TMA)
    RS = _rows_source(R, T, HQ, sqt, BM, D, USE_TMA)
    DOS = _rows_source(DO, T, HQ, HQ * D, BM, D, USE_TMA)
    offs_n = n0 + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    ok_n = offs_n < T
    k = _load_rows(K, offs_n, kv_h, skt, skh, offs_d, ok_n)
    v = _load_rows(V, offs_n, kv_h, svt, svh, offs_d, ok_n)
    lo, d_hi, f_hi, hi = _column_phases(DOCE, n0, T, L, WINDOW, BM, BN, VARLEN)

    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    for g in range(GROUP):
        h = kv_h * GROUP + g
        dk, dv = _dkdv_span(dk, dv, k, v, QS, RS, DOS, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, lo, d_hi,
                            offs_n, T, L, WINDOW, scale, qk_scale, D, BM, True, VARLEN, PREC, ROWS, USE_TMA)
        dk, dv = _dkdv_span(dk, dv, k, v, QS, RS, DOS, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, d_hi, f_hi,
                            offs_n, T, L, WINDOW, scale, qk_scale, D, BM, False, VARLEN, PREC, ROWS, USE_TMA)
        dk, dv = _dkdv_span(dk, dv, k, v, QS, RS, DOS, TBAR, LSE, TAU, BETA, DOCS, h, sqt, sqh, HQ, f_hi, hi,
                            offs_n, T, L, WINDOW, scale, qk_scale, D, BM, True, VARLEN, PREC, ROWS, USE_TMA)
    _store_rows(DK, dk, offs_n, kv_h, HKV * D, D, offs_d, ok_n)
    _store_rows(DV, dv, offs_n, kv_h, HKV * D, D, offs_d, ok_n)


# ----------------------------------------------------------------------------- launch
# The JIT kernels by their names in tuning (launch configs: kernels/parallax/tuning.py).
JIT_KERNELS = {"fwd": _fwd_kernel, "dq": _bwd_dq_kernel, "dkdv": _bwd_dkdv_kernel}


def _tokens(x):
    """(B, L, H, D) -> (tensor, token stride, head stride); copies if tokens are not uniformly strided,
    or if the heads reach 2^31 elements (the kernels' head offsets are 32-bit; a head-strided view of
    a long buffer). A slice of a wider per-token tensor (v cut from the fused q, k, v, rho projection)
    is read in place."""
    b, n, h, _ = x.shape
    if x.stride(-1) != 1 or (b > 1 and x.stride(0) != n * x.stride(1)) or launcher.wide_offsets(h * x.stride(2)):
        x = x.contiguous()
    return x, x.stride(1), x.stride(2)


def _same_layout(a, b):
    """Two (B, L, H, D) tensors with one shared (token, head) stride pair."""
    a, sat, sah = _tokens(a)
    b, sbt, sbh = _tokens(b)
    if (sat, sah) != (sbt, sbh):
        a, b = a.contiguous(), b.contiguous()
        return a, b, a.stride(1), a.stride(2)
    return a, b, sat, sah


def _doc_tables(cu_seqlens, total, device):
    """Per-token document start and end (exclusive), int32 (total,); computed on device, no sync."""
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    doc = torch.searchsorted(cu, torch.arange(total, device=device), right=True) - 1
    return cu[doc].to(torch.int32), cu[doc + 1].to(torch.int32)


def _tma_ok(d, tensors_and_token_strides) -> bool:
    """Whether TMA tensor descriptors can read these (T, H, D) row sources: each (tensor, token stride)
    with head stride D (rows of one token contiguous), its base and token stride in bytes multiples of
    16 (the bulk copy engine's alignment). Otherwise the kernels keep pointer loads. Asked only when a
    config in play has the TMA flag (``tuning.wants_tma``); a candidate list without one never
    touches triton's allocator."""
    for x, stride_t in tensors_and_token_strides:
        if x.stride(-2) != d or x.data_ptr() % 16 or (stride_t * x.element_size()) % 16:
            return False
    return True


_scratch_allocators: dict = {}


def _tma_allocator(device: torch.device):
    """Give triton the allocator its tensor descriptors need, at every TMA launch: global scratch on
    the launch's ``device`` (the interpreter's: the CPU) from torch's caching allocator, so CUDA
    graph capture keeps it in the graph's pool. Set per launch because triton keeps it in a context
    variable, and autograd runs the backward of CUDA tensors on its own thread, which does not see
    a value set on the caller's."""
    if device not in _scratch_allocators:
        _scratch_allocators[device] = lambda size, alignment, stream: torch.empty(size, dtype=torch.int8,
                                                                                  device=device)
    triton.set_allocator(_scratch_allocators[device])


def hopper_unusable(q, total, rows, *names, scale=1.0) -> str | None:
    """Why kernels ``names`` ("fwd"; "dq", "dkdv") on q over ``total`` tokens with row tensors ``rows``
    ((tensor, token stride) pairs) and softmax ``scale`` run as the Triton kernels instead of
    ``hopper``'s, or None when they do not: switched off (``tuning.hopper_kernels(False)``,
    ``candidates`` lists), this triton has no Gluon for Hopper, or ``hopper.unusable``'s reasons (GPU,
    dtype, head dim, layout, the forward's scale)."""
    if not tuning.hopper_wanted(*names):
        return "the Triton kernels were asked for (tuning.hopper_kernels or tuning.candidates)"
    if not q.is_cuda:
        return "inputs are not CUDA tensors"
    try:
        from kernels.parallax import hopper
    except ImportError as exc:
        return f"this triton has no Gluon for Hopper ({exc})"
    return hopper.unusable(q, total, _tma_ok(q.shape[-1], rows), names, scale)


def check_head_dim(d):
    """Raise ValueError unless head_dim d is a power of two in [16, 256] (tl.dot tile rule)."""
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"parallax_attention: backend='triton' needs head_dim a power of two in [16, 256], got {d}")


def _common(q, k, scale, cu_seqlens, window):
    b, n, hq, d = q.shape
    check_head_dim(d)
    total = b * n
    varlen = cu_seqlens is not None
    docs = doce = q  # placeholders: never read when VARLEN is False
    if varlen:
        offsets.check_values(cu_seqlens, total)  # wrong offsets would index K/V out of bounds
        docs, doce = _doc_tables(cu_seqlens, total, q.device)
    prec = "ieee" if q.dtype == torch.float32 else "tf32"  # only fp32 dots read it
    meta = dict(GROUP=hq // k.shape[2], D=d, VARLEN=varlen, PREC=prec)
    keys = min(n, window or n)  # keys per query, at most
    band = min(window or total, total)  # WINDOW: at most T keeps n0 + WINDOW in int32
    tune = (triton.next_power_of_2(total), triton.next_power_of_2(n), triton.next_power_of_2(keys))
    return total, n, hq, docs, doce, meta, scale * LOG2E, band, tune, total * keys * hq * d


def tile_grid(total: int, tile: int, heads: int) -> tuple[int]:
    """The launch grid of a kernel over ``tile``-token tiles of ``total`` tokens and ``heads`` heads:
    one (tile, head) program each, on one grid dim (``_tile_order``)."""
    return (triton.cdiv(total, tile) * heads,)


def stats_buffer(q):
    """Empty fp32 per-(head, token) statistics for q (B, L, Hq, D): shape (Hq, B * L), head-major,
    so that a tile of consecutive tokens of one head reads and writes one contiguous run (the
    column pass loads four of them per query tile)."""
    return torch.empty((q.shape[2], q.shape[0] * q.shape[1]), dtype=torch.float32, device=q.device)


def forward(q, r, k, v, scale, cu_seqlens=None, window=None, *, config=None, hopper=True):
    """Fused causal forward.

    q, r: (B, L, Hq, D); k, v: (B, L, Hkv, D); fp16/bf16/fp32, CUDA (or CPU under TRITON_INTERPRET=1).
    cu_seqlens: optional (num_docs + 1,) int32 offsets (B == 1), values checked here (cu_seqlens.py).
    window: optional sliding window W >= 1 (keys i - W < j <= i), validated by the caller.
    Returns o, vbar (B, L, Hq, D) in q's dtype, tbar and lse (Hq, B * L) fp32 (lse in log2 units of
    scale * log2(e) * q.k). config: optional ``triton.Config`` or dict of launch kwargs ({"BM", "BN",
    "num_warps", "num_stages"}, optionally "GLOBAL_ORDER") run instead of ``tuning.choose``'s pick.
    On an sm_90 GPU it runs as ``hopper``'s kernel where that applies (``hopper_unusable`` says why
    not), unless a config is given or ``hopper`` is False.
    """
    total, n, hq, docs, _, meta, qk_scale, band, tune, work = _common(q, k, scale, cu_seqlens, window)
    q, r, sqt, sqh = _same_layout(q, r)
    (k, skt, skh), (v, svt, svh) = _tokens(k), _tokens(v)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    vbar = torch.empty_like(o)
    tbar = stats_buffer(q)
    lse = torch.empty_like(tbar)
    rows = [(q, sqt), (r, sqt), (k, skt), (v, svt)]
    with launcher.on_device(q.device):
        if hopper and config is None and hopper_unusable(q, total, rows, "fwd", scale=scale) is None:
            from kernels.parallax import hopper

            hopper.forward(q, r, k, v, (o, vbar, tbar, lse), docs, strides={"q": sqt, "k": skt, "v": svt},
                           total=total, seq_len=n, window=band, qk_scale=qk_scale, varlen=meta["VARLEN"])
            return o, vbar, tbar, lse
        meta["TMA_OK"] = tuning.wants_tma("fwd", config) and _tma_ok(q.shape[-1], rows)
        if meta["TMA_OK"]:
            _tma_allocator(q.device)
        kernel, launch = tuning.select("fwd", _fwd_kernel, work, config)
        kernel[lambda meta_: tile_grid(total, meta_["BM"], hq)](
            q, r, k, v, o, vbar, tbar, lse, docs, total, n, hq, sqt, sqh, skt, skh, svt, svh, qk_scale, band, *tune,
            **meta, **launch)
    return o, vbar, tbar, lse


def backward(do, q, r, k, v, o, vbar, tbar, lse, scale, cu_seqlens=None, window=None, *, dq_config=None,
             dkdv_config=None, hopper=True):
    """Fused closed-form backward.

    do, q, r, o, vbar: (B, L, Hq, D); k, v: (B, L, Hkv, D); tbar, lse: (Hq, B * L) fp32 from forward.
    cu_seqlens, window: as in ``forward``.
    Returns dq, dr (B, L, Hq, D) and dk, dv (B, L, Hkv, D) in the inputs' dtypes.
    Two passes: a row pass (dq, drho) then a column pass (dk, dv), 11 matmuls per tile pair. On an
    sm_90 GPU both run as ``hopper``'s kernels where they apply (``hopper_unusable`` says why not),
    unless configs are given or ``hopper`` is False.
    dq_config, dkdv_config: optional explicit configs of the two Triton passes, as ``forward``'s config
    (the column pass also reads "ROWS").
    """
    total, n, hq, docs, doce, meta, qk_scale, band, tune, work = _common(q, k, scale, cu_seqlens, window)
    q, r, sqt, sqh = _same_layout(q, r)
    (k, skt, skh), (v, svt, svh) = _tokens(k), _tokens(v)
    do, o, vbar = do.contiguous(), o.contiguous(), vbar.contiguous()
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dr = torch.empty_like(r, memory_format=torch.contiguous_format)
    rows = [(q, sqt), (r, sqt), (k, skt), (v, svt), (do, do.stride(1))]
    with launcher.on_device(q.device):
        if (hopper and dq_config is None and dkdv_config is None
                and hopper_unusable(q, total, rows, "dq", "dkdv") is None):
            from kernels.parallax import hopper

            hopper.backward(q, r, k, v, o, vbar, do, tbar, lse, (dq, dr, dk, dv), docs, doce,
                            strides={"q": sqt, "do": do.stride(1), "k": skt, "v": svt}, total=total, seq_len=n,
                            window=band, scale=scale, qk_scale=qk_scale, varlen=meta["VARLEN"])
            return dq, dr, dk, dv
        tau = torch.empty_like(tbar)
        beta = torch.empty_like(tbar)
        wanted = tuning.wants_tma("dq", dq_config) or tuning.wants_tma("dkdv", dkdv_config)
        meta["TMA_OK"] = wanted and _tma_ok(q.shape[-1], rows)
        if meta["TMA_OK"]:
            _tma_allocator(q.device)
        kernel, launch = tuning.select("dq", _bwd_dq_kernel, work, dq_config)
        kernel[lambda meta_: tile_grid(total, meta_["BM"], hq)](
            q, r, k, v, o, vbar, do, tbar, lse, tau, beta, dq, dr, docs, total, n, hq,
            sqt, sqh, skt, skh, svt, svh, scale, qk_scale, band, *tune, **meta, **launch)
        kernel, launch = tuning.select("dkdv", _bwd_dkdv_kernel, work, dkdv_config)
        kernel[lambda meta_: tile_grid(total, meta_["BN"], k.shape[2])](
            q, r, k, v, do, tbar, lse, tau, beta, dk, dv, docs, doce, total, n, hq,
            k.shape[2], sqt, sqh, skt, skh, svt, svh, scale, qk_scale, band, *tune, **meta, **launch)
    return dq, dr, dk, dv
