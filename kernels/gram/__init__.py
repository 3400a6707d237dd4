"""Symmetric products for Muon's orthogonalisers: ``scale_b * (alpha * P @ P^T + beta * Y + gamma * I)``.

* ``symmetric_product(P, alpha=1.0, Y=None, beta=0.0, gamma=0.0, scale=None)``: the batched Triton kernel
  (``fused``), which computes only the output tiles on and above the diagonal and stores each twice;
  P is (B, k, K) or (k, K) of any strides, the result a contiguous, exactly symmetric (B, k, k).
  Needs CUDA tensors (or TRITON_INTERPRET=1). Imported lazily: ``import kernels.gram`` does not
  import Triton.
* ``naive.symmetric_product``: the PyTorch reference with the same signature, on any device.
"""

_EXPORTS = {"symmetric_product": "kernels.gram.fused"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kernels.gram' has no attribute {name!r}")


__all__ = list(_EXPORTS)
