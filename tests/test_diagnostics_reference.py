"""Diagnostics against references written out from their textbook definitions in fp64 (SPEC
sections 1 and 3): per-query Python loops over keys for p, w, the covariances, COR, CPA and
Corr (inverse square roots by eigh, not Cholesky); numpy SVD of each explicit per-head product
for the circuit spectra; the centred-Gram (HSIC) form of linear CKA. Complements
test_diagnostics_metrics.py with the cases it leaves out: float32/bf16 inputs, sliding windows,
singular covariances under a ridge, softmax layers, GQA circuits W_OV / W_RK and per-head
projections, rank-deficient circuits, the CKA of V outputs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from parallax_titan.diagnostics.attention import causal_document_mask, per_query_statistics, query_positions
from parallax_titan.diagnostics.spectral import linear_cka, product_singular_values, spectral_metrics
from parallax_titan.diagnostics.weights import circuit_singular_values, fixed_inputs, layer_spectral


def inv_sqrt(m: np.ndarray) -> np.ndarray:
    """m^-1/2 by eigh; NaN unless m is positive definite (Corr is then undefined)."""
    evals, evecs = np.linalg.eigh(m)
    if evals.min() <= 1e-12 * max(evals.max(), 0.0):
        return np.full_like(m, np.nan)
    return evecs @ np.diag(evals ** -0.5) @ evecs.T


def reference_statistics(q, r, k, v, mask, positions, ridge):
    """SPEC 1 diagnostics, one query at a time, fp64 numpy, from the definitions:
    p = softmax(q.k / sqrt(D)) over readable keys, t = rho.k, w = p (1 - t + tbar),
    Sigma_XY = sum_j p_j (x_j - xbar)(y_j - ybar)^T, c = Sigma_KV rho;
    COR ||c|| / ||vbar||; CPA ||c|| / (||rho|| ||Sigma_KV||_2); Corr ||Sigma_VV'^-1/2 Sigma_KV
    Sigma_KK'^-1/2||_F with X' = X + ridge tr(X)/D I (NaN for a zero covariance); entropy; sinks at
    the first readable key; extreme w (w = p without a probe)."""
    q, k, v = (np.asarray(x.double()) for x in (q, k, v))
    r = None if r is None else np.asarray(r.double())
    B, L, H, D = q.shape
    group = H // k.shape[2]
    out = {name: np.full((B, H, L), np.nan) for name in ("entropy", "sink_p", "sink_w", "w_min", "w_max", "cor",
                                                         "probe_norm")}
    out.update({name: np.full((B, H, len(positions)), np.nan) for name in ("cpa", "corr")})
    for b in range(B):
        for h in range(H):
            g = h // group
            for i in range(L):
                keys = [j for j in range(L) if mask[b, i, j]]
                s = np.array([q[b, i, h] @ k[b, j, g] for j in keys]) / math.sqrt(D)
                p = np.exp(s - s.max())
                p /= p.sum()
                K, V = k[b, keys, g], v[b, keys, g]
                kbar, vbar = p @ K, p @ V
                out["entropy"][b, h, i] = -sum(x * math.log(x) for x in p if x > 0)
                out["sink_p"][b, h, i] = p[0]
                w = p
                if r is not None:
                    rho = r[b, i, h]
                    t = K @ rho
                    w = p * (1 - t + p @ t)
                    s_kv = sum(p[n] * np.outer(V[n] - vbar, K[n] - kbar) for n in range(len(keys)))
                    out["cor"][b, h, i] = np.linalg.norm(s_kv @ rho) / np.linalg.norm(vbar)
                    out["probe_norm"][b, h, i] = np.linalg.norm(rho)
                    out["sink_w"][b, h, i] = w[0] ** 2 / (w ** 2).sum()
                out["w_min"][b, h, i], out["w_max"][b, h, i] = w.min(), w.max()
                if i not in positions:
                    continue
                n_pos = positions.index(i)
                cov = lambda X, Y, xb, yb: sum(p[n] * np.outer(X[n] - xb, Y[n] - yb) for n in range(len(keys)))  # noqa: E731
                s_kv, s_kk, s_vv = cov(V, K, vbar, kbar), cov(K, K, kbar, kbar), cov(V, V, vbar, vbar)
                if np.trace(s_kk) > 0 and np.trace(s_vv) > 0:
                    a = s_vv + ridge * np.trace(s_vv) / D * np.eye(D)
                    c = s_kk + ridge * np.trace(s_kk) / D * np.eye(D)
                    out["corr"][b, h, n_pos] = np.linalg.norm(inv_sqrt(a) @ s_kv @ inv_sqrt(c))
                if r is not None:
                    rho = r[b, i, h]
                    spec = np.linalg.norm(s_kv, 2)
                    if spec > 0:
                        out["cpa"][b, h, n_pos] = np.linalg.norm(s_kv @ rho) / (np.linalg.norm(rho) * spec)
    return out


def qrkv(B, L, HQ, HKV, D, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.randn(2, B, L, HQ, D, generator=gen, dtype=torch.float64)
    k, v = torch.randn(2, B, L, HKV, D, generator=gen, dtype=torch.float64)
    return tuple(x.to(dtype) for x in (q, r, k, v))


def compare(got, ref, names, rtol, atol):
    for name in names:
        expected = torch.from_numpy(ref[name])
        value = got[name].double()
        assert value.shape == expected.shape, name
        torch.testing.assert_close(value, expected, rtol=rtol, atol=atol, equal_nan=True, msg=name)


ALL = ("entropy", "sink_p", "sink_w", "w_min", "w_max", "cor", "probe_norm", "cpa", "corr")


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 2e-5), (torch.bfloat16, 2e-5)])
def test_statistics_of_low_precision_inputs_against_fp64_loops(dtype, rtol):
    """float32 and bf16 inputs are computed in float32 (the docstring's promotion); the reference
    is the fp64 loop on the same (rounded) input values, so the only error is fp32 arithmetic, a
    few dozen operations deep per statistic (measured at most 2e-6 relative, in CPA): 2e-5 is
    ~170 fp32 ulps. Every statistic, ridge 1e-2, GQA 4/2, documents."""
    B, L, HQ, HKV, D = 2, 16, 4, 2, 4
    q, r, k, v = qrkv(B, L, HQ, HKV, D, seed=1, dtype=dtype)
    tokens = torch.full((B, L), 3)
    tokens[1, 6] = 7
    mask = causal_document_mask(tokens, 7)
    got = per_query_statistics(q, r, k, v, mask, max_queries=8, ridge=1e-2)
    assert all(got[name].dtype == (torch.float64 if dtype == torch.float64 else torch.float32) for name in ALL)
    ref = reference_statistics(q, r, k, v, mask, query_positions(L, 8).tolist(), 1e-2)
    compare(got, ref, ALL, rtol=rtol, atol=rtol * 1e-2)
    assert np.isfinite(ref["corr"]).mean() > 0.8


@pytest.mark.parametrize("window", [2, 5])
def test_statistics_under_a_sliding_window_against_loops(window):
    """Sliding window i - W < j <= i (with a document boundary): at most W < D + 1 readable keys,
    so every covariance is singular and Corr exists only through the ridge (checked against
    eigh inverse square roots of the ridged covariances); the sinks are taken at the window's
    first key, not token 1; entropy is at most log W."""
    B, L, HQ, HKV, D = 1, 14, 2, 1, 6
    q, r, k, v = qrkv(B, L, HQ, HKV, D, seed=2)
    tokens = torch.full((B, L), 3)
    tokens[0, 8] = 7
    mask = causal_document_mask(tokens, 7, window=window)
    got = per_query_statistics(q, r, k, v, mask, max_queries=L, ridge=1e-3)
    ref = reference_statistics(q, r, k, v, mask, query_positions(L, L).tolist(), 1e-3)
    compare(got, ref, ALL, rtol=1e-9, atol=1e-12)
    assert got["entropy"].max() <= math.log(window) + 1e-12
    assert got["corr"].isfinite().sum() > 0 and got["cpa"].isfinite().sum() > 0


def test_softmax_layer_statistics_against_loops():
    """Without a probe (r = None): entropy, sink_p, w = p extremes and Corr from the loops; the
    probe statistics are absent."""
    B, L, HQ, HKV, D = 2, 12, 4, 1, 3
    q, _, k, v = qrkv(B, L, HQ, HKV, D, seed=3)
    mask = causal_document_mask(torch.full((B, L), 3), None)
    got = per_query_statistics(q, None, k, v, mask, max_queries=5, ridge=0.0)
    ref = reference_statistics(q, None, k, v, mask, query_positions(L, 5).tolist(), 0.0)
    assert set(got) == {"entropy", "sink_p", "w_min", "w_max", "corr"}
    compare(got, ref, got.keys(), rtol=1e-9, atol=1e-12)


def test_query_positions_hand_example():
    """round(linspace(1, L - 1, n)) by hand: L = 24, n = 6 -> 1, 5.4, 9.8, 14.2, 18.6, 23."""
    assert query_positions(24, 6).tolist() == [1, 5, 10, 14, 19, 23]
    assert query_positions(4, 64).tolist() == [1, 2, 3]
    assert query_positions(1, 8).tolist() == []


# ----------------------------------------------------------------------------- weight spectra


def textbook_metrics(s: np.ndarray, top_k: int) -> dict[str, float]:
    """SPEC 3 metrics from singular values written out directly."""
    q1, q2 = s / s.sum(), s ** 2 / (s ** 2).sum()
    h1 = -sum(x * math.log(x) for x in q1 if x > 0)
    h2 = -sum(x * math.log(x) for x in q2 if x > 0)
    return {"stable_rank": (s ** 2).sum() / s.max() ** 2, "erank": math.exp(h1), "energy_erank": math.exp(h2),
            "top_k_energy": np.sort(s ** 2)[::-1][:top_k].sum() / (s ** 2).sum(),
            "spectral_entropy": h1 / math.log(len(s))}


def cka_hsic(x: np.ndarray, y: np.ndarray) -> float:
    n = x.shape[0]
    h = np.eye(n) - 1.0 / n
    kx, ky = h @ x @ x.T @ h, h @ y @ y.T @ h
    return float(np.trace(kx @ ky) / math.sqrt(np.trace(kx @ kx) * np.trace(ky @ ky)))


@pytest.fixture(scope="module")
def layer():
    """A GQA layer (Hq 4, Hkv 2, D 3, d 8) in nn.Linear layout; W_R's head 1 has rank 1 (a
    rank-deficient circuit) and the MLP is rectangular."""
    gen = torch.Generator().manual_seed(4)
    d, D, hq, hkv = 8, 3, 4, 2
    shapes = {"W_Q": (hq * D, d), "W_K": (hkv * D, d), "W_V": (hkv * D, d), "W_O": (d, hq * D), "W_R": (hq * D, d),
              "W_1": (20, d), "W_2": (d, 20), "W_3": (20, d)}
    w = {key: torch.randn(*shape, generator=gen, dtype=torch.float64) for key, shape in shapes.items()}
    w["W_R"][D:2 * D] = torch.outer(torch.randn(D, generator=gen, dtype=torch.float64),
                                    torch.randn(d, generator=gen, dtype=torch.float64))
    return w, D, hq, hkv


def explicit_head_matrices(w, D, hq, hkv):
    """Per head h (kv head g = h // (hq / hkv)), numpy fp64: W_Q^h (D x d) etc. and the d x d
    circuits W_QK = W_Q^hT W_K^g, W_OV = W_O[:, h] W_V^g, W_RK = W_R^hT W_K^g."""
    n = {key: value.double().numpy() for key, value in w.items()}
    rows = lambda key, i: n[key][i * D:(i + 1) * D]  # noqa: E731
    out = {key: [] for key in ("W_Q_h", "W_K_h", "W_V_h", "W_O_h", "W_R_h", "W_QK", "W_OV", "W_RK")}
    for h in range(hq):
        g = h // (hq // hkv)
        o_h = n["W_O"][:, h * D:(h + 1) * D]
        out["W_Q_h"].append(rows("W_Q", h)), out["W_R_h"].append(rows("W_R", h)), out["W_O_h"].append(o_h)
        out["W_QK"].append(rows("W_Q", h).T @ rows("W_K", g))
        out["W_OV"].append(o_h @ rows("W_V", g))
        out["W_RK"].append(rows("W_R", h).T @ rows("W_K", g))
    for g in range(hkv):
        out["W_K_h"].append(rows("W_K", g)), out["W_V_h"].append(rows("W_V", g))
    return out


def test_circuit_singular_values_against_explicit_products(layer):
    """Every per-head projection and circuit of a GQA layer: the singular values the code gets
    (QR factors, rank <= D) equal numpy's SVD of the explicit d x d product, the zero modes being
    the ones beyond D (and beyond rank 1 for W_R's rank-1 head)."""
    w, D, hq, hkv = layer
    got = circuit_singular_values(w, D)
    for key, mats in explicit_head_matrices(w, D, hq, hkv).items():
        assert got[key].shape[0] == len(mats), key
        for h, mat in enumerate(mats):
            ref = np.linalg.svd(mat, compute_uv=False)
            n = got[key].shape[-1]
            np.testing.assert_allclose(got[key][h].numpy(), ref[:n], rtol=1e-9, atol=1e-9 * ref[0], err_msg=key)
            assert np.all(ref[n:] < 1e-9 * ref[0]), key  # what the D-dimensional factor leaves out is zero
    rk = got["W_RK"][1].numpy()
    assert rk[1:].max() < 1e-9 * rk[0]  # rank 1


def test_layer_spectral_against_textbook_metrics(layer):
    """layer_spectral's numbers: full matrices and per-head types (mean over heads; a circuit's
    normalised entropy over R = D modes), normalised spectra (mean of sigma / sigma_1 over heads),
    and the CKA of V outputs on the fixed Gaussian inputs (mean over kv-head pairs, HSIC form)."""
    w, D, hq, hkv = layer
    metrics, spectra = layer_spectral(w, D, top_k=2, cka_tokens=50)
    for key in ("W_Q", "W_K", "W_V", "W_O", "W_R", "W_1", "W_2", "W_3"):
        s = np.linalg.svd(w[key].double().numpy(), compute_uv=False)
        for name, value in textbook_metrics(s, 2).items():
            assert metrics[key][name] == pytest.approx(value, rel=1e-10), (key, name)
        np.testing.assert_allclose(spectra[key].numpy(), s / s[0], rtol=1e-10)
    for key, mats in explicit_head_matrices(w, D, hq, hkv).items():
        svals = [np.linalg.svd(m, compute_uv=False)[:D] for m in mats]
        for name in ("stable_rank", "erank", "energy_erank", "top_k_energy", "spectral_entropy"):
            mean = np.mean([textbook_metrics(s, 2)[name] for s in svals])
            assert metrics[key][name] == pytest.approx(mean, rel=1e-9), (key, name)
        np.testing.assert_allclose(spectra[key].numpy(), np.mean([s / s[0] for s in svals], 0), rtol=1e-9, atol=1e-12)
    x = fixed_inputs(50, 8).numpy()
    assert x.shape == (50, 8) and abs(x.mean()) < 0.5
    outs = [x @ w["W_V"][g * D:(g + 1) * D].double().numpy().T for g in range(hkv)]
    assert metrics["cka"]["v_fixed"] == pytest.approx(cka_hsic(outs[0], outs[1]), rel=1e-10)


def test_product_singular_values_of_rank_deficient_and_batched_factors():
    """a b^T with a of rank 2 < D = 4 (and a zero b for one batch entry): the QR path gives the
    explicit product's singular values, zeros included."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(3, 10, 2, generator=gen, dtype=torch.float64) @ torch.randn(3, 2, 4, generator=gen,
                                                                                 dtype=torch.float64)
    b = torch.randn(3, 7, 4, generator=gen, dtype=torch.float64)
    b[2] = 0
    got = product_singular_values(a, b)
    assert got.shape == (3, 4)
    for i in range(3):
        ref = np.linalg.svd((a[i] @ b[i].T).numpy(), compute_uv=False)[:4]
        np.testing.assert_allclose(got[i].numpy(), ref, rtol=1e-10, atol=1e-10 * max(ref[0], 1.0))
    assert got[0, 2:].abs().max() < 1e-10 * got[0, 0] and torch.equal(got[2], torch.zeros(4, dtype=torch.float64))


def test_spectral_metrics_rowwise_and_cka_edge_cases():
    """Batched singular values are reduced row by row (textbook metrics per row; top_k >= R gives
    energy 1); linear CKA with fewer samples than features and with batch dims matches the HSIC
    form pair by pair."""
    s = torch.tensor([[4.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [9.0, 1e-3, 1e-6, 0.0]], dtype=torch.float64)
    for top_k in (1, 3, 6):
        got = spectral_metrics(s, top_k)
        for row in range(3):
            for name, value in textbook_metrics(s[row].numpy(), top_k).items():
                assert float(got[name][row]) == pytest.approx(value, rel=1e-12), (row, name, top_k)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 5, 9, generator=gen, dtype=torch.float64)  # N = 5 < D = 9
    y = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64) + x[..., :3]
    got = linear_cka(x, y)
    for i in range(2):
        assert float(got[i]) == pytest.approx(cka_hsic(x[i].numpy(), y[i].numpy()), rel=1e-10)


def test_cka_of_v_outputs_in_a_diagnostics_pass():
    """``cka_v`` of a pass on a small GQA model (2 kv heads): the HSIC-form CKA of the two kv
    heads' V outputs over evenly spaced tokens of the batch (cka_tokens of B * L), the V outputs
    read by the hooks the pass uses."""
    from parallax_titan.diagnostics import collect
    from parallax_titan.diagnostics.capture import attention_hooks, project_qrkv
    from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer
    from tests.test_diagnostics_runner import CONFIG, batch, tiny

    config = dataclasses.replace(CONFIG, cka_tokens=21)  # of 64 tokens: every ~3rd
    model, tokens = tiny("parallax", dtype=torch.float64), batch()
    seen = {}
    with torch.no_grad(), attention_hooks(model, lambda n, m, x, rope, pos: seen.__setitem__(
            n, project_qrkv(m, x, rope, pos)[3])):
        model(tokens)
    result = collect(model, tokens, PretrainTokenizer(TINY_TOKENIZER_PATH), config, spectral=False)
    for layer, v in seen.items():
        flat = v.reshape(-1, 2, v.shape[-1]).numpy()  # (B * L, Hkv, D)
        rows = np.round(np.linspace(0, flat.shape[0] - 1, config.cka_tokens)).astype(int)
        expected = cka_hsic(flat[rows, 0], flat[rows, 1])
        assert result.attention[layer]["cka_v"] == pytest.approx(expected, rel=1e-10), layer
