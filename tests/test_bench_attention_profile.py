"""The Nsight Compute profile of the attention kernels: ncu's command lines, its raw CSV read into
the page's quantities, and the page, on CPU (a fake ncu stands in for the real one)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from scripts.bench import attention_profile as ap

TENSOR = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
GMMA_INSTRUCTIONS = "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active"  # a rate, not busy cycles
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
# (column, unit, first kernel, second kernel); the second kernel's tensor metrics are n/a
COLUMNS = [
    ("ID", "", "0", "1"), ("Process ID", "", "4242", "4242"), ("Process Name", "", "python", "python"),
    ("Host Name", "", "127.0.0.1", "127.0.0.1"),
    ("Kernel Name", "", "_fwd_kernel", "_bwd_dkdv_kernel_0d1d2d3d4d5d6d7d8d9d10d11d12de13de"),
    ("Context", "", "1", "1"), ("Stream", "", "7", "7"), ("Block Size", "", "(256, 1, 1)", "(128, 1, 1)"),
    ("Grid Size", "", "(2048, 1, 1)", "(1024, 1, 1)"), ("Device", "", "0", "0"), ("CC", "", "9.0", "9.0"),
    ("gpu__time_duration.sum", "ns", "1,234,567", "3,456,789.5"),  # ncu 2025.3's base unit
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "71.25", "55.5"),
    ("launch__registers_per_thread", "register/thread", "168", "255"),
    ("launch__occupancy_limit_registers", "block", "1", "2"),
    ("launch__occupancy_limit_shared_mem", "block", "2", "1"),
    ("launch__occupancy_limit_warps", "block", "8", "16"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", "12.4", "11.9"),
    ("sm__maximum_warps_per_active_cycle_pct", "%", "12.5", "12.5"),
    ("launch__shared_mem_per_block_dynamic", "byte/block", "98,304", "1,024"),
    ("launch__shared_mem_per_block_static", "byte/block", "0", "n/a"),
    ("sm__instruction_throughput.avg.pct_of_peak_sustained_active", "%", "40.1", "45.2"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "%", "38.0", "64.5"),
    (GMMA_INSTRUCTIONS, "%", "4.3", "n/a"),
    (TENSOR, "%", "62.4", "n/a"),
    ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "%", "21.0", ""),
    (STALL.format("long_scoreboard"), "", "3.1", "0.5"),
    (STALL.format("wait"), "", "2.0", "1.5"),
    (STALL.format("barrier"), "", "1.0", "2.5"),
    (STALL.format("selected"), "", "1.0", "1.0"),  # the issuing warp: no stall
    (STALL.format("short_scoreboard"), "", "0.5", "n/a"),
    (STALL.format("math_pipe_throttle"), "", "n/a", "0.5"),
    (STALL.format("gmma"), "", "2.4", "0"),
    ("smsp__average_warp_latency_issue_stalled_long_scoreboard", "", "9,999", "9,999"),  # a family not preferred
]
CONFIGS = {"shape": {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128},
           "machine": {"gpu": "NVIDIA H200 x 1", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0",
                       "python": "3.12.3"},
           "configs": {"fwd": "BM: 128, BN: 64, GLOBAL_ORDER: True, TMA: True, num_warps: 8, num_ctas: 1, "
                              "num_stages: 3, maxnreg: None, ir_override: None",
                       "dq": "BM: 128, BN: 32, GLOBAL_ORDER: False, num_warps: 8, num_ctas: 1, num_stages: 3",
                       "dkdv": "BM: 64, BN: 64, GLOBAL_ORDER: True, ROWS: True, TMA: True, num_warps: 4, "
                               "num_ctas: 1, num_stages: 1, maxnreg: None"}}


def quoted(cells) -> str:
    return ",".join(f'"{cell}"' for cell in cells)


def raw_csv(columns=COLUMNS, kernels=2) -> str:
    """ncu's raw page: the quoted header, the units, a line per kernel."""
    lines = [quoted(c[0] for c in columns), quoted(c[1] for c in columns)]
    return "\n".join(lines + [quoted(c[2 + i] for c in columns) for i in range(kernels)]) + "\n"


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "raw_D128.csv"
    path.write_text(raw_csv())
    units, records = ap.read_raw(path)
    return [ap.kernel_row(record, units, 128, CONFIGS["configs"]) for record in records]


def test_raw_csv_becomes_the_page_quantities(rows):
    fwd, dkdv = rows
    assert (fwd["kernel"], dkdv["kernel"]) == ("fwd", "dkdv column pass")
    assert fwd["config"] == "BM: 128, BN: 64, GLOBAL_ORDER: True, TMA: True, num_warps: 8, num_stages: 3"
    assert dkdv["config"].startswith("BM: 64, BN: 64, GLOBAL_ORDER: True, ROWS: True")
    assert fwd["duration_us"] == pytest.approx(1234.567) and dkdv["duration_us"] == pytest.approx(3456.7895)
    assert (fwd["sm_throughput"], fwd["issue_slots"], fwd["achieved_occupancy"], fwd["theoretical_occupancy"]) == (
        71.25, 38.0, 12.4, 12.5)
    assert fwd["tensor_pipes"] == 62.4 and fwd["sources"]["tensor_pipes"] == TENSOR  # busy cycles, not the rate
    assert (fwd["registers"], dkdv["registers"]) == (168, 255)
    assert (fwd["shared_mem_bytes"], dkdv["shared_mem_bytes"]) == (98304, 1024)  # static n/a counts as none
    assert (fwd["occupancy_limiter"], dkdv["occupancy_limiter"]) == ("registers", "shared_mem")
    assert fwd["pipe_columns"][GMMA_INSTRUCTIONS] == 4.3 and dkdv["pipe_columns"][GMMA_INSTRUCTIONS] == "n/a"
    assert "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active" in fwd["pipe_columns"]
    cells = ap.table_cells(fwd)
    assert len(cells) == len(ap.COLUMNS)
    assert cells[3:7] == ["1,234.6", "71.2", "62.4", "38.0"] and cells[9:11] == ["168", "96.0"]


def test_stall_shares_sum_to_one_largest_first(rows):
    fwd, dkdv = rows
    stalls = fwd["stalls"]
    assert [s["reason"] for s in stalls] == ["long_scoreboard", "gmma", "wait", "barrier", "short_scoreboard"]
    assert sum(s["share"] for s in stalls) == pytest.approx(1.0)
    assert stalls[0]["share"] == pytest.approx(3.1 / 9.0)  # the ratio family, without "selected"
    assert ap.top_stalls(fwd) == "long scoreboard 34%, gmma 27%, wait 22%, barrier 11%"
    assert [s["reason"] for s in dkdv["stalls"]][:2] == ["barrier", "wait"]
    assert sum(s["share"] for s in dkdv["stalls"]) == pytest.approx(1.0)


def test_other_stall_family_when_the_preferred_one_is_missing():
    record = {"smsp__average_warp_latency_issue_stalled_wait": "30",
              "smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio": "1,000",
              "smsp__average_warp_latency_issue_stalled_barrier_per_warp_active.pct": "50",  # another quantity
              STALL.format("wait"): "n/a"}
    assert [(s["reason"], round(s["share"], 3)) for s in ap.stalls(record)] == [
        ("long_scoreboard", round(1000 / 1030, 3)), ("wait", round(30 / 1030, 3))]
    assert ap.stalls({"Kernel Name": "_fwd_kernel"}) == []


def test_missing_tensor_metric_is_na(rows):
    dkdv = rows[1]
    assert dkdv["tensor_pipes"] is None and dkdv["sources"]["tensor_pipes"] is None
    assert ap.table_cells(dkdv)[5] == "n/a"
    bare = ap.kernel_row({"Kernel Name": "_bwd_dq_kernel"}, {}, 64, {})
    assert bare["kernel"] == "dq row pass" and bare["duration_us"] is None and bare["shared_mem_bytes"] is None
    assert ap.table_cells(bare)[2:] == ["n/a"] * 10
    assert ap.summary(bare) == ("D=64 dq row pass: latency-bound: top stall n/a; tensor pipes n/a, issue slots n/a "
                                "busy; occupancy n/a of n/a theoretical")


def test_summary_names_the_limiter(rows):
    fwd, dkdv = rows
    assert ap.summary(fwd).startswith("D=128 fwd: tensor pipes 62% busy; top stall: long scoreboard 34%")
    assert ap.summary(dkdv) == ("D=128 dkdv column pass: issue slots 64% busy; top stall: barrier 50%; "
                                "tensor pipes n/a busy")
    slow = dict(fwd, tensor_pipes=20.0, issue_slots=30.0)
    assert ap.summary(slow).startswith("D=128 fwd: latency-bound: top stall long scoreboard 34%")
    assert "limited by registers" in ap.summary(slow)


@pytest.mark.parametrize("text, error", [
    (raw_csv(kernels=0), "no kernel rows"),
    ('"Kernel","Duration"\n"","nsecond"\n"_fwd_kernel","1"\n', "not an ncu raw CSV"),
    ("", "not an ncu raw CSV"),
])
def test_a_bad_csv_is_an_error_naming_the_file(tmp_path, text, error):
    path = tmp_path / "raw_D64.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"raw_D64.csv: {error}"):
        ap.read_raw(path)


def test_ncu_command_lines():
    command = ap.profile_command("ncu", "/out", 128, ["--batch", "2"], python="/py")
    text = " ".join(command)
    assert command[0] == "ncu" and "--clock-control none" in text and "--set full" in text
    assert "--nvtx --nvtx-include profile/" in text and "--export /out/attention_D128 --force-overwrite" in text
    run = command[command.index("/py"):]
    assert run == ["/py", "-m", "scripts.bench.attention_profile", "run", "--dim", "128", "--batch", "2",
                   "--configs-out", "/out/configs_D128.json"]
    assert ap.profile_command("ncu", "/out", 64)[command.index("/py")] == sys.executable
    assert " ".join(ap.import_command("/opt/ncu", "/out", 64)).startswith(
        "/opt/ncu --import /out/attention_D64.ncu-rep --csv --page raw")


def test_run_needs_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="run needs a CUDA GPU"):
        ap.main(["run", "--dim", "64"])


def test_chosen_configs_from_the_autotuner_or_the_fixed_pick():
    from kernels.parallax import tuning

    report = {"fwd": [{"best": {"(128, False)": "BM: 128"}}, {"best": {"(64, False)": "BM: 64"}}], "dq": [], "dkdv": []}
    configs = ap.chosen_configs(report, 1, 128)
    assert configs["fwd"] == "BM: 128; BM: 64" and configs["dq"] == str(tuning.choose("dq", 1))
    bm, bn, warps, stages = tuning.HOPPER_CONFIGS["dkdv"][128][:4]
    assert configs["dkdv_hopper"] == f"BM: {bm}, BN: {bn}, num_warps: {warps}, stages: {stages}"
    capped = tuning.HOPPER_CONFIGS["fwd"][64]  # a register cap is part of the config
    assert ap.chosen_configs(report, 1, 64)["fwd_hopper"] == (f"BM: {capped.bm}, BN: {capped.bn}, num_warps: "
                                                              f"{capped.warps}, stages: {capped.stages}, "
                                                              f"maxnreg: {capped.maxnreg}")
    assert "dq_hopper" not in ap.chosen_configs(report, 1, 96)  # no Hopper kernel at that head dim
    assert ap.kernel_label("_bwd_dkdv_hopper_kernel") == ("dkdv_hopper", "dkdv column pass, Hopper")
    assert ap.kernel_label("_bwd_dkdv_kernel") == ("dkdv", "dkdv column pass")


def fake_ncu(tmp_path, body: str) -> str:
    path = tmp_path / "ncu"
    path.write_text("#!/bin/bash\n" + body)
    os.chmod(path, 0o755)
    return str(path)


def test_profile_without_ncu_or_with_a_failing_one_says_so(tmp_path):
    with pytest.raises(SystemExit, match="ncu not found"):
        ap.main(["profile", "--out-dir", str(tmp_path), "--ncu", str(tmp_path / "missing")])
    ncu = fake_ncu(tmp_path, '[ "$1" = --version ] && exit 0\necho "==ERROR== ERR_NVGPUCTRPERM" >&2\nexit 1\n')
    with pytest.raises(SystemExit, match="(?s)ncu profile of D=64 failed.*ERR_NVGPUCTRPERM"):
        ap.main(["profile", "--dims", "64", "--out-dir", str(tmp_path / "out"), "--ncu", ncu])


def test_profile_then_report_end_to_end(tmp_path, capsys):
    fixture = tmp_path / "fixture.csv"
    fixture.write_text("==WARNING== a line ncu may print first\n" + raw_csv())
    ncu = fake_ncu(tmp_path, f"""case "$1" in
  --version) echo "NVIDIA (R) Nsight Compute Command Line Profiler"; echo "Version 2025.3.0.0 (build 1)";;
  --import) cat {fixture};;
  *) while [ $# -gt 0 ]; do [ "$1" = --export ] && touch "$2.ncu-rep"; shift; done;;
esac
""")
    out = tmp_path / "profile"
    ap.main(["profile", "--dims", "128", "64", "--out-dir", str(out), "--ncu", ncu])
    assert sorted(p.name for p in out.glob("raw_D*.csv")) == ["raw_D128.csv", "raw_D64.csv"]
    (out / "configs_D128.json").write_text(json.dumps(CONFIGS))  # what run writes on the GPU
    page = tmp_path / "docs" / "attention_ncu"
    ap.main(["report", str(out), "--out", str(page)])
    text = (tmp_path / "docs" / "attention_ncu.md").read_text()
    assert text.startswith("# Attention kernels: Nsight Compute profile")
    assert "Version 2025.3.0.0" in text and "B, L, Hq, Hkv = 4, 4096, 16, 8" in text
    assert "- Hardware: NVIDIA H200 x 1" in text and "triton 3.6.0" in text
    assert "python -m scripts.bench.attention_profile profile --dims 128 64" in text
    assert "| " + " | ".join(ap.COLUMNS) + " |" in text
    table = [line for line in text.splitlines() if line.startswith(("| 128 ", "| 64 "))]
    assert [line.split(" | ")[:2] for line in table] == [
        ["| 128", "fwd"], ["| 128", "dkdv column pass"], ["| 64", "fwd"], ["| 64", "dkdv column pass"]]
    assert "| 128 | fwd | BM: 128, BN: 64" in text and "| 64 | fwd | n/a |" in text  # D=64 has no configs file
    assert "- D=128 fwd: tensor pipes 62% busy" in text
    data = json.loads((tmp_path / "docs" / "attention_ncu.json").read_text())
    assert data["meta"]["gpu"] == "NVIDIA H200 x 1" and len(data["rows"]) == 4 and len(data["summaries"]) == 4
    assert data["rows"][0]["pipe_columns"][TENSOR] == 62.4 and data["ncu"]["ncu_version"].startswith("Version")


def test_report_of_a_folder_without_csvs_exits(tmp_path):
    with pytest.raises(SystemExit, match="no raw_D"):
        ap.main(["report", str(tmp_path), "--out", str(tmp_path / "page")])
