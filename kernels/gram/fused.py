"""Triton kernel for ``symmetric_product(P, alpha, Y, beta, gamma, scale) = scale_b (alpha P P^T + beta Y +
gamma I)``.

The output S (k x k per batch entry) is symmetric, so each program computes one tile on or above
the diagonal, S[i-block, j-block] with i <= j, and stores it twice: at (i, j) and, transposed, at
(j, i). That is T (T + 1) / 2 tiles of the T^2 a GEMM would compute (T = ceil(k / BM)), about half
the FLOPs for large T. The epilogue (alpha, beta Y, gamma on the diagonal) is fused, so Polar
Express's H = aI + bA + cA^2 is one call ``symmetric_product(A, c, A, b, a)`` (A is symmetric,
so A A = A A^T) with no copy of A into the output first.

Exactly symmetric output: every entry on or above the diagonal is computed once, rounded, and
stored twice, the second time at its mirror below the diagonal (a diagonal tile stores its upper
triangle and the transpose of it). No atomics: every output element is written by one program, so
two calls give the same bits.

P is read in place through its strides, so the tall case of Polar Express passes ``X.mT`` (a
transposed view) without a copy. Products accumulate in fp32; fp32 inputs use IEEE fp32 dots
(Triton's default would round them to tf32).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels import launcher
from kernels.checks import refuse_grad
from kernels.gram.naive import check_args

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_K = 46340  # the largest k with k * k < 2**31: offsets within one output matrix are int32


def launch_config(k: int, K: int) -> dict:
    """Tile sizes, warps and pipeline stages for a (k, K) operand.

    Fixed per shape rather than autotuned, so that every process computes the same bits (the K step
    BK sets the summation order). At the 0.6B Muon shapes on an H200 the autotuner picked 128 x 128
    tiles with BK 64 and 8 warps, 4 stages for K >= 2048 (docs/bench/gram.md). Square tiles (BM = BN)
    so that a tile and its mirror have the same shape. Compiled for sm_90 (triton 3.6) as a launch
    specialises it, none of these spills (docs/bench/gram.md). 64 x 64 tiles below k = 512: fewer
    idle programs (not timed). Under the CPU interpreter: small tiles, so that tests stay fast and
    cover several tiles."""
    if INTERPRET:
        return {"BM": 32, "BK": 16, "num_warps": 4, "num_stages": 1}
    if k < 512:
        return {"BM": 64, "BK": 64, "num_warps": 4, "num_stages": 4}
    return {"BM": 128, "BK": 64, "num_warps": 8, "num_stages": 4 if K >= 2048 else 3}


def _upcast(dtype: torch.dtype) -> bool:
    """Whether the dot's operands go in as fp32: bf16 under the CPU interpreter, whose bf16 tl.dot
    returns garbage (triton 3.9). bf16 -> fp32 is exact and so are the products of two bf16
    numbers in fp32, so this computes what the GPU's bf16 dot with fp32 accumulation does."""
    return INTERPRET and dtype == torch.bfloat16


def _tiles(k: int, bm: int) -> int:
    """Number of tiles on and above the diagonal of a k x k output in bm x bm tiles."""
    t = triton.cdiv(k, bm)
    return t * (t + 1) // 2


def launch_grids(k: int, batch: int, bm: int) -> list[tuple[slice, tuple[int, int]]]:
    """(batch entries, grid) of each launch for ``batch`` k x k outputs in bm x bm tiles: a matrix's
    tiles on the grid's first dim (``_tile_of``'s order, whose neighbours share row blocks of P), its
    batch entry on the second, which CUDA stops at 65535: a longer batch takes a launch per run of
    65535 entries."""
    step, tiles = launcher.MAX_GRID[1], _tiles(k, bm)
    return [(slice(b0, min(b0 + step, batch)), (tiles, min(step, batch - b0))) for b0 in range(0, batch, step)]


@triton.jit
def _tile_of(pid, k, BM: tl.constexpr):
    """Row and column tile (i <= j) of the pid-th upper-triangle tile, row by row: i = 0 takes
    pids 0..T-1 (j = 0..T-1), i = 1 the next T-1, and so on, so that programs that run together
    share their row block of P (L2 reuse).

    Counted from the end, row i is row r = T-1-i of a triangle with r+1 tiles per row, whose
    first tile has index r (r + 1) / 2: r comes from a square root, then one integer correction
    each way for its rounding."""
    T = tl.cdiv(k, BM)
    u = T * (T + 1) // 2 - 1 - pid
    r = ((tl.sqrt((8 * u + 1).to(tl.float32)) - 1.0) * 0.5).to(tl.int32)
    r = tl.where(r * (r + 1) // 2 > u, r - 1, r)
    r = tl.where((r + 1) * (r + 2) // 2 <= u, r + 1, r)
    i = T - 1 - r
    return i, i + r - (u - r * (r + 1) // 2)


@triton.jit
def _dot_tile(Pb, i, j, k, K, sp_r, sp_c, BM: tl.constexpr, BK: tl.constexpr,
              EVEN_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 (BM, BM) tile P[i-block, :] @ P[j-block, :]^T of the (k, K) matrix at ``Pb``; with
    UPCAST the operands enter the dot as fp32 (exact for 16-bit inputs, see ``_upcast``)."""
    rows_i = i * BM + tl.arange(0, BM)
    rows_j = j * BM + tl.arange(0, BM)
    cols = tl.arange(0, BK)
    # 64-bit offsets once; the loop then only advances the pointers
    a_ptrs = Pb + rows_i.to(tl.int64)[:, None] * sp_r + cols.to(tl.int64)[None, :] * sp_c
    b_ptrs = Pb + cols.to(tl.int64)[:, None] * sp_c + rows_j.to(tl.int64)[None, :] * sp_r
    ok_i = rows_i < k
    ok_j = rows_j < k
    acc = tl.zeros((BM, BM), dtype=tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            a_mask = ok_i[:, None]
            b_mask = ok_j[None, :]
        else:
            a_mask = ok_i[:, None] & (cols[None, :] < K - k0)
            b_mask = ok_j[None, :] & (cols[:, None] < K - k0)
        if EVEN_M and EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BK * sp_c
        b_ptrs += BK * sp_c
    return acc


@triton.heuristics({"EVEN_M": lambda a: a["k"] % a["BM"] == 0, "EVEN_K": lambda a: a["K"] % a["BK"] == 0})
@triton.jit
def _symmetric_product_kernel(P, Y, S, OUT, k, K, sp_b, sp_r, sp_c, sy_b, sy_r, sy_c, alpha, beta, gamma,
                              HAS_Y: tl.constexpr, HAS_SCALE: tl.constexpr, PRECISION: tl.constexpr,
                              UPCAST: tl.constexpr,
                              BM: tl.constexpr, BK: tl.constexpr,
                              EVEN_M: tl.constexpr, EVEN_K: tl.constexpr):
    """One (BM, BM) output tile (i <= j) of batch entry ``program_id(1)``.

    P: (B, k, K) with strides (sp_b, sp_r, sp_c); Y: (B, k, k) with strides (sy_b, sy_r, sy_c),
    read only when HAS_Y and only at tile (i, j); S: (B,) fp32 factors of the whole result, read
    only when HAS_SCALE; OUT: contiguous (B, k, k) in P's dtype."""
    i, j = _tile_of(tl.program_id(0), k, BM)
    b = tl.program_id(1).to(tl.int64)
    acc = _dot_tile(P + b * sp_b, i, j, k, K, sp_r, sp_c, BM, BK, EVEN_M, EVEN_K, PRECISION, UPCAST) * alpha
    rows = i * BM + tl.arange(0, BM)
    cols = j * BM + tl.arange(0, BM)
    inside = (rows[:, None] < k) & (cols[None, :] < k)
    if HAS_Y:
        y_ptrs = Y + b * sy_b + (rows[:, None] * sy_r + cols[None, :] * sy_c)
        acc += beta * tl.load(y_ptrs, mask=inside, other=0.0).to(tl.float32)
    acc += tl.where(rows[:, None] == cols[None, :], gamma, 0.0)
    if HAS_SCALE:
        acc *= tl.load(S + b)
    tile = acc.to(OUT.dtype.element_ty)
    out = OUT + b * k * k
    # Every entry below the diagonal is the rounded value of its mirror, stored a second time, so the
    # output is exactly symmetric. Offsets within one matrix are int32 (k <= MAX_K, and Y's
    # strides, checked by the launcher): half the address registers of int64 ones. The store
    # masks stay constant along a row, or are absent, so that stores are 16 bytes wide (a
    # triangular store mask made them scalar and the kernel about 1.7x slower on an H200).
    if i == j:
        tile = tl.where(rows[:, None] <= cols[None, :], tile, tl.trans(tile))
        _store(out + rows[:, None] * k + cols[None, :], tile, inside, EVEN_M)
    else:
        _store(out + rows[:, None] * k + cols[None, :], tile, inside, EVEN_M)
        _store(out + cols[:, None] * k + rows[None, :], tl.trans(tile), (cols[:, None] < k) & (rows[None, :] < k),
               EVEN_M)


@triton.jit
def _store(ptrs, values, mask, EVEN_M: tl.constexpr):
    """``tl.store`` with ``mask``, or without one when every tile is whole (EVEN_M)."""
    if EVEN_M:
        tl.store(ptrs, values)
    else:
        tl.store(ptrs, values, mask=mask)


def symmetric_product(P: torch.Tensor, alpha: float = 1.0, Y: torch.Tensor | None = None,
                      beta: float = 0.0, gamma: float = 0.0, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``scale_b * (alpha * P @ P^T + beta * Y + gamma * I)`` per batch entry b, computing only the
    tiles on and above the diagonal.

    Args:
        P: (B, k, K) or (k, K) CUDA tensor, fp16 / bf16 / fp32, any strides (a transposed view
            such as ``X.mT`` is read in place).
        alpha, beta, gamma: finite Python numbers.
        Y: None or a (B, k, k) (or (k, k)) tensor of P's dtype and device, assumed symmetric: only
            its entries on and above the diagonal are used (the result's lower triangle mirrors
            its upper one).
        scale: None or a (B,) (or () for a 2-D P) floating tensor on P's device: one factor per
            matrix, applied in fp32 before the result is rounded (Polar Express folds its
            normalisation into it).
    Returns:
        Contiguous (B, k, k) (or (k, k)) tensor of P's dtype, accumulated in fp32, exactly
        symmetric and deterministic.
    Raises:
        TypeError / ValueError for bad arguments (``naive.check_args``), a ValueError for CPU
        tensors unless Triton's interpreter is on (TRITON_INTERPRET=1), and one naming P, Y or scale
        where it requires grad while autograd records: the kernel has no backward.
    """
    check_args(P, alpha, Y, beta, gamma, scale)
    refuse_grad("symmetric_product", {"P": P, "Y": Y, "scale": scale},
                "kernels.gram.naive.symmetric_product is differentiable")
    if P.shape[-2] > MAX_K:
        raise ValueError(f"symmetric_product: P has {P.shape[-2]} rows; at most {MAX_K} are supported (the "
                         "kernel addresses a k x k output with 32-bit offsets)")
    if not P.is_cuda and not INTERPRET:
        raise ValueError(f"symmetric_product: the Triton kernel needs CUDA tensors; got P on {P.device} "
                         "(run under TRITON_INTERPRET=1 for the CPU interpreter, or use kernels.gram.naive)")
    flat = P.ndim == 2
    P3 = P.unsqueeze(0) if flat else P
    Y3 = None if Y is None else (Y.unsqueeze(0) if flat else Y)
    B, k, K = P3.shape
    if Y3 is not None and (k - 1) * (abs(Y3.stride(1)) + abs(Y3.stride(2))) >= 2**31:
        Y3 = Y3.contiguous()  # its in-matrix offsets must fit the kernel's 32-bit arithmetic
    out = torch.empty(B, k, k, dtype=P.dtype, device=P.device)
    if B and k:
        ys = (0, 0, 0) if Y3 is None else Y3.stride()
        upcast = _upcast(P.dtype)
        config = launch_config(k, K)
        launches = launch_grids(k, B, config["BM"])
        with launcher.on_device(P.device):
            factors = out if scale is None else scale.reshape(B).to(torch.float32).contiguous()
            tensors = (P3, P3 if Y3 is None else Y3, factors, out)
            for rows, grid in launches:
                part = tensors if len(launches) == 1 else [x[rows] for x in tensors]
                _symmetric_product_kernel[grid](*part, k, K, *P3.stride(), *ys, float(alpha), float(beta),
                                                float(gamma), HAS_Y=Y3 is not None, HAS_SCALE=scale is not None,
                                                PRECISION="ieee" if P.dtype == torch.float32 or upcast else "tf32",
                                                UPCAST=upcast, **config)
    return out[0] if flat else out
