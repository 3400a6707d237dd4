"""The forward autotune check: interleaved timing order, labels, the report, and its command line."""

from __future__ import annotations

import pytest
import torch

from kernels.parallax import tuning
from scripts.bench import attention_autotune as aa


def test_interleaved_runs_every_candidate_in_turn_and_takes_the_median():
    calls = []
    per_round = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 2.0, 9.0])}

    def timer(fn, iters):
        name = fn()
        calls.append((name, iters))
        return next(per_round[name])

    result = aa.interleaved_ms({"a": lambda: "a", "b": lambda: "b"}, rounds=3, iters=7, timer=timer)
    assert calls == [("a", 7), ("b", 7)] * 3
    assert result == {"a": 3.0, "b": 2.0}


def test_sequential_times_each_candidate_once_in_list_order():
    order = []
    result = aa.sequential_ms({"b": lambda: "b", "a": lambda: "a"}, bench=lambda fn: order.append(fn()) or len(order))
    assert order == ["b", "a"] and result == {"b": 1, "a": 2}


def test_labels_name_tiles_warps_stages_and_order():
    head_major, global_order = tuning.both_orders([(128, 64, 8, 3)], TMA=True)
    assert aa.label(head_major) == "128x64 w8 s3 head-major"
    assert aa.label(global_order) == "128x64 w8 s3 global"
    assert len({aa.label(c) for c in aa.CANDIDATES}) == len(aa.CANDIDATES) == 4


def test_report_marks_each_autotuner_pick():
    names = [aa.label(c) for c in aa.CANDIDATES[:2]]
    row = {"shape": {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128}, "shipped_choice": names[1],
           "back_to_back_ms": {names[0]: 1.05, names[1]: 1.01}, "flushed_ms": {names[0]: 1.06, names[1]: 1.03},
           "sequential_do_bench_ms": {names[0]: 1.08, names[1]: 1.09},
           "autotuner": {"list order": (names[0], {names[0]: 1.04, names[1]: 1.06}),
                         "reversed": (names[1], {names[0]: 1.07, names[1]: 1.02})}}
    text = aa.report_markdown([row])
    assert f"shipped list runs **{names[1]}**" in text
    first, second = (line for line in text.splitlines() if line.startswith(f"| {names[0]}") or
                     line.startswith(f"| {names[1]}"))
    assert "| 1.0500 | 1.0600 | 1.0800 | 1.0400 (pick) | 1.0700 |" in first
    assert "| 1.0100 | 1.0300 | 1.0900 | 1.0600 | 1.0200 (pick) |" in second


@pytest.mark.parametrize("argv, message", [(["--rounds", "0"], "'0': expected an int >= 1"),
                                           (["--shapes", "9"], "invalid choice: 9")])
def test_bad_arguments_are_rejected_before_any_gpu_work(argv, message, capsys):
    with pytest.raises(SystemExit):
        aa.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
def test_without_a_gpu_it_says_so():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        aa.main(["--shapes", "0"])
