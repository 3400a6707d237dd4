"""Diagnostics metrics against direct fp64 computations (SPEC sections 1 and 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels.parallax.naive import parallax_weights as naive_weights
from parallax_titan.diagnostics.attention import (
    attention_weights,
    causal_document_mask,
    kv_correlation_norm,
    layer_statistics,
    per_query_statistics,
    query_positions,
)
from parallax_titan.diagnostics.spectral import (
    linear_cka,
    mean_pairwise_cka,
    normalized_spectral_entropy,
    product_singular_values,
    singular_values,
    spectral_metrics,
)

B, L, HQ, HKV, D = 2, 24, 4, 2, 4
EOS = 7


def random_qrkv(seed=0, rho_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, HQ, D, generator=gen, dtype=torch.float64)
    r = rho_scale * torch.randn(B, L, HQ, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, L, HKV, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, L, HKV, D, generator=gen, dtype=torch.float64)
    return q, r, k, v


def tokens_with_documents():
    tokens = torch.full((B, L), 3)
    tokens[0, 9] = EOS  # row 0: documents [0..9] and [10..23]
    return tokens


def explicit_query(q, r, k, v, mask, b, h, i):
    """Direct fp64 loop over keys for one query: p, w, Sigma_KV, Sigma_KK, Sigma_VV, vbar."""
    g = h // (HQ // HKV)
    keys = [j for j in range(L) if mask[b, i, j]]
    scores = torch.stack([q[b, i, h] @ k[b, j, g] / math.sqrt(D) for j in keys])
    p = torch.softmax(scores, 0)
    kbar = sum(p[n] * k[b, j, g] for n, j in enumerate(keys))
    vbar = sum(p[n] * v[b, j, g] for n, j in enumerate(keys))
    outer = lambda x, y: torch.outer(x, y)  # noqa: E731
    s_kv = sum(p[n] * outer(v[b, j, g] - vbar, k[b, j, g] - kbar) for n, j in enumerate(keys))
    s_kk = sum(p[n] * outer(k[b, j, g] - kbar, k[b, j, g] - kbar) for n, j in enumerate(keys))
    s_vv = sum(p[n] * outer(v[b, j, g] - vbar, v[b, j, g] - vbar) for n, j in enumerate(keys))
    t = torch.stack([r[b, i, h] @ k[b, j, g] for j in keys])
    tbar = (p * t).sum()
    w = p * (1 - t + tbar)
    return dict(keys=keys, p=p, w=w, s_kv=s_kv, s_kk=s_kk, s_vv=s_vv, vbar=vbar, rho=r[b, i, h])


def inv_sqrt_eig(m):
    evals, evecs = np.linalg.eigh(m.numpy())
    return torch.from_numpy(evecs @ np.diag(evals ** -0.5) @ evecs.T)


@pytest.fixture(scope="module")
def case():
    q, r, k, v = random_qrkv()
    mask = causal_document_mask(tokens_with_documents(), EOS)
    stats = per_query_statistics(q, r, k, v, mask, max_queries=6, ridge=0.0)
    return q, r, k, v, mask, stats


def test_document_mask_matches_boundaries():
    mask = causal_document_mask(tokens_with_documents(), EOS)
    assert mask[0, 9, 0] and not mask[0, 10, 9] and mask[0, 23, 10] and not mask[0, 5, 6]
    assert mask[1].equal(torch.ones(L, L, dtype=torch.bool).tril())



def test_document_mask_with_a_sliding_window():
    mask = causal_document_mask(tokens_with_documents(), EOS, window=3)
    doc = [[int(b == 0 and i >= 10) for i in range(L)] for b in range(B)]
    expected = torch.tensor([[[i - 3 < j <= i and doc[b][i] == doc[b][j] for j in range(L)] for i in range(L)]
                             for b in range(B)])
    assert mask.equal(expected)

def test_per_query_statistics_against_explicit_loops(case):
    q, r, k, v, mask, stats = case
    positions = query_positions(L, 6).tolist()
    checked = 0
    for b, h in [(0, 0), (0, 3), (1, 2)]:
        for n, i in enumerate(positions):
            ref = explicit_query(q, r, k, v, mask, b, h, i)
            corr_vec = ref["s_kv"] @ ref["rho"]
            torch.testing.assert_close(stats["cor"][b, h, i], corr_vec.norm() / ref["vbar"].norm())
            cpa = corr_vec.norm() / (ref["rho"].norm() * torch.linalg.matrix_norm(ref["s_kv"], ord=2))
            torch.testing.assert_close(stats["cpa"][b, h, n], cpa, equal_nan=True)  # NaN: one key only
            entropy = -(ref["p"] * ref["p"].log()).sum()
            torch.testing.assert_close(stats["entropy"][b, h, i], entropy)
            torch.testing.assert_close(stats["sink_p"][b, h, i], ref["p"][0])
            torch.testing.assert_close(stats["sink_w"][b, h, i], ref["w"][0] ** 2 / (ref["w"] ** 2).sum())
            torch.testing.assert_close(stats["w_min"][b, h, i], ref["w"].min())
            torch.testing.assert_close(stats["w_max"][b, h, i], ref["w"].max())
            torch.testing.assert_close(stats["probe_norm"][b, h, i], ref["rho"].norm())
            if len(ref["keys"]) > D + 1:  # full-rank covariances: Corr with explicit square roots
                corr = inv_sqrt_eig(ref["s_vv"]) @ ref["s_kv"] @ inv_sqrt_eig(ref["s_kk"])
                torch.testing.assert_close(stats["corr"][b, h, n], torch.linalg.matrix_norm(corr))
                checked += 1
    assert checked >= 6 and stats["cpa"].isfinite().float().mean() > 0.8


def test_corr_with_ridge_against_explicit_square_roots():
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 5, 30, 6, generator=gen, dtype=torch.float64)
    y = y + x  # correlated
    s_vv, s_kk, s_kv = x.mT @ x / 30, y.mT @ y / 30, x.mT @ y / 30
    ridge = 0.1
    for n in range(5):
        eye = torch.eye(6, dtype=torch.float64)
        a = s_vv[n] + ridge * torch.trace(s_vv[n]) / 6 * eye
        c = s_kk[n] + ridge * torch.trace(s_kk[n]) / 6 * eye
        expected = torch.linalg.matrix_norm(inv_sqrt_eig(a) @ s_kv[n] @ inv_sqrt_eig(c))
        torch.testing.assert_close(kv_correlation_norm(s_kv, s_kk, s_vv, ridge)[n], expected)


def test_corr_is_nan_for_a_zero_covariance():
    zero = torch.zeros(1, 3, 3, dtype=torch.float64)
    assert kv_correlation_norm(zero, zero, zero, 1e-3).isnan().all()


def test_parallax_weights_sum_to_one_and_match_reference():
    q, r, k, v = random_qrkv(seed=1)
    mask = causal_document_mask(tokens_with_documents(), EOS)
    kh = k.transpose(1, 2).repeat_interleave(HQ // HKV, 1)
    p, spread = attention_weights(q.transpose(1, 2), r.transpose(1, 2), kh, mask[:, None], 1 / math.sqrt(D))
    w = p - spread
    torch.testing.assert_close(w.sum(-1), torch.ones(B, HQ, L, dtype=torch.float64))
    for b in range(B):
        cu = torch.tensor([0, 10, L]) if b == 0 else None
        ref = naive_weights(q[b:b + 1], r[b:b + 1], k[b:b + 1], cu_seqlens=cu)
        torch.testing.assert_close(w[b:b + 1], ref["w"])
        torch.testing.assert_close(p[b:b + 1], ref["p"])


def test_zero_probe_gives_softmax():
    q, r, k, v = random_qrkv(seed=2, rho_scale=0.0)
    mask = causal_document_mask(tokens_with_documents(), None)
    with_probe = per_query_statistics(q, r, k, v, mask)
    softmax = per_query_statistics(q, None, k, v, mask)
    assert with_probe["cor"].abs().max() == 0
    for name in ("w_min", "w_max", "entropy", "sink_p", "corr"):
        torch.testing.assert_close(with_probe[name], softmax[name], equal_nan=True)
    assert set(softmax) == {"entropy", "sink_p", "w_min", "w_max", "corr"}


def test_layer_statistics_chunks_agree_with_one_pass(monkeypatch):
    import parallax_titan.diagnostics.attention as attention

    q, r, k, v = random_qrkv(seed=4)
    mask = causal_document_mask(tokens_with_documents(), EOS)
    whole = layer_statistics(q, r, k, v, mask)
    monkeypatch.setattr(attention, "MAX_ELEMENTS", L * L)  # one head block and one query at a time
    chunked = layer_statistics(q, r, k, v, mask)
    assert whole.keys() == chunked.keys()
    for name in whole:
        assert chunked[name] == pytest.approx(whole[name], rel=1e-12)
    stats = per_query_statistics(q, r, k, v, mask)
    assert whole["w_min"] == float(stats["w_min"].min()) and whole["cor"] == pytest.approx(float(stats["cor"].mean()))


def test_bad_attention_inputs_are_rejected():
    q, r, k, v = random_qrkv()
    mask = causal_document_mask(tokens_with_documents(), None)
    with pytest.raises(ValueError, match="mask"):
        per_query_statistics(q, r, k, v, mask.float())
    with pytest.raises(ValueError, match="r has shape"):
        per_query_statistics(q, r[:, :, :2], k, v, mask)
    with pytest.raises(ValueError, match="max_queries"):
        query_positions(L, 0)


def matrix_with_spectrum(s, m, n, seed=0):
    gen = np.random.default_rng(seed)
    u, _ = np.linalg.qr(gen.standard_normal((m, len(s))))
    v, _ = np.linalg.qr(gen.standard_normal((n, len(s))))
    return torch.from_numpy(u @ np.diag(s) @ v.T)


@pytest.mark.parametrize("shape", [(12, 7), (7, 12)])
def test_spectral_metrics_against_svd(shape):
    s = np.array([5.0, 3.0, 1.0, 0.5, 0.1, 0.01, 0.0])
    w = matrix_with_spectrum(s, *shape)
    sv = np.linalg.svd(w.numpy(), compute_uv=False)
    got = spectral_metrics(singular_values(w), top_k=2)
    q1, q2 = sv / sv.sum(), sv ** 2 / (sv ** 2).sum()
    h1 = -sum(x * math.log(x) for x in q1 if x > 0)
    h2 = -sum(x * math.log(x) for x in q2 if x > 0)
    assert float(got["stable_rank"]) == pytest.approx((sv ** 2).sum() / sv[0] ** 2, rel=1e-10)
    assert float(got["erank"]) == pytest.approx(math.exp(h1), rel=1e-10)
    assert float(got["energy_erank"]) == pytest.approx(math.exp(h2), rel=1e-10)
    assert float(got["top_k_energy"]) == pytest.approx((sv[:2] ** 2).sum() / (sv ** 2).sum(), rel=1e-10)
    assert float(got["spectral_entropy"]) == pytest.approx(h1 / math.log(7), rel=1e-10)
    assert float(got["stable_rank"]) == pytest.approx((25 + 9 + 1 + 0.25 + 0.01 + 1e-4) / 25, rel=1e-10)


def test_spectral_metrics_edge_cases():
    flat = spectral_metrics(torch.ones(4, dtype=torch.float64), top_k=1)
    assert float(flat["erank"]) == pytest.approx(4) and float(flat["spectral_entropy"]) == pytest.approx(1)
    assert spectral_metrics(torch.zeros(3, dtype=torch.float64))["stable_rank"].isnan()
    with pytest.raises(ValueError, match="R > 1"):
        normalized_spectral_entropy(torch.ones(1))
    with pytest.raises(ValueError, match="top_k"):
        spectral_metrics(torch.ones(3), top_k=0)


@pytest.mark.parametrize("m,n,inner", [(20, 16, 5), (3, 16, 5)])
def test_product_singular_values_against_svd(m, n, inner):
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(2, m, inner, generator=gen), torch.randn(2, n, inner, generator=gen)
    got = product_singular_values(a, b)
    for h in range(2):
        ref = np.linalg.svd((a[h].double() @ b[h].double().T).numpy(), compute_uv=False)[: got.shape[-1]]
        np.testing.assert_allclose(got[h].numpy(), ref, rtol=1e-9, atol=1e-9)


def cka_from_gram(x, y):
    """CKA through centred Gram matrices (HSIC form), independent of the feature-space formula."""
    n = x.shape[0]
    h = np.eye(n) - 1.0 / n
    kx, ky = h @ x @ x.T @ h, h @ y @ y.T @ h
    return np.trace(kx @ ky) / math.sqrt(np.trace(kx @ kx) * np.trace(ky @ ky))


def test_linear_cka():
    gen = torch.Generator().manual_seed(6)
    x, y = torch.randn(40, 5, generator=gen, dtype=torch.float64), torch.randn(40, 3, generator=gen, dtype=torch.float64)
    assert float(linear_cka(x, x)) == pytest.approx(1.0, abs=1e-12)
    assert float(linear_cka(x, y)) == pytest.approx(cka_from_gram(x.numpy(), y.numpy()), rel=1e-10)
    rot, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    assert float(linear_cka(3.7 * x @ rot, y)) == pytest.approx(float(linear_cka(x, y)), rel=1e-10)
    assert float(linear_cka(x + 2.0, y)) == pytest.approx(float(linear_cka(x, y)), rel=1e-10)
    heads = torch.stack([x, 2 * x @ rot, torch.randn(40, 5, generator=gen, dtype=torch.float64)])
    pairs = [float(linear_cka(heads[i], heads[j])) for i, j in ((0, 1), (0, 2), (1, 2))]
    assert mean_pairwise_cka(heads) == pytest.approx(sum(pairs) / 3, rel=1e-12)
    assert pairs[0] == pytest.approx(1.0) and pairs[1] < 0.5
    with pytest.raises(ValueError, match="heads >= 2"):
        mean_pairwise_cka(heads[:1])


def test_cor_is_undefined_where_the_mean_value_is_zero():
    """COR = ||Sigma_KV rho|| / ||vbar|| is 0 / 0 at a query whose values average to zero; the
    denominator was clamped to the smallest float, so it read 0 (no collapse) where CPA and Corr
    read NaN, and a layer of zero values logged COR 0."""
    q, r, k, v = random_qrkv(seed=3)
    v[:, :, 0] = 0.0  # kv head 0 (query heads 0, 1): vbar = 0 at every query
    v[0, 1, 1] = -v[0, 0, 1]  # kv head 1, row 0: two keys of opposite values
    q[0, 1, 2:] = 0.0  # query 1 of heads 2, 3 weighs them equally: vbar = 0, Sigma_KV rho is not
    mask = causal_document_mask(torch.zeros(B, L, dtype=torch.long), None)
    cor = per_query_statistics(q, r, k, v, mask)["cor"]
    assert cor[:, :2].isnan().all() and cor[0, 2:, 1].isnan().all()
    assert cor[:, 2:].isfinite().sum() == cor[:, 2:].numel() - 2
    assert math.isnan(layer_statistics(q, r, torch.zeros_like(k), torch.zeros_like(v), mask)["cor"])


def test_a_zero_head_is_left_out_of_the_head_mean_and_of_the_spectrum_alike():
    """A head whose W_R is zero has no spectrum (NaN metrics): the per-head metrics averaged the other
    heads, but the mean spectrum took the NaN in, so the report's spectra panel of W_R_h and W_RK was
    empty while its table showed the other heads' numbers; a layer without a spectrum emptied the
    panel's curve of every layer too."""
    from parallax_titan.diagnostics.plots import spectra_figure
    from parallax_titan.diagnostics.runner import DiagnosticsResult
    from parallax_titan.diagnostics.weights import layer_spectral

    gen = torch.Generator().manual_seed(7)
    d, heads, head_dim = 16, 4, 4
    weights = {key: torch.randn(heads * head_dim, d, generator=gen, dtype=torch.float64)
               for key in ("W_Q", "W_K", "W_V", "W_R")}
    weights["W_O"] = torch.randn(d, heads * head_dim, generator=gen, dtype=torch.float64)
    weights["W_R"][:head_dim] = 0.0  # head 0
    metrics, spectra = layer_spectral(weights, head_dim, top_k=2, cka_tokens=32)
    others = singular_values(weights["W_R"][head_dim:].reshape(3, head_dim, d))  # heads 1-3
    torch.testing.assert_close(spectra["W_R_h"], (others / others[:, :1]).mean(0))
    assert metrics["W_R_h"]["stable_rank"] == pytest.approx(float(spectral_metrics(others)["stable_rank"].mean()))
    assert spectra["W_RK"].isfinite().all() and math.isfinite(metrics["W_RK"]["erank"])
    zero_layer = {**spectra, "W_R_h": torch.full_like(spectra["W_R_h"], float("nan"))}
    figure = spectra_figure({"run": DiagnosticsResult(spectra={0: spectra, 1: zero_layer})}, matrices=("W_R_h",))
    line = figure.axes[0].lines[0]
    np.testing.assert_allclose(line.get_ydata(), spectra["W_R_h"].numpy())
