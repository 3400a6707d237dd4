"""Input cases shared by the attention test modules (reference and fused backends)."""

import math

import torch

SEQ = 16  # packed length (batch 1) of the cu_seqlens cases
# name -> (offsets, pattern the error must match): each names cu_seqlens and the offending values
BAD_CU_VALUES = {
    "decreasing": ([0, 10, 6, 16], r"cu_seqlens=\[0, 10, 6, 16\] is invalid: cu_seqlens\[2\]=6 < cu_seqlens\[1\]=10"),
    "first_not_zero": ([3, 8, 16], r"cu_seqlens=\[3, 8, 16\] is invalid: cu_seqlens\[0\]=3, expected 0"),
    "last_past_seq": ([0, 8, 20], r"cu_seqlens=\[0, 8, 20\] is invalid: cu_seqlens\[2\]=20 lies outside \[0, seq=16\]"),
    "inner_past_seq": ([0, 30, 16], r"cu_seqlens=\[0, 30, 16\] is invalid: cu_seqlens\[1\]=30 lies outside"),
    "negative": ([0, -4, 16], r"cu_seqlens\[1\]=-4 lies outside \[0, seq=16\]"),
    "last_before_seq": ([0, 8, 12], r"cu_seqlens=\[0, 8, 12\] is invalid: cu_seqlens\[-1\]=12, expected seq=16"),
    # a long list is shortened in the message; the problem still names the entry
    "long": ([0, *range(1, 15), 3, *range(15, 17)] + [16] * 24,
             r"cu_seqlens=\[0, 1, .*, \.\.\., .*16\] \(42 entries\) is invalid: cu_seqlens\[15\]=3 < cu_seqlens\[14\]=14"),
}
# name -> (function making the argument, pattern): type, dtype, shape and device
BAD_CU_STRUCTURE = {
    "int64": (lambda: torch.tensor([0, 16]), r"cu_seqlens must be a 1-D int32 tensor, got torch.int64 tensor of shape \(2,\)"),
    "two_dims": (lambda: torch.tensor([[0, 16]], dtype=torch.int32),
                 r"cu_seqlens must be a 1-D int32 tensor, got torch.int32 tensor of shape \(1, 2\)"),
    "list": (lambda: [0, 16], "cu_seqlens must be a 1-D int32 tensor, got list"),
    "one_entry": (lambda: torch.tensor([16], dtype=torch.int32), "cu_seqlens needs at least 2 entries, got 1"),
    "device": (lambda: torch.tensor([0, 16], dtype=torch.int32, device="meta"), "cu_seqlens is on meta, q on cpu"),
}


def bad_cu_seqlens(name):
    """(argument, pattern) of a BAD_CU_VALUES or BAD_CU_STRUCTURE case."""
    if name in BAD_CU_VALUES:
        values, pattern = BAD_CU_VALUES[name]
        return torch.tensor(values, dtype=torch.int32), pattern
    make, pattern = BAD_CU_STRUCTURE[name]
    return make(), pattern


BAD_CU_NAMES = list(BAD_CU_VALUES) + list(BAD_CU_STRUCTURE)


# ----------------------------------------------------------------------------- sliding window
def banded_mask(n, window=None, lengths=None, device="cpu"):
    """(n, n) bool mask from SPEC 1b's definition: query i reads key j iff j <= i, i - window < j
    (no lower edge for window None) and both lie in one document (``lengths``: document lengths
    summing to n; one document when None)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    doc = torch.repeat_interleave(torch.arange(len(lengths or [n]), device=device),
                                  torch.tensor(lengths or [n], device=device))
    mask = (j <= i) & (doc[:, None] == doc[None, :])
    return mask if window is None else mask & (j > i - window)


def masked_parallax_fp64(q, r, k, v, mask, scale=None):
    """Parallax attention in fp64 over an explicit (L, L) mask (SPEC section 1's weights
    w_ij = p_ij (1 - t_ij + tbar_i), o_i = sum_j w_ij v_j). q, r: (B, L, Hq, D); k, v: (B, L, Hkv, D).
    Returns (B, L, Hq, D) fp64, differentiable w.r.t. the inputs."""
    group = q.shape[2] // k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qh, rh = (x.double().transpose(1, 2) for x in (q, r))
    kh, vh = (x.double().transpose(1, 2).repeat_interleave(group, dim=1) for x in (k, v))
    p = torch.softmax((scale * qh @ kh.transpose(-1, -2)).masked_fill(~mask, float("-inf")), dim=-1)
    t = (rh @ kh.transpose(-1, -2)).masked_fill(~mask, 0.0)
    tbar = (p * t).sum(-1, keepdim=True)
    return ((p * (1.0 - t + tbar)) @ vh).transpose(1, 2)


def banded_reference(inputs, do, window, lengths=None, scale=None):
    """fp64 output and (dq, dr, dk, dv) of masked_parallax_fp64 under banded_mask, for upstream do."""
    q, r, k, v = (x.detach().double().requires_grad_() for x in inputs)
    out = masked_parallax_fp64(q, r, k, v, banded_mask(q.shape[1], window, lengths, q.device), scale)
    out.backward(do.double())
    return out.detach(), [x.grad for x in (q, r, k, v)]


def cuda_inputs(b, n, hq, hkv, d, dtype, seed, rho_scale=1.0):
    """Random CUDA ([q, rho, k, v], dO) in ``dtype``: q, rho, dO (b, n, hq, d), k, v (b, n, hkv, d),
    rho scaled by rho_scale / sqrt(d) (before the cast)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, r, do = (torch.randn(b, n, hq, d, generator=gen, device="cuda") for _ in range(3))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device="cuda") for _ in range(2))
    r = r * rho_scale / math.sqrt(d)
    return [x.to(dtype) for x in (q, r, k, v)], do.to(dtype)


def cu_from_lengths(lengths, device="cpu"):
    """int32 cu_seqlens (len(lengths) + 1,) on ``device`` for documents of ``lengths``; None for None."""
    if lengths is None:
        return None
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
