"""The draft kernels of scripts/bench/drafts (the forward and the row pass over paired query tiles)
compile for sm_90 with every config their benchmark runs, and keep their wgmmas asynchronous, so the
benchmark measures the design and not a serialised build. On CPU: compiles only; the benchmark
(``python -m scripts.bench.drafts.bench_pairs OUT.json``) runs them against the shipped kernels and
the fp64 reference on an H200."""

from __future__ import annotations

import pytest

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from kernels.parallax import hopper, tuning  # noqa: E402
from scripts.bench import kernel_resources as kr  # noqa: E402
from scripts.bench.drafts import bench_pairs  # noqa: E402

IN_FLIGHT = {"fwd": 1, "dq": 2}  # the score products issued before the first wait, as in the shipped kernels
CASES = [(d, name, kernel) for d in (128, 64) for name, variant in bench_pairs.variants(d).items()
         for kernel in variant]


@pytest.mark.parametrize("d, name, kernel", CASES, ids=[f"d{d}-{name}" for d, name, _ in CASES])
def test_each_draft_config_compiles_with_its_wgmmas_in_flight(d, name, kernel):
    shim, config = bench_pairs.variants(d)[name][kernel]
    with tuning.hopper_config(kernel, d, config):  # the benchmark sets it the same way: its checks pass
        pass
    constexprs = {**hopper.constexprs(d, config, False), **bench_pairs.PAIR_REGISTERS}
    compiled = kr.compile_gluon(shim.kernel, constexprs, kr.hopper_descriptor_types(config.bm, config.bn, d))
    sass = kr._cuobjdump(compiled.asm["cubin"], ["-sass"])[0]
    assert max(kr.wgmma_waits(sass)) == IN_FLIGHT[kernel]
    assert kr.compiled_resources(compiled)["registers"] == bench_pairs.PAIR_REGISTERS["maxnreg"]
