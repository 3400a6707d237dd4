"""Tiny models and the recompute-per-token reference for the generation tests (test helper)."""

from __future__ import annotations

import dataclasses

import torch

from parallax_titan.model import ParallaxQwen3Model
from parallax_titan.spec import BASE_FLAVORS, variant_args

# (variant, ParallaxModelArgs changes): every attention variant, the Parallax switches, G = 3 (dagger)
ATTENTION_CASES = [
    ("transformer", {}),
    ("transformer_dagger", {}),
    ("parallax", {}),
    ("parallax", {"gate": "head", "rho_rope": False}),
    ("parallax", {"gate": "token"}),
    ("parallax_dagger", {}),
    ("parallax", {"window": 3}),  # shorter than two of the prompts: the band moves in prefill and decode
]


def tiny_model(variant: str, seed: int = 0, *, dtype=torch.float32, device="cpu", n_layers: int = 2,
               max_seq_len: int = 64, **changes) -> ParallaxQwen3Model:
    """A debug-size model (vocab 4096) of ``variant`` with random weights, norms away from 1."""
    args = dataclasses.replace(variant_args(variant, BASE_FLAVORS["debug"]), n_layers=n_layers,
                               max_seq_len=max_seq_len, **changes)
    with torch.device("meta"):
        model = ParallaxQwen3Model(args)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device(device))
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm weights start at 1: make them matter
                param.uniform_(0.5, 1.5)
    rope_cache = model.rope_cache
    model.to(dtype)
    model.rope_cache = rope_cache  # fp32, as the loaders keep it
    return model.eval()


@torch.no_grad()
def full_logits(model, tokens: list[int]) -> torch.Tensor:
    """The training forward's next-token logits after ``tokens`` (vocab,)."""
    device = next(model.parameters()).device
    return model(torch.tensor([tokens], device=device))[0, -1]


def recompute_greedy(model, prompt: list[int], steps: int, window: int = 0, stop_ids=()) -> list[int]:
    """Greedy tokens by running the whole (last ``window``) sequence per new token, as lm-eval's
    adapter did before the cache; ends before a token in ``stop_ids``."""
    tokens = list(prompt)
    for _ in range(steps):
        token = int(full_logits(model, tokens[-window:] if window else tokens).argmax())
        if token in stop_ids:
            break
        tokens.append(token)
    return tokens[len(prompt):]
