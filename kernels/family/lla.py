"""Exact local-linear attention (LLA, SPEC section 1 "the parent") in PyTorch: a direct batched
Cholesky solve and a fixed-step conjugate-gradient solve. For MAD and small models only.

Per query i (causal, softmax weights p_ij = softmax_j(scale q_i . k_j)), with z_ij = k_j - q_i:

    mu_i    = sum_j p_ij z_ij = kbar_i - q_i
    Sigma_i = sum_j p_ij z_ij z_ij^T + lam I = Sigma_KK(i) + mu_i mu_i^T + lam I
    o_i     = vbar_i - (1 + eta_i) Sigma_KV(i) rho*_i,  rho*_i = Sigma_i^-1 mu_i,
              tbar_i = rho*_i . mu_i,  eta_i = tbar_i / (1 - tbar_i)
            = vbar_i + Sigma_KV(i) (Sigma_KK(i) + lam I)^-1 (q_i - kbar_i)   (Sherman-Morrison)

``cholesky`` factors the regression form's A_i = Sigma_KK(i) + lam I (the well-conditioned one:
no 1 / (1 - tbar) amplification); it forms one D x D matrix per query from p and k k^T.
``cg`` follows the paper: T CG steps on Sigma_i rho = mu_i from rho = 0, each a product
Sigma_i y = E_p[k (k . y)] - kbar (kbar . y) + mu (mu . y) + lam y, i.e. one (L x L)-masked
product with K per step and no per-query matrix. A truncated CG iterate keeps 0 <= tbar < 1
(Galerkin: rho . mu = rho^T Sigma rho >= (rho . mu)^2), so eta stays finite.
Both need Sigma_KV(i) x only as E_p[v (k . x)] - vbar (kbar . x), another masked product.

Queries are processed in blocks of ``block`` rows; autograd runs through the PyTorch ops.
"""

from __future__ import annotations

import torch

from kernels.checks import check_scale, is_finite_number
from kernels.family.common import (check_choice, check_lam, check_positive_int, check_tensors, grouped_lam,
                                    solve_spd, work_dtype)
from kernels.layout import grouped, ungrouped

SOLVERS = ("cholesky", "cg")
DEFAULT_MAX_COST = 2 ** 37
DEFAULT_BLOCK = 64


def exact_lla_cost(batch: int, seq_len: int, q_heads: int, head_dim: int, solver: str = "cholesky",
                   cg_steps: int | None = None) -> int:
    """Multiply-adds of one exact LLA forward, the quantity ``max_cost`` bounds.

    batch, seq_len, q_heads, head_dim: ints >= 0; solver: "cholesky" or "cg"; cg_steps: None (T = D) or
    an int >= 1 (ValueError otherwise: a negative size would give a negative cost, under any limit).
    cholesky: B * Hq * L * (L * D^2 + D^3)   (forming Sigma_KK(i) for every query, then factoring it)
    cg:       B * Hq * L^2 * D * (T + 4)      (T Sigma_i products, plus softmax, kbar, vbar, output)
    Dense upper bounds: causal masking halves the L^2 terms in the arithmetic but not in this count.
    """
    fn = "exact_lla_cost"
    sizes = dict(batch=batch, seq_len=seq_len, q_heads=q_heads, head_dim=head_dim)
    for name, value in sizes.items():  # exact_lla's traced calls (torch.compile) pass SymInt sizes
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 0:
            raise ValueError(f"{fn}: {name}={value!r} must be an int >= 0")
    check_choice(fn, "solver", solver, SOLVERS)
    if cg_steps is not None:
        check_positive_int(fn, "cg_steps", cg_steps)
    b, n, h, d = batch, seq_len, q_heads, head_dim
    if solver == "cholesky":
        return b * h * n * (n * d * d + d ** 3)
    steps = head_dim if cg_steps is None else cg_steps
    return b * h * n * n * d * (steps + 4)


def _cost_guard(q, solver, cg_steps, max_cost):
    b, n, h, d = q.shape
    cost = exact_lla_cost(b, n, h, d, solver, cg_steps)
    if max_cost is not None and cost > max_cost:
        formula = "B*Hq*L*(L*D^2 + D^3)" if solver == "cholesky" else "B*Hq*L^2*D*(T + 4)"
        steps = f", T={cg_steps if cg_steps is not None else d}" if solver == "cg" else ""
        raise ValueError(
            f"exact_lla: solver={solver!r} costs {formula} = {cost:.3g} multiply-adds for B={b}, L={n}, Hq={h}, "
            f"D={d}{steps}, above max_cost={max_cost:.3g}. Exact LLA is for MAD-size problems; use "
            "kernels.parallax_attention (learned probe) at model scale, or raise max_cost (None disables the check)")


def _block_stats(qb, k, v, scale, i0):
    """Softmax weights of query rows [i0, i0 + bq) over keys [0, i0 + bq), and kbar, vbar."""
    i1 = i0 + qb.shape[-2]
    kk, vv = k[..., :i1, :], v[..., :i1, :]
    s = scale * (qb @ kk.transpose(-1, -2))
    rows = torch.arange(i0, i1, device=qb.device)[:, None]
    cols = torch.arange(i1, device=qb.device)[None, :]
    p = torch.softmax(s.masked_fill(cols > rows, float("-inf")), dim=-1)
    return p, kk, vv, p @ kk, p @ vv


def _weighted_product(p, x, keys, values):
    """E_p[values (keys . x)] per row: (p * (x keys^T)) @ values."""
    return (p * (x @ keys.transpose(-1, -2))) @ values


def _cholesky_block(qb, p, kk, vv, kbar, vbar, lam, outer):
    """outer: (..., j, D*D) flattened k_j k_j^T of the block's keys."""
    d = qb.shape[-1]
    sigma_kk = (p @ outer).unflatten(-1, (d, d)) - kbar[..., :, None] * kbar[..., None, :]
    eye = torch.eye(d, dtype=qb.dtype, device=qb.device)
    ridge = lam * eye if not isinstance(lam, torch.Tensor) else lam[..., None] * eye
    x = solve_spd(sigma_kk + ridge, qb - kbar)
    return vbar + _weighted_product(p, x, kk, vv) - vbar * (kbar * x).sum(-1, keepdim=True)


def _safe_ratio(num, den):
    """num / den where den > 0, else 0, with finite gradients on both branches."""
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def _cg_block(qb, p, kk, vv, kbar, vbar, lam, steps):
    mu = kbar - qb

    def sigma_times(y):
        dot = lambda a: (a * y).sum(-1, keepdim=True)  # noqa: E731
        return _weighted_product(p, y, kk, kk) - kbar * dot(kbar) + mu * dot(mu) + lam * y

    rho = torch.zeros_like(mu)
    res, direction = mu, mu
    rr = (res * res).sum(-1, keepdim=True)
    for _ in range(steps):
        s_dir = sigma_times(direction)
        alpha = _safe_ratio(rr, (direction * s_dir).sum(-1, keepdim=True))
        rho = rho + alpha * direction
        res = res - alpha * s_dir
        rr_new = (res * res).sum(-1, keepdim=True)
        direction = res + _safe_ratio(rr_new, rr) * direction
        rr = rr_new
    tbar = (rho * mu).sum(-1, keepdim=True)
    sigma_kv_rho = _weighted_product(p, rho, kk, vv) - vbar * (kbar * rho).sum(-1, keepdim=True)
    return vbar - sigma_kv_rho / (1.0 - tbar)  # 1 + eta = 1 / (1 - tbar)


def exact_lla(q, k, v, *, lam, scale=None, solver="cholesky", cg_steps=None, max_cost=DEFAULT_MAX_COST,
              block=DEFAULT_BLOCK):
    """Exact causal local-linear attention (SPEC section 1, the parent of Parallax).

    q: (B, L, Hq, D); k, v: (B, L, Hkv, D), Hq % Hkv == 0 (query head h reads kv head h // (Hq // Hkv)), no
    dimension 0;
    fp16/bf16/fp32/fp64 (computed in fp32, fp64 for fp64 inputs).
    lam: ridge lambda > 0, a number or a (Hq,) tensor (e.g. a learned softplus(param) + floor).
    scale: softmax scale of q . k, default 1/sqrt(D); scale = 0 gives uniform weights (Affine MesaNet).
    solver: "cholesky" (direct, per-query D x D matrices) or "cg" (cg_steps CG steps, default D,
    from streaming statistics only; precision-sensitive at small lam, as the paper notes).
    max_cost: refuse problems above this many multiply-adds (``exact_lla_cost``), a positive number; None
    disables.
    block: query rows per block, an int >= 1 (bounds the transient memory: block * L per head, plus
    block * D^2 for cholesky). Autograd keeps O(L^2 + L D^2) per head for cholesky and
    O(T L^2) for cg (every step's masked product).
    Returns (B, L, Hq, D) in q's dtype; differentiable w.r.t. q, k, v and a tensor lam.
    """
    fn = "exact_lla"
    check_tensors(fn, {"q": q}, {"k": k, "v": v})
    check_choice(fn, "solver", solver, SOLVERS)
    lam = check_lam(fn, lam, q.shape[2], q.device)
    scale = check_scale(fn, scale, q.shape[-1])
    if solver == "cg" and cg_steps is not None and (not isinstance(cg_steps, int) or isinstance(cg_steps, bool)
                                                      or cg_steps < 1):
        raise ValueError(f"{fn}: cg_steps={cg_steps!r} must be a positive int (the paper uses 1 <= T <= D)")
    if solver == "cholesky" and cg_steps is not None:
        raise ValueError(f"{fn}: cg_steps={cg_steps!r} is only meaningful with solver='cg'")
    block = check_positive_int(fn, "block", block)
    if max_cost is not None and (not is_finite_number(max_cost) or max_cost <= 0):
        raise ValueError(f"{fn}: max_cost={max_cost!r} must be None or a positive number (multiply-adds)")
    _cost_guard(q, solver, cg_steps, max_cost)

    work, hkv = work_dtype(q.dtype), k.shape[2]
    qg, kg, vg = (grouped(x, hkv, work) for x in (q, k, v))
    lam_g = grouped_lam(lam, hkv, work)
    steps = q.shape[-1] if cg_steps is None else cg_steps
    if solver == "cholesky":
        outer = (kg[..., :, None] * kg[..., None, :]).flatten(-2)  # (B, Hkv, 1, L, D*D), shared by all blocks
    outs = []
    for i0 in range(0, q.shape[1], block):
        qb = qg[..., i0:i0 + block, :]
        p, kk, vv, kbar, vbar = _block_stats(qb, kg, vg, float(scale), i0)
        if solver == "cholesky":
            outs.append(_cholesky_block(qb, p, kk, vv, kbar, vbar, lam_g, outer[..., :kk.shape[-2], :]))
        else:
            outs.append(_cg_block(qb, p, kk, vv, kbar, vbar, lam_g, steps))
    return ungrouped(torch.cat(outs, -2), q.dtype)
