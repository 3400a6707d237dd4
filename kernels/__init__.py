"""Parallax attention kernels.

Public API (imported lazily so that `import kernels` never pulls in Triton):

* ``parallax_attention(q, r, k, v, *, scale=None, causal=True, backend="auto", cu_seqlens=None)``
  training/prefill attention, layout (batch, seq, heads, head_dim).
* ``parallax_decode(q, r, k_cache, v_cache, *, cache_seqlens=None, scale=None)``
  one query token against a KV cache.
"""

_EXPORTS = {
    "parallax_attention": "kernels.parallax.attention",
    "parallax_decode": "kernels.parallax.decode",
    "exact_lla": "kernels.family.lla",
    "exact_lla_cost": "kernels.family.lla",
    "value_averaging": "kernels.family.api",
    "affine_linear_attention": "kernels.family.api",
    "affine_mesanet": "kernels.family.api",
    "AffineState": "kernels.family.recurrent",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")


__all__ = list(_EXPORTS)
