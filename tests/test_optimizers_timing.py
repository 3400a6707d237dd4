"""optimizers.timing: the benchmark's parameter set and the step timer (on a tiny flavor)."""

import math

import pytest

from optimizers import RoutingConfig, build_param_groups
from optimizers.timing import OPTIMIZERS, Flavor, build_optimizer, parallax_parameters, parallax_shapes, step_times

TINY = Flavor(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, hidden=96)


def test_shapes_are_the_06b_parameter_set():
    """654,773,760 parameters: the count docs/bench/optimizers.json records for the built 0.6B
    Parallax model; 28 layers of the eight projection matrices."""
    shapes = parallax_shapes("0.6B")
    assert sum(math.prod(s) for s in shapes.values()) == 654_773_760
    assert shapes["layers.27.attention.wr.weight"] == (2048, 1024)
    assert shapes["layers.0.feed_forward.w2.weight"] == (1024, 3072)
    with pytest.raises(ValueError, match="flavor='7B'"):
        parallax_shapes("7B")


def test_routing_of_the_parameter_set_and_step_times():
    model = parallax_parameters(TINY, "cpu")
    groups = {g["name"]: g for g in build_param_groups(model, RoutingConfig())}
    assert len(groups["mlp"]["params"]) == 6 and len(groups["attn_r"]["params"]) == 2
    for name in OPTIMIZERS:
        opt = build_optimizer(model, name)
        before = [p.detach().clone() for p in model.parameters()]
        times = step_times(opt, warmup=0, iters=2)
        assert len(times) == 2 and all(t > 0 for t in times)
        assert all((p - b).abs().max() > 0 for p, b in zip(model.parameters(), before)), name
        algos = {g["algo"] for g in opt.param_groups}
        assert algos == ({"adamw"} if name == "adamw" else {"adamw", name}), name
