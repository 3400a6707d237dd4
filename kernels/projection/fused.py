"""Fused per-head RMSNorm + RoPE of the attention's input projection (Triton, forward and backward).

The fused projection ``y = x [W_Q; W_K; W_V; W_R]^T`` holds per token the q, k, v and rho heads side
by side. ``forward`` turns it into the attention's inputs with one launch per head group (q, k, rho),
one program per (tile of BT tokens, head): it reads the head's two halves (which RoPE pairs),
normalises them in fp32, rounds to y's dtype as the norm module does, rotates them by the RoPE angles
(cos and sin rounded to y's dtype, as the model casts them: ``api.rope_angles``, one row of D per
position, since RoPE turns the pair (i, i + D/2) by one angle) and stores one rounding of the result.
The k launch also copies v out (a custom op's outputs may not alias its input), so v costs no launch
of its own and its gradient reaches the backward.

The backward writes the gradient of y, one launch per head group into its columns (the k launch
also copies v's gradient into its own), so autograd never concatenates four gradients; the norms'
weight gradients come from per-program partial sums reduced in a fixed order (deterministic, no
atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BT = 64  # tokens per program
NUM_WARPS = 8  # 64 x 128 fp32 tiles: 8 warps keep the backward at 123 registers, no spills (sm_90)


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
def _forward_kernel(Y, OUT, W, ANGLES, V, T, L, y_stride, col0, v_col0, H, eps,
                    HALF: tl.constexpr, BT: tl.constexpr, ROPE: tl.constexpr, COPY_V: tl.constexpr):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    h = tl.program_id(1)
    ok = rows < T
    dtype = OUT.dtype.element_ty
    x1, x2 = _halves(Y, rows, y_stride, col0 + h * 2 * HALF, ok, HALF)
    w1 = tl.load(W + tl.arange(0, HALF)).to(tl.float32)
    w2 = tl.load(W + HALF + tl.arange(0, HALF)).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
    n1 = (x1 * rstd[:, None] * w1[None, :]).to(dtype).to(tl.float32)
    n2 = (x2 * rstd[:, None] * w2[None, :]).to(dtype).to(tl.float32)
    if ROPE:
        c, s = _angles(ANGLES, rows, L, ok, HALF)
        n1, n2 = n1 * c - n2 * s, n2 * c + n1 * s
    out = OUT + rows.to(tl.int64)[:, None] * (H * 2 * HALF) + h * 2 * HALF + tl.arange(0, HALF)[None, :]
    tl.store(out, n1.to(dtype), mask=ok[:, None])
    tl.store(out + HALF, n2.to(dtype), mask=ok[:, None])
    if COPY_V:  # v has k's heads: this program copies v's head h of its tokens
        _copy_head(Y, y_stride, v_col0 + h * 2 * HALF, V, H * 2 * HALF, h * 2 * HALF, rows, ok, 2 * HALF)


@triton.jit
def _backward_kernel(DOUT, Y, DY, W, ANGLES, DW_PART, DV, T, L, y_stride, col0, v_col0, H, eps,
                     HALF: tl.constexpr, BT: tl.constexpr, ROPE: tl.constexpr, COPY_V: tl.constexpr):
    tb = tl.program_id(0)
    h = tl.program_id(1)
    rows = tb * BT + tl.arange(0, BT)
    ok = rows < T
    g1, g2 = _halves(DOUT, rows, H * 2 * HALF, h * 2 * HALF, ok, HALF)
    x1, x2 = _halves(Y, rows, y_stride, col0 + h * 2 * HALF, ok, HALF)
    w1 = tl.load(W + tl.arange(0, HALF)).to(tl.float32)
    w2 = tl.load(W + HALF + tl.arange(0, HALF)).to(tl.float32)
    if ROPE:  # the rotation's transpose
        c, s = _angles(ANGLES, rows, L, ok, HALF)
        g1, g2 = g1 * c + g2 * s, g2 * c - g1 * s
    rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
    xh1, xh2 = x1 * rstd[:, None], x2 * rstd[:, None]
    gx1, gx2 = g1 * w1[None, :], g2 * w2[None, :]
    mean = (tl.sum(gx1 * xh1, 1) + tl.sum(gx2 * xh2, 1)) / (2 * HALF)
    dy = DY + rows.to(tl.int64)[:, None] * y_stride + col0 + h * 2 * HALF + tl.arange(0, HALF)[None, :]
    tl.store(dy, (rstd[:, None] * (gx1 - xh1 * mean[:, None])).to(DY.dtype.element_ty), mask=ok[:, None])
    tl.store(dy + HALF, (rstd[:, None] * (gx2 - xh2 * mean[:, None])).to(DY.dtype.element_ty), mask=ok[:, None])
    part = DW_PART + (tb * H + h) * 2 * HALF + tl.arange(0, HALF)  # masked rows are zero in g and x
    tl.store(part, tl.sum(g1 * xh1, 0))
    tl.store(part + HALF, tl.sum(g2 * xh2, 0))
    if COPY_V:
        _copy_head(DV, H * 2 * HALF, h * 2 * HALF, DY, y_stride, v_col0 + h * 2 * HALF, rows, ok, 2 * HALF)


def head_columns(hq: int, hkv: int, d: int) -> tuple[int, int, int, int]:
    """First column of the q, k, v and rho heads in a row of the fused projection."""
    return 0, hq * d, (hq + hkv) * d, (hq + 2 * hkv) * d


def _rows(y):
    """y (B, L, W) as (rows, row stride): the kernels index tokens by one stride."""
    b, n, _ = y.shape
    if y.stride(-1) != 1 or (b > 1 and y.stride(0) != n * y.stride(1)):
        y = y.contiguous()
    return y, y.stride(1)


def _groups(hq, hkv, d, weights, rope_rho):
    """(heads, first column, norm weight (contiguous: the kernels read it by offset), rotate?, v's first
    column or None) of q, k, rho: k's launch also moves v (the same heads)."""
    cols = head_columns(hq, hkv, d)
    w_q, w_k, w_rho = (w.contiguous() for w in weights)
    return ((hq, cols[0], w_q, True, None), (hkv, cols[1], w_k, True, cols[2]), (hq, cols[3], w_rho, rope_rho, None))


def forward(y, hq, hkv, weights, eps, angles, rope_rho):
    """Launches of ``split_norm_rope``'s forward; arguments as there, the RoPE rows as ``rope_angles``
    gives them. Returns q, k, v, rho."""
    b, n, _ = y.shape
    d = angles.shape[-1]
    y, y_stride = _rows(y)
    angles = angles.contiguous()  # its rows are read by one stride
    total = b * n
    v = torch.empty((b, n, hkv, d), dtype=y.dtype, device=y.device)
    outs = []
    for heads, col, w, rope, v_col in _groups(hq, hkv, d, weights, rope_rho):
        out = torch.empty((b, n, heads, d), dtype=y.dtype, device=y.device)
        _forward_kernel[(triton.cdiv(total, BT), heads)](
            y, out, w, angles, v, total, n, y_stride, col, v_col or 0, heads, eps,
            HALF=d // 2, BT=BT, ROPE=rope, COPY_V=v_col is not None, num_warps=NUM_WARPS)
        outs.append(out)
    return outs[0], outs[1], v, outs[2]


def backward(grads, y, hq, hkv, weights, eps, angles, rope_rho):
    """Launches of the backward: grads (dq, dk, dv, drho) -> (dy (B, L, W) in y's dtype, the three
    weights' gradients in their dtypes)."""
    b, n, width = y.shape
    d = angles.shape[-1]
    y, y_stride = _rows(y)
    angles = angles.contiguous()
    total = b * n
    tiles = triton.cdiv(total, BT)
    dy = torch.empty((b, n, width), dtype=y.dtype, device=y.device)
    dq, dk, dv, dr = grads
    dv = dv.contiguous()
    dws = []
    for g, (heads, col, w, rope, v_col) in zip((dq, dk, dr), _groups(hq, hkv, d, weights, rope_rho)):
        part = torch.empty((tiles * heads, d), dtype=torch.float32, device=y.device)
        _backward_kernel[(tiles, heads)](
            g.contiguous(), y, dy, w, angles, part, dv, total, n, y_stride, col, v_col or 0, heads, eps,
            HALF=d // 2, BT=BT, ROPE=rope, COPY_V=v_col is not None, num_warps=NUM_WARPS)
        dws.append(part.sum(0).to(w.dtype))
    return dy, *dws
