"""Triton kernels for causal Affine Linear Attention (SPEC 1b), forward and backward.

    o_i = (1/i) [ (1 + tbar_i) s_v(i) - sum_{j<=i} (r_i . k_j) v_j ],  tbar_i = r_i . s_k(i) / i

(or -(1/i) sum_{j<=i} (r_i . k_j) v_j without the intercept). With g_i = dO_i / i and
beta_i = dO_i . vbar_i the gradients are

    dr_i = (1/i) [ beta_i s_k(i) - sum_{j<=i} (dO_i . v_j) k_j ]
    dk_j = sum_{i>=j} (beta_i / i) r_i      - sum_{i>=j} (dO_i . v_j) r_i / i
    dv_j = sum_{i>=j} ((1 + tbar_i) / i) dO_i - sum_{i>=j} (r_i . k_j) dO_i / i

so two kernels cover all four: a forward scan

    out_i = (1/i) [ (c0 + m_i) s_b(i) - sum_{j<=i} (x_i . a_j) b_j ],  m_i = x_i . s_a(i) / i

(forward: x, a, b = r, k, v, c0 = 1, m = tbar; dr: x, a, b = dO, v, k, c0 = 0, m = beta), and a
reverse scan out_j = sum_{i>=j} w_i y_i - sum_{i>=j} (x_i . a_j) y_i / i (dk: x, a, y = dO, v, r,
w = beta / i; dv: x, a, y = r, k, dO, w = (1 + tbar) / i). Without the intercept the s_b and w
terms drop out.

Each program owns one (batch, query head) and one block of BV output columns and walks the
sequence in chunks of BT tokens, carrying a (D, BV) fp32 state plus the running sums: inter-chunk
through the state, intra-chunk through a causal BT x BT product. The forward state is the mean of
a_j b_j^T over the tokens before the chunk, not their sum, so that its cast to a 16-bit dtype for
the tensor-core product cannot overflow fp16 at long lengths; the reverse state sum x_i y_i^T / i
grows only like log L. x, b / y and outputs are per query head; a (and b in the forward) per kv head
h // GROUP. dk and dv come out per query head (fp32) and are summed over each GQA group.
Batch and token offsets are 64-bit; head offsets are 32-bit unless some tensor's heads reach 2^31
elements (``wide_heads``: a head-strided view of a long buffer), which takes the WIDE variant.
Matmuls accumulate in fp32 (fp32 inputs use IEEE fp32 dots). With 16-bit inputs the operands read
from memory are exact in the input dtype, and the fp32 intermediates that enter a product (the
carried state, the masked scores, x_i / i in the reverse scan) go in as a hi + lo pair of the
input dtype (``_dot_f32``, two tensor-core products): their relative rounding is then about the
square of the dtype's (2^-16 for bf16) instead of 2^-8, and the outputs match the fp32 PyTorch
form on the same inputs up to their own final rounding. One 16-bit cast would not do: the
intercept terms cancel (dr_i = beta_i kbar_i - S_kv(i) dO_i / i is much smaller than either term
at long lengths), and at L = 2048 in bf16 it gives dr about 6 times the PyTorch form's error.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels import launcher

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HEAD_DIMS = (16, 32, 64, 128)
_NO_SPECIALIZE = ["L", "HX", "GROUP"]


def check_head_dim(d: int) -> None:
    if d not in HEAD_DIMS:
        raise ValueError(f"affine_linear_attention: backend='triton' supports head_dim in {HEAD_DIMS}, got {d}")


def _config(d: int) -> dict:
    if INTERPRET:
        return {"BT": 16, "BV": min(d, 16), "num_warps": 4, "num_stages": 1}
    # untuned: at D = 128 the (D, BV) fp32 state and three (BT, D) tiles need 8 warps' registers
    return {"BT": 64, "BV": min(d, 64), "num_warps": 8 if d >= 128 else 4, "num_stages": 2}


@triton.constexpr_function
def _precision(dtype):
    """``tl.dot``'s input_precision for operands of ``dtype``: IEEE for fp32 (Triton's default
    rounds fp32 operands to tf32); the setting applies only to fp32 x fp32 products."""
    return "ieee" if dtype == tl.float32 else "tf32"


@triton.jit
def _rows(PTR, b, offs_t, h, sb, st, sh, offs_c, ok_t):
    ptrs = PTR + b.to(tl.int64) * sb + offs_t.to(tl.int64)[:, None] * st + h * sh + offs_c[None, :]
    return tl.load(ptrs, mask=ok_t[:, None], other=0.0)


@triton.jit
def _dot_f32(lhs, rhs, acc, LHS32: tl.constexpr):
    """acc + lhs @ rhs where one operand (lhs if LHS32, else rhs) is fp32 and the other is in the
    input dtype. 16-bit inputs: the fp32 operand enters as hi + lo, both in the input dtype, in two
    products, so that about twice the dtype's significant bits of it reach the fp32 accumulator.
    fp32 inputs: the cast is a no-op and one IEEE product is taken."""
    if LHS32:
        hi = lhs.to(rhs.dtype)
        acc = tl.dot(hi, rhs, acc, input_precision=_precision(rhs.dtype))
        if rhs.dtype != tl.float32:
            lo = (lhs - hi.to(tl.float32)).to(rhs.dtype)
            acc = tl.dot(lo, rhs, acc, input_precision=_precision(rhs.dtype))
    else:
        hi = rhs.to(lhs.dtype)
        acc = tl.dot(lhs, hi, acc, input_precision=_precision(lhs.dtype))
        if lhs.dtype != tl.float32:
            lo = (rhs - hi.to(tl.float32)).to(lhs.dtype)
            acc = tl.dot(lhs, lo, acc, input_precision=_precision(lhs.dtype))
    return acc


@triton.jit
def _program(HX, GROUP, NV: tl.constexpr, WIDE: tl.constexpr):
    """(batch x head index, column block, batch, head, kv head) of this program on the 1-D grid of
    ``scan_grid`` (CUDA's second and third grid dims stop at 65535, which batch x heads can pass), the
    NV column blocks of one head consecutive. The heads are 64-bit in the WIDE variant: some
    tensor's heads reach 2^31 elements."""
    pid = tl.program_id(0)
    pid_bh = pid // NV
    h = pid_bh % HX
    if WIDE:
        h = h.to(tl.int64)
    return pid_bh, pid % NV, pid_bh // HX, h, h // GROUP


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _scan_fwd_kernel(X, A, Bv, OUT, SIDE, L, HX, GROUP,
                     sxb, sxt, sxh, sab, sat, sah, sob, sot, soh, c0,
                     D: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, INTERCEPT: tl.constexpr,
                     WIDE: tl.constexpr = False):
    """out_i[cols] = (1/i) [(c0 + m_i) s_b(i)[cols] - sum_{j<=i} (x_i . a_j) b_j[cols]]; SIDE_i = m_i.
    X, OUT: (B, L, HX, D) strides (sxb, sxt, sxh) / (sob, sot, soh); A, Bv: (B, L, HX // GROUP, D),
    strides (sab, sat, sah); SIDE: (B, HX, L) fp32. WIDE: 64-bit head offsets."""
    pid_bh, pid_v, b, h, hk = _program(HX, GROUP, D // BV, WIDE)
    offs_d = tl.arange(0, D)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mean_state = tl.zeros((D, BV), dtype=tl.float32)  # mean of a_j b_j^T over the t0 tokens before the chunk
    s_a = tl.zeros((D,), dtype=tl.float32)
    s_b = tl.zeros((BV,), dtype=tl.float32)
    for t0 in range(0, L, BT):
        offs_t = t0 + tl.arange(0, BT)
        ok_t = offs_t < L
        x = _rows(X, b, offs_t, h, sxb, sxt, sxh, offs_d, ok_t)
        a = _rows(A, b, offs_t, hk, sab, sat, sah, offs_d, ok_t)
        bb = _rows(Bv, b, offs_t, hk, sab, sat, sah, offs_v, ok_t)
        causal = offs_t[None, :] <= offs_t[:, None]
        scores = tl.where(causal, tl.dot(x, tl.trans(a), input_precision=_precision(x.dtype)), 0.0)
        u = _dot_f32(x, mean_state, tl.zeros((BT, BV), dtype=tl.float32), False) * t0
        u = _dot_f32(scores, bb, u, True)
        n = (offs_t + 1).to(tl.float32)
        m = (tl.sum(x.to(tl.float32) * s_a[None, :], 1) + tl.sum(scores, 1)) / n
        if INTERCEPT:
            cum_b = s_b[None, :] + tl.cumsum(bb.to(tl.float32), 0)
            out = ((c0 + m)[:, None] * cum_b - u) / n[:, None]
        else:
            out = -u / n[:, None]
        o_ptrs = OUT + b.to(tl.int64) * sob + offs_t.to(tl.int64)[:, None] * sot + h * soh + offs_v[None, :]
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=ok_t[:, None])
        if pid_v == 0:
            tl.store(SIDE + pid_bh.to(tl.int64) * L + offs_t, m, mask=ok_t)
        mean_state = (mean_state * t0 + tl.dot(tl.trans(a), bb, input_precision=_precision(a.dtype))) / (t0 + BT)
        s_a += tl.sum(a.to(tl.float32), 0)
        s_b += tl.sum(bb.to(tl.float32), 0)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _scan_rev_kernel(X, A, Y, W, OUT, L, HX, GROUP,
                     sxb, sxt, sxh, sab, sat, sah, sob, sot, soh,
                     D: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, INTERCEPT: tl.constexpr,
                     WIDE: tl.constexpr = False):
    """out_j[cols] = sum_{i>=j} w_i y_i[cols] - sum_{i>=j} (x_i . a_j) y_i[cols] / i.
    X, Y: (B, L, HX, D) strides (sxb, sxt, sxh); A: (B, L, HX // GROUP, D) strides (sab, sat, sah);
    W: (B, HX, L) fp32; OUT: (B, L, HX, D) fp32 strides (sob, sot, soh). WIDE: 64-bit head offsets."""
    pid_bh, pid_v, b, h, hk = _program(HX, GROUP, D // BV, WIDE)
    offs_d = tl.arange(0, D)
    offs_v = pid_v * BV + tl.arange(0, BV)
    state = tl.zeros((D, BV), dtype=tl.float32)
    s_w = tl.zeros((BV,), dtype=tl.float32)
    n_chunks = tl.cdiv(L, BT)
    for c in range(0, n_chunks):
        t0 = (n_chunks - 1 - c) * BT
        offs_t = t0 + tl.arange(0, BT)
        ok_t = offs_t < L
        x = _rows(X, b, offs_t, h, sxb, sxt, sxh, offs_d, ok_t)
        a = _rows(A, b, offs_t, hk, sab, sat, sah, offs_d, ok_t)
        y = _rows(Y, b, offs_t, h, sxb, sxt, sxh, offs_v, ok_t)
        inv_n = 1.0 / (offs_t + 1).to(tl.float32)
        later = offs_t[None, :] >= offs_t[:, None]  # rows j, columns i: i >= j
        scores = tl.where(later, tl.dot(a, tl.trans(x), input_precision=_precision(a.dtype)), 0.0)
        scores *= inv_n[None, :]  # / i
        out = _dot_f32(a, state, tl.zeros((BT, BV), dtype=tl.float32), False)
        out = -_dot_f32(scores, y, out, True)
        if INTERCEPT:
            w = tl.load(W + pid_bh.to(tl.int64) * L + offs_t, mask=ok_t, other=0.0)
            wy = w[:, None] * y.to(tl.float32)
            total = tl.sum(wy, 0)
            out += s_w[None, :] + total[None, :] - tl.cumsum(wy, 0) + wy
            s_w += total
        o_ptrs = OUT + b.to(tl.int64) * sob + offs_t.to(tl.int64)[:, None] * sot + h * soh + offs_v[None, :]
        tl.store(o_ptrs, out, mask=ok_t[:, None])
        x_n = x.to(tl.float32) * inv_n[:, None]
        state = _dot_f32(tl.trans(x_n), y, state, True)


def _contiguous(*xs):
    return [x if x.stride(-1) == 1 else x.contiguous() for x in xs]


def scan_grid(batch: int, heads: int, d: int, bv: int) -> tuple[int]:
    """The scans' launch grid: one program per (batch, head, block of ``bv`` of the ``d`` columns), on
    one grid dim (``_program``)."""
    return (batch * heads * (d // bv),)


def wide_heads(*tensors) -> bool:
    """Whether the scans over these (B, L, H, D) tensors need 64-bit head offsets: some tensor's
    heads times its head stride reaches 2^31 elements (a head-strided view of a long buffer); its
    batch and token offsets are 64-bit in both variants."""
    return launcher.wide_offsets(*(x.shape[2] * x.stride(2) for x in tensors))


def _scan_fwd(x, a, b, c0, intercept):
    """Forward scan; returns out (x's shape and dtype) and side m (B, HX, L) fp32."""
    x, a, b = _contiguous(x, a, b)
    bsz, n, hx, d = x.shape
    if a.stride() != b.stride():  # the kernel reads A and B with one set of strides
        a, b = a.contiguous(), b.contiguous()
    cfg = _config(d)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    side = torch.empty(bsz, hx, n, dtype=torch.float32, device=x.device)
    _scan_fwd_kernel[scan_grid(bsz, hx, d, cfg["BV"])](
        x, a, b, out, side, n, hx, hx // a.shape[2],
        x.stride(0), x.stride(1), x.stride(2), a.stride(0), a.stride(1), a.stride(2),
        out.stride(0), out.stride(1), out.stride(2), float(c0),
        D=d, BT=cfg["BT"], BV=cfg["BV"], INTERCEPT=intercept, WIDE=wide_heads(x, a, b, out),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out, side


def _scan_rev(x, a, y, w, intercept):
    """Reverse scan; returns out (B, L, HX, D) fp32, summed over GQA groups to (B, L, HA, D)."""
    x, a, y = _contiguous(x, a, y)
    if x.stride() != y.stride():  # the kernel reads X and Y with one set of strides
        x, y = x.contiguous(), y.contiguous()
    bsz, n, hx, d = x.shape
    cfg = _config(d)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _scan_rev_kernel[scan_grid(bsz, hx, d, cfg["BV"])](
        x, a, y, w, out, n, hx, hx // a.shape[2],
        x.stride(0), x.stride(1), x.stride(2), a.stride(0), a.stride(1), a.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        D=d, BT=cfg["BT"], BV=cfg["BV"], INTERCEPT=intercept, WIDE=wide_heads(x, a, y, out),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    hk = a.shape[2]
    return out.view(bsz, n, hk, hx // hk, d).sum(3)


def forward(r, k, v, intercept: bool):
    """o (B, L, Hq, D) in r's dtype and tbar (B, Hq, L) fp32."""
    check_head_dim(r.shape[-1])
    with launcher.on_device(r.device):
        return _scan_fwd(r, k, v, 1.0, intercept)


def backward(do, r, k, v, tbar, intercept: bool):
    """dr (B, L, Hq, D) and dk, dv (B, L, Hkv, D), in the inputs' dtypes."""
    with launcher.on_device(r.device):
        do = do.contiguous()
        dr, beta = _scan_fwd(do, v, k, 0.0, intercept)
        n = torch.arange(1, r.shape[1] + 1, dtype=torch.float32, device=r.device)
        dk = _scan_rev(do, v, r, beta / n, intercept)
        dv = _scan_rev(r, k, do, (1.0 + tbar) / n, intercept)
    return dr.to(r.dtype), dk.to(k.dtype), dv.to(v.dtype)
