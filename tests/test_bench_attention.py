"""scripts.bench.attention's report: the header, the table, and the agreement section only when other
Parallax kernels ran beside ours (a run with --no-competitors has nothing to compare)."""

import json

from scripts.bench.attention import write

ROW = {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128, "method": "parallax_ours", "mode": "fwd_bwd",
       "ms": 5.072, "vs_cudnn_same_D": 2.48, "vs_cudnn_D128": 2.48}
SHAPE = {"B": 4, "L": 4096, "Hq": 16, "Hkv": 8, "D": 128}
COMMAND = "python -m scripts.bench.attention --no-competitors"


def test_agreement_section_only_when_there_is_something_to_compare(tmp_path):
    alone, beside = str(tmp_path / "alone"), str(tmp_path / "beside")
    write([{"shape": SHAPE, "agreement_vs_ours": {}}], [ROW], {}, alone, COMMAND)
    write([{"shape": SHAPE, "agreement_vs_ours": {"fla_0.6.0": 3.1e-3}}], [ROW], {}, beside, COMMAND)
    text_alone, text_beside = open(alone + ".md").read(), open(beside + ".md").read()
    assert "| 4 | 4096 | 16/8 | 128 | parallax_ours | fwd_bwd | 5.072 | 2.48 | 2.48 |" in text_alone
    assert "Output agreement" not in text_alone
    assert "Output agreement" in text_beside and "fla_0.6.0 3.1e-03" in text_beside


def test_page_and_json_carry_the_command_that_reproduces_them(tmp_path):
    out = str(tmp_path / "attention_train")
    tuning = {"fwd": {"(4096,)": "BM: 128"}}
    text = write([{"shape": SHAPE, "agreement_vs_ours": {}}], [ROW], tuning, out, COMMAND)
    assert text.startswith("# Parallax attention training benchmark\n") and f"`{COMMAND}`" in text
    saved = json.loads(open(out + ".json").read())
    assert saved["meta"]["command"] == COMMAND and saved["ratios"] == [ROW] and saved["tuning"] == tuning
