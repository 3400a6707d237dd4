"""scripts.bench.op_host_cost: the command line on CPU; every measured path runs on the GPU."""

import pytest
import torch

from scripts.bench import op_host_cost


@pytest.mark.parametrize("argv, message", [(["--calls", "0"], "'0': expected an int >= 1"),
                                           (["--batch", "-1"], "'-1': expected an int >= 1")])
def test_command_line_refuses_bad_values(argv, message, capsys):
    with pytest.raises(SystemExit):
        op_host_cost.parser().parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_every_path_runs_and_is_timed():
    """1 x 512 tokens: each path's callable runs, its host time is positive, and the profile names the op."""
    fns = op_host_cost.calls_to_time(1, 512)
    assert len(fns) == 12
    assert all(op_host_cost.host_us(fn, 2) > 0 for fn in fns.values())
    assert "attention_fwd" in op_host_cost.profile_text(fns["attention_fwd (custom op)"], 2)
