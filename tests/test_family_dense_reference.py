"""The family mixers against a second fp64 reference written from SPEC sections 1 and 1b alone, on the
cases the loop references of tests/_family_reference.py leave out: per-head lambda tensors under GQA
(with their gradients), negative and zero softmax scales, GQA groups of 3 in the recurrent state, and
chunk / block lengths that do not divide L. Dense over (query, key) pairs: each position's moments are
formed from explicitly centred keys and values (B, H, i, j, D), not from running sums."""

from __future__ import annotations

import math
import re

import pytest
import torch

from kernels import AffineState, affine_linear_attention, affine_mesanet, exact_lla, value_averaging
from kernels.family.recurrent import affine_linear_attention_step, affine_mesanet_step, value_averaging_step

F64 = torch.float64


def per_query_head(x, hq):
    """(B, L, Hkv, D) -> (B, Hq, L, D), query head h reading kv head h // (Hq / Hkv)."""
    return x[:, :, torch.arange(hq) // (hq // x.shape[2])].transpose(1, 2)


def causal_uniform(n):
    mask = torch.ones(n, n, dtype=F64).tril()
    return mask / mask.sum(-1, keepdim=True)


def causal_softmax(qh, kh, scale):
    n = qh.shape[2]
    scores = (scale * qh @ kh.transpose(-1, -2)).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(scores, -1)


def centred_moments(p, kh, vh):
    """kbar, vbar (B, H, L, D); Sigma_KK, Sigma_KV (B, H, L, D, D) = E_p[(. - mean)(k - kbar)^T]."""
    p = p.expand(*kh.shape[:2], -1, -1)
    kbar, vbar = p @ kh, p @ vh
    kc, vc = kh[:, :, None] - kbar[:, :, :, None], vh[:, :, None] - vbar[:, :, :, None]
    return (kbar, vbar, torch.einsum("bhij,bhija,bhijc->bhiac", p, kc, kc),
            torch.einsum("bhij,bhija,bhijc->bhiac", p, vc, kc))


def ridge(lam, hq, d):
    lam = lam.reshape(1, hq, 1, 1, 1) if isinstance(lam, torch.Tensor) else lam
    return lam * torch.eye(d, dtype=F64)


def spec_affine_la(r, k, v):
    """o_i = vbar_i - Sigma_KV(i) r_i, uniform weights."""
    hq = r.shape[2]
    _, vbar, _, s_kv = centred_moments(causal_uniform(r.shape[1]), per_query_head(k, hq), per_query_head(v, hq))
    return (vbar - (s_kv @ r.transpose(1, 2)[..., None])[..., 0]).transpose(1, 2)


def spec_affine_mesanet(q, k, v, lam):
    """o_i = vbar_i + Sigma_KV(i) (Sigma_KK(i) + lam I)^-1 (q_i - kbar_i), uniform weights."""
    hq, d = q.shape[2:]
    kbar, vbar, s_kk, s_kv = centred_moments(causal_uniform(q.shape[1]), per_query_head(k, hq),
                                             per_query_head(v, hq))
    x = torch.linalg.solve(s_kk + ridge(lam, hq, d), (q.transpose(1, 2) - kbar)[..., None])
    return (vbar + (s_kv @ x)[..., 0]).transpose(1, 2)


def spec_exact_lla(q, k, v, lam, scale):
    """The parent form: z_ij = k_j - q_i, Sigma_i = E_p[z z^T] + lam I, mu_i = E_p[z], rho* = Sigma_i^-1 mu_i,
    tbar = rho* . mu, o_i = vbar_i - (1 + tbar / (1 - tbar)) Sigma_KV(i) rho*_i."""
    hq, d = q.shape[2:]
    qh, kh, vh = q.transpose(1, 2), per_query_head(k, hq), per_query_head(v, hq)
    p = causal_softmax(qh, kh, scale)
    z = kh[:, :, None] - qh[:, :, :, None]
    mu = torch.einsum("bhij,bhija->bhia", p, z)
    rho = torch.linalg.solve(torch.einsum("bhij,bhija,bhijc->bhiac", p, z, z) + ridge(lam, hq, d), mu[..., None])
    tbar = (rho[..., 0] * mu).sum(-1, keepdim=True)
    _, vbar, _, s_kv = centred_moments(p, kh, vh)
    return (vbar - (1 + tbar / (1 - tbar)) * (s_kv @ rho)[..., 0]).transpose(1, 2)


def make(b, n, hq, hkv, d, seed):
    gen = torch.Generator().manual_seed(seed)
    q, r, do = (torch.randn(b, n, hq, d, generator=gen, dtype=F64) for _ in range(3))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, dtype=F64) for _ in range(2))
    return q, r * 0.5, k, v, do


def output_and_grads(fn, inputs, do):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    out.backward(do)
    return [out.detach(), *(x.grad for x in leaves)]


def assert_matches(fn, reference, inputs, do, tol):
    for i, (got, want) in enumerate(zip(output_and_grads(fn, inputs, do), output_and_grads(reference, inputs, do))):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=f"{'output' if i == 0 else f'grad {i - 1}'}")


# (B, L, Hq, Hkv, D, chunk or block): groups of 3 and 2, chunks / blocks that do not divide L, L = 1
SHAPES = {"gqa3_chunk4": (2, 13, 6, 2, 3, 4), "gqa2_chunk5": (1, 17, 4, 2, 5, 5), "len1_gqa3": (2, 1, 3, 1, 4, 2)}


@pytest.mark.parametrize("name", list(SHAPES))
def test_affine_members_with_per_head_lambdas_match_the_spec(name):
    b, n, hq, hkv, d, chunk = SHAPES[name]
    q, r, k, v, do = make(b, n, hq, hkv, d, seed=1)
    lam = torch.linspace(0.05, 3.0, hq, dtype=F64)
    assert_matches(lambda *x: affine_mesanet(*x[:3], lam=x[3], chunk=chunk), spec_affine_mesanet, [q, k, v, lam], do,
                   tol=1e-10)
    assert_matches(lambda *x: affine_linear_attention(*x, chunk=chunk), spec_affine_la, [r, k, v], do, tol=1e-12)


@pytest.mark.parametrize("scale", [None, 0.0, -0.4])
@pytest.mark.parametrize("name", list(SHAPES))
def test_exact_lla_with_per_head_lambdas_and_any_scale_matches_the_spec(name, scale):
    """scale 0 is the uniform-weight limit (h -> infinity); a negative scale is a valid softmax."""
    b, n, hq, hkv, d, block = SHAPES[name]
    q, _, k, v, do = make(b, n, hq, hkv, d, seed=2)
    lam = torch.linspace(0.2, 2.0, hq, dtype=F64)
    want_scale = 1 / math.sqrt(d) if scale is None else scale
    assert_matches(lambda *x: exact_lla(*x[:3], lam=x[3], scale=scale, block=block),
                   lambda *x: spec_exact_lla(*x, want_scale), [q, k, v, lam], do, tol=1e-10)


def test_exact_lla_at_zero_scale_is_affine_mesanet_in_the_spec_reference():
    q, _, k, v, _ = make(2, 9, 6, 2, 3, seed=3)
    torch.testing.assert_close(spec_exact_lla(q, k, v, 0.3, 0.0), spec_affine_mesanet(q, k, v, 0.3),
                               rtol=1e-11, atol=1e-11)


def test_recurrent_state_with_groups_of_three_matches_the_spec():
    q, r, k, v, _ = make(2, 8, 6, 2, 3, seed=4)
    lam = torch.linspace(0.1, 2.0, 6, dtype=F64)
    state = AffineState.from_sequence(k[:, :3], v[:, :3], with_kk=True)
    outs = {"va": [], "la": [], "mesa": []}
    for i in range(3, 8):
        tok = lambda x: x[:, i:i + 1]  # noqa: E731
        outs["va"].append(value_averaging_step(state, tok(k), tok(v), q_heads=6)[0])
        outs["la"].append(affine_linear_attention_step(state, tok(r), tok(k), tok(v))[0])
        o_mesa, state = affine_mesanet_step(state, tok(q), tok(k), tok(v), lam=lam)
        outs["mesa"].append(o_mesa)
    torch.testing.assert_close(torch.cat(outs["va"], 1), value_averaging(v, q_heads=6)[:, 3:], rtol=0, atol=1e-14)
    torch.testing.assert_close(torch.cat(outs["la"], 1), spec_affine_la(r, k, v)[:, 3:], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat(outs["mesa"], 1), spec_affine_mesanet(q, k, v, lam)[:, 3:],
                               rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("shape, dim", [((1, 3, 0, 4), "heads"), ((0, 3, 1, 4), "batch"), ((1, 3, 1, 0), "head_dim")])
def test_prefill_state_refuses_empty_dimensions(shape, dim):
    """Refused by name, as AffineState.zeros refuses them (an empty head dimension would otherwise end in
    a ZeroDivisionError at the first readout); an empty prompt (seq 0) is the empty state."""
    kv = torch.zeros(shape)
    with pytest.raises(ValueError, match=re.escape(f"AffineState.from_sequence: k has an empty {dim} dimension, "
                                                   f"shape {tuple(shape)}")):
        AffineState.from_sequence(kv, kv)
    assert AffineState.from_sequence(torch.zeros(1, 0, 2, 4), torch.zeros(1, 0, 2, 4)).count == 0
