"""Value Averaging, Affine Linear Attention and Affine MesaNet (SPEC 1b): chunked PyTorch forms and
the recurrent (decode) state against fp64 loop references (tests/_family_reference.py).
The Triton Affine LA kernels are tested in test_family_fused.py."""

from __future__ import annotations

import pytest
import torch

from kernels import AffineState, affine_linear_attention, affine_mesanet, value_averaging
from kernels.family.scan import prefix_sum
from kernels.family.recurrent import affine_linear_attention_step, affine_mesanet_step, value_averaging_step
from tests import _family_reference as ref

F64 = torch.float64
# name -> (B, L, Hq, Hkv, D, chunk)
SHAPES = {
    "mha_one_chunk": (1, 7, 2, 2, 4, 64),
    "gqa2_odd_chunks": (2, 11, 4, 2, 6, 4),
    "gqa3_chunk1": (1, 6, 3, 1, 5, 1),
    "len1": (1, 1, 2, 1, 3, 4),
}


def make(b, n, hq, hkv, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, hq, d, generator=gen, dtype=F64)
    r = torch.randn(b, n, hq, d, generator=gen, dtype=F64) * 0.5
    k, v = (torch.randn(b, n, hkv, d, generator=gen, dtype=F64) for _ in range(2))
    do = torch.randn(b, n, hq, d, generator=gen, dtype=F64)
    return q, r, k, v, do


def grads(fn, inputs, do):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    out.backward(do)
    return out.detach(), [x.grad for x in leaves]


def assert_grads_match(fn, reference, inputs, do, tol=1e-10):
    out, got = grads(fn, inputs, do)
    out_ref, want = grads(reference, inputs, do)
    torch.testing.assert_close(out, out_ref, rtol=tol, atol=tol)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=f"gradient of input {i}")


@pytest.mark.parametrize("name", list(SHAPES))
def test_value_averaging(name):
    b, n, hq, hkv, d, _ = SHAPES[name]
    q, _, k, v, do = make(b, n, hq, hkv, d, seed=1)
    assert_grads_match(lambda v: value_averaging(v, q_heads=hq), lambda v: ref.value_averaging(q, k, v), [v], do)
    assert value_averaging(v.float()).shape == (b, n, hkv, d) and value_averaging(v.float()).dtype == torch.float32


@pytest.mark.parametrize("intercept", [True, False])
@pytest.mark.parametrize("name", list(SHAPES))
def test_affine_linear_attention(name, intercept):
    b, n, hq, hkv, d, chunk = SHAPES[name]
    _, r, k, v, do = make(b, n, hq, hkv, d, seed=2)
    assert_grads_match(lambda *x: affine_linear_attention(*x, intercept=intercept, chunk=chunk),
                       lambda *x: ref.affine_linear_attention(*x, intercept), [r, k, v], do)


@pytest.mark.parametrize("intercept", [True, False])
@pytest.mark.parametrize("name", list(SHAPES))
def test_affine_mesanet(name, intercept):
    b, n, hq, hkv, d, chunk = SHAPES[name]
    q, _, k, v, do = make(b, n, hq, hkv, d, seed=3)
    assert_grads_match(lambda *x: affine_mesanet(*x, lam=0.3, intercept=intercept, chunk=chunk),
                       lambda *x: ref.affine_mesanet(*x, 0.3, intercept), [q, k, v], do, tol=1e-9)


@pytest.mark.parametrize("intercept", [True, False])
def test_gradcheck(intercept):
    q, r, k, v, _ = make(1, 5, 2, 1, 3, seed=4)
    lam = torch.tensor([0.5, 1.5], dtype=F64)
    leaves = [x.requires_grad_() for x in (q, r, k, v, lam)]
    assert torch.autograd.gradcheck(lambda r, k, v: affine_linear_attention(r, k, v, intercept=intercept, chunk=2),
                                    leaves[1:4])
    assert torch.autograd.gradcheck(
        lambda q, k, v, lam: affine_mesanet(q, k, v, lam=lam, intercept=intercept, chunk=2), [*leaves[:1], *leaves[2:]])
    torch.testing.assert_close(affine_mesanet(q, k, v, lam=lam, intercept=intercept),
                               ref.affine_mesanet(q, k, v, lam, intercept), rtol=1e-10, atol=1e-10)


def test_dense_weights_form_matches_loop_reference():
    """The vectorised fp64 reference used by the Triton tests agrees with the loop reference."""
    _, r, k, v, _ = make(2, 9, 4, 2, 5, seed=5)
    for intercept in (True, False):
        torch.testing.assert_close(ref.affine_linear_attention_dense(r, k, v, intercept),
                                   ref.affine_linear_attention(r, k, v, intercept), rtol=1e-12, atol=1e-12)


def test_small_probe_and_large_lambda_give_value_averaging():
    q, r, k, v, _ = make(2, 10, 4, 2, 6, seed=6)
    va = value_averaging(v, q_heads=4)
    assert (affine_linear_attention(r, k, v) - va).abs().max() > 1e-2
    assert (affine_linear_attention(r * 1e-9, k, v) - va).abs().max() < 1e-8
    torch.testing.assert_close(affine_linear_attention(torch.zeros_like(r), k, v), va, rtol=0, atol=1e-15)
    assert (affine_mesanet(q, k, v, lam=1.0) - va).abs().max() > 1e-2
    assert (affine_mesanet(q, k, v, lam=1e9) - va).abs().max() < 1e-7


def test_without_intercept_standard_forms():
    """Dropping the intercept: linear attention of probe -r normalised by i, and MesaNet
    S_vk (S_kk + i lam I)^-1 q (the same as (S_vk/i)(S_kk/i + lam I)^-1 q)."""
    q, r, k, v, _ = make(1, 8, 2, 2, 4, seed=7)
    kh, vh = k[0].transpose(0, 1), v[0].transpose(0, 1)  # (H, L, D)
    for i in range(8):
        s_vk = vh[:, :i + 1].transpose(1, 2) @ kh[:, :i + 1]
        s_kk = kh[:, :i + 1].transpose(1, 2) @ kh[:, :i + 1]
        la = -(s_vk @ r[0, i, :, :, None])[..., 0] / (i + 1)
        mesa = (s_vk @ torch.linalg.solve(s_kk + (i + 1) * 0.4 * torch.eye(4, dtype=F64), q[0, i, :, :, None]))[..., 0]
        torch.testing.assert_close(affine_linear_attention(r, k, v, intercept=False)[0, i], la)
        torch.testing.assert_close(affine_mesanet(q, k, v, lam=0.4, intercept=False)[0, i], mesa)


@pytest.mark.parametrize("intercept", [True, False])
def test_recurrent_steps_equal_chunked_forms(intercept):
    q, r, k, v, _ = make(2, 9, 4, 2, 5, seed=8)
    lam = torch.tensor([0.3, 0.6, 0.9, 1.2], dtype=F64)
    state = AffineState.zeros(2, 2, 5, dtype=F64, with_kk=True)
    outs = {"va": [], "la": [], "mesa": []}
    for i in range(9):
        tok = lambda x: x[:, i:i + 1]  # noqa: E731
        o_va, _ = value_averaging_step(state, tok(k), tok(v), q_heads=4)
        o_la, _ = affine_linear_attention_step(state, tok(r), tok(k), tok(v), intercept=intercept)
        o_mesa, state = affine_mesanet_step(state, tok(q), tok(k), tok(v), lam=lam, intercept=intercept)
        for key, o in zip(outs, (o_va, o_la, o_mesa)):
            outs[key].append(o)
    assert state.count == 9
    torch.testing.assert_close(torch.cat(outs["va"], 1), value_averaging(v, q_heads=4))
    torch.testing.assert_close(torch.cat(outs["la"], 1), affine_linear_attention(r, k, v, intercept=intercept))
    torch.testing.assert_close(torch.cat(outs["mesa"], 1), affine_mesanet(q, k, v, lam=lam, intercept=intercept))


def test_prefill_state_then_decode_continues_the_sequence():
    q, r, k, v, _ = make(1, 10, 2, 1, 4, seed=9)
    lowp = [x.float() for x in (q, r, k, v)]
    state = AffineState.from_sequence(lowp[2][:, :6], lowp[3][:, :6], with_kk=True)
    assert state.s_vk.dtype == torch.float32 and state.count == 6
    full_la = affine_linear_attention(*lowp[1:])
    full_mesa = affine_mesanet(lowp[0], *lowp[2:], lam=0.5)
    for i in range(6, 10):
        o_la, _ = affine_linear_attention_step(state, *(x[:, i:i + 1] for x in lowp[1:]))
        o_mesa, state = affine_mesanet_step(state, *(x[:, i:i + 1] for x in (lowp[0], *lowp[2:])), lam=0.5)
        torch.testing.assert_close(o_la[:, 0], full_la[:, i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(o_mesa[:, 0], full_mesa[:, i], rtol=1e-5, atol=1e-5)


def test_low_precision_inputs():
    _, r, k, v, _ = make(1, 40, 4, 2, 16, seed=10)
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 3e-3), (torch.float32, 1e-6)):
        lowp = [x.to(dtype) for x in (r, k, v)]
        out = affine_linear_attention(*lowp, backend="reference")
        assert out.dtype == dtype
        exact = ref.affine_linear_attention_dense(*(x.double() for x in lowp))
        assert ((out.double() - exact).norm() / exact.norm()).item() < tol


def test_state_errors_are_named():
    state = AffineState.zeros(1, 2, 4)
    token = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="no token in the state yet"):
        state.affine_la(torch.zeros(1, 1, 2, 4))
    state = state.update(token, token)
    with pytest.raises(ValueError, match="no s_kk; build it with with_kk=True"):
        state.affine_mesanet(torch.zeros(1, 1, 2, 4), lam=1.0)
    with pytest.raises(ValueError, match=r"r has 3 heads, expected a multiple of 2"):
        state.affine_la(torch.zeros(1, 1, 3, 4))
    with pytest.raises(ValueError, match=r"k must be a float tensor of shape \(1, 1, heads, 4\)"):
        state.update(torch.zeros(1, 2, 2, 4), token)
    with pytest.raises(ValueError, match=r"k has 4 heads, expected 2"):
        state.update(torch.zeros(1, 1, 4, 4), token)
    with pytest.raises(ValueError, match="dtype=torch.float16, expected torch.float32 or torch.float64"):
        AffineState.zeros(1, 2, 4, dtype=torch.float16)


@pytest.mark.parametrize("call, match", [
    (lambda s, t: s.value_average(3), r"AffineState.value_average: q_heads=3 must be a positive multiple of the kv "
                                      r"heads \(2\)"),
    (lambda s, t: s.value_average(4.0), "q_heads=4.0 must be a positive multiple"),
    (lambda s, t: s.value_average(0), "q_heads=0 must be a positive multiple"),
    (lambda s, t: value_averaging_step(s, t, t, q_heads=3), "q_heads=3 must be a positive multiple"),
    # None would read as False: the raw-moment form, silently
    (lambda s, t: s.affine_la(torch.zeros(1, 1, 2, 4), intercept=None), "intercept=None must be a bool"),
    (lambda s, t: s.affine_mesanet(torch.zeros(1, 1, 2, 4), lam=1.0, intercept=None), "intercept=None must be a bool"),
    (lambda s, t: s.update(t.to("meta"), t.to("meta")), "AffineState.update: k is on meta, the state on cpu"),
    (lambda s, t: s.affine_la(torch.zeros(1, 1, 2, 4, device="meta")), "AffineState.affine_la: r is on meta"),
    (lambda s, t: AffineState.zeros(-1, 2, 4), r"AffineState.zeros: batch=-1, kv_heads=2, head_dim=4 must be ints >= 1"),
    (lambda s, t: AffineState.zeros(1, 2.0, 4), "kv_heads=2.0"),
])
def test_state_arguments_are_named(call, match):
    token = torch.zeros(1, 1, 2, 4)
    state = AffineState.zeros(1, 2, 4, with_kk=True).update(token, token)
    with pytest.raises(ValueError, match=match):
        call(state, token)


@pytest.mark.parametrize("call, match", [
    (lambda r, k, v: affine_linear_attention(r, k, v, intercept=1), "intercept=1 must be a bool"),
    (lambda r, k, v: affine_linear_attention(r, k, v, backend="cuda"), "backend='cuda', expected one of"),
    (lambda r, k, v: affine_linear_attention(r, k, v, backend="triton"),
     r"backend='triton' needs dtype in .* and head_dim in \(16, 32, 64, 128\), got torch.float64 and 4"),
    (lambda r, k, v: affine_linear_attention(r.float(), k.float(), v.float(), backend="triton"),
     r"head_dim in \(16, 32, 64, 128\), got torch.float32 and 4"),
    (lambda r, k, v: affine_linear_attention(r, k, v, chunk=0), "chunk=0 must be an int >= 1"),
    (lambda r, k, v: affine_linear_attention(r, k, v, chunk=0.5), "chunk=0.5 must be an int >= 1"),
    (lambda r, k, v: affine_mesanet(r, k, v, lam=1.0, chunk=2.5), "chunk=2.5 must be an int >= 1"),
    (lambda r, k, v: affine_linear_attention(r[:0], k[:0], v[:0]),
     r"affine_linear_attention: r has an empty dimension, shape \(0, 4, 2, 4\)"),
    (lambda r, k, v: affine_mesanet(r[:, :0], k[:, :0], v[:, :0], lam=1.0), "affine_mesanet: q has an empty dimension"),
    (lambda r, k, v: affine_mesanet(r[..., :0], k[..., :0], v[..., :0], lam=1.0), "q has an empty dimension"),
    (lambda r, k, v: value_averaging(v[:, :, :0]), r"value_averaging: v has an empty dimension, shape \(1, 4, 0, 4\)"),
    (lambda r, k, v: affine_mesanet(r, k, v, lam=-1.0), "lam=-1.0 must be a finite positive number"),
    (lambda r, k, v: affine_mesanet(r, k, v, lam=torch.ones(2, 2)), r"lam tensor must be .* shape \(2,\)"),
    (lambda r, k, v: value_averaging(torch.cat([v, v], 2), q_heads=3),
     r"q_heads=3 must be a positive multiple of the kv heads \(2\)"),
    (lambda r, k, v: affine_linear_attention(r[:, :3], k, v), "batch, seq and head_dim must agree"),
])
def test_bad_arguments_are_named(call, match):
    _, r, k, v, _ = make(1, 4, 2, 1, 4)
    with pytest.raises(ValueError, match=match):
        call(r, k, v)


def test_triton_backend_on_cpu_names_the_device(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.zeros(1, 4, 2, 16)
    with pytest.raises(ValueError, match="needs CUDA tensors .r is on cpu. or TRITON_INTERPRET=1"):
        affine_linear_attention(x, x, x, backend="triton")


def test_keys_and_values_with_a_large_shared_mean_keep_fp32_accuracy():
    """The intercept forms only see centred moments; raw fp32 sums would lose them to cancellation."""
    q, r, k, v, do = make(1, 64, 2, 1, 8, seed=11)
    q, k, v = q + 50.0, k + 50.0, v - 50.0
    for fn, reference, inputs in (
            (lambda *x: affine_mesanet(*x, lam=0.05), lambda *x: ref.affine_mesanet(*x, 0.05), (q, k, v)),
            (affine_linear_attention, ref.affine_linear_attention_dense, (r, k, v))):
        out, got = grads(fn, [x.float() for x in inputs], do.float())
        out_ref, want = grads(reference, inputs, do)
        for a, b in zip([out, *got], [out_ref, *want]):
            assert ((a.double() - b).norm() / b.norm()).item() < 2e-5


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_prefix_sum_op_matches_cumsum_and_its_gradient(dim):
    """The opaque prefix-sum op: forward against a loop of sums in fp64, the gradient by gradcheck,
    on a non-contiguous input; the custom op passes torch.library's opcheck."""
    x = torch.randn(5, 4, 3, dtype=F64).transpose(0, 2).requires_grad_()
    want = torch.stack([x.narrow(dim, 0, i + 1).sum(dim) for i in range(x.shape[dim])], dim)
    torch.testing.assert_close(prefix_sum(x, dim), want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: prefix_sum(t, dim), [x])
    torch.library.opcheck(torch.ops.parallax_titan.prefix_sum.default, (x.detach().contiguous(), dim))


def test_compiled_family_forms_hold_no_inductor_scan():
    """The chunked forms reach Inductor with their prefix sums as the opaque op: no aten.cumsum in
    the traced graph (on CUDA, Inductor's split-scan code generation fails on Affine MesaNet)."""
    q, r, k, v, _ = make(1, 9, 2, 1, 3)
    ops = set()

    def record(gm, example_inputs):
        ops.update(str(node.target) for node in gm.graph.nodes if node.op in ("call_function", "call_method"))
        return gm

    fns = (lambda: affine_mesanet(q, k, v, lam=0.5, chunk=4), lambda: affine_linear_attention(r, k, v, chunk=4),
           lambda: value_averaging(v, q_heads=2))
    for fn in fns:
        torch._dynamo.reset()
        torch.compile(fn, backend=record, fullgraph=True)()
    assert not any("cumsum" in op for op in ops), sorted(ops)
    assert any("prefix_sum" in op for op in ops), sorted(ops)


def test_solves_never_read_an_error_flag_on_the_host(monkeypatch):
    """Affine MesaNet (chunked and recurrent) and exact LLA factor through ``cholesky_ex`` and solve
    with two triangular solves: ``torch.linalg.cholesky`` reads its error flag on the host, and
    ``torch.cholesky_solve``'s batched CUDA path synchronised, once per chunk and layer each."""
    from kernels import exact_lla

    def syncing(name):
        def fail(*args, **kwargs):
            raise AssertionError(f"{name} called")
        return fail

    monkeypatch.setattr(torch.linalg, "cholesky", syncing("torch.linalg.cholesky"))
    monkeypatch.setattr(torch, "cholesky_solve", syncing("torch.cholesky_solve"))
    q, _, k, v, _ = make(1, 6, 2, 1, 3)
    affine_mesanet(q, k, v, lam=0.5, chunk=4)
    exact_lla(q, k, v, lam=0.5)
    state = AffineState.zeros(1, 1, 3, dtype=F64, with_kk=True)
    affine_mesanet_step(state, q[:, :1], k[:, :1], v[:, :1], lam=0.5)
