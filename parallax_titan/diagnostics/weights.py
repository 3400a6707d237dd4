"""Weight and circuit spectra of every attention layer (SPEC section 3).

Per layer, from the full weights (DTensor shards are gathered with ``full_tensor()``: collective,
so every rank must call :func:`spectral_diagnostics` and in the same order):

* full matrices: W_Q, W_K, W_V, W_O, W_R and the MLP's W_1 (gate), W_2 (down), W_3 (up);
* per head (suffix ``_h``): W_Q, W_K, W_V, W_O, W_R restricted to one head (D x d or d x D);
* per-head bilinear circuits: W_QK = W_Q^h W_K^{g T}, W_OV = W_O^h W_V^g, W_RK = W_R^h W_K^{g T}
  in the papers' column convention (d x d, rank <= D), kv head g = h // (Hq / Hkv);
* cross-head linear CKA of the V outputs x W_V^g on fixed Gaussian inputs (``cka_v_fixed``).

Per-head values are averaged over the heads where they are defined (a zero head's are NaN and left
out; NaN when every head is zero). Spectra (sigma_i / sigma_1, per-head ones averaged over heads
alike) are kept for the analysis report.
"""

from __future__ import annotations

import re

import torch
from torchtitan.models.qwen3.model.model import Attention

from parallax_titan.diagnostics.spectral import (
    mean_pairwise_cka,
    product_singular_values,
    singular_values,
    spectral_metrics,
)

PROJECTIONS = ("W_Q", "W_K", "W_V", "W_O", "W_R")
CIRCUITS = ("W_QK", "W_OV", "W_RK")
MLP = ("W_1", "W_2", "W_3")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def attention_modules(model: torch.nn.Module) -> list[tuple[int, str, torch.nn.Module]]:
    """(layer index, module name, module) of every attention module, by layer index.

    Names may carry wrappers (activation checkpointing, compile); the index is the number after
    ``layers.``.
    """
    found = []
    for name, module in model.named_modules():
        match = _LAYER.search(name + ".")
        if isinstance(module, Attention) and match:
            found.append((int(match.group(1)), name, module))
    if not found:
        raise ValueError(f"model {type(model).__name__} has no attention modules under 'layers.<i>'")
    return sorted(found, key=lambda item: item[0])


def full_weight(param: torch.Tensor) -> torch.Tensor:
    """The whole parameter as a plain tensor (gathers a DTensor: every rank must call this)."""
    full = getattr(param, "full_tensor", None)
    return (full() if full is not None else param).detach()


def layer_weights(model: torch.nn.Module, name: str, attention: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full weights of one layer in nn.Linear layout (out, in): W_Q, W_K, W_V, W_O, W_R (Parallax
    only) and W_1, W_2, W_3 (when the block has a ``feed_forward`` sibling)."""
    weights = {
        "W_Q": full_weight(attention.wq.weight), "W_K": full_weight(attention.wk.weight),
        "W_V": full_weight(attention.wv.weight), "W_O": full_weight(attention.wo.weight),
    }
    if getattr(attention, "wr", None) is not None:
        weights["W_R"] = full_weight(attention.wr.weight)
    block = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    ffn = getattr(block, "feed_forward", None)
    if ffn is not None:
        for key, attr in zip(MLP, ("w1", "w2", "w3")):
            weights[key] = full_weight(getattr(ffn, attr).weight)
    return weights


def _heads(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(H * D, d) Linear weight -> (H, D, d) per-head rows."""
    return weight.reshape(-1, head_dim, weight.shape[-1])


def circuit_singular_values(weights: dict[str, torch.Tensor], head_dim: int) -> dict[str, torch.Tensor]:
    """Singular values (heads, R) of every per-head projection and circuit of one layer."""
    q, k, v = (_heads(weights[key], head_dim) for key in ("W_Q", "W_K", "W_V"))
    o = weights["W_O"].reshape(weights["W_O"].shape[0], -1, head_dim).transpose(0, 1)  # (Hq, d, D)
    group = q.shape[0] // k.shape[0]
    k_of_q, v_of_q = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    out = {
        "W_Q_h": singular_values(q), "W_K_h": singular_values(k), "W_V_h": singular_values(v),
        "W_O_h": singular_values(o),
        # W_QK = Wq_h^T Wk_g (d x d): a = Wq_h^T, b = Wk_g^T in product_singular_values(a, b) = svals(a b^T).
        "W_QK": product_singular_values(q.transpose(1, 2), k_of_q.transpose(1, 2)),
        "W_OV": product_singular_values(o, v_of_q.transpose(1, 2)),
    }
    if "W_R" in weights:
        r = _heads(weights["W_R"], head_dim)
        out["W_R_h"] = singular_values(r)
        out["W_RK"] = product_singular_values(r.transpose(1, 2), k_of_q.transpose(1, 2))
    return out


def fixed_inputs(n: int, dim: int, device=None) -> torch.Tensor:
    """(n, dim) float64 standard Gaussian inputs, the same for every call and checkpoint
    (a private generator: the global RNG is untouched)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(n, dim, generator=gen, dtype=torch.float64).to(device)


def layer_spectral(weights: dict[str, torch.Tensor], head_dim: int, top_k: int, cka_tokens: int):
    """Spectral metrics and normalised spectra of one layer.

    Returns (metrics, spectra): metrics[type][metric] -> float (per-head types averaged over
    heads) plus metrics["cka"]["v_fixed"]; spectra[type] -> (R,) float64 sigma_i / sigma_1.
    """
    svals = {key: singular_values(weights[key]) for key in PROJECTIONS + MLP if key in weights}
    svals.update(circuit_singular_values(weights, head_dim))
    metrics, spectra = {}, {}
    for key, s in svals.items():
        values = spectral_metrics(s, top_k)
        metrics[key] = {name: float(value.nanmean()) for name, value in values.items()}
        normalised = s / s[..., :1]  # NaN for a zero head: left out of the mean, as from the metrics above
        spectra[key] = normalised.reshape(-1, s.shape[-1]).nanmean(0) if s.ndim > 1 else normalised
    v = _heads(weights["W_V"], head_dim)
    if v.shape[0] > 1:
        x = fixed_inputs(cka_tokens, v.shape[-1], device=v.device)
        metrics["cka"] = {"v_fixed": mean_pairwise_cka(x @ v.to(torch.float64).transpose(1, 2))}
    return metrics, spectra


def spectral_diagnostics(model: torch.nn.Module, top_k: int = 8, cka_tokens: int = 1024):
    """Spectral metrics of every layer: (metrics, spectra) keyed by layer index, as
    :func:`layer_spectral` returns them."""
    metrics, spectra = {}, {}
    for index, name, attention in attention_modules(model):
        weights = layer_weights(model, name, attention)
        metrics[index], spectra[index] = layer_spectral(weights, attention.head_dim, top_k, cka_tokens)
    return metrics, spectra
