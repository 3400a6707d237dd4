"""scripts.bench.mad_step: the timed steps train the model, and the page reports both modes."""

import dataclasses

import torch

from eval.mad.grid import ModelConfig, TrainConfig
from scripts.bench import mad_step


def test_timed_steps_train_the_model():
    """The step is eval.mad.training's: the weights move, and the time is positive."""
    model_kw = dataclasses.asdict(ModelConfig(dim=32, n_heads=4, hidden_dim=64, backend="reference"))
    train = TrainConfig(batch_size=4, precision="fp32")
    ms, model = mad_step.step_ms("attention", model_kw, train, False, "cpu", warmup=0, steps=2)
    fresh, again = (mad_step.build_model("in-context-recall", "attention", mad_step.VOCAB, mad_step.SEQ_LEN,
                                         **model_kw) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), again.state_dict().values()))
    assert ms > 0
    moved = [not torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values())]
    assert any(moved)


def test_page_lists_each_mixer_with_both_modes_and_their_ratio(tmp_path):
    from scripts.bench.results import describe

    result = {"meta": describe("t", "m", "c"), "setup": "tiny", "ms": {"a": {"eager": 40.0, "compiled": 20.0},
                                                                      "b": {"eager": 10.0}}}
    mad_step.write(result, str(tmp_path / "page"))
    text = (tmp_path / "page.md").read_text()
    assert "| a | 40.00 | 20.00 | 0.50 |" in text
    assert "| b | 10.00 | n/a | n/a |" in text
