"""Compile our Triton attention kernels (and the backward's Gluon passes, ``*_hopper``) for Hopper
(sm_90) on a machine without a GPU and report what each launch configuration costs in resources:
registers per thread, local-memory stack (spills), spill stores/loads and wgmma instructions in the
SASS, and shared memory.

Triton's wheel carries ptxas and cuobjdump, so this needs no CUDA device or driver. It answers
"does this config spill, does it fit in shared memory" before any GPU time is spent; it does not
predict speed (the row pass spills more than the column pass and runs faster, docs/kernels.md).

    python -m scripts.bench.kernel_resources                 # every config of the shipped short lists
    python -m scripts.bench.kernel_resources --kernel dkdv --config 32,128,8,2 --d 128 64

The report (markdown, with the results header) goes to stdout.

The GPU box runs triton 3.6; a CPU environment with another version can match it with
`pip install --no-deps --target /tmp/triton36 triton==3.6.0` and `PYTHONPATH=/tmp/triton36`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.parallax import fused, tuning
from scripts.bench.results import command_line, describe, header, table, table_row

HOPPER = GPUTarget("cuda", 90, 32)
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
FP32_POINTERS = {"TBAR", "LSE", "TAU", "BETA", "STATS"}
INT_POINTERS = {"DOCS", "DOCE"}
BF16_POINTERS = {"Q", "R", "K", "V", "O", "VBAR", "DO", "DK", "DV", "DQ", "DR"}
FLOATS = {"scale", "qk_scale"}
STRIDES = {"sqt", "sqh", "skt", "skh", "svt", "svh"}
# sizes a launch at the benchmark shape (B4 L4096 Hq16 Hkv8) finds divisible by 16, so triton
# specialises them as such (HKV = 8 is not): left out, the dq pass compiled with twice the spills
SIZES = {"T", "L", "HQ"}
# report name -> (name in fused.JIT_KERNELS and tuning.SHIPPED, constexpr flags); the column pass in
# its two orientations: keys x queries, and queries on the rows (ROWS), each with the shipped configs
# of its orientation
KERNELS = {"fwd": ("fwd", {}), "dq": ("dq", {}), "dkdv": ("dkdv", {"ROWS": False}),
           "dkdv_rows": ("dkdv", {"ROWS": True})}
# report name -> the kernel of kernels/parallax/hopper.py (Gluon; configs in tuning.HOPPER_CONFIGS)
HOPPER_KERNELS = {"fwd_hopper": "fwd", "dq_hopper": "dq", "dkdv_hopper": "dkdv"}


def signature(kernel, constexprs: dict, types: dict | None = None) -> dict:
    """Triton signature of ``kernel`` for bf16 tensors, fp32 statistics and int32 sizes; ``types``
    (name -> triton type) names the arguments of a kernel outside the attention's naming."""
    def kind(name):
        if name in constexprs:
            return "constexpr"
        if types and name in types:
            return types[name]
        if name in FP32_POINTERS:
            return "*fp32"
        if name in INT_POINTERS:
            return "*i32"
        if name in BF16_POINTERS:
            return "*bf16"
        return "fp32" if name in FLOATS else "i32"
    return {name: kind(name) for name in kernel.arg_names}


def _cuobjdump(cubin: bytes, *runs: list[str]) -> list[str]:
    """cuobjdump's output for each flag list in ``runs`` on one cubin (written to disk once)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return [subprocess.run([str(TOOLS / "cuobjdump"), *flags, f.name], capture_output=True, text=True,
                               check=True).stdout for flags in runs]


def opcodes(sass: str) -> list[str]:
    """Instruction mnemonics of a cuobjdump -sass listing (predicates dropped)."""
    out = []
    for line in sass.splitlines():
        parts = line.split("*/", 1)[1].split() if line.strip().startswith("/*") and "*/" in line else []
        parts = parts[1:] if parts and parts[0].startswith("@") else parts
        if parts:
            out.append(parts[0])
    return out


def aligned(kernel, constexprs: dict, divisible: set | None = None) -> dict:
    """The launch-time specialisation of a real call: pointers, token/head strides and the benchmark
    shape's sizes (``SIZES``) divisible by 16 (without it loads and stores do not vectorise and the
    register counts are not the GPU's); ``divisible`` names them for a kernel outside the
    attention's naming."""
    divisible = divisible if divisible is not None else FP32_POINTERS | INT_POINTERS | BF16_POINTERS | STRIDES | SIZES
    return {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
            if n in divisible and n not in constexprs}


def wgmma_waits(sass: str) -> list[int]:
    """How many wgmmas each wgmma wait of a cuobjdump -sass listing leaves in flight (a kernel whose
    waits all leave 0 had its wgmmas serialised by ptxas)."""
    return [int(n, 16) for n in re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", sass)]


def inner_loops(sass: str, compute: bool = False) -> list[tuple[int, int]]:
    """(instructions, wgmma) of every innermost loop of a cuobjdump -sass listing, smallest first.

    A loop is a backward branch (BRA to a lower address); innermost when its address range holds no
    other loop. The smallest is a kernel's unmasked K/V (or Q) loop: its instruction count tracks
    the measured time per iteration (row pass 327 instructions, column pass 635 at D=128: 1.30 vs
    2.57 ms for the same number of iterations, docs/kernels.md). ``compute``: only loops with wgmma
    count, innermost among those (TMA loads put barrier-wait loops inside the tile loops)."""
    code = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2)))
    loops = [(int(m.group(1), 16), addr) for addr, ins in code
             if (m := re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins)) and int(m.group(1), 16) < addr]
    if compute:
        loops = [(lo, hi) for lo, hi in loops if any(lo <= addr <= hi and "HGMMA" in ins for addr, ins in code)]
    inner = [a for a in loops if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in loops)]
    sizes = [(sum(lo <= addr <= hi for addr, _ in code), sum(lo <= addr <= hi and "HGMMA" in ins for addr, ins in code))
             for lo, hi in inner]
    return sorted(sizes)


def compile_kernel(kernel, constexprs: dict, num_warps: int, num_stages: int, target=HOPPER,
                   types: dict | None = None, divisible: set | None = None):
    """``kernel`` compiled by triton for ``target`` (default sm_90) with ``constexprs``; constexpr
    parameters left out take their defaults, as at a launch (e.g. the column pass's ROWS).
    ``types`` and ``divisible``: see ``signature`` and ``aligned``."""
    constexprs = {**{p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}, **constexprs}
    source = ASTSource(fn=kernel, signature=signature(kernel, constexprs, types), constexprs=constexprs,
                       attrs=aligned(kernel, constexprs, divisible))
    return triton.compile(source, target=target, options={"num_warps": num_warps, "num_stages": num_stages})


def compile_hopper(name: str, d: int, config, varlen: bool = False, target=HOPPER):
    """Kernel ``name`` ("fwd", "dq" or "dkdv") of ``kernels/parallax/hopper.py`` compiled for ``target``
    with ``config`` (a ``tuning.HopperConfig``, its register cap included), bf16, its pointers
    specialised as a launch finds them."""
    from kernels.parallax import hopper

    constexprs = hopper.kernel_constexprs(name, d, config, varlen)
    return compile_gluon(hopper.kernel_for(name, config), constexprs, hopper_descriptor_types(config.bm, config.bn, d),
                         target=target)


def hopper_descriptor_types(bm: int, bn: int, d: int) -> dict:
    """Signature types of the Hopper kernels' TMA descriptors: q, rho, dO blocks of ``bm`` rows, k, v
    blocks of ``bn`` rows (bf16, head dim d) and the column pass's (4, bm) fp32 statistics."""
    from triton.experimental.gluon import language as gl

    from kernels.parallax import hopper

    def descriptor(rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)
        return f"tensordesc<bf16{[rows, d]},{layout!r}>"

    types = {n: descriptor(bm) for n in ("q_desc", "r_desc", "do_desc")}
    types.update({n: descriptor(bn) for n in ("k_desc", "v_desc")})
    types["stats_desc"] = f"tensordesc<fp32[4, {bm}],{hopper.stats_layout()!r}>"
    return types


def compile_gluon(kernel, constexprs: dict, types: dict, target=HOPPER, pointers: set = frozenset()):
    """Gluon ``kernel`` compiled for ``target`` with ``constexprs`` (num_warps and maxnreg among them
    become compile options) and argument ``types`` (name -> triton type, for names outside the
    attention's naming); its pointers (the attention's names and ``pointers``) specialised as 16-byte
    aligned, as a launch finds them."""
    from triton.experimental.gluon._runtime import GluonASTSource

    constexprs = dict(constexprs)
    options = {key: constexprs.pop(key) for key in ("num_warps", "maxnreg") if key in constexprs}
    constexprs["num_warps"] = options["num_warps"]
    sig = signature(kernel, constexprs, types)
    attrs = aligned(kernel, constexprs, FP32_POINTERS | INT_POINTERS | BF16_POINTERS | set(pointers))
    return triton.compile(GluonASTSource(kernel, sig, constexprs, attrs), target=target, options=options)


def resources(kernel, constexprs: dict, num_warps: int, num_stages: int, types: dict | None = None,
              divisible: set | None = None) -> dict:
    """Compile for sm_90 and give ``compiled_resources``."""
    return compiled_resources(compile_kernel(kernel, constexprs, num_warps, num_stages, types=types,
                                             divisible=divisible))


def compiled_resources(compiled) -> dict:
    """Registers, stack bytes, spill stores/loads, wgmma count, shared bytes, (instructions, wgmma) of
    the leanest innermost loop that runs wgmma, and the count of each global load / store opcode
    (``LDG.E.128``: 16 bytes wide; ``STG.E.U16``: one bf16 element) of a compiled kernel."""
    usage, sass = _cuobjdump(compiled.asm["cubin"], ["--dump-resource-usage"], ["-sass"])
    line = next(line for line in usage.splitlines() if "REG:" in line)
    fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
    ops = opcodes(sass)
    count = lambda prefix: sum(op.startswith(prefix) for op in ops)  # noqa: E731
    loops = inner_loops(sass, compute=True)
    return {"registers": int(fields["REG"]), "stack": int(fields["STACK"]), "spill_stores": count("STL"),
            "spill_loads": count("LDL"), "wgmma": count("HGMMA"), "shared": compiled.metadata.shared,
            "loop": loops[0] if loops else (0, 0),
            "global_ops": dict(Counter(op for op in ops if op.startswith(("LDG.", "STG.", "LDGSTS."))))}


MEASURED = ("resources of each Triton attention kernel's launch configuration compiled for sm_90 (bf16, no varlen) "
            "by triton's ptxas on this machine, read back with cuobjdump: registers per thread, stack (local memory "
            "per thread), spill stores/loads (STL/LDL in the SASS), wgmma (HGMMA) count, shared memory, and the "
            "instructions / wgmma of the leanest innermost loop; no GPU runs")


def launch_config(text: str) -> tuple[int, int, int, int]:
    """``"BM,BN,num_warps,num_stages"`` (e.g. "32,128,8,2") as four ints."""
    try:
        bm, bn, warps, stages = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BM,BN,num_warps,num_stages, e.g. 32,128,8,2") from None
    return bm, bn, warps, stages


def shipped_tiles(name: str) -> list[tuple[int, int, int, int]]:
    """(BM, BN, num_warps, num_stages) of the configs in ``tuning.SHIPPED`` that report kernel ``name``
    (a key of KERNELS) covers, sorted, each once (the two program orders compile alike)."""
    kernel_name, flags = KERNELS[name]
    rows = flags.get("ROWS", False)
    return sorted({(c.kwargs["BM"], c.kwargs["BN"], c.num_warps, c.num_stages)
                   for c in tuning.SHIPPED[kernel_name] if c.kwargs.get("ROWS", False) == rows})


def report_rows(names: list[str], config: tuple[int, int, int, int] | None, dims: list[int], tma: bool = False):
    """Table cells per (kernel, head dim, config): the shipped configs of each kernel in ``names``, or
    the one ``config`` (BM, BN, num_warps, num_stages); ``tma``: with the TMA flag (row tiles read
    through tensor descriptors, as on inputs whose layout allows them)."""
    for name in names:
        if name in HOPPER_KERNELS:
            yield from _hopper_rows(name, config, dims)
            continue
        kernel_name, flags = KERNELS[name]
        kernel = fused.JIT_KERNELS[kernel_name]
        tiles = [config] if config else shipped_tiles(name)
        for d in dims:
            for bm, bn, warps, stages in tiles:
                constexprs = dict(D=d, BM=bm, BN=bn, VARLEN=False, PREC="tf32", GLOBAL_ORDER=True, **flags)
                if tma:
                    constexprs.update(TMA=True, TMA_OK=True)
                yield _cells(name, d, (bm, bn, warps, stages), resources(kernel, constexprs, warps, stages))


def _hopper_rows(name: str, config, dims: list[int]):
    """``report_rows``'s cells for a Hopper pass: its shipped config per head dim, or ``config`` (BM, BN,
    num_warps, stages)."""
    pass_name = HOPPER_KERNELS[name]
    for d in dims:
        tile = tuning.HopperConfig(*config) if config else tuning.HOPPER_CONFIGS[pass_name][d]
        yield _cells(name, d, tile, compiled_resources(compile_hopper(pass_name, d, tile)))


def _cells(name: str, d: int, tile: tuple, r: dict) -> tuple:
    """One report row: kernel, head dim, tile (BM, BN, num_warps, stages) and its ``compiled_resources``."""
    bm, bn, warps, stages = tile[:4]
    return (name, d, f"{bm} x {bn}", warps, stages, r["registers"], r["stack"],
            f"{r['spill_stores']}/{r['spill_loads']}", r["wgmma"], r["shared"], f"{r['loop'][0]} / {r['loop'][1]}")


def main(argv: list[str] | None = None) -> None:
    """Print the report (header, then one table row per kernel, head dim and config) to stdout."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.kernel_resources",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=sorted({**KERNELS, **HOPPER_KERNELS}), nargs="+",
                        default=sorted({**KERNELS, **HOPPER_KERNELS}))
    parser.add_argument("--config", type=launch_config, help="BM,BN,num_warps,num_stages instead of the shipped lists")
    parser.add_argument("--d", type=int, nargs="+", default=[128, 64], choices=[128, 64],
                        help="head dims (the models'; the Hopper passes ship configs for these only)")
    parser.add_argument("--tma", action="store_true", help="the kernels with the TMA flag (tensor-descriptor loads)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when unset; 1 is its default
    meta = describe("Triton attention kernels on sm_90: registers, spills, shared memory", MEASURED,
                    command_line(__spec__.name, argv))
    print(header(meta), end="")
    columns = ["kernel", "D", "BM x BN", "warps", "stages", "registers", "stack B", "spill st/ld", "wgmma",
               "shared B", "leanest loop: instr / wgmma"]
    print(*table(columns, []), sep="\n")
    for row in report_rows(args.kernel, args.config, args.d, args.tma):
        print(table_row(row), flush=True)  # row by row: a full report compiles for minutes


if __name__ == "__main__":
    main()
