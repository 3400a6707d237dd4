"""The fused projection's norm + RoPE kernels (``kernels.projection``) against a copy of the same bytes
and against Inductor's fusion of the PyTorch reference, one GPU, bf16.

Per model shape (the input projection of one layer: 0.6B Parallax, heads of 128; Parallax-dagger,
heads of 64; local batch 4 x 4096 tokens) and per launch config (tokens per tile, warps, tiles per program), the
median time (``triton.testing.do_bench``) of
* the forward (``fused.forward``) and the backward (``fused.backward``, weight gradients included);
* ``torch.compile`` of ``naive.split_norm_rope``: its forward, and its forward + backward (the
  backward's row is the difference);
* the weight gradients' reduction alone (``fused.weight_grads``) per ``REDUCTIONS`` launch;
* a ``copy_`` moving as many bytes as each of our passes reads and writes (half read, half written):
  the bandwidth both could reach.
Ratios: ours / copy (1.0 = the copy's bandwidth) and ours / Inductor.

    python -m scripts.bench.projection --out docs/bench/projection
"""

from __future__ import annotations

import argparse
import sys

import torch

from scripts.bench.results import add_batch_arguments, command_line, describe, require_cuda, table, write_result_page

SHAPES = {"0.6B parallax": ("0.6B", "parallax"), "0.6B parallax_dagger": ("0.6B", "parallax_dagger")}
LAUNCHES = [(bt, warps, tiles) for bt, warps in ((16, 2), (32, 2), (32, 4), (64, 4), (64, 8), (128, 8))
            for tiles in (1, 2, 4, 8)]
# The weight gradients' reduction (columns per program, rows per step, warps), timed alone on the
# partial rows of the shipped backward launch.
REDUCTIONS = [(16, 256, 4), (8, 256, 4), (8, 128, 4), (4, 256, 4), (4, 128, 2), (16, 512, 8), (32, 256, 8)]


def median_ms(fn, rep_ms: int = 200) -> float:
    """Median milliseconds of ``fn()`` after one untimed call (``triton.testing.do_bench``)."""
    import triton

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def pass_bytes(tokens: int, hq: int, hkv: int, d: int, element: int) -> dict[str, int]:
    """Bytes each pass reads plus writes: the forward reads y and writes q, k, v, rho (y's width each
    way); the backward reads the four gradients and y's q, k, rho columns and writes dy."""
    width = (2 * hq + 2 * hkv) * d
    return {"forward": 2 * tokens * width * element, "backward": tokens * (3 * width - hkv * d) * element}


def inputs(batch: int, seq_len: int, hq: int, hkv: int, d: int, rope_theta: float):
    """(y, weights, table, grads) on the GPU in bf16 (table fp32, TorchTitan's RoPE rows)."""
    from torchtitan.models.qwen3.model.model import precompute_rope_cache

    gen = torch.Generator(device="cuda").manual_seed(0)
    y = torch.randn(batch, seq_len, (2 * hq + 2 * hkv) * d, device="cuda", generator=gen).bfloat16()
    weights = [(1 + 0.5 * torch.randn(d, device="cuda", generator=gen)).bfloat16() for _ in range(3)]
    grads = [torch.randn(batch, seq_len, h, d, device="cuda", generator=gen).bfloat16() for h in (hq, hkv, hkv, hq)]
    return y, weights, precompute_rope_cache(d, seq_len, rope_theta).cuda(), grads


def copy_ms(nbytes: int) -> float:
    """Time of a ``copy_`` that reads nbytes / 2 and writes nbytes / 2."""
    src = torch.empty(nbytes // 4, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    return median_ms(lambda: dst.copy_(src))


def inductor_ms(y, hq, hkv, weights, eps, table, grads) -> dict[str, float]:
    """Compiled ``naive.split_norm_rope``: forward, and backward (forward + backward less forward)."""
    from kernels.projection import naive

    torch._dynamo.reset()
    fn = torch.compile(lambda t, *w: naive.split_norm_rope(t, hq, hkv, w, eps, table))
    leaves = [t.detach().clone().requires_grad_() for t in (y, *weights)]

    def both():
        torch.autograd.grad(fn(*leaves), leaves, grads)

    with torch.no_grad():
        forward = median_ms(lambda: fn(*leaves))
    return {"forward": forward, "backward": median_ms(both) - forward}


def ours_ms(module, y, hq, hkv, weights, eps, angles, grads, **launch) -> dict[str, float]:
    """``module.forward`` and ``module.backward`` (``kernels.projection.fused``'s signature) timed."""
    return {"forward": median_ms(lambda: module.forward(y, hq, hkv, weights, eps, angles, True, **launch)),
            "backward": median_ms(lambda: module.backward(grads, y, hq, hkv, weights, eps, angles, True, **launch))}


def bench_shape(flavor: str, variant: str, batch: int, seq_len: int, launches) -> dict:
    """Every launch config, Inductor and the copies at one model shape."""
    from kernels.projection import fused
    from kernels.projection.api import rope_angles
    from parallax_titan.spec import BASE_FLAVORS, variant_args

    args = variant_args(variant, BASE_FLAVORS[flavor])
    hq, hkv, d, eps = args.n_heads, args.n_kv_heads, args.head_dim, args.norm_eps
    y, weights, table, grads = inputs(batch, seq_len, hq, hkv, d, args.rope_theta)
    angles = rope_angles(table, seq_len, y.dtype)
    nbytes = pass_bytes(batch * seq_len, hq, hkv, d, y.element_size())
    row = {"heads": [hq, hkv, d], "tokens": batch * seq_len, "bytes": nbytes,
           "copy": {name: copy_ms(n) for name, n in nbytes.items()},
           "inductor": inductor_ms(y, hq, hkv, weights, eps, table, grads), "launches": {}}
    for launch in launches:
        row["launches"][label(launch)] = ours_ms(fused, y, hq, hkv, weights, eps, angles, grads,
                                                 launch=fused.Launch(*launch))
    row["shipped"] = {"forward": label(fused.forward_launch(d)), "backward": label(fused.BACKWARD),
                      "reduction": label(fused.REDUCTION)}
    row["reductions"] = reductions_ms(fused, batch * seq_len, hq, hkv, d, REDUCTIONS)
    return row


def reductions_ms(module, tokens: int, hq: int, hkv: int, d: int, reductions) -> dict[str, float]:
    """``module.weight_grads`` timed per reduction launch on the partial rows that ``module.BACKWARD``
    leaves for ``tokens`` tokens."""
    spans = module._spans(tokens, module.BACKWARD)
    part = torch.randn(spans * (2 * hq + hkv), d, device="cuda")
    return {label(r): median_ms(lambda r=r: module.weight_grads(part, [torch.bfloat16] * 3, spans, hq, hkv,
                                                                  module.Reduction(*r)))
            for r in reductions}


def label(launch) -> str:
    """"BTxWARPSxTILES" of a launch config."""
    return "x".join(map(str, launch))


def shipped_mark(shipped: dict, key: str) -> str:
    """" (shipped: forward, backward)" for the passes whose default launch is ``key``, else ""."""
    passes = [part for part, launch in shipped.items() if launch == key]
    return f" (shipped: {', '.join(passes)})" if passes else ""


def markdown(result: dict) -> list[str]:
    """The page's body: per shape, each launch config's times and ratios beside Inductor and the copy."""
    lines = []
    for name, row in result["rows"].items():
        hq, hkv, d = row["heads"]
        mib = {part: row["bytes"][part] / 2**20 for part in ("forward", "backward")}
        lines += [f"**{name}** (Hq {hq}, Hkv {hkv}, D {d}, {row['tokens']} tokens; bytes per pass: forward "
                  f"{mib['forward']:.0f} MiB, backward {mib['backward']:.0f} MiB)", ""]
        columns = ["kernels", "forward ms", "x copy", "x Inductor", "backward ms", "x copy", "x Inductor"]
        rows = []
        for row_name, ms in [*(("ours " + key + shipped_mark(row["shipped"], key), ms)
                            for key, ms in row["launches"].items()), ("Inductor (naive, compiled)", row["inductor"]),
                          ("copy of the same bytes", row["copy"])]:
            cells = [row_name]
            for part in ("forward", "backward"):
                cells += [f"{ms[part]:.3f}", f"{ms[part] / row['copy'][part]:.2f}",
                          f"{ms[part] / row['inductor'][part]:.2f}"]
            rows.append(cells)
        lines += [*table(columns, rows), ""]
        if row.get("reductions"):
            lines += [*table(["weight gradients' reduction", "ms"],
                             [[key + (" (shipped)" if key == row["shipped"].get("reduction") else ""), f"{ms:.4f}"]
                              for key, ms in row["reductions"].items()]), ""]
    return lines + ["Launch configs are tokens per tile x warps x tiles per program (`fused.Launch`); x copy = "
                    "time / the copy's time (1.00: the copy's bandwidth), x Inductor = time / Inductor's. "
                    "Reductions are columns per program x partial rows per step x warps (`fused.Reduction`)."]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.projection", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/bench/projection", help="output path without extension")
    add_batch_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> None:
    """Time every shape and write OUT.md and OUT.json."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    require_cuda(__spec__.name)
    measured = ("median time (triton.testing.do_bench) of the fused norm + RoPE kernels' forward and backward per "
                "launch config, beside Inductor's compiled PyTorch reference and a copy of the same bytes, bf16")
    result = {"meta": describe("The fused projection's norm + RoPE kernels", measured,
                               command_line(__spec__.name, argv)), "rows": {}}
    for name, (flavor, variant) in SHAPES.items():
        result["rows"][name] = bench_shape(flavor, variant, args.batch, args.seq_len, LAUNCHES)
        print(name, result["rows"][name], flush=True)
    print(write_result_page(args.out, result, markdown(result)))


if __name__ == "__main__":
    main()
