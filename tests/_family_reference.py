"""Independent fp64 references for the family mixers, written from SPEC sections 1 and 1b.

Per (batch, query head, position) loops with dense matrices: explicit weights p_ij, explicit
centred moments, torch.linalg.solve. Nothing here imports kernels.family. Autograd through these
loops gives the reference gradients. Tiny shapes only.
"""

from __future__ import annotations

import math

import torch


def _loop(fn, q, k, v):
    """Apply fn(i, q_i, K[:i+1], V[:i+1], h) over batch, query heads and positions; GQA h -> h // G."""
    b, n, hq, d = q.shape
    group = hq // k.shape[2]
    rows = []
    for bi in range(b):
        heads = []
        for h in range(hq):
            kh, vh = k[bi, :, h // group], v[bi, :, h // group]
            heads.append(torch.stack([fn(i, q[bi, i, h], kh[:i + 1], vh[:i + 1], h) for i in range(n)]))
        rows.append(torch.stack(heads, 1))
    return torch.stack(rows)


def moments(p, keys, values):
    """kbar, vbar, Sigma_KK = E_p[(k-kbar)(k-kbar)^T], Sigma_KV = E_p[(v-vbar)(k-kbar)^T]."""
    kbar, vbar = p @ keys, p @ values
    kc, vc = keys - kbar, values - vbar
    return kbar, vbar, kc.T @ (p[:, None] * kc), vc.T @ (p[:, None] * kc)


def _lam(lam, h):
    return lam[h] if isinstance(lam, torch.Tensor) else lam


def softmax_weights(qi, keys, scale):
    return torch.softmax(scale * (keys @ qi), 0)


def softmax_attention(q, k, v, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _loop(lambda i, qi, kk, vv, h: softmax_weights(qi, kk, scale) @ vv, q, k, v)


def lla_parent(q, k, v, lam, scale=None):
    """SPEC 1: z = k - q, Sigma = E_p[z z^T] + lam I, rho* = Sigma^-1 mu, o = vbar - (1 + eta) Sigma_KV rho*."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale

    def one(i, qi, kk, vv, h):
        p, rho, mu = _solved_probe(qi, kk, lam, h, scale)
        tbar = rho @ mu
        eta = tbar / (1 - tbar)
        _, vbar, _, s_kv = moments(p, kk, vv)
        return vbar - (1 + eta) * (s_kv @ rho)

    return _loop(one, q, k, v)


def _solved_probe(qi, kk, lam, h, scale):
    """(p, rho*, mu) of query qi: p = softmax weights, z = k - q, mu = E_p[z], rho* = (E_p[z z^T] + lam I)^-1 mu."""
    p = softmax_weights(qi, kk, scale)
    z = kk - qi
    mu = p @ z
    sigma = z.T @ (p[:, None] * z) + _lam(lam, h) * torch.eye(len(qi), dtype=qi.dtype)
    return p, torch.linalg.solve(sigma, mu), mu


def lla_probe(q, k, v, lam, scale=None):
    """The probe (1 + eta_i) rho*_i that makes Parallax equal exact LLA."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale

    def one(i, qi, kk, vv, h):
        _, rho, mu = _solved_probe(qi, kk, lam, h, scale)
        return rho / (1 - rho @ mu)

    return _loop(one, q, k, v)


def local_linear_regression(q, k, v, lam, scale=None):
    """SPEC 1 regression form: o = vbar + Sigma_KV (Sigma_KK + lam I)^-1 (q - kbar), softmax weights."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale

    def one(i, qi, kk, vv, h):
        kbar, vbar, s_kk, s_kv = moments(softmax_weights(qi, kk, scale), kk, vv)
        return vbar + s_kv @ torch.linalg.solve(s_kk + _lam(lam, h) * torch.eye(len(qi), dtype=qi.dtype), qi - kbar)

    return _loop(one, q, k, v)


def _uniform(kk):
    return torch.full((kk.shape[0],), 1.0 / kk.shape[0], dtype=kk.dtype)


def value_averaging(q, k, v):
    """q only sets the number of query heads."""
    return _loop(lambda i, qi, kk, vv, h: vv.mean(0), q, k, v)


def affine_linear_attention(r, k, v, intercept=True):
    """SPEC 1b: o = vbar - Sigma_KV r; without intercept -(S_vk / i) r."""
    def one(i, ri, kk, vv, h):
        if not intercept:
            return -(vv.T @ kk) @ ri / kk.shape[0]
        _, vbar, _, s_kv = moments(_uniform(kk), kk, vv)
        return vbar - s_kv @ ri

    return _loop(one, r, k, v)


def affine_mesanet(q, k, v, lam, intercept=True):
    """SPEC 1b: o = vbar + Sigma_KV (Sigma_KK + lam I)^-1 (q - kbar); without intercept
    (S_vk / i)(S_kk / i + lam I)^-1 q."""
    def one(i, qi, kk, vv, h):
        eye = torch.eye(len(qi), dtype=qi.dtype)
        n = kk.shape[0]
        if not intercept:
            return (vv.T @ kk / n) @ torch.linalg.solve(kk.T @ kk / n + _lam(lam, h) * eye, qi)
        kbar, vbar, s_kk, s_kv = moments(_uniform(kk), kk, vv)
        return vbar + s_kv @ torch.linalg.solve(s_kk + _lam(lam, h) * eye, qi - kbar)

    return _loop(one, q, k, v)


def affine_linear_attention_dense(r, k, v, intercept=True):
    """Vectorised form (any device; pass fp64) for larger shapes: o = W v with
    W_ij = (1 + tbar_i - t_ij) / i for j <= i, t = r k^T, tbar_i = mean_{j<=i} t_ij (the uniform-weight
    Parallax weights); -t_ij / i without intercept."""
    b, n, hq, d = r.shape
    group = hq // k.shape[2]
    kh = k.transpose(1, 2).repeat_interleave(group, 1)
    vh = v.transpose(1, 2).repeat_interleave(group, 1)
    t = (r.transpose(1, 2) @ kh.transpose(-1, -2)).tril()
    count = torch.arange(1, n + 1, dtype=r.dtype, device=r.device)[:, None]
    if intercept:
        tbar = t.sum(-1, keepdim=True) / count
        w = torch.ones(n, n, dtype=r.dtype, device=r.device).tril() * (1 + tbar) - t
    else:
        w = -t
    return ((w / count) @ vh).transpose(1, 2)
