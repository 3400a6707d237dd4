"""Recurrent (decode) form of the uniform-weight family (SPEC 1b): an explicit running-sum state of
O(D^2) per kv head, updated one token at a time.

    state after i tokens: n = i, s_k = sum k_j, s_v = sum v_j, S_vk = sum v_j k_j^T, S_kk = sum k_j k_j^T

Each step takes the new token's projections in the (B, 1, H, D) layout of the training path,
adds its k, v to the state first (position i reads keys j <= i) and reads the output:

    Value Averaging          o = vbar
    Affine Linear Attention  o = vbar - Sigma_KV r          (or -S_vk r / n without intercept)
    Affine MesaNet           o = vbar + Sigma_KV (Sigma_KK + lam I)^-1 (q - kbar)

The state is immutable (``update`` returns a new one), so steps compose under autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.family.common import FLOAT_DTYPES, check_flag, check_lam, check_q_heads, solve_spd, work_dtype


@dataclass(frozen=True)
class AffineState:
    """Running sums of a batch of sequences, per kv head.

    count: tokens seen so far (all sequences of the batch advance together).
    s_k, s_v: (B, Hkv, D); s_vk: (B, Hkv, D, D) with s_vk[..., a, b] = sum_j v_j[a] k_j[b];
    s_kk: (B, Hkv, D, D) or None (only Affine MesaNet reads it). Stored in fp32 (fp64 for fp64).
    """

    count: int
    s_k: torch.Tensor
    s_v: torch.Tensor
    s_vk: torch.Tensor
    s_kk: torch.Tensor | None

    @classmethod
    def zeros(cls, batch: int, kv_heads: int, head_dim: int, *, dtype=torch.float32, device=None,
              with_kk: bool = False) -> "AffineState":
        """Empty state; batch, kv_heads, head_dim: ints >= 1; dtype is the accumulation dtype (float32 or float64);
        with_kk a bool (the s_kk sums Affine MesaNet reads)."""
        if any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in (batch, kv_heads, head_dim)):
            raise ValueError(f"AffineState.zeros: batch={batch!r}, kv_heads={kv_heads!r}, head_dim={head_dim!r} must be "
                             "ints >= 1")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"AffineState.zeros: dtype={dtype}, expected torch.float32 or torch.float64")
        check_flag("AffineState.zeros", "with_kk", with_kk)
        vec = torch.zeros(batch, kv_heads, head_dim, dtype=dtype, device=device)
        mat = torch.zeros(batch, kv_heads, head_dim, head_dim, dtype=dtype, device=device)
        return cls(0, vec, vec.clone(), mat, mat.clone() if with_kk else None)

    @classmethod
    def from_sequence(cls, k: torch.Tensor, v: torch.Tensor, *, with_kk: bool = False) -> "AffineState":
        """State after a whole prompt: k, v (B, L, Hkv, D) -> sums over L (prefill, then decode); L = 0 gives
        the empty state, an empty batch, heads or head_dim a ValueError; with_kk a bool (the s_kk sums
        Affine MesaNet reads)."""
        _check_kv("AffineState.from_sequence", k, v)
        check_flag("AffineState.from_sequence", "with_kk", with_kk)
        work = work_dtype(k.dtype)
        kw, vw = k.to(work), v.to(work)
        s_kk = torch.einsum("nlha,nlhc->nhac", kw, kw) if with_kk else None
        return cls(k.shape[1], kw.sum(1), vw.sum(1), torch.einsum("nlha,nlhc->nhac", vw, kw), s_kk)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> "AffineState":
        """Add one token per sequence: k, v (B, 1, Hkv, D)."""
        self._check_token("AffineState.update", {"k": k, "v": v}, kv=True)
        kw, vw = k[:, 0].to(self.s_k.dtype), v[:, 0].to(self.s_k.dtype)
        s_kk = None if self.s_kk is None else self.s_kk + kw[..., :, None] * kw[..., None, :]
        return AffineState(self.count + 1, self.s_k + kw, self.s_v + vw,
                           self.s_vk + vw[..., :, None] * kw[..., None, :], s_kk)

    def _check_token(self, fn, tensors, kv):
        b, hkv, d = self.s_k.shape
        for name, x in tensors.items():
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[0] != b or x.shape[1] != 1 \
                    or x.shape[3] != d or x.dtype not in FLOAT_DTYPES:
                got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{fn}: {name} must be a float tensor of shape ({b}, 1, heads, {d}), got {got}")
            if (kv and x.shape[2] != hkv) or (not kv and (x.shape[2] == 0 or x.shape[2] % hkv)):
                want = f"{hkv}" if kv else f"a multiple of {hkv}"
                raise ValueError(f"{fn}: {name} has {x.shape[2]} heads, expected {want} (state kv heads {hkv})")
            if x.device != self.s_k.device:
                raise ValueError(f"{fn}: {name} is on {x.device}, the state on {self.s_k.device}")

    def _moments(self):
        if self.count == 0:
            raise ValueError("AffineState: no token in the state yet; call update(k, v) first")
        return self.s_k / self.count, self.s_v / self.count

    def _grouped(self, x):
        """(B, 1, Hq, D) -> (B, Hkv, G, D) in the state dtype."""
        b, _, hq, d = x.shape
        return x[:, 0].to(self.s_k.dtype).reshape(b, self.s_k.shape[1], hq // self.s_k.shape[1], d)

    def _sigma_kv_times(self, x, intercept):
        """Sigma_KV x (or S_vk x / n without intercept) for grouped x (B, Hkv, G, D)."""
        raw = torch.einsum("nhac,nhgc->nhga", self.s_vk, x) / self.count
        if not intercept:
            return raw
        kbar, vbar = self._moments()
        return raw - vbar[:, :, None] * (kbar[:, :, None] * x).sum(-1, keepdim=True)

    def value_average(self, q_heads: int) -> torch.Tensor:
        """vbar for each query head: (B, 1, Hq, D) in the state dtype; q_heads a positive multiple of the kv heads."""
        check_q_heads("AffineState.value_average", q_heads, self.s_k.shape[1])
        _, vbar = self._moments()
        b, hkv, d = vbar.shape
        return vbar[:, :, None].expand(b, hkv, q_heads // hkv, d).reshape(b, 1, q_heads, d)

    def affine_la(self, r: torch.Tensor, *, intercept: bool = True) -> torch.Tensor:
        """Affine Linear Attention readout for probes r (B, 1, Hq, D): (B, 1, Hq, D), state dtype;
        intercept a bool."""
        self._check_token("AffineState.affine_la", {"r": r}, kv=False)
        check_flag("AffineState.affine_la", "intercept", intercept)
        out = -self._sigma_kv_times(self._grouped(r), intercept)
        if intercept:
            out = out + self._moments()[1][:, :, None]
        return out.reshape(r.shape)

    def affine_mesanet(self, q: torch.Tensor, *, lam, intercept: bool = True) -> torch.Tensor:
        """Affine MesaNet readout for queries q (B, 1, Hq, D): (B, 1, Hq, D), state dtype.
        lam: number > 0 or (Hq,) tensor; intercept a bool."""
        fn = "AffineState.affine_mesanet"
        self._check_token(fn, {"q": q}, kv=False)
        check_flag(fn, "intercept", intercept)
        if self.s_kk is None:
            raise ValueError(f"{fn}: the state has no s_kk; build it with with_kk=True")
        lam = check_lam(fn, lam, q.shape[2], q.device)
        qg = self._grouped(q)
        kbar, vbar = self._moments()
        a = self.s_kk / self.count
        if intercept:
            a = a - kbar[..., :, None] * kbar[..., None, :]
            qg = qg - kbar[:, :, None]
        d = q.shape[-1]
        eye = torch.eye(d, dtype=a.dtype, device=a.device)
        if isinstance(lam, torch.Tensor):
            ridge = lam.to(a.dtype).reshape(self.s_k.shape[1], -1, 1, 1) * eye
        else:
            ridge = lam * eye
        a = a[:, :, None] + ridge  # (B, Hkv, G or 1, D, D)
        x = solve_spd(a, qg)
        out = self._sigma_kv_times(x, intercept)
        if intercept:
            out = out + vbar[:, :, None]
        return out.reshape(q.shape)


def _check_kv(fn, k, v):
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.dtype not in FLOAT_DTYPES:
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{fn}: {name} must be a 4-D (batch, seq, heads, head_dim) float tensor, got {got}")
        # seq 0 (an empty prompt) is the empty state; the others size the state, as in AffineState.zeros
        for dim, size in (("batch", x.shape[0]), ("heads", x.shape[2]), ("head_dim", x.shape[3])):
            if size == 0:
                raise ValueError(f"{fn}: {name} has an empty {dim} dimension, shape {tuple(x.shape)}; batch, heads "
                                 "and head_dim must be >= 1")
    if k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
        raise ValueError(f"{fn}: k and v must match in shape, dtype and device, got {tuple(k.shape)} {k.dtype} "
                         f"{k.device} and {tuple(v.shape)} {v.dtype} {v.device}")


def value_averaging_step(state: AffineState, k, v, *, q_heads: int):
    """Add token (k, v: (B, 1, Hkv, D)); return (o (B, 1, q_heads, D) in v's dtype, new state)."""
    state = state.update(k, v)
    return state.value_average(q_heads).to(v.dtype), state


def affine_linear_attention_step(state: AffineState, r, k, v, *, intercept: bool = True):
    """Add token (k, v: (B, 1, Hkv, D)); return (o (B, 1, Hq, D) in r's dtype, new state)."""
    state = state.update(k, v)
    return state.affine_la(r, intercept=intercept).to(r.dtype), state


def affine_mesanet_step(state: AffineState, q, k, v, *, lam, intercept: bool = True):
    """Add token (k, v: (B, 1, Hkv, D)); return (o (B, 1, Hq, D) in q's dtype, new state).
    The state must carry s_kk (``AffineState.zeros(..., with_kk=True)``)."""
    state = state.update(k, v)
    return state.affine_mesanet(q, lam=lam, intercept=intercept).to(q.dtype), state
