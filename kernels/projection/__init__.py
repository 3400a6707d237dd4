"""Per-head RMSNorm + RoPE of the fused attention input projection (q, k, rho; v passed through).

* ``api.split_norm_rope(y, hq, hkv, weights, eps, table, rope_rho=True)`` (``kernels.split_norm_rope``):
  the Triton kernels (``fused``) behind custom ops (``ops``), forward and backward.
* ``naive.split_norm_rope``: the PyTorch reference with the same arguments, on any device.

Nothing is imported here: ``import kernels.projection`` does not import Triton.
"""
