"""scripts.bench.generate: transformers' Qwen3 given our weights computes our logits, the bytes a
decode step reads, the results page from fabricated timings; (GPU) a tiny end-to-end run."""

from __future__ import annotations

import json

import pytest
import torch

from scripts.bench import generate as bench
from tests._generation_models import recompute_greedy, tiny_model


def test_transformers_qwen3_holds_our_weights():
    pytest.importorskip("transformers")
    ours = tiny_model("transformer", max_seq_len=64)
    hf = bench.hf_qwen3(ours)
    tokens = torch.randint(0, 4096, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, ours(tokens), rtol=1e-5, atol=1e-5)
    out = hf.generate(tokens[:1, :6], max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None,
                      attention_mask=torch.ones(1, 6, dtype=torch.long))
    assert out[0, 6:].tolist() == recompute_greedy(ours, tokens[0, :6].tolist(), 5)


def test_timers_run_on_cpu():
    """The timed paths (ours without the graph, transformers' two caches, the recompute path) on a
    tiny model: every sequence gets exactly the new tokens asked for."""
    pytest.importorskip("transformers")
    ours = tiny_model("transformer", max_seq_len=64)
    row = bench.time_ours(ours, batch=2, prompt=10, new=5, graph=False)
    assert row["total_s"] > 0 and len(row["first_tokens"]) == 2
    hf = bench.hf_qwen3(ours)
    for cache in ("static", "dynamic"):
        assert bench.time_hf(hf, 2, 10, 5, cache, compile_=False)["first_tokens"] == row["first_tokens"]
    assert bench.time_recompute(ours, 2, 10, 3)["total_s"] > 0


def test_step_bytes_counts_weights_once_and_the_kv_of_the_context():
    model = tiny_model("parallax")  # debug: 2 layers, Hkv 4, D 32, tied embeddings, fp32
    args = model.model_args
    state = model.state_dict()
    weights = 4 * (sum(v.numel() for v in state.values()) - state["output.weight"].numel())  # tied: once
    kv = 2 * args.n_layers * 3 * 100 * args.n_kv_heads * args.head_dim * 2
    assert bench.step_bytes(model, batch=3, context=100) == weights + kv


def test_results_page_from_fabricated_timings():
    row = lambda variant, hf: {"variant": variant, "batch": 4, "prompt": 1024, "new": 128, "bound_step_ms": 0.5,
                               "ours": {"total_s": 0.2, "step_ms": 1.25, "first_tokens": [1, 2, 3, 4]},
                               **({"hf_static": {"total_s": 8.0, "first_tokens": [1, 2, 3, 4]},
                                   "hf_dynamic": {"total_s": 4.0, "first_tokens": [1, 2, 0, 4]}} if hf else {})}
    result = {"copy_tbps": 4.0, "rows": [row("parallax", False), row("transformer", True)],
              "recompute": {"variant": "parallax", "batch": 4, "prompt": 1024, "new": 16, "total_s": 2.0}}
    page = bench.markdown(result)
    lines = [line for line in page.splitlines() if line.startswith("| parallax") or line.startswith("| transformer")]
    # 4 x 128 / 0.2 s = 2560 tok/s; transformers' best 4 x 128 / 4 s = 128 tok/s: 20x; bound 4 / 0.5 ms = 8000
    assert lines[0].split(" | ")[3:11] == ["2,560", "640", "1.25", "0.50", "8,000", "-", "-", "20.0x"]
    assert lines[1].split(" | ")[8:12] == ["64", "128", "20.0x", "3/4 |"]
    assert "32 tok/s (8 per sequence)" in page
    json.dumps(result)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_run_writes_the_page(tmp_path):
    bench.main(["--flavor", "debug", "--batches", "1,2", "--prompts", "16,40", "--new-tokens", "8",
                "--out", str(tmp_path / "gen")])
    data = json.loads((tmp_path / "gen.json").read_text())
    assert len(data["rows"]) == 8 and data["recompute"]["total_s"] > 0
    assert "| transformer | 2 | 40 |" in (tmp_path / "gen.md").read_text()
