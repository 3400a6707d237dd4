"""Head layouts shared by the PyTorch forms of the kernels: query heads grouped by their kv head (GQA)."""

from __future__ import annotations

import torch


def grouped(x: torch.Tensor, hkv: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, L, H, D) -> contiguous (B, Hkv, H // Hkv, L, D) in ``dtype`` (query head h = kv * G + g)."""
    b, n, h, d = x.shape
    # Contiguous: batched matmuls on the permuted view fall off the fast path on CPUs.
    return x.to(dtype).reshape(b, n, hkv, h // hkv, d).permute(0, 2, 3, 1, 4).contiguous()


def ungrouped(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`grouped`: (B, Hkv, G, L, D) -> (B, L, Hkv * G, D) in ``dtype``."""
    b, hkv, g, n, d = x.shape
    return x.permute(0, 3, 1, 2, 4).reshape(b, n, hkv * g, d).to(dtype)
