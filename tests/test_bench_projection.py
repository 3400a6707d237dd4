"""scripts.bench.projection: bytes per pass, the page and the command line on CPU; one small run on the GPU."""

import pytest
import torch

from scripts.bench import projection


def test_pass_bytes_count_every_read_and_write():
    """0.6B: 16 q and rho heads, 8 k and v heads of 128, bf16. Forward: y read, q, k, v, rho written (y's
    width each way). Backward: four gradients read (y's width), y's q, k, rho columns read, dy written."""
    width = (2 * 16 + 2 * 8) * 128
    got = projection.pass_bytes(10, 16, 8, 128, 2)
    assert got == {"forward": 2 * 10 * width * 2, "backward": 10 * (width + (width - 8 * 128) + width) * 2}


def test_page_marks_the_shipped_launch_of_each_pass():
    row = {"heads": [16, 8, 128], "tokens": 16384, "bytes": projection.pass_bytes(16384, 16, 8, 128, 2),
           "copy": {"forward": 0.1, "backward": 0.2}, "inductor": {"forward": 0.2, "backward": 1.0},
           "launches": {"64x8x1": {"forward": 0.11, "backward": 0.3}, "64x4x2": {"forward": 0.12, "backward": 0.25}},
           "shipped": {"forward": "64x8x1", "backward": "64x4x2"}}
    lines = projection.markdown({"rows": {"0.6B parallax": row}})
    assert "| ours 64x8x1 (shipped: forward) | 0.110 | 1.10 | 0.55 | 0.300 | 1.50 | 0.30 |" in lines
    assert "| ours 64x4x2 (shipped: backward) | 0.120 | 1.20 | 0.60 | 0.250 | 1.25 | 0.25 |" in lines
    assert "| copy of the same bytes | 0.100 | 1.00 | 0.50 | 0.200 | 1.00 | 0.20 |" in lines
    assert any("forward 384 MiB, backward 544 MiB" in line for line in lines)
    assert not any("reduction" in line for line in lines if line.startswith("|"))


def test_page_lists_the_reductions_with_the_shipped_one_marked():
    row = {"heads": [16, 8, 128], "tokens": 16384, "bytes": projection.pass_bytes(16384, 16, 8, 128, 2),
           "copy": {"forward": 0.1, "backward": 0.2}, "inductor": {"forward": 0.2, "backward": 1.0},
           "launches": {"64x4x2": {"forward": 0.12, "backward": 0.25}},
           "shipped": {"forward": "64x4x2", "backward": "64x4x2", "reduction": "16x256x4"},
           "reductions": {"16x256x4": 0.017, "8x128x4": 0.0061}}
    lines = projection.markdown({"rows": {"0.6B parallax": row}})
    assert "| 16x256x4 (shipped) | 0.0170 |" in lines and "| 8x128x4 | 0.0061 |" in lines


@pytest.mark.parametrize("argv, message", [(["--batch", "0"], "'0': expected an int >= 1"),
                                           (["--seq-len", "x"], "'x': expected an int >= 1")])
def test_command_line_refuses_bad_values(argv, message, capsys):
    with pytest.raises(SystemExit):
        projection.parser().parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_one_small_shape_is_timed():
    """0.6B heads over 1 x 512 tokens, one launch config: every row timed, the shipped launches named."""
    row = projection.bench_shape("0.6B", "parallax", 1, 512, [(64, 4, 2)])
    assert list(row["launches"]) == ["64x4x2"]
    for times in (row["launches"]["64x4x2"], row["copy"], row["inductor"]):
        assert set(times) == {"forward", "backward"} and all(t > 0 for t in times.values())
    assert row["shipped"] == {"forward": "64x4x1", "backward": "64x4x2", "reduction": "4x256x4"}
    assert list(row["reductions"]) == [projection.label(r) for r in projection.REDUCTIONS]
    assert all(ms > 0 for ms in row["reductions"].values())
