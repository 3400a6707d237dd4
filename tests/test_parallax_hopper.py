"""The Hopper kernels (kernels/parallax/hopper.py, Gluon): the forward, the backward's row pass and
column pass.

On CPU: each kernel compiles for sm_90 with its shipped config and keeps its wgmmas asynchronous
(ptxas serialises every wgmma of a kernel when an accumulator is live in flight across a loop's back
edge), and the dispatch's rules (which calls take them, how to switch them off). GPU tests (marked
``gpu``) run them against the fp64 reference and the Triton kernels, over shapes, dtypes, GQA,
documents and windows, and twice for bit-identical results.
"""

from __future__ import annotations

import re
import types

import pytest
import torch

from kernels.parallax import fused, tuning
from tests._attention_cases import cu_from_lengths, cuda_inputs
from tests._interpret import rel_err

gluon_hopper = pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from scripts.bench.kernel_resources import wgmma_waits  # noqa: E402


# ----------------------------------------------------------------------------- sm_90 compiles (CPU)
def _compile(kernel_name, d, varlen):
    """SASS of a hopper.py pass compiled for sm_90 with its shipped config (bf16)."""
    from scripts.bench.kernel_resources import _cuobjdump, compile_hopper

    compiled = compile_hopper(kernel_name, d, tuning.HOPPER_CONFIGS[kernel_name][d], varlen)
    return _cuobjdump(compiled.asm["cubin"], ["-sass"])[0]


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("kernel_name, in_flight", [("fwd", 1), ("dq", 2), ("dkdv", 2)])
def test_kernels_compile_for_hopper_with_wgmmas_left_in_flight(kernel_name, in_flight, d, varlen):
    """Each kernel issues its score products (two in the forward, three in each backward pass) before
    waiting for the first (a wait that leaves the others in flight), so ptxas did not serialise its
    wgmmas (it would wait for none in flight after every one)."""
    sass = _compile(kernel_name, d, varlen)
    waits = wgmma_waits(sass)
    assert sass.count("HGMMA") > 0 and waits
    assert max(waits) == in_flight, waits


@pytest.mark.parametrize("kernel_name, in_flight", [("fwd", 1), ("dkdv", 2)])
def test_consumers_taking_turns_keep_their_wgmmas_in_flight(kernel_name, in_flight):
    """With ping-pong (``HopperConfig.pingpong``) the paired forward and the column pass still leave
    their score products in flight (ptxas did not serialise their wgmmas), and each consumer waits on
    its turn's mbarrier (the shipped configs without turns do not)."""
    from scripts.bench.kernel_resources import _cuobjdump, compile_hopper

    config = tuning.HOPPER_CONFIGS[kernel_name][128]
    sass = {}
    for turns in (True, False):
        compiled = compile_hopper(kernel_name, 128, config._replace(paired=kernel_name == "fwd", pingpong=turns))
        sass[turns] = _cuobjdump(compiled.asm["cubin"], ["-sass"])[0]
    assert max(wgmma_waits(sass[True])) == in_flight
    waits = {turns: len(re.findall(r"SYNCS\.PHASECHK", text)) for turns, text in sass.items()}
    assert waits[True] > waits[False], waits


def test_the_forwards_register_cap_reaches_ptxas():
    """The D=64 forward compiles within its config's register cap (three programs per SM); a lower cap
    lowers the count (the cap reaches ptxas). Spills depend on the triton version (none with 3.6,
    docs/bench/kernel_resources_sm90.md), so they are not asserted."""
    from scripts.bench.kernel_resources import compile_hopper, compiled_resources

    config = tuning.HOPPER_CONFIGS["fwd"][64]
    shipped = compiled_resources(compile_hopper("fwd", 64, config))
    assert shipped["registers"] <= config.maxnreg, shipped
    lower = compiled_resources(compile_hopper("fwd", 64, config._replace(maxnreg=128)))
    assert lower["registers"] <= 128 < shipped["registers"], lower


def _longest_copy_run(sass: str) -> int:
    """The most TMA copies (UTMALDG) the SASS issues one after another with no CTA barrier (BAR.SYNC)
    between them."""
    longest = run = 0
    for op in re.findall(r"\b(UTMALDG|BAR\.SYNC)\b", sass):
        run = run + 1 if op == "UTMALDG" else 0
        longest = max(longest, run)
    return longest


@pytest.mark.parametrize("d", [128, 64])
def test_the_column_pass_issues_a_slots_tile_copies_without_a_cta_barrier_between_them(d):
    """The producer warp issues a ring slot's copies (q, rho, dO, the statistics) back to back."""
    assert _longest_copy_run(_compile("dkdv", d, False)) >= 4


@pytest.mark.parametrize("d", [128, 64])
def test_the_column_pass_runs_a_producer_warp_and_two_consumer_warpgroups(d):
    """12 warps a program; the registers re-split between the partitions (the producer warp's warpgroup
    down to 24 a thread, the consumers to hopper's share); each consumer issues a query tile's wgmmas:
    three score products over D, then dv and dk's two over the tile's BM queries, 16 deep each."""
    from scripts.bench.kernel_resources import _cuobjdump, compile_hopper

    from kernels.parallax import hopper

    config = tuning.HOPPER_CONFIGS["dkdv"][d]
    compiled = compile_hopper("dkdv", d, config)
    sass = _cuobjdump(compiled.asm["cubin"], ["-sass"])[0]
    assert compiled.metadata.num_warps == 12
    split = set(re.findall(r"USETMAXREG\.\S+ (?:UP\d, )?(0x[0-9a-f]+)", sass))
    assert {"0x18", hex(hopper._CONSUMER_REGS)} <= split, split
    assert sass.count("HGMMA") == 2 * (3 * d // 16 + 3 * config.bm // 16)


@pytest.mark.parametrize("d", [128, 64])
def test_the_paired_forward_runs_a_producer_warp_and_two_consumer_warpgroups(d):
    """The forward with ``paired``: 12 warps, the registers re-split as in the column pass (the launch
    cap reaching ptxas), each consumer issuing its key tile's wgmmas (s and t over D, then o1 and o2
    over the tile's BN keys, 16 deep each) with t left in flight; the shipped D=128 forward is paired."""
    from scripts.bench.kernel_resources import _cuobjdump, compile_hopper, compiled_resources

    from kernels.parallax import hopper

    assert tuning.HOPPER_CONFIGS["fwd"][128].paired
    config = tuning.HOPPER_CONFIGS["fwd"][128]._replace(stages=3 if d == 64 else 2)
    compiled = compile_hopper("fwd", d, config)
    sass = _cuobjdump(compiled.asm["cubin"], ["-sass"])[0]
    assert compiled.metadata.num_warps == 12
    assert compiled_resources(compiled)["registers"] == hopper._SPECIALISED_MAXNREG
    split = set(re.findall(r"USETMAXREG\.\S+ (?:UP\d, )?(0x[0-9a-f]+)", sass))
    assert {"0x18", hex(hopper._CONSUMER_REGS)} <= split, split
    assert sass.count("HGMMA") == 2 * (2 * d // 16 + 2 * config.bn // 16)
    assert max(wgmma_waits(sass)) == 1


SM_SHARED_BYTES, CTA_RESERVED_BYTES = 233_472, 1024  # an H100/H200 SM's shared memory, and each program's reserve


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("d", [128, 64])
def test_the_row_pass_with_its_statistics_in_shared_memory_keeps_two_programs_per_sm(d, varlen):
    """``stats_in_shared``: the row pass stores three statistics once (a CTA barrier after them) and
    reads them in its loop, still issuing its score wgmmas before the first wait; its shared memory
    still lets two programs share an SM at D=128 (the fourth statistic would not: one program per SM)."""
    from scripts.bench.kernel_resources import _cuobjdump, compile_hopper, compiled_resources

    shipped = tuning.HOPPER_CONFIGS["dq"][d]
    resources, sass = {}, {}
    for flag in (False, True):
        compiled = compile_hopper("dq", d, shipped._replace(stats_in_shared=flag), varlen)
        resources[flag], sass[flag] = compiled_resources(compiled), _cuobjdump(compiled.asm["cubin"], ["-sass"])[0]
        assert max(wgmma_waits(sass[flag])) == 2
    assert resources[True]["shared"] > resources[False]["shared"]
    assert sass[True].count("BAR.SYNC") > sass[False].count("BAR.SYNC")
    if d == 128:
        assert 2 * (resources[True]["shared"] + CTA_RESERVED_BYTES) <= SM_SHARED_BYTES


def _register_a_score_wgmmas(sass: str, bm: int) -> int:
    """The column pass's score wgmmas (64 x bm x 16) whose A operand comes from registers."""
    return len(re.findall(rf"HGMMA\.64x{bm}x16\S* R\d+, R\d+", sass))


def test_the_column_pass_holds_k_in_registers_where_the_installed_triton_keeps_its_wgmmas_in_flight():
    """With ``keys_in_registers`` two of the three score products of each consumer read k from registers
    (one wgmma per 16 of D each), with it off none. The shipped D=128 config holds k there exactly when this triton's
    compile of it still leaves wgmmas in flight (``tuning.KEYS_FIT_IN_REGISTERS``: ptxas serialises
    them all, short of registers, from triton 3.9)."""
    from scripts.bench.kernel_resources import _cuobjdump, compile_hopper

    config = tuning.HOPPER_CONFIGS["dkdv"][128]
    sass = {}
    for keys_in_registers, expected in ((True, 2 * 2 * 128 // 16), (False, 0)):
        compiled = compile_hopper("dkdv", 128, config._replace(keys_in_registers=keys_in_registers))
        sass[keys_in_registers] = _cuobjdump(compiled.asm["cubin"], ["-sass"])[0]
        assert _register_a_score_wgmmas(sass[keys_in_registers], config.bm) == expected
    waits = wgmma_waits(sass[True])
    assert config.keys_in_registers == tuning.KEYS_FIT_IN_REGISTERS == (max(waits) == 2), waits


# ----------------------------------------------------------------------------- dispatch (CPU)
def _fake_cuda(dtype=torch.bfloat16, d=128):
    return types.SimpleNamespace(is_cuda=True, device="cuda:0", dtype=dtype, shape=(2, 64, 4, d))


@pytest.mark.parametrize("change, reason", [
    (dict(arch=(8, 0)), "sm_90 GPU, this one is sm_80"),
    (dict(arch=(10, 0)), "sm_90 GPU, this one is sm_100"),
    (dict(dtype=torch.float32), "dtype torch.float32"),
    (dict(d=96), "head_dim 96 has no Hopper config"),
    (dict(d=256), "head_dim 256 has no Hopper config"),
    (dict(total=130), "130 tokens"),
    (dict(tma_ok=False), "does not allow TMA"),
    (dict(tma_ok=False, names=("fwd",)), "does not allow TMA"),
    (dict(d=32, names=("fwd",)), "head_dim 32 has no Hopper config"),
])
def test_unusable_names_why(monkeypatch, change, reason):
    from kernels.parallax import hopper

    arch = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: arch[0])
    assert hopper.unusable(_fake_cuda(), 128, True) is None
    arch[0] = change.get("arch", (9, 0))
    q = _fake_cuda(change.get("dtype", torch.bfloat16), change.get("d", 128))
    names = change.get("names", ("dq", "dkdv"))
    assert reason in hopper.unusable(q, change.get("total", 128), change.get("tma_ok", True), names)


@pytest.mark.parametrize("scale", [0.0, -0.125, float("nan")])
def test_the_forward_needs_a_positive_scale(monkeypatch, scale):
    """The forward takes the max of unscaled scores and scales it: a scale of 0 or below would pick the
    wrong max (or NaN from masked -inf x 0), so such calls run the Triton forward; the backward does
    not fold the scale and keeps its kernels."""
    from kernels.parallax import hopper

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert f"scale {scale}" in hopper.unusable(_fake_cuda(), 128, True, ("fwd",), scale)
    assert hopper.unusable(_fake_cuda(), 128, True, ("dq", "dkdv"), scale) is None
    assert hopper.unusable(_fake_cuda(), 128, True, ("fwd",), 1e-3) is None


def test_the_forward_takes_any_token_count(monkeypatch):
    """Only the column pass copies statistics by TMA: 130 tokens keep the backward off the Hopper
    kernels, not the forward."""
    from kernels.parallax import hopper

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert hopper.unusable(_fake_cuda(), 130, True, ("fwd",)) is None
    assert "130 tokens" in hopper.unusable(_fake_cuda(), 130, True, ("fwd", "dq", "dkdv"))


def test_cpu_tensors_and_switched_off_calls_keep_the_triton_kernels(monkeypatch):
    q = torch.zeros(1, 64, 4, 64)
    rows = [(q, q.stride(1))]
    assert "not CUDA" in fused.hopper_unusable(q, 64, rows, "dq", "dkdv")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fake = _fake_cuda(d=64)
    monkeypatch.setattr(fused, "_tma_ok", lambda d, rows: True)
    assert fused.hopper_unusable(fake, 64, rows, "dq", "dkdv") is None
    asked = "the Triton kernels were asked for (tuning.hopper_kernels or tuning.candidates)"
    with tuning.hopper_kernels(False):
        assert fused.hopper_unusable(fake, 64, rows, "dq", "dkdv") == asked
        with tuning.hopper_kernels(True):
            assert fused.hopper_unusable(fake, 64, rows, "dq", "dkdv") is None
    for name in ("dq", "dkdv"):  # a candidates list for either pass keeps both Triton passes
        with tuning.candidates(**{name: [tuning.SHIPPED[name][0]]}):
            assert fused.hopper_unusable(fake, 64, rows, "dq", "dkdv") == asked
        assert fused.hopper_unusable(fake, 64, rows, "fwd") is None  # nor the forward's
    with tuning.candidates(fwd=[tuning.SHIPPED["fwd"][0]]):  # the forward's list does not concern the backward
        assert fused.hopper_unusable(fake, 64, rows, "dq", "dkdv") is None
        assert fused.hopper_unusable(fake, 64, rows, "fwd") == asked
    with tuning.hopper_kernels(False):
        assert fused.hopper_unusable(fake, 64, rows, "fwd") == asked


@pytest.mark.parametrize("hopper_kernels", [True, False])
def test_the_switch_reaches_the_forward_and_travels_with_the_op_to_the_backward(monkeypatch, hopper_kernels):
    """The flag given to the custom op's forward reaches ``fused.forward``'s and, in autograd,
    ``fused.backward``'s ``hopper``."""
    from kernels.parallax import ops

    seen = []

    def forward(q, r, k, v, *rest, hopper):
        seen.append(("fwd", hopper))
        return torch.zeros_like(q), torch.zeros_like(q), fused.stats_buffer(q), fused.stats_buffer(q)

    def backward(do, q, r, k, v, *rest, hopper):
        seen.append(("bwd", hopper))
        return tuple(torch.zeros_like(x) for x in (q, r, k, v))

    monkeypatch.setattr(fused, "backward", backward)
    monkeypatch.setattr(fused, "forward", forward)
    leaves = [torch.randn(1, 8, 2, 16, requires_grad=True) for _ in range(4)]
    ops.parallax_attention_triton(*leaves, scale=0.25, hopper_kernels=hopper_kernels).sum().backward()
    assert seen == [("fwd", hopper_kernels), ("bwd", hopper_kernels)]


def test_public_api_rejects_a_switch_that_is_not_a_bool():
    from kernels import parallax_attention

    x = torch.zeros(1, 4, 2, 16)
    with pytest.raises(ValueError, match=r"hopper_kernels='yes' must be a bool"):
        parallax_attention(x, x, x, x, hopper_kernels="yes")


def test_hopper_kernels_takes_a_bool():
    with pytest.raises(TypeError, match=r"hopper_kernels\(enabled\) takes a bool, got 'no'"):
        with tuning.hopper_kernels("no"):
            pass
    assert tuning.hopper_wanted("dq", "dkdv")


# ----------------------------------------------------------------------------- GPU
def _is_hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper_gpu = pytest.mark.skipif(not _is_hopper(), reason="needs an sm_90 GPU")


def _inputs(b, n, hq, hkv, d, dtype, seed):
    """(q, rho, k, v, dO) of ``cuda_inputs``."""
    qrkv, do = cuda_inputs(b, n, hq, hkv, d, dtype, seed)
    return (*qrkv, do)


def _outputs(inputs, cu, window, hopper):
    """(o, dq, dr, dk, dv) of the fused kernels, the Hopper ones (``hopper``) or the Triton ones."""
    q, r, k, v, do = inputs
    scale = q.shape[-1] ** -0.5
    with tuning.hopper_kernels(hopper):
        saved = fused.forward(q, r, k, v, scale, cu, window)
        return (saved[0], *fused.backward(do, q, r, k, v, *saved, scale, cu, window))


def _reference(inputs, cu, window):
    """fp64 (o, dq, dr, dk, dv) of the reference backend."""
    from kernels import parallax_attention

    leaves = [x.detach().double().requires_grad_() for x in inputs[:4]]
    out = parallax_attention(*leaves, backend="reference", cu_seqlens=cu, window=window)
    out.backward(inputs[4].double())
    return (out.detach(), *[x.grad for x in leaves])


CASES = {  # (B, L, Hq, Hkv, D, dtype, window, document lengths)
    "d128_gqa2_ragged": (2, 1000, 16, 8, 128, torch.bfloat16, None, None),
    "d64_gqa4": (1, 2048, 8, 2, 64, torch.bfloat16, None, None),
    "d64_mha_fp16": (3, 300, 4, 4, 64, torch.float16, None, None),
    "d128_window": (2, 778, 6, 2, 128, torch.bfloat16, 100, None),
    "d128_documents": (1, 3000, 8, 2, 128, torch.bfloat16, None, [1, 700, 2299]),
    "d64_documents_window": (1, 3000, 4, 1, 64, torch.bfloat16, 300, [64, 1935, 1001]),
    "d128_short": (1, 132, 2, 1, 128, torch.bfloat16, 7, None),
}


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_hopper_kernels_match_fp64_and_the_triton_kernels(name):
    """Output and gradients of the Hopper kernels within twice the Triton kernels' distance from fp64
    (or 1e-3), and bit-identical over two runs."""
    b, n, hq, hkv, d, dtype, window, lengths = CASES[name]
    inputs = _inputs(b, n, hq, hkv, d, dtype, seed=len(name))
    cu = cu_from_lengths(lengths, "cuda")
    rows = [(x, x.stride(1)) for x in inputs]
    assert fused.hopper_unusable(inputs[0], b * n, rows, "fwd", "dq", "dkdv") is None
    hopper, triton_kernels = _outputs(inputs, cu, window, True), _outputs(inputs, cu, window, False)
    ref = _reference(inputs, cu, window)
    for what, got, base, exact in zip(("o", "dq", "dr", "dk", "dv"), hopper, triton_kernels, ref):
        assert rel_err(got, exact) < max(2.0 * rel_err(base, exact), 1e-3), (what, rel_err(got, exact), rel_err(base, exact))
    assert all(torch.equal(a, b) for a, b in zip(hopper, _outputs(inputs, cu, window, True)))


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("name", ["d128_gqa2_ragged", "d128_documents", "d64_gqa4"])
def test_gpu_keys_in_registers_changes_no_bit(name):
    """The column pass with k held in registers gives the bits it gives with k read from shared memory
    by each score wgmma (the same products, summed in the same order)."""
    b, n, hq, hkv, d, dtype, window, lengths = CASES[name]
    inputs = _inputs(b, n, hq, hkv, d, dtype, seed=len(name))
    cu = cu_from_lengths(lengths, "cuda")
    config = tuning.HOPPER_CONFIGS["dkdv"][d]
    got = {}
    for keys_in_registers in (True, False):
        with tuning.hopper_config("dkdv", d, config._replace(keys_in_registers=keys_in_registers)):
            got[keys_in_registers] = _outputs(inputs, cu, window, True)
    assert all(torch.equal(a, b) for a, b in zip(got[True], got[False]))


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_the_paired_forward_gives_the_single_tiles_bits(name):
    """The forward over paired query tiles (two consumers sharing each k, v copy) gives the bits of the
    forward over single tiles at the same tiles and stages, at every case (documents, windows, lengths
    whose last program's second tile lies past the end)."""
    b, n, hq, hkv, d, dtype, window, lengths = CASES[name]
    q, r, k, v, _ = _inputs(b, n, hq, hkv, d, dtype, seed=len(name))
    cu = cu_from_lengths(lengths, "cuda")
    shipped = tuning.HOPPER_CONFIGS["fwd"][d]
    got = {}
    for paired in (True, False):
        config = shipped._replace(paired=paired, maxnreg=None if paired else shipped.maxnreg)
        with tuning.hopper_kernels(True), tuning.hopper_config("fwd", d, config):
            got[paired] = fused.forward(q, r, k, v, d**-0.5, cu, window)
    assert all(torch.equal(a, b) for a, b in zip(got[True], got[False]))


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_consumers_taking_turns_give_the_same_bits(name):
    """Ping-pong changes when each consumer of the paired forward and of the column pass issues its
    wgmmas, not what it computes: the outputs and gradients without turns, bit for bit, at every case
    (documents, windows, lengths where a consumer has no tiles of its own yet takes its turns)."""
    b, n, hq, hkv, d, dtype, window, lengths = CASES[name]
    inputs = _inputs(b, n, hq, hkv, d, dtype, seed=len(name))
    cu = cu_from_lengths(lengths, "cuda")
    paired = tuning.HOPPER_CONFIGS["fwd"][d]._replace(paired=True, maxnreg=None)
    column = tuning.HOPPER_CONFIGS["dkdv"][d]
    got = {}
    for turns in (True, False):
        with (tuning.hopper_config("fwd", d, paired._replace(pingpong=turns)),
              tuning.hopper_config("dkdv", d, column._replace(pingpong=turns))):
            got[turns] = _outputs(inputs, cu, window, True)
    assert all(torch.equal(a, b) for a, b in zip(got[True], got[False]))


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_the_row_pass_with_its_statistics_in_shared_memory_gives_the_same_bits(name):
    """``stats_in_shared`` reads the statistics the row pass held in registers: the same values, so the
    same gradients bit for bit (documents, windows, odd lengths)."""
    b, n, hq, hkv, d, dtype, window, lengths = CASES[name]
    inputs = _inputs(b, n, hq, hkv, d, dtype, seed=len(name))
    cu = cu_from_lengths(lengths, "cuda")
    got = {}
    for flag in (True, False):
        with tuning.hopper_config("dq", d, tuning.HOPPER_CONFIGS["dq"][d]._replace(stats_in_shared=flag)):
            got[flag] = _outputs(inputs, cu, window, True)
    assert all(torch.equal(a, b) for a, b in zip(got[True], got[False]))


@pytest.mark.gpu
@hopper_gpu
def test_gpu_token_counts_off_the_tma_alignment_take_the_triton_backward():
    """777 tokens: the statistics' TMA copies would start off 16-byte boundaries; the Hopper forward and
    the Triton backward passes run and give the fp64 results."""
    inputs = _inputs(1, 777, 8, 2, 64, torch.bfloat16, seed=3)
    rows = [(x, x.stride(1)) for x in inputs]
    assert "777 tokens" in fused.hopper_unusable(inputs[0], 777, rows, "dq", "dkdv")
    assert fused.hopper_unusable(inputs[0], 777, rows[:4], "fwd") is None
    ref = _reference(inputs, None, None)
    assert all(rel_err(g, e) < 2e-2 for g, e in zip(_outputs(inputs, None, None, True), ref))


@pytest.mark.gpu
@hopper_gpu
@pytest.mark.parametrize("scale", [-0.125, 0.0])
def test_gpu_scales_of_zero_and_below_match_fp64(scale):
    """Such scales take the Triton forward (the Hopper backward still runs): output and gradients match
    the fp64 reference, with no NaN from masked scores."""
    from kernels import parallax_attention

    q, r, k, v, do = _inputs(1, 512, 4, 2, 64, torch.bfloat16, seed=5)
    leaves = [x.detach().requires_grad_() for x in (q, r, k, v)]
    out = parallax_attention(*leaves, scale=scale)
    out.backward(do)
    exact = [x.detach().double().requires_grad_() for x in (q, r, k, v)]
    ref = parallax_attention(*exact, scale=scale, backend="reference")
    ref.backward(do.double())
    for got, want in zip([out, *[x.grad for x in leaves]], [ref, *[x.grad for x in exact]]):
        assert rel_err(got, want) < 2e-2


# ----------------------------------------------------------------------------- the config sweep (CPU)
def test_sweep_sets_configs_for_its_block_and_renders_rows():
    from scripts.bench import attention_hopper as sweep

    shipped = dict(tuning.HOPPER_CONFIGS["dq"]), dict(tuning.HOPPER_CONFIGS["dkdv"])
    pair = {"dq": tuning.HopperConfig(128, 32, 8, 2), "dkdv": tuning.HopperConfig(32, 128, 4, 3)}
    with sweep.configs(128, pair):
        assert tuning.HOPPER_CONFIGS["dq"][128] == tuning.HopperConfig(128, 32, 8, 2)
        assert tuning.HOPPER_CONFIGS["dkdv"][128] == pair["dkdv"]
    assert (tuning.HOPPER_CONFIGS["dq"], tuning.HOPPER_CONFIGS["dkdv"]) == shipped
    assert sweep.pair_label(pair) == "dq 128x32 w8 s2 + dkdv 32x128 w4 s3"
    rows = [sweep.row((4, 4096), 128, "triton passes", 3.5, 1.0, 2.0, 3.5),
            sweep.row((4, 4096), 128, "hopper, dq 64x64 w4 s2", 3.0, 1.0, 2.0, 3.5)]
    text = sweep.report_markdown(rows)
    assert "| 4 | 4096 | 128 | triton passes | 3.500 | 1.000 | 2.25 |" in text
    assert "| 4 | 4096 | 128 | hopper, dq 64x64 w4 s2 | 3.000 | 0.857 | 2.00 |" in text
    for name, by_dim in sweep.CANDIDATES.items():  # every shipped config is among the candidates it won
        assert all(tuning.HOPPER_CONFIGS[name][d] in by_dim[d] for d in by_dim)


def test_sweep_picks_the_fastest_config_of_each_pass_and_times_them_together(monkeypatch):
    """With a fake timer whose backward costs a fixed amount per config of each pass, the sweep's pair
    is each pass's cheapest candidate, timed with the shipped configs restored around it."""
    from scripts.bench import attention_hopper as sweep

    d = 64
    cost = {name: {c: 1.0 + 0.1 * i for i, c in enumerate(reversed(by_dim[d]))}
            for name, by_dim in sweep.CANDIDATES.items()}

    def fake_timer(shape, dim):
        def backward_ms(hopper):
            if not hopper:
                return 5.0
            return sum(cost[name][tuning.HOPPER_CONFIGS[name][dim]] for name in cost)
        return 1.0, 2.0, backward_ms

    monkeypatch.setattr(sweep, "timer", fake_timer)
    shipped = {name: tuning.HOPPER_CONFIGS[name][d] for name in cost}
    rows, best = sweep.sweep(d)
    assert best == {name: sweep.CANDIDATES[name][d][-1] for name in cost}  # the cheapest: last in each list
    assert rows[-1]["backward"] == f"hopper, fastest pair: {sweep.pair_label(best)}" and rows[-1]["ms"] == 2.0
    assert len(rows) == 2 + sum(len(sweep.CANDIDATES[name][d]) for name in cost)
    assert {name: tuning.HOPPER_CONFIGS[name][d] for name in cost} == shipped
    other = sweep.elsewhere(d, best)
    assert [r["backward"].split(":")[0] for r in other] == ["triton passes", "hopper, shipped",
                                                           "hopper, fastest pair"] * len(sweep.OTHER_SHAPES)


def test_shipped_and_sweep_configs_pass_the_checks_hopper_config_makes():
    from scripts.bench import attention_hopper as sweep

    candidates = {**sweep.CANDIDATES, "fwd": sweep.FORWARD_CANDIDATES}
    for name, by_dim in tuning.HOPPER_CONFIGS.items():
        for d, shipped in by_dim.items():
            for config in [shipped, *candidates[name][d]]:
                with tuning.hopper_config(name, d, config):
                    assert tuning.HOPPER_CONFIGS[name][d] is config


@pytest.mark.parametrize("name, d, config, error", [
    ("dqq", 128, tuning.HopperConfig(64, 64, 4, 2), "no Hopper kernel 'dqq' at head dim 128"),
    ("dq", 96, tuning.HopperConfig(64, 64, 4, 2), "no Hopper kernel 'dq' at head dim 96"),
    ("dq", 128, (64, 64, 4, 2), "config must be a tuning.HopperConfig, got \\(64, 64, 4, 2\\)"),
    ("dq", 128, tuning.HopperConfig(48, 64, 4, 2), "bm and bn must be powers of two >= 16, got 48 and 64"),
    ("dkdv", 64, tuning.HopperConfig(64, 8, 4, 2), "bm and bn must be powers of two >= 16, got 64 and 8"),
    ("dq", 64, tuning.HopperConfig(64, 64, 6, 2), "warps must be a multiple of 4 \\(whole warpgroups\\), got 6"),
    ("dq", 64, tuning.HopperConfig(64, 64, 4, 1), "stages must be at least 2, got 1"),
    ("dq", 64, tuning.HopperConfig(64, 64.0, 4, 2), "bm, bn, warps and stages must be ints"),
    ("dq", 64, tuning.HopperConfig(64, 64, True, 2), "bm, bn, warps and stages must be ints"),
    ("fwd", 64, tuning.HopperConfig(64, 64, 4, 3, 170), "maxnreg must be None or a multiple of 8 from 24 to 255 "
                                                        "\\(registers per thread\\), got 170"),
    ("fwd", 64, tuning.HopperConfig(64, 64, 4, 3, 256), "got 256"),
    ("fwd", 128, tuning.HopperConfig(64, 64, 4, 2, 16), "got 16"),
    ("fwd", 128, tuning.HopperConfig(64, 64, 4, 2, "168"), "got '168'"),
    ("fwd", 128, tuning.HopperConfig(64, 64, 4, 2, True), "got True"),
    ("fwd", 64, tuning.HopperConfig(32, 64, 4, 2), "bm must be a multiple of 64 for 'fwd' \\(the rows of its score "
                                                   "tiles, wgmma's M\\), got 32"),
    ("dq", 128, tuning.HopperConfig(16, 64, 4, 2), "bm must be a multiple of 64 for 'dq'"),
    ("dkdv", 64, tuning.HopperConfig(64, 32, 4, 2), "bn must be a multiple of 64 for 'dkdv'"),
    ("dkdv", 128, tuning.HopperConfig(32, 128, 8, 3), "warps must be 4 for 'dkdv' \\(each of its two consumer "
                                                      "partitions is one warpgroup\\), got 8"),
    ("dkdv", 64, tuning.HopperConfig(64, 64, 4, 3, 168), "maxnreg must be None for 'dkdv' \\(it splits its "
                                                         "registers between its partitions itself\\), got 168"),
    ("dkdv", 128, tuning.HopperConfig(32, 64, 4, 3, None, "yes"), "keys_in_registers must be a bool, got 'yes'"),
    ("dkdv", 128, tuning.HopperConfig(32, 64, 4, 3, None, 1), "keys_in_registers must be a bool, got 1"),
    ("dq", 128, tuning.HopperConfig(64, 64, 4, 2, None, True), "keys_in_registers applies to the column pass "
                                                              "'dkdv' only, not 'dq'"),
    ("fwd", 64, tuning.HopperConfig(64, 64, 4, 3, 168, True), "not 'fwd'"),
    ("dq", 128, tuning.HopperConfig(64, 64, 4, 2, paired=True), "paired applies to the forward 'fwd' only, not 'dq'"),
    ("dkdv", 128, tuning.HopperConfig(32, 64, 4, 3, paired=True), "paired applies to the forward 'fwd' only"),
    ("fwd", 128, tuning.HopperConfig(64, 64, 4, 2, paired=1), "paired must be a bool, got 1"),
    ("fwd", 128, tuning.HopperConfig(128, 64, 8, 2, paired=True), "warps must be 4 for a paired 'fwd' \\(each of "
                                                                  "its two consumer partitions is one warpgroup\\), got 8"),
    ("fwd", 128, tuning.HopperConfig(64, 64, 4, 2, stats_in_shared=True), "stats_in_shared applies to the row pass "
                                                                         "'dq' only, not 'fwd'"),
    ("dkdv", 64, tuning.HopperConfig(64, 64, 4, 3, stats_in_shared=True), "not 'dkdv'"),
    ("dq", 128, tuning.HopperConfig(64, 64, 4, 2, stats_in_shared="yes"), "stats_in_shared must be a bool, got 'yes'"),
    ("fwd", 64, tuning.HopperConfig(64, 64, 4, 3, 168, paired=True), "maxnreg must be None for a paired 'fwd' "
                                                                     "\\(it splits its registers"),
    ("fwd", 64, tuning.HopperConfig(64, 64, 4, 3, 168, pingpong=True), "pingpong needs two consumer warpgroups "
                                                                       "\\(the column pass 'dkdv' or a paired "
                                                                       "'fwd'\\), not an unpaired 'fwd'"),
    ("dq", 128, tuning.HopperConfig(64, 64, 4, 2, pingpong=True), "not an unpaired 'dq'"),
    ("dkdv", 128, tuning.HopperConfig(32, 64, 4, 3, pingpong=1), "pingpong must be a bool, got 1"),
    ("fwd", 128, tuning.HopperConfig(64, 64, 4, 2, paired=True, pingpong="on"), "pingpong must be a bool, got 'on'"),
])
def test_hopper_config_rejects_bad_kernels_head_dims_and_configs(name, d, config, error):
    shipped = {k: dict(v) for k, v in tuning.HOPPER_CONFIGS.items()}
    with pytest.raises((ValueError, TypeError), match=error):
        with tuning.hopper_config(name, d, config):
            pass
    assert tuning.HOPPER_CONFIGS == shipped


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without an sm_90 GPU")
def test_sweep_refuses_without_a_hopper_gpu():
    from scripts.bench import attention_hopper as sweep

    with pytest.raises(SystemExit, match="needs an sm_90 GPU"):
        sweep.main(["--out", "unused"])


@pytest.mark.parametrize("d", [128, 64])
def test_forward_sweep_candidates_have_distinct_labels(d):
    """The sweep keys its timings by label: a paired config and the single-tile one of the same tiles
    (or a capped and an uncapped one) would otherwise share a row."""
    from scripts.bench import attention_hopper as sweep

    labels = [sweep.label(c) for c in sweep.FORWARD_CANDIDATES[d]]
    assert len(set(labels)) == len(labels), labels
    assert any(c.paired for c in sweep.FORWARD_CANDIDATES[d])
    assert sweep.label(tuning.HopperConfig(64, 64, 4, 2, paired=True)) == "64x64 w4 s2 paired"


def test_forward_sweep_times_each_candidate_under_its_config_beside_the_triton_forward(monkeypatch):
    """With fake inputs, forward and timer: one row per shape for the Triton forward and one per
    candidate, each candidate's call made with that config active and the Hopper kernels on, the
    Triton forward's with them off; ratios against the Triton forward."""
    from scripts.bench import attention_autotune, attention_hopper as sweep

    d = 64
    calls = []
    shipped = tuning.HOPPER_CONFIGS["fwd"][d]

    def forward(q, r, k, v, scale, hopper=True):
        calls.append(tuning.HOPPER_CONFIGS["fwd"][d] if hopper else "triton")

    monkeypatch.setattr(sweep, "make_inputs", lambda b, n, hq, hkv, dim: (torch.zeros(1, 1, 1, dim),) * 4)
    monkeypatch.setattr(fused, "forward", forward)
    cost = {"triton": 2.0, **{f"hopper {sweep.label(c)}": 1.0 + i for i, c in enumerate(sweep.FORWARD_CANDIDATES[d])}}

    def fake_interleaved(fns, rounds, iters, timer):
        for fn in fns.values():
            fn()
        return {name: cost[name] for name in fns}

    monkeypatch.setattr(attention_autotune, "interleaved_ms", fake_interleaved)
    rows = sweep.forward_sweep(d, rounds=1)
    assert len(rows) == len(sweep.FORWARD_SHAPES) * (1 + len(sweep.FORWARD_CANDIDATES[d]))
    assert calls[: 1 + len(sweep.FORWARD_CANDIDATES[d])] == ["triton", *sweep.FORWARD_CANDIDATES[d]]
    first = {r["forward"]: r["vs_triton"] for r in rows if r["L"] == sweep.FORWARD_SHAPES[0][1]}
    assert first["triton"] == 1.0 and first[f"hopper {sweep.label(sweep.FORWARD_CANDIDATES[d][0])}"] == 0.5
    assert "| 4 | 4096 | 64 | hopper 64x64 w4 s3 r168 | 2.0000 | 1.000 |" in sweep.forward_report_markdown(rows)
    assert tuning.HOPPER_CONFIGS["fwd"][d] is shipped  # restored
    assert shipped in sweep.FORWARD_CANDIDATES[d]


@pytest.mark.parametrize("name, shipped_row", [
    ("dkdv", "| 4 | 4096 | 128 | dkdv | 32x64 w4 s3 k in registers | 3.000 | 2.00 | yes |"),
    ("dq", "| 4 | 4096 | 128 | dq | 64x64 w4 s2 stats in shared | 3.000 | 2.00 | yes |"),
])
def test_pass_comparison_times_each_candidate_under_its_config_and_compares_bits(monkeypatch, name, shipped_row):
    """With fake inputs, forward, backward and timers: one row per shape and candidate of the compared
    pass, each backward run with that candidate active (the other pass at its shipped config); bits
    compared with the first candidate's gradients; the shipped configs restored."""
    from scripts.bench import attention_autotune, attention_hopper as sweep

    shipped = {n: tuning.HOPPER_CONFIGS[n][128] for n in ("dq", "dkdv")}
    candidates = sweep.COMPARED[name]
    other = "dq" if name == "dkdv" else "dkdv"
    seen = []

    def backward(do, q, r, k, v, *rest):
        assert tuning.HOPPER_CONFIGS[other][128] is shipped[other]
        config = tuning.HOPPER_CONFIGS[name][128]
        seen.append(config)
        grad = torch.full((2,), 1.0 if config == candidates[-1] else 0.0)
        return grad, grad, grad, grad

    monkeypatch.setattr(sweep, "make_inputs", lambda b, n, hq, hkv, dim: (torch.zeros(1, 1, 1, dim),) * 4)
    monkeypatch.setattr(sweep, "cudnn_ms", lambda *a: 2.0)
    monkeypatch.setattr(fused, "forward", lambda *a, **k: (None,) * 4)
    monkeypatch.setattr(fused, "backward", backward)
    monkeypatch.setattr("triton.testing.do_bench", lambda fn, **k: 1.0)
    cost = {sweep.label(c): 3.0 + i for i, c in enumerate(candidates)}
    monkeypatch.setattr(attention_autotune, "interleaved_ms", lambda fns, *a: {n: (fns[n](), cost[n])[1] for n in fns})
    rows = sweep.pass_comparison(name, rounds=1)
    assert len(rows) == (1 + len(sweep.OTHER_SHAPES)) * len(candidates)
    assert seen[: len(candidates)] == candidates
    first = rows[: len(candidates)]
    assert [r["same_bits"] for r in first] == [True] * (len(first) - 1) + [False]
    assert first[0]["fwd_bwd_vs_cudnn"] == 2.0  # (1 + 3) / 2
    assert shipped_row in sweep.comparison_report_markdown(rows)
    assert {n: tuning.HOPPER_CONFIGS[n][128] for n in shipped} == shipped
    assert sweep.ROW_CANDIDATES[0] == tuning.HOPPER_CONFIGS["dq"][128]  # the others are compared with the shipped
