"""Parallax attention kernels, and the symmetric product of Muon's orthogonalisers.

Public API (imported lazily so that `import kernels` never pulls in Triton):

* ``parallax_attention(q, r, k, v, *, scale=None, causal=True, backend="auto", cu_seqlens=None, window=None)``
  training/prefill attention, layout (batch, seq, heads, head_dim).
* ``parallax_decode(q, r, k_cache, v_cache, *, cache_seqlens=None, scale=None, backend="auto", window=None,
  check_seqlens=True)``
  one query token against a KV cache.
* ``DecodePlan(batch, hq, hkv, head_dim, cache_len, dtype, device, ...)`` (or ``DecodePlan.like(q, k_cache)``):
  parallax_decode for one geometry with the host work done once (no sync per call, CUDA graphs).
* ``rolling_cache_write(k_cache, v_cache, k, v, start)`` writes tokens into a rolling cache of
  W slots (sliding-window decode) and returns its cache_seqlens.
* The Parallax family (``kernels.family``, SPEC 1 and 1b): ``exact_lla`` (and its ``exact_lla_cost``),
  ``value_averaging``, ``affine_linear_attention``, ``affine_mesanet``, and ``AffineState`` for decoding.
* ``symmetric_product(P, alpha=1.0, Y=None, beta=0.0, gamma=0.0, scale=None)`` (``kernels.gram``):
  ``scale_b * (alpha * P @ P^T + beta * Y + gamma * I)`` per matrix b, from the tiles on and above the
  diagonal (Muon's Polar Express steps).
* ``split_norm_rope(y, hq, hkv, weights, eps, table, rope_rho=True)`` (``kernels.projection``): the
  attention's q, k, v, rho from the fused input projection, per-head RMSNorm and RoPE, one launch over
  every head (Triton, forward and backward); ``ParallaxAttention.project`` runs it on CUDA.
"""

_EXPORTS = {
    "parallax_attention": "kernels.parallax.attention",
    "parallax_decode": "kernels.parallax.decode",
    "rolling_cache_write": "kernels.parallax.decode",
    "DecodePlan": "kernels.parallax.decode",
    "exact_lla": "kernels.family.lla",
    "exact_lla_cost": "kernels.family.lla",
    "value_averaging": "kernels.family.api",
    "affine_linear_attention": "kernels.family.api",
    "affine_mesanet": "kernels.family.api",
    "AffineState": "kernels.family.recurrent",
    "symmetric_product": "kernels.gram",
    "split_norm_rope": "kernels.projection.api",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")


__all__ = list(_EXPORTS)
