"""scripts.bench.kernel_resources: compiling our kernels for sm_90 without a GPU, and reading the SASS."""

from kernels.parallax import fused
from scripts.bench import kernel_resources as kr


def test_signature_types_every_argument():
    consts = {"D": 64, "BM": 128, "BN": 64, "VARLEN": False, "PREC": "tf32", "GLOBAL_ORDER": True}
    sig = kr.signature(fused._fwd_kernel, consts)
    assert list(sig) == fused._fwd_kernel.arg_names
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
    res = kr.resources(fused._fwd_kernel, consts, num_warps=8, num_stages=3)
    assert res["wgmma"] > 0  # sm_90 code: Hopper's warpgroup MMA, not the sm_80 mma.sync path
    assert 0 < res["registers"] <= 255
    assert 0 < res["shared"] <= 232448  # H100/H200 opt-in shared memory per block
    assert res["stack"] >= 0 and res["spill_stores"] >= 0


def test_alignment_covers_pointers_and_strides_only():
    """A real launch specialises 16-divisible pointers and strides; sizes that vary per call and the
    float scales are never specialised, so they must not be marked."""
    consts = {"D": 64, "BM": 128, "BN": 64, "VARLEN": False, "PREC": "tf32", "GLOBAL_ORDER": True}
    names = fused._fwd_kernel.arg_names
    marked = {names[i] for (i,) in kr.aligned(fused._fwd_kernel, consts)}
    assert {"Q", "R", "K", "V", "O", "TBAR", "LSE", "DOCS", "sqt", "sqh", "skt", "skh"} <= marked
    assert not marked & {"T", "L", "HQ", "GROUP", "qk_scale", "D", "BM"}


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
