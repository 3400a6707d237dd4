"""scripts.bench.probe_cost: the kernel split, the W_R floor, the page and the command line on CPU; one
small run on the GPU."""

import pytest
import torch

from scripts.bench import probe_cost


def test_kernels_split_into_matmuls_and_the_rest():
    kernels = {"nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": 1.0, "triton_poi_fused_mul_rsqrt_0": 0.5,
               "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>": 0.25, "Memset (Device)": 0.125}
    assert probe_cost.split_by_group(kernels) == {"matmul": 1.25, "other": 0.625}


def test_w_r_floor_is_three_products_at_peak():
    """0.6B, 4 x 4096 tokens: x (16384 x 1024) times W_R^T (1024 x 2048), three times, 2 FLOP each."""
    flop = 3 * 2 * 16384 * 1024 * 2048
    assert probe_cost.w_r_floor_ms(16384, 1024, 2048) == pytest.approx(flop / 790e12 * 1e3)
    assert probe_cost.w_r_floor_ms(16384, 1024, 1024) == pytest.approx(probe_cost.w_r_floor_ms(16384, 1024, 2048) / 2)


def test_page_gives_the_difference_per_layer_and_per_step():
    rows = {"parallax": {"matmul": 0.8, "other": 0.65}, "softmax": {"matmul": 0.5, "other": 0.4},
            "parallax_modules": {"matmul": 0.8, "other": 0.9}}
    lines = probe_cost.markdown({"flavor": "0.6B", "variant": "parallax", "batch": 4, "seq_len": 4096, "layers": 28,
                                 "rows": rows, "w_r_floor_ms": 0.26})
    diff = next(line for line in lines if line.startswith("| **probe"))
    assert diff == "| **probe (difference)** | 0.300 | 0.250 | **8.4** | **7.0** | 15.4 |"
    assert "| with rho (Parallax, as the model runs it) | 0.800 | 0.650 | 22.4 | 18.2 | 40.6 |" in lines
    assert "| with rho, TorchTitan's norm modules and apply_rope | 0.800 | 0.900 | 22.4 | 25.2 | 47.6 |" in lines
    assert any("0.260 ms per layer, 7.3 ms per step" in line for line in lines)
    assert any("Both projections run through Inductor here" in line for line in lines)
    rows["parallax"]["kernels"] = {"_forward_kernel": 0.1, "_backward_kernel": 0.2, "nvjet_x": 0.8}
    lines = probe_cost.markdown({"flavor": "0.6B", "variant": "parallax", "batch": 4, "seq_len": 4096, "layers": 28,
                                 "rows": rows, "w_r_floor_ms": 0.26})
    assert any("puts q and k through the fused kernels too" in line for line in lines)


@pytest.mark.parametrize("argv, message", [(["--batch", "0"], "'0': expected an int >= 1"),
                                           (["--seq-len", "-4"], "'-4': expected an int >= 1"),
                                           (["--flavor", "2B"], "invalid choice: '2B'"),
                                           (["--variant", "transformer"], "invalid choice: 'transformer'")])
def test_command_line_refuses_bad_values(argv, message, capsys):
    with pytest.raises(SystemExit):
        probe_cost.parser().parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_both_projections_are_timed_and_split():
    """One 0.6B layer (heads of 128), 1 x 256 tokens: the three projections timed, their kernels profiled
    and split; the model's CUDA path runs the fused norm + RoPE kernels, the modules' path does not."""
    result = probe_cost.run("0.6B", "parallax", 1, 256)
    assert result["layers"] == 28
    for row in result["rows"].values():
        assert row["matmul"] > 0 and row["other"] > 0
        assert sum(row["kernels"].values()) == pytest.approx(row["matmul"] + row["other"])
    assert any("_forward_kernel" in name for name in result["rows"]["parallax"]["kernels"])
    assert not any("_forward_kernel" in name for name in result["rows"]["parallax_modules"]["kernels"])
