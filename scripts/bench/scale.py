"""What reproducing the paper's 0.6B and 1.7B runs costs, on paper: the model behind docs/scale.md.

    python -m scripts.bench.scale        # prints the tables of docs/scale.md

Inputs are measured 1-GPU figures (docs/bench/train_h200) and stated link bandwidths; parameter
counts come from the models themselves (built on the meta device). Every formula is in
docs/scale.md; this file only evaluates them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

# Measured on one H200 at 0.6B, local batch 4 x 4096, bf16, compiled (docs/bench/train_h200).
STEP_MS = {("transformer", "muon"): 240.0, ("parallax", "muon"): 340.0,
           ("transformer", "adamw"): 187.0, ("parallax", "adamw"): 283.0}
ADAMW_FOREACH_MS = {"transformer": 16.3, "parallax": 11.6}  # the AdamW step itself, from the 1-GPU profiles
MEASURED_2GPU = {"1 GPU, accumulation 2": 51_390, "2 GPUs": 47_672, "2 GPUs, reshard never": 48_805,
                 "1 GPU": 47_176}  # tokens/s per GPU, Parallax Muon (scaling_2gpu*.md)
TOKENS_PER_MICROBATCH = 4 * 4096
NVLINK_GBPS = 360.0  # NCCL bus bandwidth within an H200 node (NVLink 4, 450 GB/s per direction)
INTER_NODE_GBPS = 40.0  # per GPU across nodes: one 400 Gb/s NDR link per GPU at ~80%
FS_WRITE_GBPS_PER_NODE = 2.0  # checkpoint writes to the shared file system, per node
LOADER_TOKENS_PER_S = 484e6  # docs/bench/data.md, pretokenized, one rank, warm page cache
RECIPES = {"0.6B": {"global_batch": 960, "steps": 20_000}, "1.7B": {"global_batch": 1920, "steps": 20_000}}
SEQ = 4096


@dataclass
class Counts:
    """Parameters of one model: all, Muon matrices (attention and MLP), AdamW (embeddings, head, norms)."""

    total: int
    muon: int
    flops_per_token: float


def counts(variant: str, flavor: str) -> Counts:
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.spec import BASE_FLAVORS, variant_args

    args = variant_args(variant, BASE_FLAVORS[flavor])
    with torch.device("meta"):
        model = ParallaxQwen3Model(args)
    params = dict(model.named_parameters())  # tied weights appear once
    total = sum(p.numel() for p in params.values())
    muon = sum(p.numel() for n, p in params.items() if p.ndim == 2 and n.startswith("layers."))
    embedding = model.tok_embeddings.weight.numel()
    head_dim_total = args.n_heads * args.head_dim
    # 6 x the parameters used in matmuls (the LM head, also when tied to the embedding) + causal attention
    dense = total - (0 if args.enable_weight_tying else embedding)
    flops = 6 * dense + 12 * args.n_layers * head_dim_total * SEQ
    return Counts(total, muon, flops)


def compute_ms(variant: str, flavor: str) -> tuple[float, float]:
    """(fwd+bwd ms of one 4 x 4096 microbatch, Muon step ms on one GPU) at ``flavor``.

    0.6B, measured: Muon's cost is the Muon-AdamW step difference plus the AdamW step itself, and
    fwd+bwd the Muon step minus it. 1.7B: the Transformer's fwd+bwd scaled by FLOPs per token (the
    same MFU); Parallax adds its 0.6B difference to the Transformer unscaled (the attention kernels,
    most of it, have the same shapes at both sizes); Muon scaled by the sum of m n min(m, n) over
    the matrices (the work of its iterations)."""
    def measured(v: str) -> tuple[float, float]:
        muon_ms = STEP_MS[(v, "muon")] - STEP_MS[(v, "adamw")] + ADAMW_FOREACH_MS[v]
        return STEP_MS[(v, "muon")] - muon_ms, muon_ms

    fwd_bwd, muon_ms = measured(variant)
    if flavor == "0.6B":
        return fwd_bwd, muon_ms
    transformer = measured("transformer")[0]
    scaled = transformer * counts("transformer", flavor).flops_per_token / counts("transformer", "0.6B").flops_per_token
    return scaled + (fwd_bwd - transformer), muon_ms * cubic_work(variant, flavor) / cubic_work(variant, "0.6B")


def cubic_work(variant: str, flavor: str) -> float:
    from parallax_titan.model import ParallaxQwen3Model
    from parallax_titan.spec import BASE_FLAVORS, variant_args

    with torch.device("meta"):
        model = ParallaxQwen3Model(variant_args(variant, BASE_FLAVORS[flavor]))
    return float(sum(p.shape[0] * p.shape[1] * min(p.shape) for n, p in model.named_parameters()
                     if p.ndim == 2 and n.startswith("layers.")))


def layout(flavor: str, gpus: int) -> tuple[int, int]:
    """(local batch, accumulation) for the recipe on ``gpus``: local batch 4 when it divides, else the
    smallest local batch >= 4 that does (global batch = local x GPUs x accumulation)."""
    global_batch = RECIPES[flavor]["global_batch"]
    for local in range(4, global_batch + 1):
        if global_batch % (local * gpus) == 0:
            return local, global_batch // (local * gpus)
    raise ValueError(f"no local batch fits {global_batch} on {gpus} GPUs")


def bus_gbps(gpus: int) -> float:
    return NVLINK_GBPS if gpus <= 8 else INTER_NODE_GBPS


def step_model(variant: str, flavor: str, gpus: int, reshard: bool = True) -> dict:
    """Predicted step time and its parts (ms), communication volumes per GPU and step (GB)."""
    c = counts(variant, flavor)
    local, accumulation = layout(flavor, gpus) if gpus in (8, 64) else (4, RECIPES[flavor]["global_batch"] // (4 * gpus))
    fwd_bwd, muon = compute_ms(variant, flavor)
    mb_ms = fwd_bwd * local / 4
    share = (gpus - 1) / gpus
    ag_gb = (2 if reshard else 1) * share * c.total * 2 / 1e9  # bf16 parameters, per microbatch
    rs_gb = share * c.total * 4 / 1e9  # fp32 gradients, per microbatch
    muon_gb = 2 * share * c.muon * 2 / 1e9 / gpus  # bf16 updates to the owners and directions back
    bw = bus_gbps(gpus)
    comm_mb_ms = (ag_gb + rs_gb) / bw * 1e3
    exposed_mb_ms = max(0.0, comm_mb_ms - mb_ms) + comm_mb_ms / 30  # the first gather and last reduce are not hidden
    opt_ms = muon / gpus + muon_gb / bw * 1e3
    step_ms = accumulation * (mb_ms + exposed_mb_ms) + opt_ms
    tokens = RECIPES[flavor]["global_batch"] * SEQ
    return {"local": local, "accumulation": accumulation, "fwd_bwd_ms": accumulation * mb_ms,
            "comm_exposed_ms": accumulation * exposed_mb_ms, "opt_ms": opt_ms, "step_ms": step_ms,
            "ag_gb": accumulation * ag_gb, "rs_gb": accumulation * rs_gb, "muon_gb": muon_gb,
            "tokens_per_s_per_gpu": tokens / gpus / (step_ms / 1e3),
            "gpu_hours": RECIPES[flavor]["steps"] * step_ms / 1e3 * gpus / 3600}


def checkpoint(variant: str, flavor: str, gpus: int) -> dict:
    """Checkpoint size (fp32 weights, Muon momentum, AdamW moments) and save seconds on ``gpus``."""
    c = counts(variant, flavor)
    size_gb = (4 * c.total + 4 * c.muon + 8 * (c.total - c.muon)) / 1e9
    nodes = max(1, gpus // 8)
    return {"size_gb": size_gb, "save_s": size_gb / (FS_WRITE_GBPS_PER_NODE * nodes)}


def two_gpu_check() -> list[tuple[str, float, float]]:
    """(run, predicted tokens/s per GPU, measured) for the measured 0.6B Parallax scaling runs."""
    fwd_bwd, muon = compute_ms("parallax", "0.6B")
    c = counts("parallax", "0.6B")
    rows = []
    for name, measured in MEASURED_2GPU.items():
        gpus = 2 if name.startswith("2") else 1
        accumulation = 2 if "accumulation" in name else 1
        reshard = "never" not in name
        share = (gpus - 1) / gpus
        comm = ((2 if reshard else 1) * share * c.total * 2 + share * c.total * 4) / 1e9 / NVLINK_GBPS * 1e3
        exchange = 2 * share * c.muon * 2 / 1e9 / gpus / NVLINK_GBPS * 1e3
        step = accumulation * (fwd_bwd + max(0.0, comm - fwd_bwd) + comm / 30) + muon / gpus + exchange
        rows.append((name, accumulation * TOKENS_PER_MICROBATCH / (step / 1e3), measured))
    return rows


def main(argv: list[str] | None = None) -> None:
    """Print the tables of docs/scale.md. The command takes no options: an argument (``--flavor 1.7B``)
    is refused rather than ignored while the fixed tables print."""
    argparse.ArgumentParser(prog="python -m scripts.bench.scale", description=__doc__.splitlines()[0]).parse_args(argv)
    for flavor in ("0.6B", "1.7B"):
        for variant in ("transformer", "parallax"):
            c = counts(variant, flavor)
            print(f"{flavor} {variant}: params {c.total / 1e6:.0f}M (Muon {c.muon / 1e6:.0f}M), "
                  f"{c.flops_per_token / 1e9:.2f} GFLOP/token; fwd+bwd, Muon ms (1 GPU, 4x4096): "
                  f"{compute_ms(variant, flavor)[0]:.0f}, {compute_ms(variant, flavor)[1]:.0f}; "
                  f"checkpoint {checkpoint(variant, flavor, 8)}")
            for gpus in (8, 64):
                m = step_model(variant, flavor, gpus)
                print(f"  {gpus} GPUs: " + ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in m.items())
                      + f"; save {checkpoint(variant, flavor, gpus)['save_s']:.1f} s")
    for name, predicted, measured in two_gpu_check():
        print(f"check {name}: predicted {predicted:,.0f}, measured {measured:,}, error {predicted / measured - 1:+.1%}")
    print(f"loader share of a step (0.6B, 8 GPUs): {30 * 4 * 4096 / LOADER_TOKENS_PER_S * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
