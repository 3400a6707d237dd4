"""Per-head RMSNorm + RoPE of the fused attention input projection (q, k, rho; v passed through).

* ``split_norm_rope(y, hq, hkv, weights, eps, table, rope_rho=True)`` (``api``): the Triton kernels
  (``fused``) behind custom ops (``ops``), forward and backward; imported lazily, so ``import
  kernels.projection`` does not import Triton.
* ``naive.split_norm_rope``: the PyTorch reference with the same arguments, on any device.
"""

_EXPORTS = {"split_norm_rope": "kernels.projection.api"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kernels.projection' has no attribute {name!r}")


__all__ = list(_EXPORTS)
