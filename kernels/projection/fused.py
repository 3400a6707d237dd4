"""Fused per-head RMSNorm + RoPE of the attention's input projection (Triton, forward and backward).

The fused projection ``y = x [W_Q; W_K; W_V; W_R]^T`` holds per token the q, k, v and rho heads side
by side. ``forward`` turns it into the attention's inputs in one launch: one program per (token tile,
head slot), the slots being the q heads, then the k heads, then the rho heads, and the programs of one
tile of BT tokens numbered consecutively, so that those running together read whole rows of y (one
head's D elements of each row alone would leave DRAM pages partly read). A program reads its head's two
halves (which RoPE pairs), normalises them in fp32, rounds to y's dtype as the norm module does,
rotates them by the RoPE angles (cos and sin rounded to y's dtype, as the model casts them:
``api.rope_angles``, one row of D per position, since RoPE turns the pair (i, i + D/2) by one angle)
and stores one rounding of the result. A k program also copies its head of v out (a custom op's
outputs may not alias its input), so v costs no launch of its own and its gradient reaches the
backward.

The backward writes the whole gradient of y in one launch of the same programs (a k program also
copies its head of v's gradient), so autograd never concatenates four gradients; the norms' weight
gradients come from per-program partial sums that a second, small launch reduces in a fixed order
(deterministic, no atomics).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import launcher


class Launch(NamedTuple):
    """Tokens per tile, warps per program and tiles per program of both kernels (the backward writes
    one partial sum of the weight gradients per program)."""

    bt: int
    warps: int
    tiles: int


# measured at the 0.6B shapes (heads of 128 and 64) on an H200: docs/bench/projection.md. The forward at
# heads of 128 with 4 warps: 7% faster than 8 in two sweeps (8 stays for heads of 64, where the sweeps
# disagreed).
FORWARD = Launch(bt=64, warps=8, tiles=1)
FORWARD_BY_HEAD_DIM = {128: Launch(bt=64, warps=4, tiles=1)}
BACKWARD = Launch(bt=64, warps=4, tiles=2)  # half the partial sums of one tile per program


class Reduction(NamedTuple):
    """Launch of the weight gradients' reduction (``_weight_grads_kernel``): columns per program
    (at most the head dim), partial rows added per step, warps."""

    cols: int
    block: int
    warps: int


# 4 columns per program: 3 D / 4 programs read the partial rows (3 D / 16 left most SMs idle): 3.7x faster
# at heads of 64, 9% at heads of 128 (docs/bench/projection.md)
REDUCTION = Reduction(cols=4, block=256, warps=4)


def forward_launch(head_dim: int) -> Launch:
    """The forward's launch config at ``head_dim``."""
    return FORWARD_BY_HEAD_DIM.get(head_dim, FORWARD)


@triton.jit
def _halves(PTR, rows, row_stride, col, ok, HALF: tl.constexpr):
    """The two halves [BT, HALF] of head columns [col, col + 2 HALF) of rows ``rows``, fp32."""
    offs = rows.to(tl.int64)[:, None] * row_stride + col + tl.arange(0, HALF)[None, :]
    a = tl.load(PTR + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    b = tl.load(PTR + offs + HALF, mask=ok[:, None], other=0.0).to(tl.float32)
    return a, b


@triton.jit
def _angles(ANGLES, rows, L, ok, HALF: tl.constexpr):
    """cos and sin [BT, HALF] of the rotation angles of positions rows % L (fp32 values)."""
    return _halves(ANGLES, rows % L, 2 * HALF, 0, ok, HALF)


@triton.jit
def _copy_head(SRC, src_stride, src_col, DST, dst_stride, dst_col, rows, ok, HEAD: tl.constexpr):
    """Columns [src_col, src_col + HEAD) of rows ``rows`` of SRC into DST's from dst_col, as they are."""
    r = rows.to(tl.int64)[:, None]
    cols = tl.arange(0, HEAD)[None, :]
    x = tl.load(SRC + r * src_stride + src_col + cols, mask=ok[:, None])
    tl.store(DST + r * dst_stride + dst_col + cols, x.to(DST.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _program(HQ, HKV):
    """(span of TILES token tiles, head slot) of this program: the 2 HQ + HKV slots of a span are
    consecutive programs."""
    slots = 2 * HQ + HKV
    pid = tl.program_id(0)
    return pid // slots, pid % slots


@triton.jit
def _tile_rows(span, t, T, BT: tl.constexpr, TILES: tl.constexpr):
    """Rows [BT] of tile t of the span, and which of them are tokens (< T)."""
    rows = (span * TILES + t) * BT + tl.arange(0, BT)
    return rows, rows < T


@triton.jit
def _slot(slot, HQ, HKV, ROPE_SLOTS, D: tl.constexpr):
    """(group: 0 q, 1 k, 2 rho; head within the group; heads of the group; the head's first column in
    a row of y; rotate?) of a head slot. The slots below ROPE_SLOTS rotate."""
    is_k = (slot >= HQ) & (slot < HQ + HKV)
    is_rho = slot >= HQ + HKV
    group = is_k.to(tl.int32) + 2 * is_rho.to(tl.int32)
    h = tl.where(is_rho, slot - HQ - HKV, tl.where(is_k, slot - HQ, slot))
    col = tl.where(is_rho, slot + HKV, slot) * D  # rho's columns follow v's
    return group, h, tl.where(is_k, HKV, HQ), col, slot < ROPE_SLOTS


@triton.jit
def _pick(group, A, B, C):
    """A, B or C for group 0, 1 or 2 (pointers of one element type)."""
    if group == 0:
        P = A
    elif group == 1:
        P = B
    else:
        P = C
    return P


@triton.jit
def _weight_halves(WQ, WK, WR, group, HALF: tl.constexpr):
    """The two halves [HALF] of the group's norm weight, fp32."""
    W = _pick(group, WQ, WK, WR)
    return tl.load(W + tl.arange(0, HALF)).to(tl.float32), tl.load(W + HALF + tl.arange(0, HALF)).to(tl.float32)


@triton.jit
def _forward_kernel(Y, Q, K, R, V, WQ, WK, WR, ANGLES, T, L, y_stride, HQ, HKV, ROPE_SLOTS, eps,
                    HALF: tl.constexpr, BT: tl.constexpr, TILES: tl.constexpr):
    span, slot = _program(HQ, HKV)
    D: tl.constexpr = 2 * HALF
    group, h, heads, col, rope = _slot(slot, HQ, HKV, ROPE_SLOTS, D)
    OUT = _pick(group, Q, K, R)
    dtype = Q.dtype.element_ty
    w1, w2 = _weight_halves(WQ, WK, WR, group, HALF)
    for t in range(TILES):
        rows, ok = _tile_rows(span, t, T, BT, TILES)
        x1, x2 = _halves(Y, rows, y_stride, col, ok, HALF)
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)
        n1 = (x1 * rstd[:, None] * w1[None, :]).to(dtype).to(tl.float32)
        n2 = (x2 * rstd[:, None] * w2[None, :]).to(dtype).to(tl.float32)
        if rope:
            c, s = _angles(ANGLES, rows, L, ok, HALF)
            n1, n2 = n1 * c - n2 * s, n2 * c + n1 * s
        out = OUT + rows.to(tl.int64)[:, None] * (heads * D) + h * D + tl.arange(0, HALF)[None, :]
        tl.store(out, n1.to(dtype), mask=ok[:, None])
        tl.store(out + HALF, n2.to(dtype), mask=ok[:, None])
        if group == 1:  # v has k's heads: this program copies v's head h of its tokens
            _copy_head(Y, y_stride, (HQ + HKV + h) * D, V, HKV * D, h * D, rows, ok, D)


@triton.jit
def _backward_kernel(DQ, DK, DR, Y, DY, WQ, WK, WR, ANGLES, DW_PART, DV, T, L, y_stride, HQ, HKV, ROPE_SLOTS, eps,
                     HALF: tl.constexpr, BT: tl.constexpr, TILES: tl.constexpr):
    span, slot = _program(HQ, HKV)
    D: tl.constexpr = 2 * HALF
    group, h, heads, col, rope = _slot(slot, HQ, HKV, ROPE_SLOTS, D)
    DOUT = _pick(group, DQ, DK, DR)
    w1, w2 = _weight_halves(WQ, WK, WR, group, HALF)
    dw1 = tl.zeros((HALF,), dtype=tl.float32)
    dw2 = tl.zeros((HALF,), dtype=tl.float32)
    for t in range(TILES):
        rows, ok = _tile_rows(span, t, T, BT, TILES)
        g1, g2 = _halves(DOUT, rows, heads * D, h * D, ok, HALF)
        x1, x2 = _halves(Y, rows, y_stride, col, ok, HALF)
        if rope:  # the rotation's transpose
            c, s = _angles(ANGLES, rows, L, ok, HALF)
            g1, g2 = g1 * c + g2 * s, g2 * c - g1 * s
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)
        xh1, xh2 = x1 * rstd[:, None], x2 * rstd[:, None]
        gx1, gx2 = g1 * w1[None, :], g2 * w2[None, :]
        mean = (tl.sum(gx1 * xh1, 1) + tl.sum(gx2 * xh2, 1)) / D
        dy = DY + rows.to(tl.int64)[:, None] * y_stride + col + tl.arange(0, HALF)[None, :]
        tl.store(dy, (rstd[:, None] * (gx1 - xh1 * mean[:, None])).to(DY.dtype.element_ty), mask=ok[:, None])
        tl.store(dy + HALF, (rstd[:, None] * (gx2 - xh2 * mean[:, None])).to(DY.dtype.element_ty), mask=ok[:, None])
        dw1 += tl.sum(g1 * xh1, 0)  # masked rows are zero in g and x
        dw2 += tl.sum(g2 * xh2, 0)
        if group == 1:
            _copy_head(DV, HKV * D, h * D, DY, y_stride, (HQ + HKV + h) * D, rows, ok, D)
    part = DW_PART + (span * (2 * HQ + HKV) + slot) * D + tl.arange(0, HALF)
    tl.store(part, dw1)
    tl.store(part + HALF, dw2)


@triton.jit
def _weight_grads_kernel(DW_PART, DWQ, DWK, DWR, spans, HQ, HKV, D: tl.constexpr, COLS: tl.constexpr,
                         BLOCK: tl.constexpr):
    """The norm weights' gradients: per group (program axis 0) and run of COLS columns (axis 1) the
    sum of the group's partial rows over every span of tiles and head, in a fixed order."""
    group = tl.program_id(0)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    first = tl.where(group == 0, 0, tl.where(group == 1, HQ, HQ + HKV))
    heads = tl.where(group == 1, HKV, HQ)
    acc = tl.zeros((BLOCK, COLS), dtype=tl.float32)
    n = spans * heads
    for start in range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK)
        row = (i // heads) * (2 * HQ + HKV) + first + i % heads
        acc += tl.load(DW_PART + row.to(tl.int64)[:, None] * D + cols[None, :], mask=(i < n)[:, None], other=0.0)
    DW = _pick(group, DWQ, DWK, DWR)
    tl.store(DW + cols, tl.sum(acc, 0).to(DW.dtype.element_ty))


def _rows(y):
    """y (B, L, W) as (rows, row stride): the kernels index tokens by one stride."""
    b, n, _ = y.shape
    if y.stride(-1) != 1 or (b > 1 and y.stride(0) != n * y.stride(1)):
        y = y.contiguous()
    return y, y.stride(1)


def _rope_slots(hq: int, hkv: int, rope_rho: bool) -> int:
    """The head slots that rotate: q's and k's, and rho's when ``rope_rho``."""
    return 2 * hq + hkv if rope_rho else hq + hkv


def _spans(total: int, launch: Launch) -> int:
    """Programs per head slot: spans of ``launch.tiles`` tiles of ``launch.bt`` tokens."""
    return triton.cdiv(total, launch.bt * launch.tiles)


def _weights(weights):
    """The norm weights as the kernels read them: contiguous, of one dtype (fp32 where they differ)."""
    weights = [w.contiguous() for w in weights]
    if len({w.dtype for w in weights}) > 1:
        weights = [w.float() for w in weights]
    return weights


def forward(y, hq, hkv, weights, eps, angles, rope_rho, launch: Launch | None = None):
    """The launch of ``split_norm_rope``'s forward; arguments as there, ``weights`` the (w_q, w_k,
    w_rho) norm weights, the RoPE rows as ``rope_angles`` gives them; ``launch`` by default
    ``forward_launch(D)``. Returns q, k, v, rho."""
    b, n, _ = y.shape
    d = angles.shape[-1]
    launch = launch or forward_launch(d)
    y, y_stride = _rows(y)
    angles = angles.contiguous()  # its rows are read by one stride
    total = b * n
    q, r = (torch.empty((b, n, hq, d), dtype=y.dtype, device=y.device) for _ in range(2))
    k, v = (torch.empty((b, n, hkv, d), dtype=y.dtype, device=y.device) for _ in range(2))
    with launcher.on_device(y.device):
        _forward_kernel[(_spans(total, launch) * (2 * hq + hkv),)](
            y, q, k, r, v, *_weights(weights), angles, total, n, y_stride, hq, hkv, _rope_slots(hq, hkv, rope_rho),
            eps, HALF=d // 2, BT=launch.bt, TILES=launch.tiles, num_warps=launch.warps)
    return q, k, v, r


def backward(grads, y, hq, hkv, weights, eps, angles, rope_rho, launch: Launch = BACKWARD,
             reduction: Reduction = REDUCTION):
    """The launches of the backward: grads (dq, dk, dv, drho) -> (dy (B, L, W) in y's dtype, the three
    weights' gradients in their dtypes)."""
    b, n, width = y.shape
    d = angles.shape[-1]
    y, y_stride = _rows(y)
    angles = angles.contiguous()
    total = b * n
    spans = _spans(total, launch)
    dy = torch.empty((b, n, width), dtype=y.dtype, device=y.device)
    dq, dk, dv, dr = (g.contiguous() for g in grads)
    read = _weights(weights)
    part = torch.empty((spans * (2 * hq + hkv), d), dtype=torch.float32, device=y.device)
    with launcher.on_device(y.device):
        _backward_kernel[(spans * (2 * hq + hkv),)](
            dq, dk, dr, y, dy, *read, angles, part, dv, total, n, y_stride, hq, hkv, _rope_slots(hq, hkv, rope_rho),
            eps, HALF=d // 2, BT=launch.bt, TILES=launch.tiles, num_warps=launch.warps)
    dws = weight_grads(part, [w.dtype for w in read], spans, hq, hkv, reduction)
    return dy, *(g.to(w.dtype) for g, w in zip(dws, weights))


def weight_grads(part, dtypes, spans, hq, hkv, reduction: Reduction = REDUCTION):
    """The three norm weights' gradients ([D] each, in ``dtypes``) from the backward's partial rows
    ``part`` ((spans * (2 hq + hkv), D) fp32, one row per program), summed in a fixed order."""
    d = part.shape[-1]
    cols = min(d, reduction.cols)
    dws = [torch.empty((d,), dtype=dtype, device=part.device) for dtype in dtypes]
    with launcher.on_device(part.device):
        _weight_grads_kernel[(3, d // cols)](part, *dws, spans, hq, hkv, D=d, COLS=cols, BLOCK=reduction.block,
                                             num_warps=reduction.warps)
    return dws
