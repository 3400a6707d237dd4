"""Reference (chunked PyTorch) Parallax attention against an independent fp64 O(L^2) computation."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from kernels import parallax_attention
from kernels.parallax.chunked import parallax_attention_chunked
from kernels.parallax.naive import parallax_attention_naive, parallax_weights
from tests._attention_cases import BAD_CU_NAMES, SEQ, bad_cu_seqlens, banded_mask, banded_reference, cu_from_lengths


def make_inputs(b, n, hq, hkv, d, dtype=torch.float64, rho_scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, r = (torch.randn(b, n, hq, d, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, n, hkv, d, generator=gen, dtype=torch.float64) for _ in range(2))
    r = r * rho_scale / math.sqrt(d)
    return [x.to(dtype).requires_grad_() for x in (q, r, k, v)]


def output_and_grads(fn, inputs, grad_out):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    out.backward(grad_out.to(out.dtype))
    return out.detach(), [x.grad for x in inputs]


def rel_err(a, b):
    a, b = a.double(), b.double()
    # floor: exact-zero references (dq at L=1) against rounding-level results
    return ((a - b).norm() / b.norm().clamp_min(1e-2)).item()


def assert_close_all(got, ref, tol):
    (o, grads), (o_ref, grads_ref) = got, ref
    assert rel_err(o, o_ref) < tol, ("out", rel_err(o, o_ref))
    for name, g, g_ref in zip("qrkv", grads, grads_ref):
        assert rel_err(g, g_ref) < tol, (f"d{name}", rel_err(g, g_ref))


SHAPES = [  # (B, L, Hq, Hkv, D)
    (1, 1, 2, 1, 64),
    (2, 7, 2, 2, 64),
    (1, 33, 4, 2, 128),
    (2, 21, 4, 1, 64),
    (1, 40, 8, 2, 16),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", [8, 256])
def test_reference_matches_fp64_naive(shape, block):
    inputs = make_inputs(*shape)
    grad_out = torch.randn(shape[0], shape[1], shape[2], shape[4], dtype=torch.float64)
    scale = 1.0 / math.sqrt(shape[4])
    ref = output_and_grads(lambda *x: parallax_attention_naive(*x, scale=scale), inputs, grad_out)
    got = output_and_grads(lambda *x: parallax_attention_chunked(*x, scale=scale, block=block), inputs, grad_out)
    assert_close_all(got, ref, 1e-11)


@pytest.mark.parametrize("rho_scale", [1.0, 30.0])
def test_public_api_fp32_and_large_rho(rho_scale):
    shape = (2, 37, 4, 2, 64)
    inputs = make_inputs(*shape, rho_scale=rho_scale, seed=1)
    weights = parallax_weights(*inputs[:3])["w"]
    assert weights.abs().max() > (10.0 if rho_scale > 1 else 0.0)  # the large case really is large
    grad_out = torch.randn(2, 37, 4, 64, dtype=torch.float64)
    ref = output_and_grads(parallax_attention_naive, inputs, grad_out)
    inputs32 = [x.detach().float() for x in inputs]
    got = output_and_grads(lambda *x: parallax_attention(*x, backend="reference"), inputs32, grad_out)
    assert got[0].dtype == torch.float32
    assert_close_all(got, ref, 2e-5)


def test_bf16_inputs_return_bf16():
    inputs = [x.detach().bfloat16() for x in make_inputs(1, 9, 2, 1, 64, seed=2)]
    out = parallax_attention(*inputs, backend="auto")  # CPU tensors: reference
    ref = parallax_attention_naive(*[x.double() for x in inputs])
    assert out.dtype == torch.bfloat16 and out.shape == (1, 9, 2, 64)
    assert rel_err(out, ref) < 1e-2


def test_naive_matches_covariance_form():
    """o_i = vbar_i - Sigma_KV(i) rho_i, computed row by row in fp64 (independent of naive's w form)."""
    q, r, k, v = (x.detach() for x in make_inputs(1, 6, 2, 1, 16, seed=3))
    out = parallax_attention_naive(q, r, k, v)
    scale = 1.0 / 4.0
    for i in range(6):
        for h in range(2):
            kk, vv = k[0, : i + 1, 0], v[0, : i + 1, 0]
            p = torch.softmax(scale * kk @ q[0, i, h], dim=0)
            vbar, kbar = p @ vv, p @ kk
            sigma_kv = (vv - vbar).T @ ((kk - kbar) * p[:, None])
            assert torch.allclose(out[0, i, h], vbar - sigma_kv @ r[0, i, h], atol=1e-12)


def test_weights_sum_to_one():
    q, r, k, _ = make_inputs(1, 12, 2, 2, 16, rho_scale=5.0, seed=4)
    w = parallax_weights(q, r, k)["w"]
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-12, rtol=0)
    assert (w < 0).any()


def test_zero_probe_is_softmax_attention():
    q, r, k, v = make_inputs(2, 17, 4, 2, 64, seed=5)
    r = torch.zeros_like(r, requires_grad=True)
    grad_out = torch.randn(2, 17, 4, 64, dtype=torch.float64)

    def sdpa(q, r, k, v):
        kk, vv = (x.repeat_interleave(2, dim=2).transpose(1, 2) for x in (k, v))
        return F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, is_causal=True).transpose(1, 2)

    ref = output_and_grads(sdpa, [q, r, k, v], grad_out)
    got = output_and_grads(lambda *x: parallax_attention(*x, backend="reference"), [q, r, k, v], grad_out)
    assert rel_err(got[0], ref[0]) < 1e-12
    for i in (0, 2, 3):  # r gets no gradient from SDPA
        assert rel_err(got[1][i], ref[1][i]) < 1e-11


def test_non_causal_matches_naive():
    inputs = make_inputs(1, 13, 2, 1, 16, seed=6)
    grad_out = torch.randn(1, 13, 2, 16, dtype=torch.float64)
    ref = output_and_grads(lambda *x: parallax_attention_naive(*x, causal=False), inputs, grad_out)
    got = output_and_grads(lambda *x: parallax_attention_chunked(*x, scale=0.25, causal=False, block=4),
                           inputs, grad_out)
    assert_close_all(got, ref, 1e-11)


@pytest.mark.parametrize("lengths", [[5, 1, 12, 7], [25], [1, 1, 1]])
def test_cu_seqlens_equals_separate_documents(lengths):
    n = sum(lengths)
    inputs = make_inputs(1, n, 4, 2, 64, seed=7)
    grad_out = torch.randn(1, n, 4, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    cu = cu_from_lengths(lengths)

    def per_document(q, r, k, v):
        outs = [parallax_attention_naive(*(x[:, a:b] for x in (q, r, k, v)))
                for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
        return torch.cat(outs, dim=1)

    ref = output_and_grads(per_document, inputs, grad_out)
    got = output_and_grads(lambda *x: parallax_attention(*x, backend="reference", cu_seqlens=cu), inputs, grad_out)
    # 1e-10: one-token documents have exactly zero dq, drho, dk, met to rounding (~1e-13 absolute)
    assert_close_all(got, ref, 1e-10)
    # the packed naive mask agrees too
    naive_packed = output_and_grads(lambda *x: parallax_attention_naive(*x, cu_seqlens=cu), inputs, grad_out)
    assert_close_all(naive_packed, ref, 1e-10)


class _MaxNumel(TorchDispatchMode):
    """Records the largest tensor any op returns."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.max_numel = max(self.max_numel, x.numel())
        return out


def test_memory_is_linear_in_length():
    b, n, hq, hkv, d, block = 1, 512, 2, 1, 16, 32
    q, r, k, v = make_inputs(b, n, hq, hkv, d, dtype=torch.float32, seed=8)
    with _MaxNumel() as mode:
        out = parallax_attention_chunked(q, r, k, v, scale=0.25, block=block)
        out.sum().backward()
    # largest tensor is one (rows, block) score chunk per head, far below one (L, L) matrix per head
    assert mode.max_numel <= b * hq * n * max(block, d)
    assert mode.max_numel < b * hq * n * n // 8


def test_bad_inputs_raise_clear_errors():
    q, r, k, v = (x.detach() for x in make_inputs(1, 8, 4, 2, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"multiple of kv heads.*q=\(1, 8, 3, 16\)"):
        parallax_attention(q[:, :, :3], r[:, :, :3], k, v)
    with pytest.raises(ValueError, match="r must have q's shape"):
        parallax_attention(q, r[:, :4], k, v)
    with pytest.raises(ValueError, match="must be 4-D"):
        parallax_attention(q[0], r, k, v)
    with pytest.raises(ValueError, match="all four must match"):
        parallax_attention(q, r, k.double(), v)
    with pytest.raises(TypeError, match="q.dtype=torch.int64"):
        parallax_attention(q.long(), r, k, v)
    with pytest.raises(ValueError, match="backend='cuda'"):
        parallax_attention(q, r, k, v, backend="cuda")
    with pytest.raises(ValueError, match="scale=nan"):
        parallax_attention(q, r, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        parallax_attention(q, r, k, v, backend="triton")
    with pytest.raises(ValueError, match="1-D int32"):
        parallax_attention(q, r, k, v, cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="end at seq=8"):
        parallax_attention(q, r, k, v, cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32))
    q2, r2, k2, v2 = (torch.cat([x, x]) for x in (q, r, k, v))
    with pytest.raises(ValueError, match="batch == 1"):
        parallax_attention(q2, r2, k2, v2, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32))


@pytest.mark.parametrize("name", BAD_CU_NAMES)
def test_bad_cu_seqlens_raise_naming_the_values(name):
    q, r, k, v = (x.detach() for x in make_inputs(1, SEQ, 2, 1, 16, dtype=torch.float32))
    cu, pattern = bad_cu_seqlens(name)
    with pytest.raises(ValueError, match=pattern):
        parallax_attention(q, r, k, v, backend="reference", cu_seqlens=cu)


def test_cu_seqlens_checked_again_after_an_in_place_write_or_at_another_length():
    """A tensor that passed is remembered, but only for its current contents and packed length."""
    q, r, k, v = (x.detach() for x in make_inputs(1, SEQ, 2, 1, 16, dtype=torch.float32))
    cu = torch.tensor([0, 6, SEQ], dtype=torch.int32)
    parallax_attention(q, r, k, v, backend="reference", cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\]=16 lies outside \[0, seq=8\]"):
        parallax_attention(*(x[:, :8] for x in (q, r, k, v)), backend="reference", cu_seqlens=cu)
    cu[1] = 20
    with pytest.raises(ValueError, match=r"cu_seqlens=\[0, 20, 16\] is invalid: cu_seqlens\[1\]=20 lies outside"):
        parallax_attention(q, r, k, v, backend="reference", cu_seqlens=cu)
    with torch.inference_mode():  # inference tensors keep no version counter: checked every call
        cu = torch.tensor([0, 6, SEQ], dtype=torch.int32)
        parallax_attention(q, r, k, v, backend="reference", cu_seqlens=cu)
        cu[0] = 1
        with pytest.raises(ValueError, match=r"cu_seqlens\[0\]=1, expected 0"):
            parallax_attention(q, r, k, v, backend="reference", cu_seqlens=cu)


# (B, L, Hq, Hkv, D, window, document lengths or None, chunk block)
WINDOW_CASES = [
    (1, 37, 4, 2, 16, 1, None, 8),
    (2, 37, 4, 2, 16, 5, None, 8),  # W not a multiple of the chunk
    (1, 37, 4, 1, 32, 16, None, 8),
    (1, 37, 2, 2, 16, 37, None, 8),  # W = L: full causal
    (2, 21, 4, 2, 16, 100, None, 256),  # W > L
    (1, 37, 4, 2, 16, 6, [5, 1, 17, 14], 8),  # the band inside each document
    (1, 37, 4, 2, 16, 20, [5, 1, 17, 14], 256),
]


@pytest.mark.parametrize("b, n, hq, hkv, d, window, lengths, block", WINDOW_CASES)
def test_window_matches_fp64_banded_mask(b, n, hq, hkv, d, window, lengths, block):
    inputs = [x.detach() for x in make_inputs(b, n, hq, hkv, d, rho_scale=2.0, seed=window)]
    do = torch.randn(b, n, hq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = banded_reference(inputs, do, window, lengths)
    cu = cu_from_lengths(lengths)
    got = output_and_grads(lambda *x: parallax_attention_chunked(*x, scale=d ** -0.5, cu_seqlens=cu, window=window,
                                                                 block=block), inputs, do)
    assert_close_all(got, ref, 1e-11)
    api = output_and_grads(lambda *x: parallax_attention(*x, backend="reference", cu_seqlens=cu, window=window),
                           inputs, do)
    assert_close_all(api, ref, 1e-11)


def test_window_mask_is_the_band():
    """The test mask itself, against the definition written out for a few entries."""
    mask = banded_mask(6, 2, [4, 2])
    assert mask.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0],
                             [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("window, match", [
    (0, "window=0 must be None or an int >= 1"),
    (-3, "window=-3 must be None or an int >= 1"),
    (2.5, "window=2.5 must be None or an int >= 1"),
    (True, "window=True must be None or an int >= 1"),
    ("4", "window='4' must be None or an int >= 1"),
])
def test_bad_window_raises(window, match):
    q, r, k, v = (x.detach() for x in make_inputs(1, 8, 2, 1, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match=match):
        parallax_attention(q, r, k, v, window=window)


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(q=a["q"][..., :0], r=a["r"][..., :0], k=a["k"][..., :0], v=a["v"][..., :0]),
     r"head_dim must be >= 1.*q=\(1, 8, 4, 0\)"),
    (lambda a: a.update(causal="no"), "causal='no' must be a bool"),
    (lambda a: a.update(causal=None), "causal=None must be a bool"),
    (lambda a: a.update(window=2 ** 40), r"window=1099511627776 .*at most 2147483647"),
])
def test_bad_arguments_are_named(change, match):
    """Hostile values of the other arguments: a ValueError naming them, before any work."""
    q, r, k, v = (x.detach() for x in make_inputs(1, 8, 4, 2, 16, dtype=torch.float32))
    args = dict(q=q, r=r, k=k, v=v)
    change(args)
    with pytest.raises(ValueError, match=match):
        parallax_attention(**args)


def test_window_needs_causal():
    q, r, k, v = (x.detach() for x in make_inputs(1, 8, 2, 1, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match="window=4 needs causal=True"):
        parallax_attention(q, r, k, v, window=4, causal=False)


@pytest.mark.parametrize("n, window", [(1, None), (9, None), (9, 1), (9, 4), (9, 9), (9, 30)])
def test_band_pairs_counts_the_mask(n, window):
    from kernels.parallax.benchmark import band_pairs

    assert band_pairs(n, window) == int(banded_mask(n, window).sum())


def test_compiled_call_traces_a_scale_that_dynamo_made_dynamic():
    """dynamo turns a module's float attribute into a symbolic float after recompiles with other
    values (several models' blocks compiled in one process); the scale check must still trace, and
    every call must use its own scale."""

    class Scaled(torch.nn.Module):
        def __init__(self, scaling):
            super().__init__()
            self.scaling = scaling

        def forward(self, q, r, k, v):
            return parallax_attention(q, r, k, v, scale=self.scaling, backend="reference")

    gen = torch.Generator().manual_seed(0)
    q, r, k, v = (torch.randn(1, 9, 2, 8, generator=gen) for _ in range(4))
    call = torch.compile(lambda module, *x: module(*x), fullgraph=True, backend="aot_eager")
    for scaling in (0.1, 0.2, 0.3, 0.4):
        torch.testing.assert_close(call(Scaled(scaling), q, r, k, v),
                                   parallax_attention(q, r, k, v, scale=scaling, backend="reference"))
