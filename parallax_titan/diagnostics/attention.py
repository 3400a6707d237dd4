"""Attention statistics of one layer from its q, rho, k, v (SPEC section 1, diagnostics).

Inputs follow the model's layout: q, r (batch, seq, Hq, D), k, v (batch, seq, Hkv, D), after
norms, gate and RoPE; query head h reads kv head h // (Hq / Hkv). ``mask`` (batch, seq, seq) bool
is True where query i may read key j (causal, same document under block-causal masking, within a
sliding window).
``r = None`` means softmax attention: the probe-only statistics are then left out.

Per query i (weights w_ij = p_ij (1 - t_ij + tbar_i), correction c_i = Sigma_KV(i) rho_i):
    entropy   H_i = -sum_j p_ij log p_ij
    sink_p    p at the first key query i may read (the row or document start)
    sink_w    w_first^2 / sum_j w_ij^2                       (Parallax)
    w_min/max extreme w_ij over readable keys (w = p for softmax)
    cor       ||c_i|| / ||vbar_i||, NaN where vbar_i = 0     (Parallax)
    probe_norm ||rho_i||                                       (Parallax)
At ``max_queries`` evenly spaced query positions, where the D x D covariances are formed:
    cpa       ||Sigma_KV rho|| / (||rho|| ||Sigma_KV||_2)    (Parallax)
    corr      ||Sigma_VV^-1/2 Sigma_KV Sigma_KK^-1/2||_F
"""

from __future__ import annotations

import math

import torch

# Largest number of elements of one (heads, L, L) or (queries, L, D) intermediate.
MAX_ELEMENTS = 1 << 24
# Statistics reduced with min / max over queries and heads; every other one with the mean.
REDUCE_MIN = ("w_min",)
REDUCE_MAX = ("w_max",)


def query_positions(seq_len: int, max_queries: int, device=None) -> torch.Tensor:
    """Evenly spaced query positions in [1, seq_len - 1] (at most ``max_queries``), int64."""
    if max_queries < 1:
        raise ValueError(f"max_queries = {max_queries}; expected >= 1")
    if seq_len < 2:
        return torch.zeros(0, dtype=torch.long, device=device)
    n = min(max_queries, seq_len - 1)
    return torch.linspace(1, seq_len - 1, n, device=device).round().long().unique()


def causal_document_mask(tokens: torch.Tensor, eos_id: int | None, window: int | None = None) -> torch.Tensor:
    """(batch, seq) tokens -> (batch, seq, seq) bool mask: causal, within one document when
    ``eos_id`` is given (a document ends with its eos token, as the model's block-causal masks), and
    within the sliding window i - W < j <= i when ``window`` = W is given (SPEC 1b)."""
    batch, seq = tokens.shape
    band = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).tril()
    if window:
        band = band.triu(1 - window)
    mask = band.expand(batch, seq, seq)
    if eos_id is None:
        return mask.clone()
    ends = (tokens == eos_id).long()
    doc = ends.cumsum(-1) - ends
    return mask & (doc[:, :, None] == doc[:, None, :])


def _heads_first(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, L, H, D) -> (B, n_heads, L, D), kv heads repeated over their query group."""
    return x.transpose(1, 2).repeat_interleave(n_heads // x.shape[2], dim=1)


def weighted_covariances(p: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Covariances under one query's attention distribution.

    p: (B, H, Q, L) rows summing to 1; k, v: (B, H, L, D).
    Returns Sigma_KV, Sigma_KK, Sigma_VV, each (B, H, Q, D, D):
    Sigma_XY = sum_j p_j (x_j - xbar)(y_j - ybar)^T.
    """
    out = ([], [], [])
    chunk = max(1, MAX_ELEMENTS // max(1, p.shape[0] * p.shape[1] * p.shape[-1] * k.shape[-1]))
    for start in range(0, p.shape[2], chunk):
        pc = p[:, :, start:start + chunk]
        kbar, vbar = pc @ k, pc @ v
        pk = (pc.unsqueeze(-1) * k.unsqueeze(2)).transpose(-1, -2)  # (B, H, Qc, D, L)
        pv = (pc.unsqueeze(-1) * v.unsqueeze(2)).transpose(-1, -2)
        k2, v2 = k.unsqueeze(2), v.unsqueeze(2)
        out[0].append(pv @ k2 - vbar.unsqueeze(-1) * kbar.unsqueeze(-2))
        out[1].append(pk @ k2 - kbar.unsqueeze(-1) * kbar.unsqueeze(-2))
        out[2].append(pv @ v2 - vbar.unsqueeze(-1) * vbar.unsqueeze(-2))
    return tuple(torch.cat(parts, dim=2) for parts in out)


def kv_correlation_norm(s_kv: torch.Tensor, s_kk: torch.Tensor, s_vv: torch.Tensor, ridge: float) -> torch.Tensor:
    """||Sigma_VV^-1/2 Sigma_KV Sigma_KK^-1/2||_F per (..., D, D) matrix, both covariances first
    given a ridge of ``ridge`` times their mean eigenvalue (trace / D).

    With A = L_A L_A^T (Cholesky), A^-1/2 L_A is orthogonal, so the norm is ||L_VV^-1 S L_KK^-T||_F:
    two triangular solves, no eigendecomposition. NaN where a covariance is zero or not positive
    definite (ridge 0 on a singular one).
    """
    eye = torch.eye(s_kv.shape[-1], dtype=s_kv.dtype, device=s_kv.device)
    factors = []
    for cov in (s_vv, s_kk):
        trace = cov.diagonal(dim1=-2, dim2=-1).sum(-1)
        chol, info = torch.linalg.cholesky_ex(cov + (ridge * trace / cov.shape[-1])[..., None, None] * eye)
        factors.append((chol, (info != 0) | (trace <= 0)))
    (l_vv, bad_vv), (l_kk, bad_kk) = factors
    left = torch.linalg.solve_triangular(l_vv, s_kv, upper=False)  # L_VV^-1 S
    both = torch.linalg.solve_triangular(l_kk, left.transpose(-1, -2), upper=False)  # (L_VV^-1 S L_KK^-T)^T
    return torch.linalg.matrix_norm(both).masked_fill(bad_vv | bad_kk, float("nan"))


def _gather_first(x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, L), first (B, L) key index per query -> (B, H, L)."""
    index = first[:, None, :, None].expand(x.shape[0], x.shape[1], -1, 1)
    return x.gather(-1, index).squeeze(-1)


def attention_weights(qh, rh, kh, allowed, scale: float):
    """Softmax probabilities and the Parallax spread, heads first.

    qh: (B, H, L, D); rh: (B, H, L, D) or None; kh: (B, H, L, D) (kv heads already repeated);
    allowed: bool broadcastable to (B, H, L, L). Returns p (B, H, L, L) and spread
    p_ij (t_ij - tbar_i) (None without a probe); the Parallax weights are w = p - spread.
    """
    p = torch.softmax((scale * qh @ kh.transpose(-1, -2)).masked_fill(~allowed, float("-inf")), dim=-1)
    if rh is None:
        return p, None
    t = (rh @ kh.transpose(-1, -2)).masked_fill(~allowed, 0.0)
    return p, p * (t - (p * t).sum(-1, keepdim=True))


def per_query_statistics(q, r, k, v, mask, *, scale: float | None = None, max_queries: int = 64,
                         ridge: float = 1e-3) -> dict[str, torch.Tensor]:
    """Per-query statistics of one layer (see the module docstring), in the inputs' dtype
    promoted to at least float32.

    Returns (B, Hq, L) tensors ``entropy, sink_p, w_min, w_max`` (+ ``sink_w, cor, probe_norm``
    with a probe) and (B, Hq, Q) tensors ``corr`` (+ ``cpa``) at :func:`query_positions`.
    """
    _check_shapes(q, r, k, v, mask)
    dtype = torch.promote_types(q.dtype, torch.float32)
    n_heads, head_dim = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    qh = q.to(dtype).transpose(1, 2)
    kh, vh = _heads_first(k.to(dtype), n_heads), _heads_first(v.to(dtype), n_heads)
    allowed = mask[:, None]
    rh = None if r is None else r.to(dtype).transpose(1, 2)
    p, spread = attention_weights(qh, rh, kh, allowed, scale)
    first = mask.to(torch.int8).argmax(-1)
    stats = {"entropy": -torch.special.xlogy(p, p).sum(-1), "sink_p": _gather_first(p, first)}
    w = p
    if r is not None:
        w = p - spread
        vbar = p @ vh
        correction = spread @ vh  # = Sigma_KV(i) rho_i
        vbar_norm = vbar.norm(dim=-1)
        stats["cor"] = (correction.norm(dim=-1) / vbar_norm).masked_fill(vbar_norm == 0, float("nan"))
        stats["probe_norm"] = rh.norm(dim=-1)
        w2 = w.square()
        stats["sink_w"] = _gather_first(w2, first) / w2.sum(-1)
    stats["w_min"] = w.masked_fill(~allowed, float("inf")).amin(-1)
    stats["w_max"] = w.masked_fill(~allowed, float("-inf")).amax(-1)

    positions = query_positions(q.shape[1], max_queries, device=q.device)
    s_kv, s_kk, s_vv = weighted_covariances(p[:, :, positions], kh, vh)
    stats["corr"] = kv_correlation_norm(s_kv, s_kk, s_vv, ridge)
    if r is not None:
        rho = rh[:, :, positions]
        aligned = (s_kv @ rho.unsqueeze(-1)).squeeze(-1).norm(dim=-1)
        denom = rho.norm(dim=-1) * torch.linalg.matrix_norm(s_kv, ord=2)
        stats["cpa"] = (aligned / denom).masked_fill(denom <= 0, float("nan"))
    return stats


def _check_shapes(q, r, k, v, mask) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected q (B, L, Hq, D) "
                         "and k, v of one shape (B, L, Hkv, D)")
    if r is not None and r.shape != q.shape:
        raise ValueError(f"r has shape {tuple(r.shape)}; expected q's shape {tuple(q.shape)}")
    if q.shape[2] % k.shape[2] or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: expected the same B, L, D and Hq a multiple of Hkv")
    expected = (q.shape[0], q.shape[1], q.shape[1])
    if mask.dtype != torch.bool or tuple(mask.shape) != expected:
        raise ValueError(f"mask {mask.dtype} {tuple(mask.shape)}; expected bool {expected}")


def summarize(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """Reduce per-query statistics over queries and heads: min for ``w_min``, max for ``w_max``,
    the mean (ignoring NaN: undefined CPA/Corr at degenerate queries) for the rest."""
    out = {}
    for name, values in stats.items():
        values = values.flatten()
        if name in REDUCE_MIN:
            out[name] = float(values.min())
        elif name in REDUCE_MAX:
            out[name] = float(values.max())
        else:
            out[name] = float(values.nanmean())
    return out


def layer_statistics(q, r, k, v, mask, *, scale: float | None = None, max_queries: int = 64,
                     ridge: float = 1e-3) -> dict[str, float]:
    """Layer summary of :func:`per_query_statistics`, computed one batch row and one block of kv
    groups at a time so that the (heads, L, L) intermediates stay under ``MAX_ELEMENTS``."""
    _check_shapes(q, r, k, v, mask)
    batch, seq, n_heads, _ = q.shape
    n_kv = k.shape[2]
    group = n_heads // n_kv
    kv_block = max(1, MAX_ELEMENTS // (group * seq * seq))
    parts: dict[str, list[torch.Tensor]] = {}
    for b in range(batch):
        for g in range(0, n_kv, kv_block):
            heads = slice(g * group, min(n_kv, g + kv_block) * group)
            kv = slice(g, min(n_kv, g + kv_block))
            stats = per_query_statistics(
                q[b:b + 1, :, heads], None if r is None else r[b:b + 1, :, heads], k[b:b + 1, :, kv],
                v[b:b + 1, :, kv], mask[b:b + 1], scale=scale, max_queries=max_queries, ridge=ridge,
            )
            for name, value in stats.items():
                parts.setdefault(name, []).append(value.flatten())
    return summarize({name: torch.cat(values) for name, values in parts.items()})
