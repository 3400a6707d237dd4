"""The results pages of scripts.bench.optimizers and scripts.bench.decode on fabricated timings: the
ratios they derive, the table rows, and the header with the reproducing command."""

import json

import pytest

from scripts.bench import decode, optimizers
from scripts.bench.results import describe


def _optimizer_result(fwd_bwd_s: dict, errors: dict | None = None) -> dict:
    result = {"meta": describe("Optimizer step benchmark", "fabricated", "python -m scripts.bench.optimizers"),
              "flavor": "debug", "n_params": 1234, "fwd_bwd_batch": "4 x 32 as 1 micro-batches of 4 x 32",
              "opt_step_s": {"adamw": 0.002, "muon_polar_express_batched": 0.010}, "fwd_bwd_s": fwd_bwd_s}
    return {**result, "fwd_bwd_error": errors} if errors else result


def test_optimizer_ratios_use_the_parallax_forward_backward_when_it_ran(tmp_path):
    optimizers.write(_optimizer_result({"softmax": 0.1, "parallax": 0.2}), str(tmp_path / "opt"))
    saved = json.loads((tmp_path / "opt.json").read_text())
    muon = saved["ratios"]["muon_polar_express_batched"]
    assert muon["vs_adamw"] == pytest.approx(5.0) and muon["vs_fwd_bwd"] == pytest.approx(0.05)
    assert saved["fwd_bwd_model"].startswith("ParallaxQwen3Model (Parallax")
    text = (tmp_path / "opt.md").read_text()
    assert text.startswith("# Optimizer step benchmark\n") and "`python -m scripts.bench.optimizers`" in text
    assert "| muon_polar_express_batched | 10.0 | 5.000 | 0.050 |" in text
    assert "Parameter set: Parallax debug (1,234 parameters, fp32)." in text


def test_optimizer_ratios_fall_back_to_softmax_and_report_the_failure(tmp_path):
    result = _optimizer_result({"softmax": 0.1}, {"parallax": "OutOfMemoryError: no"})
    optimizers.write(result, str(tmp_path / "opt"))
    text = (tmp_path / "opt.md").read_text()
    assert "| adamw | 2.0 | 1.000 | 0.020 |" in text and "fwd+bwd (parallax) failed: OutOfMemoryError: no" in text
    saved = json.loads((tmp_path / "opt.json").read_text())
    assert saved["fwd_bwd_model"].endswith("(TorchTitan Qwen3 attention, SDPA)")


def test_decode_table_marks_contenders_that_did_not_run():
    us = {"cudnn-gqa": 20.0, "cudnn-packed": 25.0, "ours": 22.0}
    row = {"D": 128, "B": 1, "L": 4096, "us": us, "ratio": {n: t / 20.0 for n, t in us.items()},
           "tbps": {"ours": 2 * 4096 * 8 * 128 * 2 / 22.0 / 1e6}}
    text = decode.markdown([row], 4.25)
    assert text.startswith("Device-to-device copy ceiling 4.25 TB/s (read + write).\n")
    assert "| 128 | 1 | 4096 | 20.0 | 25.0 | - | - | - | - | 22.0 | 0.76 | 1.10 | - | - |" in text
