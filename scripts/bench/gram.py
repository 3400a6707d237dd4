"""Polar Express's symmetric products: kernels.gram's Triton kernel against torch's GEMMs (one GPU).

Reproduce (one H200), writing docs/bench/gram.md and .json:
    python -m scripts.bench.gram --out docs/bench/gram
For each bucket of same-shape matrices of a 0.6B Muon step (bf16, B matrices of m x n), the median
time (``triton.testing.do_bench``) of
* the Gram step A = X X^T (wide) or X^T X (tall, the kernel reads ``X.mT`` in place):
  ``symmetric_product(X)`` against ``torch.bmm``;
* the polynomial H = aI + bA + cA^2: ``symmetric_product(A, c, A, b, a)`` against ``torch.baddbmm``
  plus the diagonal ``add_`` (Polar Express's first coefficients);
* a whole ``polar_express`` call (8 steps) with the kernel and with the torch path
  (``polar_express(G, kernel=False)``),
and the relative difference ||ours - torch|| / ||torch|| of each stage's output. Ratios are ours / torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import torch

from scripts.bench.results import command_line, describe, positive_int, table, write_result_page

# (B, m, n): the 0.6B Muon buckets
SHAPES = [(56, 1024, 1024), (84, 2048, 1024), (28, 1024, 2048), (56, 3072, 1024), (28, 1024, 3072)]
STAGES = ("gram", "poly", "polar")
STAGE_NAMES = {"gram": "A = Gram", "poly": "H = aI + bA + cA^2", "polar": "polar_express (8 steps)"}


def orientation(m: int, n: int) -> str:
    return "tall" if m > n else ("wide" if m < n else "square")


def median_ms(fn, rep_ms: int) -> float:
    """Median milliseconds of ``fn()`` (``triton.testing.do_bench``, after one untimed call that
    also compiles)."""
    import triton

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def relative_difference(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.double(), ref.double()
    return ((ours - ref).norm() / ref.norm()).item()


def bench_shape(B: int, m: int, n: int, rep_ms: int, device: str = "cuda", timer=median_ms) -> dict:
    """Timings (ms, ``timer(fn, rep_ms)``) and differences of the three stages for one bucket of B
    bf16 m x n matrices on ``device`` (the tests run it on the CPU under Triton's interpreter)."""
    from kernels.gram import symmetric_product

    ortho = importlib.import_module("optimizers.orthogonalize")  # the package's name is a function

    gen = torch.Generator(device=device).manual_seed(0)
    G = torch.randn(B, m, n, device=device, generator=gen, dtype=torch.bfloat16)
    X = ortho._normalised(G, ortho._SAFETY)
    tall = m > n
    a, b, c = ortho.POLAR_EXPRESS_COEFFS[0]
    P = X.mT if tall else X

    def torch_gram():
        return torch.bmm(X.mT, X) if tall else torch.bmm(X, X.mT)

    A = torch_gram()

    def torch_poly():
        H = torch.baddbmm(A, A, A, beta=b, alpha=c)
        H.diagonal(dim1=-2, dim2=-1).add_(a)
        return H

    def ours_poly():
        return symmetric_product(A, alpha=c, Y=A, beta=b, gamma=a)

    fns = {"gram": (lambda: symmetric_product(P), torch_gram), "poly": (ours_poly, torch_poly),
           "polar": (lambda: ortho.polar_express(G), lambda: ortho.polar_express(G, kernel=False))}
    row = {"shape": [B, m, n], "orientation": orientation(m, n), "ms": {}, "rel_diff": {}}
    for stage, (ours, ref) in fns.items():
        row["ms"][stage] = {"ours": timer(ours, rep_ms), "torch": timer(ref, rep_ms)}
        row["rel_diff"][stage] = relative_difference(ours(), ref())
    return row


def write(result: dict, out: str) -> str:
    """Fill in ``result``'s ratios (ours / torch per stage) and totals; write ``out``.md and .json."""
    for row in result["rows"]:
        row["ratio"] = {stage: t["ours"] / t["torch"] for stage, t in row["ms"].items()}
    totals = {stage: {side: sum(r["ms"][stage][side] for r in result["rows"]) for side in ("ours", "torch")}
              for stage in STAGES}
    result["total_ms"] = totals

    def cells(ms, diff=None):
        out = []
        for stage in STAGES:
            out += [f"{ms[stage]['ours']:.3f}", f"{ms[stage]['torch']:.3f}",
                    f"{ms[stage]['ours'] / ms[stage]['torch']:.2f}" if ms[stage]["torch"] else "n/a"]
        return out + ([f"{diff[stage]:.1e}" for stage in STAGES] if diff else [""] * len(STAGES))

    columns = ["B x m x n", "orientation"]
    for stage in STAGES:
        columns += [f"{STAGE_NAMES[stage]}: ours ms", "torch ms", "ours / torch"]
    columns += ["A rel. diff", "H rel. diff", "polar rel. diff"]
    rows = [["x".join(map(str, r["shape"])), r["orientation"], *cells(r["ms"], r["rel_diff"])]
            for r in result["rows"]]
    if result["rows"]:
        rows.append(["all buckets", "", *cells(totals)])
    lines = ["bf16 on CUDA; ours = kernels.gram.symmetric_product (and polar_express with it), torch = "
             "torch.bmm / torch.baddbmm + diagonal add_ (and polar_express with kernel=False). "
             "Rel. diff = ||ours - torch|| / ||torch||.", "", *table(columns, rows)]
    return write_result_page(out, result, lines)


def shape_indices(text: str) -> list[int]:
    """``--shapes``: comma-separated indices into :data:`SHAPES` (argparse type); a negative one counted
    from the end, a large one failed after the CUDA check."""
    parts = text.split(",")
    if not all(part.isdigit() and int(part) < len(SHAPES) for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated indices 0..{len(SHAPES) - 1} "
                                         f"into {SHAPES}")
    return [int(part) for part in parts]


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark over SHAPES (or --shapes) and write OUT.md and OUT.json after each bucket."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.gram", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="docs/bench/gram", help="output path without extension")
    ap.add_argument("--shapes", type=shape_indices, default=None,
                    help=f"comma-separated indices into {SHAPES} (default: all)")
    ap.add_argument("--rep", type=positive_int, default=200, help="do_bench's timing window per function (ms)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the Triton kernel and the timings run on it)")
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
    measured = ("median time of Polar Express's symmetric products (Gram step, polynomial step) and of a "
                "whole polar_express call per 0.6B Muon bucket, bf16: the Triton kernel against torch's GEMMs")
    result = {"meta": describe("Symmetric-product kernel benchmark", measured, command_line(__spec__.name, argv)),
              "rows": []}
    for B, m, n in shapes:
        result["rows"].append(bench_shape(B, m, n, args.rep))
        print(result["rows"][-1], flush=True)
        write(result, args.out)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
