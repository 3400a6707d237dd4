"""The fused projection norm + RoPE (``kernels.projection``) against its fp64 PyTorch reference.

CPU: the Triton kernels run under TRITON_INTERPRET=1 in one child process (tests/_interpret.py);
GPU tests (marked ``gpu``) run them at the 0.6B model's shapes.
"""

import math

import pytest
import torch

from kernels.projection import naive
from tests._interpret import rel_err, run_interpreted

# name -> (B, L, Hq, Hkv, D, dtype, rope_rho, table rows beyond L)
CASES = {
    "gqa2_odd_len": (2, 37, 4, 2, 16, "float32", True, 0),
    "no_rho_rope_longer_table": (1, 70, 2, 1, 32, "float32", False, 9),
    "mha_d64": (1, 5, 2, 2, 64, "float32", True, 3),
    "bf16": (2, 33, 4, 2, 32, "bfloat16", True, 0),
    "partials_beyond_one_block": (1, 4100, 4, 2, 16, "float32", True, 0),  # 65 tiles x 4 heads of q and rho
}
TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def rope_table(positions: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """(positions, 2d) fp32 cos | sin rows, as TorchTitan's Qwen3 RoPE cache lays them out."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def make_case(b, n, hq, hkv, d, dtype, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    y = 2 * torch.randn(b, n, (2 * hq + 2 * hkv) * d, generator=gen)
    weights = [1 + 0.5 * torch.randn(d, generator=gen) for _ in range(3)]
    grads = [torch.randn(b, n, h, d, generator=gen) for h in (hq, hkv, hkv, hq)]
    dt = getattr(torch, dtype)
    return y.to(dt), [w.to(dt) for w in weights], rope_table(n + extra, d), [g.to(dt) for g in grads]


def _interpret_jobs():
    """Child processes (TRITON_INTERPRET=1): one job per case (outputs and gradients of the fused op),
    a strided y, and the model's projection through both branches."""
    from functools import partial

    jobs = [partial(_case_results, seed, name, spec) for seed, (name, spec) in enumerate(CASES.items())]
    return jobs + [_strided_case, lambda: {"mixed_weights": _mixed_weights_case()}, _launch_cases, _reduction_cases,
                   lambda: {"model": _model_case()}, lambda: {"opcheck": _opcheck()},
                   lambda: {"odd_table": _odd_table_results()}]


def _opcheck():
    """torch.library.opcheck on both custom ops (schema, fake tensors, autograd registration), with and
    without RoPE on rho; the errors as text (the parent fails the test on any)."""
    from kernels.projection import ops

    from kernels.projection.api import rope_angles

    y, weights, table, grads = make_case(2, 9, 2, 1, 16, "float32", 2, 11)
    angles = rope_angles(table, 9, y.dtype)
    errors = []
    for rope_rho in (True, False):
        fwd_args = (y.clone().requires_grad_(), 2, 1, *[w.clone().requires_grad_() for w in weights], 1e-6,
                    angles, rope_rho)
        bwd_args = (*grads, y, 2, 1, *weights, 1e-6, angles, rope_rho)
        for op, args in ((ops.split_norm_rope_op, fwd_args), (ops.split_norm_rope_bwd, bwd_args)):
            try:
                torch.library.opcheck(op, args)
            except Exception as exc:
                errors.append(f"{op}: {exc!r}"[:2000])
    return errors


def _case_results(seed, name, spec):
    from kernels import split_norm_rope

    b, n, hq, hkv, d, dtype, rope_rho, extra = spec
    y, weights, table, grads = make_case(b, n, hq, hkv, d, dtype, extra, seed)
    leaves = [t.clone().requires_grad_() for t in (y, *weights)]
    outs = split_norm_rope(leaves[0], hq, hkv, leaves[1:], 1e-6, table, rope_rho)
    torch.autograd.backward(outs, grads)
    return {name: {"outs": [o.detach() for o in outs], "grads": [t.grad for t in leaves],
                   "contiguous": all(o.is_contiguous() for o in outs)}}


def mixed_weights_case():
    """fp32 y with norm weights of two dtypes (bf16, fp32, fp16)."""
    y, weights, table, grads = make_case(1, 13, 2, 1, 16, "float32", 0, 31)
    return y, [w.to(dt) for w, dt in zip(weights, (torch.bfloat16, torch.float32, torch.float16))], table, grads


def _mixed_weights_case():
    from kernels import split_norm_rope

    y, weights, table, grads = mixed_weights_case()
    leaves = [t.clone().requires_grad_() for t in (y, *weights)]
    torch.autograd.backward(split_norm_rope(leaves[0], 2, 1, leaves[1:], 1e-6, table), grads)
    outs = split_norm_rope(y, 2, 1, weights, 1e-6, table)
    return [o.detach() for o in outs] + [t.grad for t in leaves]


LAUNCHES = [(16, 4, 3), (32, 2, 1), (8, 1, 2)]  # tiles per program beyond the tokens' end, one warp


def _launch_cases():
    """fused.forward and fused.backward called with explicit launch configs on a 53-token case."""
    from kernels.projection import fused
    from kernels.projection.api import rope_angles

    y, weights, table, grads = make_case(1, 53, 4, 2, 16, "float32", 0, 41)
    angles = rope_angles(table, 53, y.dtype)
    runs = {}
    for bt, warps, tiles in LAUNCHES:
        launch = fused.Launch(bt, warps, tiles)
        runs[(bt, warps, tiles)] = [*fused.forward(y, 4, 2, weights, 1e-6, angles, True, launch),
                                    *fused.backward(grads, y, 4, 2, weights, 1e-6, angles, True, launch)]
    return {"launches": runs}


REDUCTIONS = [(16, 256, 4), (8, 16, 2), (4, 8, 1), (32, 32, 1)]  # the last wider than D = 16: D columns


def reduction_case(d, seed):
    """(partial rows of 37 spans x (2 x 4 + 2) head slots of width d, fp32; spans)."""
    return torch.randn(37 * 10, d, generator=torch.Generator().manual_seed(seed)), 37


def _reduction_cases():
    """fused.weight_grads over each REDUCTIONS launch, at head dims 16 and 64, gradients in three dtypes."""
    from kernels.projection import fused

    runs = {}
    for d in (16, 64):
        part, spans = reduction_case(d, d)
        for reduction in REDUCTIONS:
            runs[(d, reduction)] = fused.weight_grads(part, [torch.float32, torch.bfloat16, torch.float16], spans, 4, 2,
                                                      fused.Reduction(*reduction))
    return {"reductions": runs}


def odd_table_case():
    """A bf16 case whose RoPE rows are random: their second halves do not repeat the first."""
    y, weights, _, grads = make_case(1, 11, 2, 1, 16, "bfloat16", 0, 21)
    return y, weights, torch.randn(11, 32, generator=torch.Generator().manual_seed(3)), grads


def _odd_table_results():
    from kernels import split_norm_rope

    y, weights, table, grads = odd_table_case()
    leaves = [t.clone().requires_grad_() for t in (y, *weights)]
    outs = split_norm_rope(leaves[0], 2, 1, leaves[1:], 1e-6, table)
    torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs] + [t.grad for t in leaves]


def _strided_case():
    """y as a non-contiguous view (every other token of a longer buffer): the kernels index by its stride."""
    from kernels import split_norm_rope

    y, weights, table, grads = make_case(1, 20, 2, 1, 16, "float32", 0, 99)
    wide = torch.zeros(1, 40, y.shape[-1])
    wide[:, ::2] = y
    outs = split_norm_rope(wide[:, ::2], 2, 1, weights, 1e-6, table)
    same = split_norm_rope(y, 2, 1, weights, 1e-6, table)
    # weights and table as strided views (every other element / row-major transposed back)
    views = [torch.stack([w, torch.zeros_like(w)], -1)[..., 0] for w in weights]
    table_view = table.t().contiguous().t()
    leaves = [t.clone().requires_grad_() for t in (y, *views)]
    strided = split_norm_rope(leaves[0], 2, 1, leaves[1:], 1e-6, table_view)
    torch.autograd.backward(strided, grads)
    leaves_c = [t.clone().requires_grad_() for t in (y, *weights)]
    torch.autograd.backward(split_norm_rope(leaves_c[0], 2, 1, leaves_c[1:], 1e-6, table), grads)
    views_equal = all(torch.equal(a, b) for a, b in zip(strided, same))
    grads_equal = all(torch.equal(a.grad, b.grad) for a, b in zip(leaves, leaves_c))
    return {"strided": {"equal": all(torch.equal(a, b) for a, b in zip(outs, same)), "views_equal": views_equal,
                        "grads_equal": grads_equal, "views_strided": not views[0].is_contiguous()
                        and not table_view.is_contiguous()}}


def _model_args(**changes):
    import dataclasses

    from eval.mad.models import mad_model_args

    return dataclasses.replace(mad_model_args("parallax", 16, 12, dim=64, n_heads=4), **changes)  # heads of 16


def _model_case():
    """ParallaxAttention.project through the fused branch (forced: on CPU it is not chosen) against its
    TorchTitan-module branch, same weights: outputs and the input's and weights' gradients."""
    from parallax_titan.model import ParallaxAttention, ParallaxQwen3Model

    args = _model_args(rho_rope=True)
    torch.manual_seed(0)
    attention = ParallaxAttention(args)
    with torch.no_grad():
        attention.init_weights(0.02)
        attention.r_norm.weight.normal_()
    rope = ParallaxQwen3Model(args).rope_cache
    x = torch.randn(2, 12, 64)
    runs = []
    for fused in (False, True):
        attention.zero_grad()
        attention._fused_norm_rope = lambda *_: fused  # noqa: B023
        leaf = x.clone().requires_grad_()
        outs = attention.project(leaf, rope, None)
        sum((o * torch.arange(o.numel()).reshape(o.shape).sin()).sum() for o in outs).backward()
        runs.append([o.detach() for o in outs] + [leaf.grad] + [p.grad.clone() for p in attention.parameters()
                                                                  if p.grad is not None])
    return runs


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return run_interpreted("tests.test_projection_kernel", tmp_path_factory.mktemp("proj"))


def reference(name):
    """fp64 outputs and gradients (y, w_q, w_k, w_rho) of the naive op for case ``name``."""
    b, n, hq, hkv, d, dtype, rope_rho, extra = CASES[name]
    y, weights, table, grads = make_case(b, n, hq, hkv, d, dtype, extra, list(CASES).index(name))
    leaves = [t.double().requires_grad_() for t in (y, *weights)]
    outs = naive.split_norm_rope(leaves[0], hq, hkv, leaves[1:], 1e-6, table.double(), rope_rho)
    torch.autograd.backward(outs, [g.double() for g in grads])
    return [o.detach() for o in outs], [t.grad for t in leaves]


@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_matches_fp64(interpreted, name):
    res, (outs, grads) = interpreted[name], reference(name)
    tol = TOL[CASES[name][5]]
    errors = [rel_err(a, b) for a, b in zip(res["outs"] + res["grads"], outs + grads)]
    assert all(e < tol for e in errors), errors
    assert res["contiguous"]
    assert [t.dtype for t in res["grads"]] == [getattr(torch, CASES[name][5])] * 4


def test_interpreted_reads_the_first_halves_of_the_rope_rows(interpreted):
    """RoPE rows whose second halves do not repeat the first (not TorchTitan's): the kernels and the
    reference both turn each pair by the first halves' angle, so they still agree."""
    y, weights, table, grads = odd_table_case()
    leaves = [t.double().requires_grad_() for t in (y, *weights)]
    outs = naive.split_norm_rope(leaves[0], 2, 1, leaves[1:], 1e-6, table.double())
    torch.autograd.backward(outs, [g.double() for g in grads])
    errors = [rel_err(a, b) for a, b in zip(interpreted["odd_table"], [*outs, *(t.grad for t in leaves)])]
    assert all(e < TOL["bfloat16"] for e in errors), errors


def test_interpreted_takes_norm_weights_of_several_dtypes(interpreted):
    """Weights of three dtypes: each gradient comes back in its weight's dtype, the values as fp64's."""
    y, weights, table, grads = mixed_weights_case()
    leaves = [t.double().requires_grad_() for t in (y, *weights)]
    outs = naive.split_norm_rope(leaves[0], 2, 1, leaves[1:], 1e-6, table.double())
    torch.autograd.backward(outs, [g.double() for g in grads])
    got = interpreted["mixed_weights"]
    assert [t.dtype for t in got[4:]] == [torch.float32, torch.bfloat16, torch.float32, torch.float16]
    errors = [rel_err(a, b) for a, b in zip(got, [*outs, *(t.grad for t in leaves)])]
    assert all(e < 1e-5 for e in errors[:5]) and all(e < 1e-2 for e in errors[5:]), errors


def test_interpreted_launch_configs_agree_with_fp64(interpreted):
    """Tiles of 8 to 32 tokens, 1 to 3 tiles per program (the last program's tiles past the end), 1 to 4
    warps: outputs, dy and the weights' gradients as fp64's."""
    y, weights, table, grads = make_case(1, 53, 4, 2, 16, "float32", 0, 41)
    leaves = [t.double().requires_grad_() for t in (y, *weights)]
    outs = naive.split_norm_rope(leaves[0], 4, 2, leaves[1:], 1e-6, table.double())
    torch.autograd.backward(outs, [g.double() for g in grads])
    expected = [*outs, *(t.grad for t in leaves)]
    assert sorted(interpreted["launches"]) == sorted(LAUNCHES)
    for launch, got in interpreted["launches"].items():
        errors = [rel_err(a, b) for a, b in zip(got, expected)]
        assert len(errors) == 8 and all(e < 1e-5 for e in errors), (launch, errors)


def test_interpreted_weight_grads_reduction_sums_each_groups_partial_rows(interpreted):
    """Each reduction launch (columns per program, rows per step, warps; columns wider than the head dim)
    sums the q, k and rho slots' partial rows over every span, as fp64 does, in each weight's dtype."""
    assert len(interpreted["reductions"]) == 2 * len(REDUCTIONS)
    for (d, reduction), got in interpreted["reductions"].items():
        part, spans = reduction_case(d, d)
        slots = part.double().view(spans, 10, d)
        expected = [slots[:, :4].sum((0, 1)), slots[:, 4:6].sum((0, 1)), slots[:, 6:].sum((0, 1))]
        assert [g.dtype for g in got] == [torch.float32, torch.bfloat16, torch.float16]
        errors = [rel_err(a, b) for a, b in zip(got, expected)]
        assert errors[0] < 1e-6 and max(errors[1:]) < 1e-2, (d, reduction, errors)


def test_interpreted_custom_ops_pass_opcheck(interpreted):
    assert interpreted["opcheck"] == []


def test_interpreted_reads_strided_y_weights_and_table(interpreted):
    """y as a strided view, and the norm weights and RoPE table as non-contiguous views: the same bits
    (outputs and gradients) as contiguous inputs."""
    res = interpreted["strided"]
    assert res["equal"] and res["views_strided"] and res["views_equal"] and res["grads_equal"]


def test_interpreted_model_projection_takes_either_branch_alike(interpreted):
    """ParallaxAttention.project's fused branch returns q, r, k, v (that order) and gradients of the
    input and every weight as its TorchTitan-module branch does."""
    plain, fused = interpreted["model"]
    assert len(plain) == len(fused) == 4 + 1 + 7  # q, r, k, v; x; wq, wk, wv, wr and the three norms
    errors = [rel_err(a, b) for a, b in zip(fused, plain)]
    assert all(e < 1e-5 for e in errors), errors


def test_one_launch_each_way_and_no_copy_of_v(monkeypatch):
    """The forward is one launch, the backward one launch and the weight gradients' reduction; k's
    programs move v and its gradient: the host code around the launches runs no aten copy (a strided
    slice's copy of v and ``dy[..., v] = dv`` were two copies per layer and step)."""
    from kernels.projection import fused
    from kernels.projection.api import rope_angles
    from tests._aten_ops import recorded_ops

    launches = []

    class Launches:  # stands in for a kernel: records each launch's grid
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.name, grid))

    for name in ("_forward_kernel", "_backward_kernel", "_weight_grads_kernel"):
        monkeypatch.setattr(fused, name, Launches(name))
    y, weights, table, grads = make_case(2, 9, 2, 1, 16, "float32", 0, 5)
    angles = rope_angles(table, 9, y.dtype)
    ops = recorded_ops(lambda: fused.forward(y, 2, 1, weights, 1e-6, angles, True))
    ops += recorded_ops(lambda: fused.backward(grads, y, 2, 1, weights, 1e-6, angles, True))
    spans = [-(-18 // (launch.bt * launch.tiles)) for launch in (fused.forward_launch(16), fused.BACKWARD)]
    assert launches == [("_forward_kernel", (spans[0] * 5,)), ("_backward_kernel", (spans[1] * 5,)),
                        ("_weight_grads_kernel", (3, 16 // fused.REDUCTION.cols))]
    assert not [op for op in ops if any(word in op for word in ("copy", "clone", "scatter", "cat", "stack"))], ops


def test_the_forward_launches_with_its_head_dims_config(monkeypatch):
    """Without an explicit launch the forward takes ``forward_launch(D)``: the per-head-dim entry at 128,
    the general one elsewhere; an explicit launch wins."""
    from kernels.projection import fused

    seen = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append((kwargs["BT"], kwargs["num_warps"], kwargs["TILES"]))

    monkeypatch.setattr(fused, "_forward_kernel", Kernel())
    for d in (128, 64):
        y, weights, table, _ = make_case(1, 3, 2, 1, d, "float32", 0, 1)
        fused.forward(y, 2, 1, weights, 1e-6, table[:, :d], True)
    fused.forward(y, 2, 1, weights, 1e-6, table[:, :64], True, fused.Launch(16, 2, 3))
    assert seen == [tuple(fused.FORWARD_BY_HEAD_DIM[128]), tuple(fused.FORWARD), (16, 2, 3)]


@pytest.mark.parametrize("change", [{}, dict(gate="token"), dict(attn_backend="reference"), dict(qk_norm=False),
                                    dict(head_dim=64), dict(head_dim=12), dict(head_dim=32), "positions", "decode rows",
                                    "switched off"])
def test_model_takes_the_fused_path_only_where_it_applies(change, monkeypatch):
    """On CUDA (faked here) only the plain case (heads of 128 or 64) takes it: not with a gate, the reference
    backend, no q/k norms, heads of 12 or 32, explicit positions, a decode step's RoPE rows or
    ``fused_norm_rope`` off."""
    from parallax_titan.model import ParallaxAttention, ParallaxQwen3Model

    args = _model_args(**{"head_dim": 128, **(change if isinstance(change, dict) else {})})
    attention = ParallaxAttention(args)
    attention.fused_norm_rope = change != "switched off"
    rope = ParallaxQwen3Model(args).rope_cache
    positions = torch.arange(12)[None] if change == "positions" else None
    rope = rope[:1][None, :, None] if change == "decode rows" else rope
    x = torch.randn(1, 12, args.dim)
    assert not attention._fused_norm_rope(x, rope, positions)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert attention._fused_norm_rope(x, rope, positions) == (change in ({}, dict(head_dim=64)))


def test_reference_is_the_models_unfused_path():
    """naive.split_norm_rope equals the model's path: TorchTitan's norms and apply_rope on fused_linear."""
    from parallax_titan.model import apply_rope

    y, weights, table, _ = make_case(2, 9, 4, 2, 16, "float32", 0, 5)
    q, k, v, r = y.split([64, 32, 32, 64], dim=-1)
    norms = [torch.nn.RMSNorm(16, eps=1e-6) for _ in range(3)]
    for norm, w in zip(norms, weights):
        norm.weight.data.copy_(w)
    shape = (2, 9, -1, 16)
    expected = [apply_rope(norms[0](q.reshape(shape)), table, None),
                apply_rope(norms[1](k.reshape(shape)), table, None),
                v.reshape(shape), apply_rope(norms[2](r.reshape(shape)), table, None)]
    got = naive.split_norm_rope(y, 4, 2, weights, 1e-6, table)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))


@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "y": a["y"][0]}, "y must be a"),
    (lambda a: {**a, "hq": 3}, "width"),
    (lambda a: {**a, "table": a["table"][:, :30]}, "power of two"),
    (lambda a: {**a, "table": a["table"][:, :24]}, "power of two"),
    (lambda a: {**a, "table": a["table"][:5]}, "positions"),
    (lambda a: {**a, "table": a["table"].long()}, "table must hold floats"),
    (lambda a: {**a, "weights": a["weights"][:2]}, "three"),
    (lambda a: {**a, "weights": [a["weights"][0].long(), *a["weights"][1:]]}, "float tensors"),
    (lambda a: {**a, "y": a["y"].double()}, "fp16/bf16/fp32"),
    (lambda a: {**a, "y": a["y"].long()}, "fp16/bf16/fp32"),
    (lambda a: {**a, "eps": 0.0}, "eps"),
    (lambda a: {**a, "eps": math.nan}, "eps"),
    (lambda a: {**a, "y": a["y"].tolist()}, "y must be a torch.Tensor, got list"),
    (lambda a: {**a, "table": a["table"].tolist()}, "table must be a torch.Tensor, got list"),
    (lambda a: {**a, "weights": None}, r"weights must be three \(16,\) float tensors, got NoneType"),
    (lambda a: {**a, "weights": [w.tolist() for w in a["weights"]]}, r"weights must be three \(16,\) float tensors"),
    (lambda a: {**a, "hq": 4.0}, "hq=4.0 and hkv=2 must be ints >= 1"),
    (lambda a: {**a, "hq": "4"}, "hq='4' and hkv=2 must be ints >= 1"),
    (lambda a: {**a, "hkv": True, "hq": 1, "y": a["y"][..., :64]}, "hq=1 and hkv=True must be ints >= 1"),
    (lambda a: {**a, "eps": math.inf}, "eps=inf must be a finite positive number"),
    (lambda a: {**a, "eps": "1e-6"}, "eps='1e-6' must be a finite positive number"),
    (lambda a: {**a, "eps": True}, "eps=True must be a finite positive number"),
    (lambda a: {**a, "rope_rho": "no"}, "rope_rho='no' must be a bool"),
    (lambda a: {**a, "weights": [*a["weights"][:2], a["weights"][2].to("meta")]}, "weights\\[2\\] is on meta, y on cpu"),
    (lambda a: {**a, "table": a["table"].to("meta")}, "table is on meta, y on cpu"),
])
def test_bad_input_names_the_argument(change, match):
    from kernels import split_norm_rope

    y, weights, table, _ = make_case(1, 9, 4, 2, 16, "float32", 0, 3)
    args = change({"y": y, "hq": 4, "hkv": 2, "weights": weights, "eps": 1e-6, "table": table})
    with pytest.raises((ValueError, TypeError), match=match):
        split_norm_rope(**args)


def test_cpu_tensors_need_cuda_or_the_interpreter(monkeypatch):
    """Valid CPU arguments outside the interpreter: a ValueError naming the device, not Triton's driver error."""
    from kernels import split_norm_rope

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    y, weights, table, _ = make_case(1, 9, 4, 2, 16, "float32", 0, 3)
    with pytest.raises(ValueError, match="split_norm_rope: needs CUDA tensors .y is on cpu. or TRITON_INTERPRET=1"):
        split_norm_rope(y, 4, 2, weights, 1e-6, table)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _gpu_run(y, hq, hkv, weights, table, grads):
    from kernels import split_norm_rope

    leaves = [t.detach().clone().requires_grad_() for t in (y, *weights)]
    outs = split_norm_rope(leaves[0], hq, hkv, leaves[1:], 1e-6, table)
    torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs] + [t.grad for t in leaves]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_matches_fp64_and_is_deterministic(d):
    """The 0.6B layer's heads (16 q and rho, 8 k and v) over 2 x 1000 tokens in bf16: within bf16
    rounding of fp64, and bit for bit the same in two runs (weight gradients included)."""
    y, weights, table, grads = make_case(2, 1000, 16, 8, d, "bfloat16", 0, 7)
    y, table = y.cuda(), table.cuda()
    weights, grads = [w.cuda() for w in weights], [g.cuda() for g in grads]
    first, second = _gpu_run(y, 16, 8, weights, table, grads), _gpu_run(y, 16, 8, weights, table, grads)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    leaves = [t.double().requires_grad_() for t in (y, *weights)]
    outs = naive.split_norm_rope(leaves[0], 16, 8, leaves[1:], 1e-6, table.double())
    torch.autograd.backward(outs, [g.double() for g in grads])
    errors = [rel_err(a, b) for a, b in zip(first, [o.detach() for o in outs] + [t.grad for t in leaves])]
    assert all(e < 1e-2 for e in errors), errors


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_compiled_model_projection_is_as_close_to_fp64_as_the_modules(d):
    """ParallaxAttention.project compiled on CUDA in bf16, the fused path and the module path, against
    the module path in fp64, heads of 128 and of 64 (Parallax-dagger's): outputs, the input's and every
    weight's gradient. The output gradients follow the outputs (o + 0.01), so the norms' backward
    cancels most of them: the module path, which rounds the RoPE backward's result to bf16 before the
    norm's backward, errs more there."""
    import copy

    from parallax_titan.model import ParallaxAttention, ParallaxModelArgs, ParallaxQwen3Model

    args = ParallaxModelArgs(dim=512, n_heads=512 // d, n_kv_heads=256 // d, head_dim=d, n_layers=1, vocab_size=256)
    torch.manual_seed(0)
    attention = ParallaxAttention(args).to("cuda", torch.bfloat16)
    with torch.no_grad():
        attention.init_weights(0.02)
        attention.r_norm.weight.normal_()
    rope = ParallaxQwen3Model(args).rope_cache.cuda()
    x = torch.randn(2, 512, 512, device="cuda", dtype=torch.bfloat16)
    assert attention._fused_norm_rope(x, rope, None)
    exact = copy.deepcopy(attention).double()
    exact.fused_norm_rope = False

    with torch.no_grad():
        grads = [o + 0.01 for o in exact.project(x.double(), rope, None)]

    def run(module, inputs, compiled):
        module.zero_grad()
        leaf = inputs.clone().requires_grad_()
        fn = lambda t: module.project(t, rope, None)  # noqa: E731
        outs = (torch.compile(fn) if compiled else fn)(leaf)
        torch.autograd.backward(outs, [g.to(o.dtype) for g, o in zip(grads, outs)])
        torch._dynamo.reset()
        return [o.detach() for o in outs] + [leaf.grad] + [p.grad for p in module.parameters() if p.grad is not None]

    fused = run(attention, x, True)
    attention.fused_norm_rope = False
    modules = run(attention, x, True)
    reference = run(exact, x.double(), False)
    err_fused = [rel_err(a, b) for a, b in zip(fused, reference)]
    err_modules = [rel_err(a, b) for a, b in zip(modules, reference)]
    assert len(err_fused) == len(err_modules) == 12
    assert all(f <= max(1.5 * m, 1e-2) for f, m in zip(err_fused, err_modules)), (err_fused, err_modules)
