"""The attention's input projection per layer: Parallax's ``project`` (one matmul for W_Q, W_K, W_V,
W_R, then the norms and RoPE of q, k and rho) with the fused norm + RoPE (``kernels.projection``)
against TorchTitan's modules, both inside one compiled function as the trainer compiles a block.

    python -m scripts.bench.projection --out docs/bench/projection

Per model (0.6B Parallax: heads of 128; Parallax-dagger: heads of 64), local batch 4 x 4096, bf16:
the median milliseconds (``triton.testing.do_bench``) of forward + backward of ``project`` under
``torch.compile``, and the largest relative difference of the outputs and gradients between the two.
"""

from __future__ import annotations

import argparse
import sys

import torch

from scripts.bench.results import command_line, describe, table, write_results

# name -> (dim, Hq, Hkv, head_dim) of the paper configs (configs/paper/0.6B)
MODELS = {"parallax 0.6B": (1024, 16, 8, 128), "parallax_dagger 0.6B": (1024, 16, 8, 64)}
BATCH, SEQ = 4, 4096
DEVICE = "cuda"


def _attention(dim, hq, hkv, head_dim):
    from parallax_titan.model import ParallaxAttention, ParallaxModelArgs, ParallaxQwen3Model

    args = ParallaxModelArgs(dim=dim, n_heads=hq, n_kv_heads=hkv, head_dim=head_dim, max_seq_len=SEQ,
                             rho_rope=True, qk_norm=True, n_layers=1, vocab_size=256)
    torch.manual_seed(0)
    attention = ParallaxAttention(args).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        attention.init_weights(0.02)
    return attention, ParallaxQwen3Model(args).rope_cache.to(DEVICE)


def run_model(name: str) -> dict:
    """Timings and differences of the two paths for model ``name``."""
    import triton

    attention, rope = _attention(*MODELS[name])
    x = torch.randn(BATCH, SEQ, MODELS[name][0], device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    upstream = None
    result = {"model": name}
    outputs = {}
    for path in ("modules", "fused"):
        if path == "modules":
            attention._fused_norm_rope = lambda *_: False
        else:
            del attention._fused_norm_rope  # the class's rule again: on CUDA it takes the fused path
        step = torch.compile(lambda x: attention.project(x, rope, None), dynamic=False)
        outs = step(x)
        upstream = upstream or [torch.randn_like(o) for o in outs]

        def fwd_bwd():
            x.grad = None
            attention.zero_grad()
            torch.autograd.backward(step(x), upstream)

        fwd_bwd()
        outputs[path] = [o.detach() for o in step(x)] + [x.grad.clone()] + [
            p.grad.clone() for p in attention.parameters() if p.grad is not None]
        result[path + "_ms"] = triton.testing.do_bench(fwd_bwd, warmup=10, rep=100)
        torch._dynamo.reset()
    result["fused_over_modules"] = result["fused_ms"] / result["modules_ms"]
    result["max_rel_diff"] = max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))
                                 for a, b in zip(outputs["fused"], outputs["modules"]))
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.projection", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/bench/projection", help="output path without extension")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("scripts.bench.projection needs a CUDA GPU")
    rows = [run_model(name) for name in MODELS]
    meta = describe("Attention input projection: fused norm + RoPE against the modules",
                    f"ms of forward + backward of ParallaxAttention.project (compiled), B, L = {BATCH}, {SEQ}, bf16",
                    command_line(__spec__.name, argv))
    cells = [[r["model"], f"{r['modules_ms']:.3f}", f"{r['fused_ms']:.3f}", f"{r['fused_over_modules']:.3f}",
              f"{r['max_rel_diff']:.2g}"] for r in rows]
    body = "\n".join(table(["model", "modules ms", "fused ms", "fused / modules", "max rel diff"], cells)) + "\n"
    print(write_results(args.out, meta, body, {"rows": rows}))


if __name__ == "__main__":
    main()
