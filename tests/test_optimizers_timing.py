"""optimizers.timing: every algorithm's recipe routes the model's matrices and the timer times real steps."""

import pytest

from optimizers.timing import OPTIMIZERS, build_optimizer, step_times
from tests._optim_models import TinyParallax


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_optimizer_routes_and_steps(name):
    model = TinyParallax()
    for p in model.parameters():
        p.grad = p.detach() * 0 + 1e-3
    opt = build_optimizer(model, name)
    before = [p.detach().clone() for p in model.parameters()]
    times = step_times(opt, warmup=0, iters=2)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert all((p - b).abs().max() > 0 for p, b in zip(model.parameters(), before)), name
    algos = {g["algo"] for g in opt.param_groups}
    assert algos == ({"adamw"} if name == "adamw" else {"adamw", name}), name


def test_options_reach_the_matrix_groups():
    model = TinyParallax()
    opt = build_optimizer(model, "muon", spectral={"attn": (2, 1e-4), "mlp": (2, 1e-4)},
                          orthogonalizer="newton_schulz")
    muon = [g for g in opt.param_groups if g["algo"] == "muon"]
    assert muon and all(g["orthogonalizer"] == "newton_schulz" and g["sp_power"] == 2 for g in muon)
    with pytest.raises(ValueError, match="name='lion'"):
        build_optimizer(model, "lion")
