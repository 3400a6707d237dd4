"""Time the fused attention kernels in Hopper variants beside the shipped kernels, per shipped
launch config.

Variants (``LOOPS``, ``CONFIG_FLAGS``): ``range`` (the shipped kernels), ``warp_specialize``
(``tl.range(..., warp_specialize=True)``: producer/consumer warp groups), ``loop_stages``
(``tl.range(..., num_stages=2)``: a pipeline depth per loop instead of the kernel's), ``tma``
(the shipped source with the ``TMA`` flag: row tiles read through tensor descriptors) and ``maxnreg``
(the shipped source with at most 168 registers per thread, triton's ``maxnreg`` launch option). The loop
variants are the source of ``kernels/parallax/fused.py`` with its loop headers rewritten, loaded as
a separate module; the shipped kernels are not changed. Per variant, head dim and shipped config: the forward, and the
backward with that config for one pass and the first shipped config for the other; a config that
does not compile is recorded with its error. Outputs are compared with the shipped kernel's at the
same config (max abs difference).

    python -m scripts.bench.attention_loops --out docs/bench/attention_loops
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
from pathlib import Path

import torch

from kernels.parallax import fused, tuning
from scripts.bench.results import command_line, describe, table, write_results

SHAPE = (4, 4096, 16, 8)  # B, L, Hq, Hkv
DIMS = (128, 64)
_KV_LOOP = "for n0 in range(lo, hi, BN):"
_Q_LOOP = "for m0 in range(lo, hi, BM):"
LOOPS = {
    "range": ("", ""),
    "warp_specialize": ("for n0 in tl.range(lo, hi, BN, warp_specialize=True):",
                        "for m0 in tl.range(lo, hi, BM, warp_specialize=True):"),
    "loop_stages": ("for n0 in tl.range(lo, hi, BN, num_stages=2):", "for m0 in tl.range(lo, hi, BM, num_stages=2):"),
    "tma": ("", ""),
    "maxnreg": ("", ""),
}
# launch flags a variant adds to every config; maxnreg caps registers per thread so that three programs
# of 4 warps fit an SM (168 x 128 x 3 <= 65536) where shared memory allows
CONFIG_FLAGS = {"tma": {"TMA": True}, "maxnreg": {"maxnreg": 168}}


def variant_source(name: str) -> str:
    """fused.py's source with its loops rewritten as LOOPS[name] (the shipped source for "range")."""
    source = Path(fused.__file__).read_text()
    if not LOOPS[name][0]:
        return source
    if _KV_LOOP not in source or _Q_LOOP not in source:
        raise RuntimeError("kernels/parallax/fused.py's loop headers changed; update LOOPS")
    return source.replace(_KV_LOOP, LOOPS[name][0]).replace(_Q_LOOP, LOOPS[name][1])


def variant_list(text: str) -> tuple:
    """``--variants`` parsed: names of LOOPS, comma-separated; an unknown name is an argparse error."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in LOOPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--variants {text!r}: expected names among {', '.join(LOOPS)}")
    return names


def load_variant(name: str, folder: str):
    """The module built from ``variant_source(name)`` (a file in ``folder``: triton reads kernel sources)."""
    path = Path(folder) / f"fused_{name}.py"
    path.write_text(variant_source(name))
    spec = importlib.util.spec_from_file_location(f"fused_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(d: int):
    """bf16 CUDA q, r, do (B, L, Hq, D) and k, v (B, L, Hkv, D) at SHAPE; r scaled by 1/sqrt(D)."""
    b, n, hq, hkv = SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, r, do = (torch.randn(b, n, hq, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, r / math.sqrt(d), k, v, do


def cudnn_ms(q, k, v, do) -> float:
    """cuDNN softmax attention forward + backward (causal, GQA), ms."""
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True).backward(do.transpose(1, 2))

    return triton.testing.do_bench(run, warmup=50, rep=200)


def time_config(module, kernel: str, config, tensors, flags=None):
    """(ms, outputs) of ``kernel`` ("fwd", "dq" or "dkdv") of ``module`` under ``config`` (plus launch
    ``flags``): the forward, or the backward with ``config`` for that pass and the first shipped
    config for the other."""
    import triton

    q, r, k, v, do = tensors
    scale = q.shape[-1] ** -0.5
    launch = {**tuning.launch_kwargs(config), **(flags or {})}
    if kernel == "fwd":
        def fn():
            return module.forward(q, r, k, v, scale, config=launch)
    else:
        saved = module.forward(q, r, k, v, scale)
        other = {name: tuning.launch_kwargs(tuning.SHIPPED[name][0]) for name in ("dq", "dkdv")}
        other[kernel] = launch

        def fn():
            return module.backward(do, q, r, k, v, *saved, scale, dq_config=other["dq"], dkdv_config=other["dkdv"])
    out = fn()
    return triton.testing.do_bench(fn, warmup=25, rep=100), out


def max_difference(out, reference) -> float:
    """Largest absolute difference over the output tensors (fp32)."""
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, reference))


def run(folder: str, variants=tuple(LOOPS)) -> list[dict]:
    """Rows (variant, D, kernel, config, ms or error, max difference from the shipped kernels) of the
    shipped kernels ("range", always first: the reference) and ``variants``."""
    rows, modules = [], {"range": load_variant("range", folder)}
    for name in variants:  # a variant of the shipped source (tma, maxnreg) shares its module
        modules.setdefault(name, load_variant(name, folder) if LOOPS[name][0] else modules["range"])
    for d in DIMS:
        tensors = inputs(d)
        baseline = cudnn_ms(*tensors[:3], tensors[4])
        rows.append(dict(variant="cudnn softmax fwd+bwd", D=d, kernel="", config="", ms=baseline))
        for kernel in ("fwd", "dq", "dkdv"):
            for config in tuning.SHIPPED[kernel]:
                shipped = None
                for name, module in modules.items():
                    row = dict(variant=name, D=d, kernel=kernel, config=str(config))
                    try:
                        row["ms"], out = time_config(module, kernel, config, tensors, CONFIG_FLAGS.get(name))
                        shipped = out if name == "range" else shipped
                        row["max_diff"] = max_difference(out, shipped) if shipped is not None else None
                    except Exception as exc:  # a variant that does not compile is a result
                        row["error"] = repr(exc)[:200]
                    rows.append(row)
                    print(row, flush=True)
                    torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict]) -> str:
    """One table row per timing; a failed compile shows its error."""
    cells = [[r["variant"], r["D"], r["kernel"], r["config"],
              f"{r['ms']:.3f}" if "ms" in r else "does not compile: " + r["error"][:60],
              "" if r.get("max_diff") is None else f"{r['max_diff']:.2g}"] for r in rows]
    return "\n".join(table(["loops", "D", "kernel", "config", "ms", "max diff vs range"], cells)) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Time every variant at every shipped config and head dim; write OUT.md and OUT.json."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.attention_loops",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/bench/attention_loops", help="output path without extension")
    parser.add_argument("--variants", type=variant_list, default=tuple(LOOPS),
                        help=f"comma-separated subset of {','.join(LOOPS)} (default: all; range always runs)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("scripts.bench.attention_loops needs a CUDA GPU")
    meta = describe("Attention kernels: loop variants on Hopper",
                    f"ms per call (triton.testing.do_bench median) of the fused attention kernels at B, L, Hq, Hkv = "
                    f"{SHAPE}, bf16, causal, per shipped launch config, with the loops as plain range (shipped), "
                    "tl.range(warp_specialize=True) or tl.range(num_stages=2), the row tiles read through TMA "
                    "tensor descriptors, or at most 168 registers per thread", command_line(__spec__.name, argv))
    with tempfile.TemporaryDirectory() as folder:
        rows = run(folder, args.variants)
    print(write_results(args.out, meta, markdown(rows), {"rows": rows}))


if __name__ == "__main__":
    main()
