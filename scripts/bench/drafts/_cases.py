"""The inputs the draft benchmarks ran on (the same as tests/_attention_cases.py's)."""

import math

import torch


def cuda_inputs(b, n, hq, hkv, d, dtype, seed, rho_scale=1.0):
    """Random CUDA ([q, rho, k, v], dO) in ``dtype``: q, rho, dO (b, n, hq, d), k, v (b, n, hkv, d)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, r, do = (torch.randn(b, n, hq, d, generator=gen, device="cuda") for _ in range(3))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device="cuda") for _ in range(2))
    r = r * rho_scale / math.sqrt(d)
    return [x.to(dtype) for x in (q, r, k, v)], do.to(dtype)


def cu_from_lengths(lengths, device="cpu"):
    """int32 cu_seqlens for documents of ``lengths``; None for None."""
    if lengths is None:
        return None
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
