"""The Parallax family of sequence mixers (SPEC sections 1 and 1b, seed 001).

Public entry points (re-exported lazily by ``kernels``), layout (batch, seq, heads, head_dim),
causal, GQA (query head h reads kv head h // (Hq // Hkv)):

* ``exact_lla(q, k, v, *, lam, scale=None, solver="cholesky" | "cg", cg_steps=None, max_cost=...)``
  exact local-linear attention, the parent of Parallax (``lla``; MAD-size problems only).
* ``value_averaging(v, *, q_heads=None)``, ``affine_linear_attention(r, k, v, *, intercept=True,
  backend="auto")``, ``affine_mesanet(q, k, v, *, lam, intercept=True)``: the uniform-weight
  (h -> infinity) members, as chunked PyTorch forms (``chunked``) and, for Affine LA, fused Triton
  kernels (``affine_la_fused``, ``ops``).
* ``AffineState`` and the ``*_step`` functions of ``recurrent``: the O(D^2)-per-head decode state.
* ``bench.time_affine_la``: GPU timing of Affine LA beside fla's chunked linear attention.
"""
