"""The loop-variant benchmark rewrites exactly the fused kernels' KV and query loops."""

from __future__ import annotations

import argparse
import ast

import pytest

from scripts.bench import attention_loops


@pytest.mark.parametrize("name, flags", [("range", {}), ("tma", {"TMA": True}), ("maxnreg", {"maxnreg": 168})])
def test_shipped_source_variants(name, flags):
    from kernels.parallax import fused

    assert attention_loops.variant_source(name) == open(fused.__file__).read()
    assert attention_loops.CONFIG_FLAGS.get(name, {}) == flags


@pytest.mark.parametrize("name", ["warp_specialize", "loop_stages"])
def test_every_tile_loop_is_rewritten_and_nothing_else(name):
    shipped = attention_loops.variant_source("range").splitlines()
    rewritten = attention_loops.variant_source(name).splitlines()
    assert len(rewritten) == len(shipped)
    changed = [(a.strip(), b.strip()) for a, b in zip(shipped, rewritten) if a != b]
    # forward and row pass loop over KV tiles, the column pass's two orientations over query tiles
    assert sorted(a for a, _ in changed) == sorted([attention_loops._KV_LOOP] * 2 + [attention_loops._Q_LOOP] * 2)
    assert {b for _, b in changed} == set(attention_loops.LOOPS[name])
    ast.parse("\n".join(rewritten))


def test_a_changed_loop_header_is_an_error(monkeypatch):
    monkeypatch.setattr(attention_loops, "_KV_LOOP", "for n0 in range(lo, hi, BLOCK_N):")
    with pytest.raises(RuntimeError, match="loop headers changed"):
        attention_loops.variant_source("warp_specialize")


def test_variant_list_rejects_unknown_names():
    assert attention_loops.variant_list("range, tma") == ("range", "tma")
    for bad in ("tma,ws", ",", "fast"):
        with pytest.raises(argparse.ArgumentTypeError, match="--variants"):
            attention_loops.variant_list(bad)
