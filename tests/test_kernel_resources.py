"""scripts.bench.kernel_resources: compiling our kernels for sm_90 without a GPU, and reading the SASS."""

from kernels.parallax import fused
from scripts.bench import kernel_resources as kr


def test_signature_types_every_argument():
    consts = {"D": 64, "BM": 128, "BN": 64, "VARLEN": False, "PREC": "tf32", "GLOBAL_ORDER": True}
    sig = kr.signature(fused.JIT_KERNELS["fwd"], consts)
    assert list(sig) == fused.JIT_KERNELS["fwd"].arg_names
    assert sig["Q"] == "*bf16" and sig["TBAR"] == "*fp32" and sig["DOCS"] == "*i32"
    assert sig["qk_scale"] == "fp32" and sig["T"] == "i32" and sig["D"] == "constexpr"


def test_opcodes_drop_addresses_and_predicates():
    sass = """
        /*0010*/                   LDL.64 R2, [R1+0x8] ;               /* 0x000fe20000100a00 */
        /*0020*/              @!P0 STL [R1+0x10], R4 ;                /* 0x0001e80000100800 */
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        .text._fwd_kernel:
    """
    assert kr.opcodes(sass) == ["LDL.64", "STL", "HGMMA.64x64x16.F32.BF16"]


def test_forward_compiles_for_hopper_tensor_cores():
    consts = dict(D=64, BM=128, BN=64, VARLEN=False, PREC="tf32", GLOBAL_ORDER=True)
    res = kr.resources(fused.JIT_KERNELS["fwd"], consts, num_warps=8, num_stages=3)
    assert res["wgmma"] > 0  # sm_90 code: Hopper's warpgroup MMA, not the sm_80 mma.sync path
    assert 0 < res["registers"] <= 255
    assert 0 < res["shared"] <= 232448  # H100/H200 opt-in shared memory per block
    assert res["stack"] >= 0 and res["spill_stores"] >= 0


def test_alignment_covers_pointers_strides_and_the_benchmark_sizes():
    """A real launch specialises 16-divisible pointers, strides and int sizes; at the benchmark shape
    (B4 L4096 Hq16 Hkv8) T, L and HQ are multiples of 16 and HKV is not, as triton's own launch-time
    specialisation says. Float scales and constexprs are never marked."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    consts = {"D": 64, "BM": 128, "BN": 64, "VARLEN": False, "PREC": "tf32", "GLOBAL_ORDER": True}
    kernel = fused.JIT_KERNELS["dkdv"]
    marked = {kernel.arg_names[i] for (i,) in kr.aligned(kernel, consts)}
    assert {"Q", "R", "K", "V", "TBAR", "LSE", "DOCS", "sqt", "sqh", "skt", "skh", "svt", "svh"} <= marked
    assert not marked & {"qk_scale", "D", "BM"}
    for name, value in {"T": 4 * 4096, "L": 4096, "HQ": 16, "HKV": 8}.items():
        launch = native_specialize_impl(CUDABackend, value, False, True, True)[1] == "D"
        assert (name in marked) == launch, (name, value)


def test_inner_loops_counts_the_innermost_backward_branches():
    """Two loops nested in a third: only the inner two count, with their instructions and HGMMAs."""
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0020*/                   FADD R2, R2, R3 ;
        /*0030*/              @P0 BRA 0x10 ;
        /*0040*/                   FMUL R2, R2, R3 ;
        /*0050*/                   FMUL R2, R2, R3 ;
        /*0060*/              @!P1 BRA 0x40 ;
        /*0070*/              @P2 BRA 0x10 ;
        /*0080*/                   EXIT ;
    """
    assert kr.inner_loops(sass) == [(3, 0), (3, 1)]


def test_compute_loops_skip_barrier_waits_inside_the_tile_loop():
    """A TMA tile loop holds a barrier-wait spin loop: the compute loop is the one with the HGMMAs."""
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   SYNCS.PHASECHK.TRANS64 P0, [UR4], R2 ;
        /*0020*/              @!P0 BRA 0x10 ;
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0040*/                   FADD R2, R2, R3 ;
        /*0050*/              @P1 BRA 0x10 ;
        /*0060*/                   EXIT ;
    """
    assert kr.inner_loops(sass) == [(2, 0)]
    assert kr.inner_loops(sass, compute=True) == [(5, 1)]


def test_shipped_tiles_cover_every_shipped_config_once_in_its_orientation():
    """The report's kernels together cover each kernel's shipped list, the column pass split by ROWS."""
    from kernels.parallax import tuning

    def tiles(configs):
        return {(c.kwargs["BM"], c.kwargs["BN"], c.num_warps, c.num_stages) for c in configs}

    assert set(kr.shipped_tiles("fwd")) == tiles(tuning.SHIPPED["fwd"])
    assert set(kr.shipped_tiles("dq")) == tiles(tuning.SHIPPED["dq"])
    rows = [c for c in tuning.SHIPPED["dkdv"] if c.kwargs.get("ROWS")]
    keys_by_queries = [c for c in tuning.SHIPPED["dkdv"] if not c.kwargs.get("ROWS")]
    assert rows and keys_by_queries
    assert set(kr.shipped_tiles("dkdv_rows")) == tiles(rows)
    assert set(kr.shipped_tiles("dkdv")) == tiles(keys_by_queries)
    assert all(len(kr.shipped_tiles(n)) == len(set(kr.shipped_tiles(n))) for n in kr.KERNELS)


def test_window_and_tuning_bucket_arguments_are_int32_sizes():
    """The kernels' runtime WINDOW and TUNE_W (and the other tuning buckets) compile as i32 scalars,
    not as pointers, and are not marked 16-divisible (their values vary per call)."""
    consts = {"D": 64, "BM": 64, "BN": 64, "VARLEN": False, "PREC": "tf32", "GLOBAL_ORDER": True}
    for name in ("fwd", "dq", "dkdv"):
        kernel = fused.JIT_KERNELS[name]
        sig = kr.signature(kernel, consts)
        assert {sig[a] for a in ("WINDOW", "TUNE_T", "TUNE_L", "TUNE_W")} == {"i32"}
        marked = {kernel.arg_names[i] for (i,) in kr.aligned(kernel, consts)}
        assert not marked & {"WINDOW", "TUNE_T", "TUNE_L", "TUNE_W"}


def test_tma_configs_compile_to_bulk_copies_on_hopper_and_pointer_loads_before():
    """The shipped TMA configs on any CUDA GPU: for sm_90 the forward's K/V tiles come through the bulk
    tensor copy engine; for sm_80 triton rewrites the descriptors into pointer loads, and it compiles."""
    from triton.backends.compiler import GPUTarget

    consts = dict(D=64, BM=64, BN=64, VARLEN=False, PREC="tf32", GLOBAL_ORDER=True, TMA=True, TMA_OK=True)
    ptx = {arch: kr.compile_kernel(fused.JIT_KERNELS["fwd"], consts, 4, 3, GPUTarget("cuda", arch, 32)).asm["ptx"]
           for arch in (90, 80)}
    assert "cp.async.bulk.tensor" in ptx[90]
    assert "cp.async.bulk.tensor" not in ptx[80]
    assert "cp.async.cg.shared.global" in ptx[80] or "ld.global" in ptx[80]  # Ampere's pointer loads


def test_hopper_passes_report_their_shipped_config_per_head_dim():
    """The backward's Gluon passes (``*_hopper``) are reported with ``tuning.HOPPER_CONFIGS``'s config of
    each head dim, compiled for Hopper's wgmma, within its registers and shared memory."""
    from kernels.parallax import tuning

    rows = list(kr.report_rows(["dq_hopper"], None, [64]))
    bm, bn, warps, stages = tuning.HOPPER_CONFIGS["dq"][64][:4]
    assert [row[:5] for row in rows] == [("dq_hopper", 64, f"{bm} x {bn}", warps, stages)]
    registers, wgmma, shared = rows[0][5], rows[0][8], rows[0][9]
    assert 0 < registers <= 255 and wgmma > 0 and 0 < shared <= 232448
