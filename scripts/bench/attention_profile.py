"""Profile the fused attention kernels with Nsight Compute and say where each one's ceiling is: the
forward and the backward's row and column passes (on sm_90 the backward's Hopper kernels, as shipped).

Three subcommands:

* ``run --dim D``: one forward + backward of ``kernels.parallax.fused`` at (B, L, Hq, Hkv, D), bf16,
  causal, inside the NVTX range ``profile`` (after two unprofiled calls that autotune and compile);
  writes the shape and the configs the autotuner chose to ``--configs-out``. Needs CUDA; ncu runs it.
* ``profile --dims 128 64 --out-dir DIR``: per head dim, ``ncu --set full`` on ``run`` (only the
  kernels in the NVTX range), then the report's raw page as ``DIR/raw_D{d}.csv``.
* ``report DIR --out docs/bench/attention_ncu``: one page row per profiled kernel launch (duration,
  SM throughput, tensor pipes, issue slots, occupancy, registers, shared memory, top warp stalls)
  and a line per kernel naming its limiter; markdown and JSON.

    python -m scripts.bench.attention_profile profile --dims 128 64 --out-dir /tmp/attention_ncu
    python -m scripts.bench.attention_profile report /tmp/attention_ncu --out docs/bench/attention_ncu
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from scripts.bench.results import (command_line, describe, gpu_description, positive_int, software_versions, table,
                                   write_results)

REPO = str(Path(__file__).resolve().parents[2])
MODULE = "scripts.bench.attention_profile"
HEAD_DIMS = (128, 64)  # the models' head dims, those the Hopper passes ship configs for
RANGE = "profile"  # the NVTX range around the profiled calls; ncu's filter names it as "profile/"
# Triton names a kernel's cubin entry after its function: tuning's name and the page's label.
KERNELS = {"_fwd_kernel": ("fwd", "fwd"), "_bwd_dq_kernel": ("dq", "dq row pass"),
           "_bwd_dkdv_kernel": ("dkdv", "dkdv column pass"), "_fwd_hopper_kernel": ("fwd_hopper", "fwd, Hopper"),
           "_fwd_paired_kernel": ("fwd_hopper", "fwd over paired query tiles, Hopper"),
           "_bwd_dq_hopper_kernel": ("dq_hopper", "dq row pass, Hopper"),
           "_bwd_dkdv_hopper_kernel": ("dkdv_hopper", "dkdv column pass, Hopper")}
# Per quantity, metric-name patterns in order of preference: names differ between ncu versions and
# GPUs. The tensor pipes: all tensor-pipe cycles first (wgmma and mma), then the per-kind cycle
# counters; the sm__inst_executed_pipe_tensor_* rates count instructions, not busy cycles (a wgmma
# keeps the pipe busy for many cycles), so they come last.
METRICS = {
    "duration": [r"^gpu__time_duration\.sum$"],
    "sm_throughput": [r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$"],
    "tensor_pipes": [r"^sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_active$",
                     r"^sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active$",
                     r"^sm__pipe_tensor_op_hmma_cycles_active\.avg\.pct_of_peak_sustained_active$",
                     r"pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$",
                     r"pipe_tensor.*[gh]mma.*\.avg\.pct_of_peak_sustained_active$",
                     r"pipe_tensor.*pct_of_peak_sustained_active$"],
    "issue_slots": [r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$",
                    r"^sm__inst_issued\.avg\.pct_of_peak_sustained_active$",
                    r"^smsp__inst_issued\.avg\.pct_of_peak_sustained_active$"],
    "achieved_occupancy": [r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$"],
    "theoretical_occupancy": [r"^sm__maximum_warps_per_active_cycle_pct$"],
    "registers": [r"^launch__registers_per_thread$"],
    "smem_dynamic": [r"^launch__shared_mem_per_block_dynamic$"],
    "smem_static": [r"^launch__shared_mem_per_block_static$"],
}
OCCUPANCY_LIMITS = ("registers", "shared_mem", "warps", "blocks")  # launch__occupancy_limit_*: blocks per SM
# Warp stall families, preferred first: cycles per issued instruction (their sum is the average
# time between two issues of a warp), their latency form, then the sampled program counters.
STALLS = [r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$",
          r"^smsp__average_warp_latency_issue_stalled_(\w+?)(?:\.ratio|\.pct|\.sum)?$",
          r"^smsp__pcsamp_warps_issue_stalled_(\w+)$"]
BUSY = 60.0  # % of peak from which a unit, not latency, is called the limiter
# ncu prints "ns" with --print-units base (2025.3) and "nsecond" in other versions and pages
TIME_UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3,
              "s": 1e6}
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "KB": 1e3, "MB": 1e6, "Kibyte": 1024, "KiB": 1024}


# ----------------------------------------------------------------------------- run (under ncu)
def work(batch: int, length: int, hq: int, dim: int) -> int:
    """fused's autotuning measure of a causal call: tokens x keys per query x heads x head dim."""
    return batch * length * length * hq * dim


def chosen_configs(report: dict, amount: int, dim: int) -> dict[str, str]:
    """Per kernel name, the config its launches ran: the autotuner's choices in ``report``
    (``tuning.autotune_report()``), or where none tuned, ``tuning.choose``'s fixed pick; the Hopper
    kernels (``fwd_hopper``, ``dq_hopper``, ``dkdv_hopper``) with ``tuning.HOPPER_CONFIGS`` at head dim ``dim``."""
    from kernels.parallax import tuning

    out = {}
    for name in tuning.KERNEL_NAMES:
        best = sorted({config for tuner in report.get(name, []) for config in tuner["best"].values()})
        if not best:  # below tuning.SMALL_WORK, or one candidate: no autotuner ran
            best = [str(tuning.choose(name, amount))]
        out[name] = "; ".join(best)
    for name, by_dim in tuning.HOPPER_CONFIGS.items():
        if dim in by_dim:
            c = by_dim[dim]
            cap = "" if c.maxnreg is None else f", maxnreg: {c.maxnreg}"
            out[f"{name}_hopper"] = f"BM: {c.bm}, BN: {c.bn}, num_warps: {c.warps}, stages: {c.stages}{cap}"
    return out


def run(args) -> None:
    """Autotune and compile the kernels outside the NVTX range, then run them once inside it."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"{MODULE} run needs a CUDA GPU (it launches the fused Triton kernels)")
    from kernels.parallax import fused, tuning

    b, n, hq, hkv, d = args.batch, args.length, args.hq, args.hkv, args.dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, r, do = (torch.randn(b, n, hq, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    r = r / d**0.5  # scores in the range training sees
    scale = d**-0.5

    def step():
        o, vbar, tbar, lse = fused.forward(q, r, k, v, scale)
        fused.backward(do, q, r, k, v, o, vbar, tbar, lse, scale)

    for _ in range(2):  # the first call autotunes (triton caches the choice), the second runs compiled code
        step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(RANGE)
    step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    report = tuning.autotune_report()
    shape = {"B": b, "L": n, "Hq": hq, "Hkv": hkv, "D": d}
    machine = {"gpu": gpu_description(), **software_versions()}  # the page's hardware and versions
    configs = chosen_configs(report, work(b, n, hq, d), d)
    data = {"shape": shape, "machine": machine, "configs": configs, "autotune": report}
    Path(args.configs_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.configs_out).write_text(json.dumps(data, indent=1))


# ----------------------------------------------------------------------------- profile
def shape_args(args) -> list[str]:
    """The shape options of ``args`` as command-line arguments of ``run``."""
    return ["--batch", str(args.batch), "--length", str(args.length), "--hq", str(args.hq), "--hkv", str(args.hkv)]


def profile_command(ncu: str, out_dir: str, dim: int, shape=(), python: str = sys.executable) -> list[str]:
    """ncu's command line that profiles ``run --dim dim`` (the kernels in the NVTX range only, full
    metric set, clocks as the GPU sets them) into ``out_dir/attention_D{dim}.ncu-rep``."""
    return [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{RANGE}/", "--set", "full",
            "--export", f"{out_dir}/attention_D{dim}", "--force-overwrite",
            python, "-m", MODULE, "run", "--dim", str(dim), *shape, "--configs-out", f"{out_dir}/configs_D{dim}.json"]


def import_command(ncu: str, out_dir: str, dim: int) -> list[str]:
    """ncu's command line that prints the raw page of ``attention_D{dim}.ncu-rep`` as CSV (its columns
    are the metric names), values in base units (auto-scaled units may differ per launch); ncu 2025.3
    refuses ``--print-metric-name`` outside the details page."""
    return [ncu, "--import", f"{out_dir}/attention_D{dim}.ncu-rep", "--csv", "--page", "raw",
            "--print-units", "base"]


def _ncu(command: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    """Run an ncu command; a missing ncu or a failure is a SystemExit with the tail of its output."""
    try:
        done = subprocess.run(command, cwd=REPO, text=True, check=False, **kwargs)
    except FileNotFoundError:
        raise SystemExit(f"ncu not found ({command[0]!r}): put Nsight Compute on PATH or pass --ncu") from None
    if done.returncode != 0:
        tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-30:])
        raise SystemExit(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n{tail}")
    return done


def profile(args) -> None:
    """Per head dim: ncu on ``run``, then the raw page as CSV; ``DIR/profile.json`` names ncu and the commands."""
    if shutil.which(args.ncu) is None:
        raise SystemExit(f"ncu not found ({args.ncu!r}): put Nsight Compute on PATH or pass --ncu")
    out = Path(args.out_dir).resolve()  # ncu runs in the repository root
    out.mkdir(parents=True, exist_ok=True)
    version = _ncu([args.ncu, "--version"], "ncu --version", capture_output=True).stdout.strip().splitlines()
    commands = []
    for d in args.dims:
        command = profile_command(args.ncu, str(out), d, shape_args(args))
        done = _ncu(command, f"ncu profile of D={d}", capture_output=True)
        (out / f"ncu_D{d}.log").write_text(done.stdout + done.stderr)  # ncu's ==PROF== lines and the run's output
        if not (out / f"attention_D{d}.ncu-rep").exists():  # ncu exits 0 when its filter matched no kernel
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise SystemExit(f"ncu wrote no report for D={d}: no kernel ran in NVTX range {RANGE!r}?\n{tail}")
        with open(out / f"raw_D{d}.csv", "w") as f:
            _ncu(import_command(args.ncu, str(out), d), f"ncu import of D={d}", stdout=f, stderr=subprocess.PIPE)
        commands += [command, import_command(args.ncu, str(out), d)]
        print(f"D={d}: {out / f'raw_D{d}.csv'}", flush=True)
    info = {"ncu_version": version[-1] if version else "unknown", "command": command_line(MODULE, args.argv),
            "ncu_commands": [" ".join(c) for c in commands]}
    (out / "profile.json").write_text(json.dumps(info, indent=1))


# ----------------------------------------------------------------------------- report
def number(text: str | None) -> float | None:
    """A CSV value as a float ("1,234.5" -> 1234.5); None for "n/a", empty or non-numeric values."""
    try:
        return float((text or "").replace(",", "").strip())
    except ValueError:
        return None


def read_raw(path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(units per column, one dict of column -> value text per kernel launch) of an ncu raw CSV.

    Lines before the header (ncu's ==WARNING== lines) are skipped; a file without the header or
    without kernel rows is a ValueError naming it."""
    lines = list(csv.reader(Path(path).read_text().splitlines()))
    start = next((i for i, cells in enumerate(lines) if cells[:1] == ["ID"] and "Kernel Name" in cells), None)
    if start is None:
        raise ValueError(f"{path}: not an ncu raw CSV (no header line with \"ID\" and \"Kernel Name\")")
    columns = lines[start]
    rows = [dict(zip(columns, cells)) for cells in lines[start + 2:] if len(cells) > 1]
    if not rows:
        raise ValueError(f"{path}: no kernel rows (ncu profiled no kernel in NVTX range {RANGE!r}?)")
    return dict(zip(columns, lines[start + 1])), rows


def pick(record: dict[str, str], patterns: list[str]) -> tuple[str | None, float | None]:
    """(column, value) of the first pattern with a column holding a number; (None, None) if none does."""
    for pattern in patterns:
        for column, text in record.items():
            if re.search(pattern, column) and number(text) is not None:
                return column, number(text)
    return None, None


def scaled(value: float | None, unit: str, factors: dict[str, float]) -> float | None:
    """``value`` in ``unit`` (e.g. "Kbyte/block": the part before "/") times its factor; None if unknown."""
    factor = factors.get((unit or "").split("/")[0].strip())
    return None if value is None or factor is None else value * factor


def stalls(record: dict[str, str]) -> list[dict]:
    """Warp stall reasons of the first family of ``STALLS`` with values, largest first, each with its
    share of the family's sum. "selected" (the warp issuing) is no stall; "*_not_issued" repeat a reason."""
    for pattern in STALLS:
        found = {}
        for column, text in record.items():
            m = re.match(pattern, column)
            if m and number(text) is not None and "_per_" not in m.group(1):
                found[m.group(1)] = number(text)
        found = {reason: v for reason, v in found.items()
                 if reason != "selected" and not reason.endswith("_not_issued")}
        total = sum(found.values())
        if total > 0:
            return [{"reason": reason, "value": v, "share": v / total}
                    for reason, v in sorted(found.items(), key=lambda item: -item[1])]
    return []


def occupancy_limiter(record: dict[str, str]) -> str | None:
    """The resource that allows the fewest blocks per SM (launch__occupancy_limit_*), e.g. "registers"."""
    limits = {name: number(record.get(f"launch__occupancy_limit_{name}")) for name in OCCUPANCY_LIMITS}
    limits = {name: v for name, v in limits.items() if v is not None}
    return min(limits, key=limits.get) if limits else None


def kernel_label(name: str) -> tuple[str, str]:
    """(tuning name, page label) of a kernel name from ncu; an unknown kernel keeps its name twice."""
    for entry, names in KERNELS.items():
        if re.search(rf"(?<![A-Za-z0-9]){entry}", name):
            return names
    return name, name


def short_config(config: str) -> str:
    """A triton.Config string without its default entries (num_ctas: 1, maxnreg: None, ...)."""
    parts = [p for p in config.split(", ") if not p.endswith(": None") and p != "num_ctas: 1"]
    return ", ".join(parts)


def kernel_row(record: dict[str, str], units: dict[str, str], dim, configs: dict) -> dict:
    """The page's quantities of one kernel launch (None where the CSV has none), with the column each came from."""
    name, label = kernel_label(record.get("Kernel Name", ""))
    values, sources = {}, {}
    for quantity, patterns in METRICS.items():
        sources[quantity], values[quantity] = pick(record, patterns)
    smem = [scaled(values.pop(key), units.get(sources[key] or "", "byte"), BYTE_UNITS)
            for key in ("smem_dynamic", "smem_static")]
    pipes = {column: number(text) if number(text) is not None else text
             for column, text in record.items() if "tensor" in column or "pipe" in column}
    return dict(D=dim, kernel=label, kernel_name=record.get("Kernel Name", ""),
                config=short_config(configs.get(name, "")),
                duration_us=scaled(values.pop("duration"), units.get(sources["duration"] or "", ""), TIME_UNITS),
                **values, shared_mem_bytes=None if smem == [None, None] else sum(v or 0 for v in smem),
                occupancy_limiter=occupancy_limiter(record), stalls=stalls(record),
                block=record.get("Block Size"), grid=record.get("Grid Size"), sources=sources, pipe_columns=pipes)


def fmt(value: float | None, digits: int = 1) -> str:
    """``value`` rounded to ``digits``, or "n/a"."""
    return "n/a" if value is None else f"{value:,.{digits}f}"


def top_stalls(row: dict, count: int = 4) -> str:
    """The ``count`` largest stall reasons of a row with their shares, e.g. "long scoreboard 31%, wait 20%"."""
    shares = [f"{s['reason'].replace('_', ' ')} {100 * s['share']:.0f}%" for s in row["stalls"][:count]]
    return ", ".join(shares) or "n/a"


def pct(value: float | None) -> str:
    """A percentage rounded to a whole number ("62%"), or "n/a"."""
    return "n/a" if value is None else f"{value:.0f}%"


def summary(row: dict) -> str:
    """One line naming a kernel's limiter: the busiest unit when it is BUSY% or more of its peak, else
    latency (with the top stall and the occupancy that hides it)."""
    units = {"tensor pipes": row["tensor_pipes"], "issue slots": row["issue_slots"]}
    busy = {unit: v for unit, v in units.items() if v is not None}
    stall = top_stalls(row, 1)
    head = f"D={row['D']} {row['kernel']}: "
    if busy and max(busy.values()) >= BUSY:
        unit = max(busy, key=busy.get)
        others = "; ".join(f"{u} {pct(v)} busy" for u, v in units.items() if u != unit)
        return head + f"{unit} {pct(busy[unit])} busy; top stall: {stall}; {others}"
    limit = f", limited by {row['occupancy_limiter']}" if row["occupancy_limiter"] else ""
    return (head + f"latency-bound: top stall {stall}; tensor pipes {pct(row['tensor_pipes'])}, issue slots "
            f"{pct(row['issue_slots'])} busy; occupancy {pct(row['achieved_occupancy'])} of "
            f"{pct(row['theoretical_occupancy'])} theoretical{limit}")


COLUMNS = ["D", "kernel", "config", "duration (us)", "SM throughput %", "tensor pipes %", "issue slots busy %",
           "achieved occupancy %", "theoretical occupancy %", "registers/thread", "shared mem/block (KiB)",
           "top warp stalls (share of stall cycles)"]


def table_cells(row: dict) -> list:
    """The cells of a row of the page's table, in COLUMNS order."""
    smem = None if row["shared_mem_bytes"] is None else row["shared_mem_bytes"] / 1024
    return [row["D"], row["kernel"], row["config"] or "n/a", fmt(row["duration_us"]), fmt(row["sm_throughput"]),
            fmt(row["tensor_pipes"]), fmt(row["issue_slots"]), fmt(row["achieved_occupancy"]),
            fmt(row["theoretical_occupancy"]), fmt(row["registers"], 0), fmt(smem), top_stalls(row)]


def raw_files(folder) -> list[tuple[int, Path]]:
    """(head dim, path) of every ``raw_D{d}.csv`` in ``folder``, largest head dim first."""
    found = [(int(m.group(1)), path) for path in Path(folder).glob("raw_D*.csv")
             if (m := re.fullmatch(r"raw_D(\d+)\.csv", path.name))]
    return sorted(found, key=lambda item: -item[0])


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def collect(folder) -> tuple[list[dict], dict]:
    """(rows of every profiled launch, the first ``configs_D*.json``) of a profile folder."""
    files = raw_files(folder)
    if not files:
        raise ValueError(f"{folder}: no raw_D*.csv (run `python -m {MODULE} profile --out-dir {folder}` first)")
    rows, first = [], {}
    for dim, path in files:
        configs = _json(Path(folder) / f"configs_D{dim}.json")
        first = first or configs
        units, records = read_raw(path)
        rows += [kernel_row(record, units, dim, configs.get("configs", {})) for record in records]
    return rows, first


# What the page's columns read (under the table).
NOTE = ("Tensor pipes: % of their peak over the SMs' active cycles that the tensor pipes were busy; issue slots: % "
        "of cycles a warp scheduler issued an instruction. A stall's share: its part of the sum over all stall "
        "reasons but 'selected' (the issuing warp) of ncu's warp cycles per issued instruction. The metric each "
        "column came from is in the JSON (`sources`), beside every tensor and pipe metric ncu reported "
        "(`pipe_columns`). Durations are under the profiler (clocks not locked, caches flushed between replay "
        "passes): they place a kernel, they do not time it.")


def markdown(rows: list[dict]) -> list[str]:
    """The page body: the table, the limiter per kernel, and what the columns read."""
    return [*table(COLUMNS, map(table_cells, rows)), "",
            f"Limiter per kernel (the busiest unit at {BUSY:.0f}% of its peak or more, else latency):", "",
            *(f"- {summary(row)}" for row in rows), "", NOTE]


def report(args) -> None:
    """Write the page (``args.out``.md and .json) of the profile folder ``args.folder``."""
    try:
        rows, configs = collect(args.folder)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    info = _json(Path(args.folder) / "profile.json")
    shape = configs.get("shape", {})
    sizes = ", ".join(str(shape[key]) for key in ("B", "L", "Hq", "Hkv")) if shape else "n/a"
    command = command_line(MODULE, args.argv)
    command = f"{info['command']} && {command}" if "command" in info else command
    meta = describe("Attention kernels: Nsight Compute profile",
                    f"one launch of each fused attention kernel (forward, backward row and column passes) under "
                    f"Nsight Compute ({info.get('ncu_version', 'version not recorded')}; --set full, --clock-control "
                    f"none) at B, L, Hq, Hkv = {sizes}, bf16, causal, in the configs triton's autotuner chose "
                    f"(the backward's Hopper kernels: tuning.HOPPER_CONFIGS)", command)
    meta.update(configs.get("machine", {}))  # the GPU and versions the kernels ran on, not this machine's
    data = {"shape": shape, "ncu": info, "rows": rows, "summaries": [summary(row) for row in rows]}
    print(write_results(args.out, meta, "\n".join(markdown(rows)) + "\n", data))


def parser() -> argparse.ArgumentParser:
    """The command line: subcommands run, profile and report."""
    top = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    for name, helptext in (("run", "the profiled calls (ncu runs this)"), ("profile", "ncu on run, per head dim")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--batch", type=positive_int, default=4)
        p.add_argument("--length", type=positive_int, default=4096)
        p.add_argument("--hq", type=positive_int, default=16)
        p.add_argument("--hkv", type=positive_int, default=8)
    sub.choices["run"].add_argument("--dim", type=int, required=True, choices=HEAD_DIMS)
    sub.choices["run"].add_argument("--configs-out", default="attention_profile_configs.json")
    sub.choices["profile"].add_argument("--dims", type=int, nargs="+", default=list(HEAD_DIMS), choices=HEAD_DIMS)
    sub.choices["profile"].add_argument("--out-dir", required=True)
    sub.choices["profile"].add_argument("--ncu", default="ncu", help="the ncu executable")
    p = sub.add_parser("report", help="the results page of a profile folder")
    p.add_argument("folder")
    p.add_argument("--out", default="docs/bench/attention_ncu", help="output path without extension")
    return top


def main(argv: list[str] | None = None) -> None:
    """Dispatch to run, profile or report."""
    argv = sys.argv[1:] if argv is None else argv
    top = parser()
    args = top.parse_args(argv)
    if args.command != "report" and args.hq % args.hkv:  # the kernels' GQA: failed inside the profiled run
        top.error(f"--hq {args.hq} is not a multiple of --hkv {args.hkv}; expected query heads in whole groups")
    args.argv = argv
    {"run": run, "profile": profile, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
