"""What the probe costs outside the attention kernel: the compiled forward + backward of Parallax's input
projection (``ParallaxAttention.project``: W_Q, W_K, W_V, W_R in one matmul, RMSNorm and RoPE of q, k and
rho) beside the same projection without rho (``SoftmaxAttention.project``), one layer, one GPU, bf16.
The Parallax projection runs twice: as the model runs it (on CUDA the fused norm + RoPE kernels of
``kernels.projection``) and through TorchTitan's norm modules and ``apply_rope`` (Inductor's fusion).

Per variant: the GPU kernel time of a step (forward, then backward with fixed random output gradients)
under the PyTorch profiler, split into matmuls and the rest (``trace_summary.group_of``); per training
step = per layer x the flavor's layers. Wall time is not reported: a lone layer's step is bound by its
launches, not its kernels. The probe's cost is the difference between the two rows; its matmul part has
a floor, the W_R products (forward and two backward) at the GPU's peak, which the page states beside it.

    python -m scripts.bench.probe_cost --out docs/bench/probe_cost
    python -m scripts.bench.probe_cost --flavor 0.6B --variant parallax_dagger --batch 4 --seq-len 4096
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from scripts.bench.results import add_batch_arguments, command_line, describe, require_cuda, table, write_result_page
from scripts.bench.trace_summary import group_of

PEAK_BF16_TFLOPS = 790.0  # H200 dense bf16 (the figure the other pages' floors use)
PROFILED_STEPS = 5


def build(flavor: str, variant: str):
    """(ParallaxAttention, SoftmaxAttention, args) at ``flavor``'s shapes as ``variant`` builds them,
    bf16 on the GPU, weights as a model initialises them and norm weights drawn in [0.5, 1.5)."""
    from parallax_titan.model import ParallaxAttention, SoftmaxAttention
    from parallax_titan.spec import BASE_FLAVORS, variant_args

    args = variant_args(variant, BASE_FLAVORS[flavor])
    modules = []
    for cls in (ParallaxAttention, SoftmaxAttention):
        module = cls(dataclasses.replace(args)).cuda().to(torch.bfloat16)
        with torch.no_grad():
            module.init_weights(0.02)
            for norm in (module.q_norm, module.k_norm, getattr(module, "r_norm", None)):
                if norm is not None:
                    norm.weight.copy_(torch.rand_like(norm.weight) + 0.5)
        modules.append(module)
    return modules[0], modules[1], args


def kernel_ms(step, steps: int = PROFILED_STEPS) -> dict[str, float]:
    """GPU time per call of ``step`` by kernel name, ms, from the PyTorch profiler over ``steps`` calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / steps / 1000 for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA}


def split_by_group(kernels: dict[str, float]) -> dict[str, float]:
    """``{"matmul": ms, "other": ms}``: kernel times summed by whether ``group_of`` calls them matmuls."""
    out = {"matmul": 0.0, "other": 0.0}
    for name, ms in kernels.items():
        out["matmul" if group_of(name) == "matmul" else "other"] += ms
    return out


def time_projection(module, x: torch.Tensor, rope: torch.Tensor) -> dict:
    """Compiled ``module.project`` forward + backward on x (B, L, dim): the profiler's kernel times, ms
    per layer, by kernel and summed as ``split_by_group``."""
    torch._dynamo.reset()
    project = torch.compile(lambda inputs: module.project(inputs, rope, None))
    gen = torch.Generator(device="cuda").manual_seed(1)
    grads = [torch.randn(o.shape, device="cuda", dtype=o.dtype, generator=gen) for o in project(x)]

    def step():
        module.zero_grad(set_to_none=True)
        x.grad = None
        torch.autograd.backward(project(x), grads)

    for _ in range(3):  # compile and warm up
        step()
    kernels = kernel_ms(step)
    return {"kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1])), **split_by_group(kernels)}


def w_r_floor_ms(tokens: int, dim: int, probe_width: int) -> float:
    """The W_R matmuls' time at peak, ms: forward, input gradient and weight gradient, 2 FLOP per
    multiply-add each, of a (tokens x dim) by (dim x probe_width) product."""
    return 3 * 2 * tokens * dim * probe_width / (PEAK_BF16_TFLOPS * 1e12) * 1e3


def run(flavor: str, variant: str, batch: int, seq_len: int) -> dict:
    """Both projections timed at one shape; returns the rows and the W_R floor, per layer."""
    from torchtitan.models.qwen3.model.model import precompute_rope_cache

    parallax, softmax, args = build(flavor, variant)
    rope = precompute_rope_cache(args.head_dim, max(seq_len, args.max_seq_len), args.rope_theta).cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, seq_len, args.dim, device="cuda", dtype=torch.bfloat16, generator=gen,
                    requires_grad=True)
    rows = {"parallax": time_projection(parallax, x, rope), "softmax": time_projection(softmax, x, rope)}
    if parallax._fused_norm_rope(x, rope, None):  # else the first row already is the modules' path
        parallax.fused_norm_rope = False
        rows["parallax_modules"] = time_projection(parallax, x, rope)
    floor = w_r_floor_ms(batch * seq_len, args.dim, args.n_heads * args.head_dim)
    return {"flavor": flavor, "variant": variant, "batch": batch, "seq_len": seq_len, "layers": args.n_layers,
            "rows": rows, "w_r_floor_ms": floor}


def took_fused_path(row: dict) -> bool:
    """Whether a projection's profiled kernels include ``kernels.projection``'s."""
    return any(name in ("_forward_kernel", "_backward_kernel") for name in row.get("kernels", {}))


def markdown(result: dict) -> list[str]:
    """The page's body: per-layer and per-step ms of each projection and of the difference."""
    from parallax_titan.model import FUSED_NORM_ROPE_MIN_HEAD_DIM

    layers, rows = result["layers"], result["rows"]
    paths = ("As the model runs it here, the Parallax projection puts q and k through the fused kernels too "
             "(`kernels.projection`), the projection without rho through Inductor: the difference is the "
             "probe's cost net of that; the last row is the Parallax projection through Inductor as well."
             if took_fused_path(rows["parallax"]) else
             "Both projections run through Inductor here (`kernels.projection` takes heads of "
             f"{FUSED_NORM_ROPE_MIN_HEAD_DIM} or more).")
    def cells(label, row, bold=""):
        return [label, f"{row['matmul']:.3f}", f"{row['other']:.3f}", f"{bold}{row['matmul'] * layers:.1f}{bold}",
                f"{bold}{row['other'] * layers:.1f}{bold}", f"{(row['matmul'] + row['other']) * layers:.1f}"]

    diff = {key: rows["parallax"][key] - rows["softmax"][key] for key in ("matmul", "other")}
    floor = result["w_r_floor_ms"]
    return [f"{result['variant']} at {result['flavor']}, local batch {result['batch']} x {result['seq_len']} tokens, "
            f"{layers} layers; GPU kernel time per layer (ms) and per training step (ms, x {layers}):", "",
            *table(["projection", "matmul ms", "other kernels ms", "matmul ms per step", "other ms per step",
                    "all ms per step"],
                   [cells("with rho (Parallax, as the model runs it)", rows["parallax"]),
                    cells("without rho", rows["softmax"]), cells("**probe (difference)**", diff, "**"),
                    *([cells("with rho, TorchTitan's norm modules and apply_rope", rows["parallax_modules"])]
                      if "parallax_modules" in rows else [])]), "",
            f"- The W_R products (forward, input and weight gradients) at {PEAK_BF16_TFLOPS:.0f} TFLOP/s take "
            f"{floor:.3f} ms per layer, {floor * layers:.1f} ms per step: the probe's matmul floor.",
            "- Other kernels: RMSNorm and RoPE of rho beside those of q and k, casts, the gradients' "
            "concatenation into the fused projection's. " + paths,
            "- Kernels of each projection (ms per layer) are in the JSON (`rows.*.kernels`)."]


def parser() -> argparse.ArgumentParser:
    from parallax_titan.spec import BASE_FLAVORS

    ap = argparse.ArgumentParser(prog="python -m scripts.bench.probe_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/bench/probe_cost", help="output path without extension")
    ap.add_argument("--flavor", choices=list(BASE_FLAVORS), default="0.6B")
    ap.add_argument("--variant", choices=("parallax", "parallax_dagger"), default="parallax")
    add_batch_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> None:
    """Time both projections and write OUT.md and OUT.json."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    require_cuda(__spec__.name)
    meta = describe("The probe's cost outside the attention kernel",
                    "compiled forward + backward of the attention's input projection with rho (Parallax) and "
                    "without it, one layer, bf16: GPU kernel time under the PyTorch profiler (mean of "
                    f"{PROFILED_STEPS} steps after 3 warm-up steps), split into matmuls and other kernels",
                    command_line(__spec__.name, argv))
    result = {"meta": meta, **run(args.flavor, args.variant, args.batch, args.seq_len)}
    print(write_result_page(args.out, result, markdown(result)))


if __name__ == "__main__":
    main()
