"""MuonAdamW.step(skip=...): a skipped step changes no bit; skip=0 is the unskipped step; no host sync."""

import pytest
import torch
import torch.nn as nn

from optimizers import MuonAdamW
from tests._optim_helpers import same_bits, state_bits

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


ALGOS = ["muon", "normuon", "aurora", "soap"]


def make(device="cpu", seed=1, algo="muon", soap_frequency=2):
    """Matrix groups of ``algo`` (S_p with p = 2 and a band, head-wise except for SOAP, a plain
    one), an AdamW matrix with S_p and an AdamW vector; SOAP refreshes its bases every
    ``soap_frequency`` calls."""
    g = torch.Generator().manual_seed(seed)

    def param(*shape):
        return nn.Parameter((torch.randn(*shape, generator=g) / 4).to(device))

    sp_mats = [param(24, 16), param(16, 40)]
    head_mat, plain_mat = param(16, 12), param(12, 12)
    adam_mat, vec = param(10, 6), param(16)
    groups = [
        {"params": sp_mats, "algo": algo, "sp_power": 2, "sp_coeff": 0.05, "weight_decay": 0.1,
         "sp_band": "top", "sp_band_tau": 0.5},
        {"params": [head_mat], "algo": algo, "head_dim": 0 if algo == "soap" else 4, "weight_decay": 0.1},
        {"params": [plain_mat], "algo": algo, "nesterov": False},
        {"params": [adam_mat], "algo": "adamw", "sp_power": 0, "sp_coeff": 0.02, "weight_decay": 0.1},
        {"params": [vec], "algo": "adamw", "weight_decay": 0.1},
    ]
    opt = MuonAdamW(groups, lr=0.02, ortho_dtype="float32", soap_precondition_frequency=soap_frequency)
    return opt, sp_mats + [head_mat, plain_mat, adam_mat, vec]


@torch.no_grad()
def plant_negative_zeros(opt):
    """-0.0 in a few entries of every parameter and moment: a skipped step must keep the sign."""
    for group in opt.param_groups:
        for p in group["params"]:
            for t in [p] + [v for k, v in opt.state[p].items() if k != "step"]:
                t.view(-1)[:3] = -0.0


def make_grads(params, seed, bad=None):
    """Seeded gradients, one per parameter on its device; ``bad`` in every third entry."""
    g = torch.Generator().manual_seed(seed)
    grads = []
    for p in params:
        grad = torch.randn(p.shape, generator=g)
        if bad is not None:
            grad.view(-1)[1::3] = bad
        grads.append(grad.to(p.device))
    return grads


def set_grads(params, seed, bad=None):
    for p, grad in zip(params, make_grads(params, seed, bad)):
        p.grad = grad


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("flag", [torch.tensor(True), torch.tensor(1.0), torch.tensor(-2.5, dtype=torch.float64)])
def test_skipped_step_changes_no_bit_even_with_nonfinite_gradients(bad, flag, algo):
    """The skipped call is SOAP's fourth, one that refreshes its bases."""
    opt, params = make(algo=algo)
    set_grads(params, 0)
    for _ in range(3):  # momentum, moments, counts, NorMuon's and SOAP's state exist before the skipped step
        opt.step()
    plant_negative_zeros(opt)
    before = state_bits(opt)
    set_grads(params, 1, bad)
    opt.step(skip=flag)
    assert same_bits(state_bits(opt), before)
    assert all(opt.state[p] for p in params)


@pytest.mark.parametrize("algo", ALGOS)
def test_skip_zero_equals_no_skip_and_a_skipped_step_is_no_step(algo):
    """Run A: steps 0, 1, 3 with skip=None. Run B: the same with skip=0 (bool and float), and a
    skipped step 2 with NaN gradients in between. Every parameter and state tensor agrees bit for
    bit after each step: Adam's counts did not advance on the skipped step (its bias correction
    would differ) and nothing else moved. (SOAP's refresh schedule counts calls, skipped ones
    included: no refresh falls in this run.)"""
    opt_a, params_a = make(algo=algo, soap_frequency=1000)
    opt_b, params_b = make(algo=algo, soap_frequency=1000)
    for step, flag in [(0, torch.tensor(False)), (1, torch.tensor(0.0))]:
        set_grads(params_a, step), set_grads(params_b, step)
        opt_a.step(), opt_b.step(skip=flag)
        assert same_bits(state_bits(opt_a), state_bits(opt_b)), step
    plant_negative_zeros(opt_a), plant_negative_zeros(opt_b)
    set_grads(params_b, 2, float("nan"))
    opt_b.step(skip=torch.tensor(True))
    set_grads(params_a, 3), set_grads(params_b, 3)
    opt_a.step(), opt_b.step(skip=torch.tensor(False))
    assert same_bits(state_bits(opt_a), state_bits(opt_b))
    assert [float(opt_b.state[p]["step"]) for p in params_b[-2:]] == [3.0, 3.0]
    assert not torch.equal(params_a[0], make()[1][0])  # the steps moved the parameters


@pytest.mark.parametrize("algo", ["muon", "normuon", "aurora"])
def test_first_step_skipped_then_taken_equals_one_fresh_step(algo):
    """(Not SOAP: its first call sets the eigenbases from the gradient; skipped, it leaves the
    identity bases, and the next call is an Adam step in them.)"""
    opt_a, params_a = make(algo=algo)
    opt_b, params_b = make(algo=algo)
    set_grads(params_b, 5, float("inf"))
    opt_b.step(skip=torch.tensor(True))  # state is created (zeros, count 0): as if there were none
    set_grads(params_a, 6), set_grads(params_b, 6)
    opt_a.step(), opt_b.step(skip=torch.tensor(False))
    assert same_bits(state_bits(opt_a), state_bits(opt_b))


@pytest.mark.parametrize("skip,match", [
    (torch.tensor([True]), r"skip must be a 0-dim tensor \(bool or float\) or None; got \(1,\)"),
    (True, "skip must be a 0-dim tensor .* got bool"),
    (torch.tensor(1), "skip has dtype torch.int64; expected torch.bool or a float dtype"),
    (torch.tensor(True, device="meta"), "skip is on meta; expected the parameters' device cpu"),
])
def test_bad_skip_is_named(skip, match):
    opt, params = make()
    set_grads(params, 0)
    with pytest.raises(ValueError, match=match):
        opt.step(skip=skip)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("algo", ALGOS)
def test_gpu_step_never_synchronises_and_skips_exactly(algo):
    """Under ``set_sync_debug_mode("error")`` any device-to-host wait raises: the step with a
    device flag (set and unset) and without one issues none (SOAP's calls 3-5 include a basis
    refresh: QR, no eigh; the momentum runs compiled). The flag comes from the gradients on the
    device, as a trainer's non-finite check would make it."""
    opt, params = make("cuda", algo=algo)
    set_grads(params, 0)
    # outside the checked region: state creation (SOAP: eigh, which checks its result on the host)
    # and the compilation of the momentum kernels, with and without a flag
    opt.step()
    opt.step(skip=torch.zeros((), dtype=torch.bool, device="cuda"))
    torch.cuda.synchronize()
    set_grads(params, 1, float("nan"))
    finite = make_grads(params, 2)  # made outside: a copy from the host synchronises
    plant_negative_zeros(opt)
    before = state_bits(opt)
    torch.cuda.set_sync_debug_mode("error")
    try:
        norms = torch.stack(torch._foreach_norm([p.grad for p in params]))
        opt.step(skip=~torch.isfinite(norms).all())
        for p, grad in zip(params, finite):
            p.grad = grad
        norms = torch.stack(torch._foreach_norm([p.grad for p in params]))
        skipped = state_bits(opt)
        opt.step(skip=~torch.isfinite(norms).all())
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert same_bits(skipped, before)
    assert not same_bits(state_bits(opt), before)


@pytest.mark.gpu
@cuda
def test_gpu_compiled_momentum_matches_eager():
    """The compiled momentum kernels (the CUDA default) against the eager foreach path: momentum
    buffers agree to fp32 rounding (the compiled ones may fuse mu * B + G into one FMA), and a
    skipped step leaves both bit for bit. Where mu * B and G nearly cancel, one rounding instead of
    two differs by an ulp of the operands (|G| up to about 4: 5e-7), not of the small result."""
    runs = []
    for compiled in (True, False):
        opt, params = make("cuda", algo="muon")
        for group in opt.param_groups:
            group["compile_momentum"] = compiled
        for step in range(3):
            set_grads(params, step)
            opt.step()
        before = state_bits(opt)
        set_grads(params, 9, float("nan"))
        opt.step(skip=torch.ones((), dtype=torch.bool, device="cuda"))
        assert same_bits(state_bits(opt), before)
        runs.append([opt.state[p]["momentum_buffer"] for p in params if "momentum_buffer" in opt.state[p]])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=2e-6)
