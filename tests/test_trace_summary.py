"""scripts.bench.trace_summary on a hand-made Chrome trace: groups, totals and the top list."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench import trace_summary

ROOT = Path(__file__).resolve().parents[1]


def _trace():
    kernels = [("_fwd_kernel", 300), ("_bwd_dkdv_kernel", 500), ("_bwd_dq_kernel", 200),
               ("sm90_xmma_gemm_bf16bf16_bf16f32", 800), ("ncclDevKernel_AllGather_RING_LL", 100),
               ("triton_poi_fused_mul_0", 50), ("multi_tensor_apply_kernel", 50),
               ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", 0)]
    events = [{"cat": "kernel", "name": n, "dur": d, "ts": i, "args": {"External id": 100 + i}}
              for i, (n, d) in enumerate(kernels)]
    events.append({"cat": "cpu_op", "name": "aten::mm", "dur": 10_000, "ts": 0, "args": {"External id": 103}})
    events.append({"cat": "cpu_op", "name": "ParallaxAttention", "dur": 9, "ts": 0, "args": {"External id": 101}})
    events.append({"cat": "cpu_op", "name": "ParallaxAttention", "dur": 9, "ts": 0, "args": {"External id": 102}})
    gpus = [{"id": 0, "name": "NVIDIA H200"}, {"id": 1, "name": "NVIDIA H200"}]
    return {"traceEvents": events, "deviceProperties": gpus}


def test_groups_and_shares():
    text = trace_summary.summarize(trace_summary.kernel_events(_trace()), top=3)
    assert "GPU kernel time in the trace: 2.00 ms over 8 kernels" in text
    assert "| attention backward | 0.70 | 35.0% |" in text  # cuDNN's flash_bprop counts here too
    assert trace_summary.group_of("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma") == "attention backward"
    fused_norm = "triton_per_fused__fused_rms_norm__fused_rms_norm_backward__to_copy__unsafe_view_add_view_8"
    assert trace_summary.group_of(fused_norm) == "other (elementwise, norms, loss)"
    assert trace_summary.group_of("void at::native::direct_copy_kernel_cuda") == "copy / cast"
    assert trace_summary.group_of("_symmetric_product_kernel") == "matmul"  # kernels.gram's Triton GEMM
    for hopper in ("_bwd_dq_hopper_kernel", "_bwd_dkdv_hopper_kernel"):  # kernels/parallax/hopper.py's passes
        assert trace_summary.group_of(hopper) == "attention backward"
    for hopper in ("_fwd_hopper_kernel", "_fwd_paired_kernel"):
        assert trace_summary.group_of(hopper) == "attention forward"
    assert "| matmul | 0.80 | 40.0% |" in text
    assert "| attention forward | 0.30 | 15.0% |" in text
    assert "| communication | 0.10 | 5.0% |" in text
    top = [line for line in text.splitlines() if line.startswith("| `")]
    assert [line.split("`")[1] for line in top] == ["sm90_xmma_gemm_bf16bf16_bf16f32", "_bwd_dkdv_kernel", "_fwd_kernel"]


def test_kernels_are_attributed_to_their_launching_op():
    trace = _trace()
    text = trace_summary.summarize(trace_summary.kernel_events(trace), top=2, ops=trace_summary.launching_ops(trace))
    op_rows = text.split("| launching CPU op |")[1].splitlines()[2:]
    assert op_rows[0] == "| `aten::mm` | 1 | 0.80 | 40.0% |"
    assert op_rows[1] == "| `ParallaxAttention` | 2 | 0.70 | 35.0% |"


def test_cli_reads_gzip_and_writes(tmp_path):
    path = tmp_path / "rank0_trace.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(_trace(), fh)
    out = tmp_path / "summary"
    subprocess.run([sys.executable, "-m", "scripts.bench.trace_summary", str(path), "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    text = (tmp_path / "summary.md").read_text()
    assert "| matmul | 0.80 | 40.0% |" in text
    assert "| `(no CPU op)` | 5 | 0.50 | 25.0% |" in text
    assert f"in the profiler trace {path} (recorded on NVIDIA H200;" in text
    assert f"`python -m scripts.bench.trace_summary {path} --out {out}`" in text


@pytest.mark.parametrize("content", [None, "{\"traceEvents\": [", "folder"])
def test_cli_names_a_trace_it_cannot_read(tmp_path, capsys, content):
    """A missing trace (a profiled run that failed), a cut or a folder one were tracebacks."""
    from scripts.bench.trace_summary import main

    path = tmp_path / "rank0_trace.json"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as info:
        main([str(path), "--out", str(tmp_path / "summary")])
    assert info.value.code == 2
    assert f"trace: {str(path)!r} cannot be read" in capsys.readouterr().err
    assert not (tmp_path / "summary.md").exists()


def test_timeline_idle_and_exposed_communication():
    # compute 0-100 and 150-250; NCCL 80-120 (20 us exposed) and 200-230 (hidden); idle 120-150
    events = [{"cat": "kernel", "name": n, "ts": ts, "dur": d} for n, ts, d in [
        ("sm90_xmma_gemm", 0, 100), ("triton_poi_fused_add", 150, 100),
        ("ncclDevKernel_AllGather", 80, 40), ("ncclDevKernel_ReduceScatter", 200, 30)]]
    times = trace_summary.timeline(events)
    assert times == {"span": 250, "busy": 220, "idle": 30, "communication": 70, "exposed_communication": 20}
    text = trace_summary.summarize(events, top=1)
    assert trace_summary.idle_by_tenth(events) == [0, 0, 0, 0, 5, 25, 0, 0, 0, 0]  # 120-150 in tenths of 25 us
    assert "|  | 0.00 | 0.00 | 0.00 | 0.00 | 0.01 | 0.03 | 0.00 | 0.00 | 0.00 | 0.00 |" in text
    assert "| exposed communication | 0.02 | 8.0% |" in text
    assert "| idle | 0.03 | 12.0% |" in text


def test_idle_gaps_are_attributed_to_the_host_event_running():
    kernels = [("sm90_xmma_gemm", 0, 100), ("sm90_xmma_gemm", 300, 100), ("triton_poi_add", 450, 50)]
    host = [("ProfilerStep#20", "user_annotation", 0, 600), ("optimizer step", "user_annotation", 90, 400),
            ("aten::item", "cpu_op", 120, 150), ("cudaStreamSynchronize", "cuda_runtime", 130, 100),
            ("aten::mm", "cpu_op", 280, 20), ("cudaLaunchKernel", "cuda_runtime", 285, 5),
            ("cudaLaunchKernel", "cuda_runtime", 10, 5)]
    trace = {"traceEvents": [{"cat": "kernel", "name": n, "ts": ts, "dur": d} for n, ts, d in kernels]
             + [{"cat": c, "name": n, "ts": ts, "dur": d, "tid": 1} for n, c, ts, d in host]
             + [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 140, "dur": 1, "tid": 2}]}
    events = trace_summary.kernel_events(trace)
    # gaps: 100-300 (middle 200: inside the sync) and 400-450 (middle 425: optimizer step only)
    assert trace_summary.idle_causes(trace, events) == {"optimizer step > cudaStreamSynchronize": 200,
                                                        "optimizer step": 50}
    text = trace_summary.summarize(events, top=5, idle=trace_summary.idle_causes(trace, events))
    assert "| `optimizer step > cudaStreamSynchronize` | 0.20 |" in text


def test_memcpy_and_memset_count_as_gpu_work_not_idle():
    """A DtoD memcpy between two kernels (baddbmm's input copied into its output) is GPU time."""
    events = [{"cat": "kernel", "name": "nvjet_sm90_tst", "ts": 0, "dur": 100},
              {"cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 100, "dur": 50},
              {"cat": "gpu_memset", "name": "Memset (Device)", "ts": 150, "dur": 1},
              {"cat": "kernel", "name": "nvjet_sm90_tst", "ts": 151, "dur": 100},
              {"cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 90, "dur": 5}]
    found = trace_summary.kernel_events({"traceEvents": events})
    assert len(found) == 4
    assert trace_summary.timeline(found)["idle"] == 0
    text = trace_summary.summarize(found, top=3)
    assert "2.51 ms" not in text and "over 2 kernels and 2 memcpy / memset" in text
    assert "| copy / cast | 0.05 |" in text
