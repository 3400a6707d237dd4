"""scripts/bench_attention.py's report: the table, and the agreement section only when other Parallax
kernels ran beside ours (a run with --no-competitors has nothing to compare)."""

import torch

from scripts.bench_attention import write

ROW = {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128, "method": "parallax_ours", "mode": "fwd_bwd",
       "ms": 5.072, "vs_cudnn_same_D": 2.48, "vs_cudnn_D128": 2.48}
SHAPE = {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128}


def test_agreement_section_only_when_there_is_something_to_compare(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    alone, beside = str(tmp_path / "alone"), str(tmp_path / "beside")
    write([{"shape": SHAPE, "agreement_vs_ours": {}}], [ROW], {}, alone, ["bench_attention.py"])
    write([{"shape": SHAPE, "agreement_vs_ours": {"fla_0.6.0": 3.1e-3}}], [ROW], {}, beside, ["bench_attention.py"])
    text_alone, text_beside = open(alone + ".md").read(), open(beside + ".md").read()
    assert "| 4 | 4096 | 16/8 | 128 | parallax_ours | fwd_bwd | 5.072 | 2.48 | 2.48 |" in text_alone
    assert "Output agreement" not in text_alone
    assert "Output agreement" in text_beside and "fla_0.6.0 3.1e-03" in text_beside
