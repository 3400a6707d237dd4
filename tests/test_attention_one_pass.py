"""The one-pass backward benchmark (scripts/bench/attention_one_pass.py): its kernel compiles for
Hopper without a GPU, keeps its wgmmas asynchronous and adds partials without reading them back; on an
sm_90 GPU its gradients match fp64 and its ordered sums give the same bits on a rerun."""

import functools
import re

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from scripts.bench import attention_one_pass as one_pass  # noqa: E402
from scripts.bench import kernel_resources  # noqa: E402


@functools.cache
def _sass(mode):
    """The one-pass kernel's SASS in ``mode``, compiled once per test session."""
    return kernel_resources._cuobjdump(one_pass.compiled(mode).asm["cubin"], ["-sass"])[0]


@pytest.mark.parametrize("mode", sorted(one_pass.MODES))
def test_compiles_for_hopper_with_wgmmas_in_flight(mode):
    sass = _sass(mode)
    waits = kernel_resources.wgmma_waits(sass)
    assert waits and max(waits) == 2, waits  # the three score products in flight together
    adds = re.findall(r"\b(REDG|ATOMG)\.\S*ADD\.F32", sass)
    if mode == "no partials":
        assert not adds
    else:
        # the middle key tiles add without a result register (ATOMG would make ptxas wait on it)
        assert adds and set(adds) == {"REDG"}, adds


def test_only_the_ordered_mode_releases_turns_behind_a_gpu_fence():
    """The ordered mode counts each query tile's contributions with an integer add (the turns) after a
    GPU-scope fence; the other modes take no turns."""
    def turns(sass):
        # an integer add (no type suffix): ATOMG in triton 3.6, REDG (result unused) in 3.9
        return (len(re.findall(r"\b(?:ATOMG|REDG)\.E\.ADD\.STRONG\.GPU\b", sass)),
                len(re.findall(r"\bMEMBAR\.ALL\.GPU\b", sass)))

    counts = {mode: turns(_sass(mode)) for mode in one_pass.MODES}
    assert all(n >= 1 for n in counts["ordered"]), counts
    assert counts["unordered"] == counts["no partials"] == (0, 0), counts


@pytest.mark.parametrize("mode", ["sideways", ""])
def test_bad_mode_is_refused_by_name(mode):
    with pytest.raises(ValueError, match=f"mode {mode!r}: expected one of"):
        one_pass.one_pass_backward(*([torch.zeros(1)] * 9), 1.0, mode)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                    reason="needs an sm_90 GPU")
def test_gpu_one_pass_matches_fp64_and_reruns_bit_for_bit():
    row = one_pass.check((2, 1000, 4, 2))
    assert row["rerun_same_bits"]
    two_pass = row["two_pass_vs_fp64"]
    for name, err in row["one_pass_vs_fp64"].items():
        assert err < max(2 * two_pass[name], 1e-2), (name, err, two_pass[name])
