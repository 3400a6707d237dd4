"""Exact Parallax attention in pure PyTorch, chunked over the KV axis (the ``reference`` backend).

Forward is SPEC's streaming form (running max, four accumulators d1, O1, d2, O2 sharing one
rescale) over KV chunks; backward is SPEC's closed form. Per KV chunk the backward does both
halves of the work on the same recomputed (L, block) scores: the row pass contribution
(dq, drho accumulated over chunks) and the column pass result (dk, dv of the chunk, summed
over the GQA group). No (L, L) tensor is ever built: peak extra memory is O(B*H*L*block).
Arithmetic is float32 (float64 for float64 inputs); results are cast back to the inputs' dtypes.
"""

from __future__ import annotations

import torch

from kernels.layout import grouped, ungrouped
from kernels.parallax.naive import document_ids

DEFAULT_BLOCK = 256


class _Plan:
    """Chunk geometry and masks shared by forward and backward."""

    def __init__(self, seq_len, block, causal, cu_seqlens, device, window=None):
        self.seq_len, self.block, self.causal, self.window = seq_len, block, causal, window
        self.doc = None if cu_seqlens is None else document_ids(cu_seqlens.to(device), seq_len)
        self.device = device

    def chunks(self):
        """Yield (rows, c0, c1): keys [c0, c1) only reach the rows of slice ``rows`` (causal: from c0;
        with a window of W: up to c1 - 1 + W - 1); chunks no row reaches are left out."""
        for c0 in range(0, self.seq_len, self.block):
            c1 = min(c0 + self.block, self.seq_len)
            row1 = self.seq_len if self.window is None else min(self.seq_len, c1 - 1 + self.window)
            yield slice(c0 if self.causal else 0, row1), c0, c1

    def mask(self, rows, c0, c1):
        """(rows, c1 - c0) bool, True where allowed; None when nothing is masked."""
        i = torch.arange(rows.start, rows.stop, device=self.device)[:, None]
        j = torch.arange(c0, c1, device=self.device)[None, :]
        allowed = None
        if self.causal:
            allowed = j <= i
        if self.window is not None:
            allowed = allowed & (j > i - self.window)
        if self.doc is not None:
            same = self.doc[rows, None] == self.doc[None, c0:c1]
            allowed = same if allowed is None else allowed & same
        return allowed


def _scores(plan, qg, rg, kg, scale, rows, c0, c1):
    """Masked scaled logits s (-inf where masked) and probe scores t (0 where masked)."""
    kc = kg[..., c0:c1, :].transpose(-1, -2)
    s = scale * (qg[..., rows, :] @ kc)
    t = rg[..., rows, :] @ kc
    allowed = plan.mask(rows, c0, c1)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
        t = t.masked_fill(~allowed, 0.0)
    return s, t


def _forward(plan, qg, rg, kg, vg, scale):
    """Streaming forward. Returns o, vbar (B,Hkv,G,L,D) and tbar, lse (B,Hkv,G,L)."""
    stats = qg.shape[:-1]
    m = torch.full(stats, float("-inf"), dtype=qg.dtype, device=qg.device)
    d1, d2 = torch.zeros_like(m), torch.zeros_like(m)
    o1, o2 = torch.zeros_like(qg), torch.zeros_like(qg)
    for rows, c0, c1 in plan.chunks():
        s, t = _scores(plan, qg, rg, kg, scale, rows, c0, c1)
        m_old = m[..., rows]
        m_new = torch.maximum(m_old, s.amax(-1))
        # Rows with no allowed key yet keep m = -inf; shift by 0 there to avoid inf - inf.
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m_old - shift)
        e = torch.exp(s - shift[..., None])
        et = e * t
        vc = vg[..., c0:c1, :]
        d1[..., rows] = d1[..., rows] * alpha + e.sum(-1)
        d2[..., rows] = d2[..., rows] * alpha + et.sum(-1)
        o1[..., rows, :] = o1[..., rows, :] * alpha[..., None] + e @ vc
        o2[..., rows, :] = o2[..., rows, :] * alpha[..., None] + et @ vc
        m[..., rows] = m_new
    vbar = o1 / d1[..., None]
    tbar = d2 / d1
    o = (1.0 + tbar[..., None]) * vbar - o2 / d1[..., None]
    return o, vbar, tbar, m + torch.log(d1)


def _backward(plan, qg, rg, kg, vg, scale, o, vbar, tbar, lse, dog):
    """Closed-form backward (SPEC). Returns dq, dr (B,Hkv,G,L,D) and dk, dv (B,Hkv,1,L,D)."""
    tau = (dog * o).sum(-1)
    beta = (dog * vbar).sum(-1)
    dq, dr = torch.zeros_like(qg), torch.zeros_like(rg)
    dk, dv = torch.zeros_like(kg), torch.zeros_like(vg)
    for rows, c0, c1 in plan.chunks():
        s, t = _scores(plan, qg, rg, kg, scale, rows, c0, c1)
        p = torch.exp(s - lse[..., rows, None])
        kc, vc = kg[..., c0:c1, :], vg[..., c0:c1, :]
        dor = dog[..., rows, :]
        delta = dor @ vc.transpose(-1, -2) - beta[..., rows, None]
        c = 1.0 + tbar[..., rows, None] - t
        g2 = -p * delta
        g1 = p * (c * delta + (beta - tau)[..., rows, None])
        dq[..., rows, :] += scale * (g1 @ kc)
        dr[..., rows, :] += g2 @ kc
        dk_c = scale * (g1.transpose(-1, -2) @ qg[..., rows, :])
        dk_c = dk_c + g2.transpose(-1, -2) @ rg[..., rows, :]
        dk[..., c0:c1, :] = dk_c.sum(2, keepdim=True)
        dv[..., c0:c1, :] = ((p * c).transpose(-1, -2) @ dor).sum(2, keepdim=True)
    return dq, dr, dk, dv


class ChunkedParallaxAttention(torch.autograd.Function):
    """autograd.Function wrapping the chunked forward and closed-form backward."""

    @staticmethod
    def forward(ctx, q, r, k, v, scale, causal, cu_seqlens, block, window):
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        hkv = k.shape[2]
        qg, rg, kg, vg = (grouped(x, hkv, work) for x in (q, r, k, v))
        plan = _Plan(q.shape[1], block, causal, cu_seqlens, q.device, window)
        o, vbar, tbar, lse = _forward(plan, qg, rg, kg, vg, scale)
        ctx.save_for_backward(q, r, k, v, o, vbar, tbar, lse)
        ctx.plan, ctx.scale, ctx.work = plan, scale, work
        return ungrouped(o, q.dtype)

    @staticmethod
    def backward(ctx, do):
        q, r, k, v, o, vbar, tbar, lse = ctx.saved_tensors
        hkv = k.shape[2]
        qg, rg, kg, vg, dog = (grouped(x, hkv, ctx.work) for x in (q, r, k, v, do))
        dq, dr, dk, dv = _backward(ctx.plan, qg, rg, kg, vg, ctx.scale, o, vbar, tbar, lse, dog)
        grads = (ungrouped(g, x.dtype) for g, x in zip((dq, dr, dk, dv), (q, r, k, v)))
        return (*grads, None, None, None, None, None)


def parallax_attention_chunked(q, r, k, v, *, scale, causal=True, cu_seqlens=None,
                               block=DEFAULT_BLOCK, window=None):
    """Exact Parallax attention, differentiable, O(L * block) extra memory.

    q, r: (B, L, Hq, D); k, v: (B, L, Hkv, D), Hq % Hkv == 0, any float dtype, CPU or GPU.
    scale: float. cu_seqlens: optional (num_docs + 1,) int32 offsets (B == 1).
    window: optional int W >= 1 (causal only): query i reads keys i - W < j <= i (within its document);
    KV chunks out of every row's band are skipped.
    Returns (B, L, Hq, D) in q's dtype. Inputs are assumed validated by the dispatcher.
    """
    return ChunkedParallaxAttention.apply(q, r, k, v, scale, causal, cu_seqlens, block, window)
