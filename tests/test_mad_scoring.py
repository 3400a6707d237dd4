"""MAD scoring and models: oracle = 1.0, constant predictor = chance, models built from the LM code,
a short CPU training run of attention beats chance on in-context recall."""

import pytest
import torch

from eval.mad.grid import TrainConfig
from eval.mad.metrics import AccuracyCounter, evaluate
from eval.mad.models import CompressionModel, build_model
from eval.mad.recall import IGNORE
from eval.mad.tasks import TaskSetting, make_dataset
from eval.mad.training import lr_factor
from parallax_titan.model import ParallaxAttention, ParallaxQwen3Model

ICR = TaskSetting("in-context-recall", 16, 64, num_train_examples=1024, num_test_examples=256, seed=3)


class Oracle(torch.nn.Module):
    """Told the answer: one-hot logits of the targets (IGNORE positions predict token 0)."""

    def __init__(self, inputs, targets, vocab):
        super().__init__()
        self.answers = {tuple(x.tolist()): y for x, y in zip(inputs, targets)}
        self.vocab = vocab

    def forward(self, x):
        y = torch.stack([self.answers[tuple(r.tolist())] for r in x]).clamp(min=0)
        return torch.nn.functional.one_hot(y, self.vocab).float()


class Constant(torch.nn.Module):
    def __init__(self, token, vocab):
        super().__init__()
        self.token, self.vocab = token, vocab

    def forward(self, x):
        return torch.nn.functional.one_hot(torch.full_like(x, self.token), self.vocab).float()


@pytest.mark.parametrize("task", ["in-context-recall", "selective-copying", "memorization", "compression"])
def test_oracle_scores_one(task):
    params = {"selective-copying": dict(vocab_size=16, seq_len=64, num_tokens_to_copy=8),
              "memorization": dict(vocab_size=64, seq_len=16)}.get(task, dict(vocab_size=16, seq_len=32))
    data = make_dataset(TaskSetting(task, num_train_examples=8, num_test_examples=64, **params))
    x, y = (torch.as_tensor(a) for a in data["test"])
    acc = evaluate(Oracle(x, y, params["vocab_size"]), x, y, params["vocab_size"], batch_size=16)
    assert acc == {"macro": 1.0, "micro": 1.0}


def test_constant_predictor_scores_chance():
    x, y = (torch.as_tensor(a) for a in make_dataset(ICR)["test"])
    values = y[y != IGNORE]
    acc = evaluate(Constant(int(values[0]), 16), x, y, 16)
    n_values = len(values.unique())
    assert n_values == 8
    assert acc["macro"] == pytest.approx(1 / n_values)  # recall 1 on one class, 0 on the others
    assert acc["micro"] == pytest.approx(float((values == values[0]).float().mean()))
    assert abs(acc["micro"] - 1 / 8) < 0.03


def test_macro_accuracy_matches_hand_count():
    c = AccuracyCounter(4)
    c.update(torch.tensor([0, 1, 1, 3, 2]), torch.tensor([0, 1, 2, IGNORE, 2]))
    # class 0: 1/1, class 1: 1/1, class 2: 1/2; class 3 never seen (ignored position) -> skipped
    assert c.result() == {"macro": pytest.approx((1 + 1 + 0.5) / 3), "micro": pytest.approx(3 / 4)}
    with pytest.raises(ValueError, match="targets"):
        c.update(torch.tensor([0]), torch.tensor([7]))


@pytest.mark.parametrize("mixer,rope", [("attention", None), ("parallax", True), ("parallax_norope", False)])
def test_models_are_the_lm(mixer, rope):
    m = build_model("in-context-recall", mixer, 16, 64, dim=32, n_heads=2, hidden_dim=64, backend="reference")
    assert isinstance(m, ParallaxQwen3Model) and len(m.layers) == 2 and m.model_args.dim == 32
    attn = m.layers["0"].attention
    assert isinstance(attn, ParallaxAttention) == (mixer != "attention")
    if rope is not None:
        assert attn.rho_rope is rope
    logits = m(torch.randint(0, 16, (2, 63)))
    assert logits.shape == (2, 63, 16) and torch.isfinite(logits).all()
    comp = build_model("compression", mixer, 16, 32, dim=32, n_heads=2, hidden_dim=64, backend="reference")
    assert isinstance(comp, CompressionModel) and comp(torch.randint(0, 16, (2, 32))).shape == (2, 32, 16)
    with pytest.raises(ValueError, match="mixer"):
        build_model("in-context-recall", "mamba", 16, 64)


def test_wsd_schedule():
    f = [lr_factor(k, 100, "wsd", 0.2) for k in range(100)]
    assert f[:80] == [1.0] * 80 and f[90] == pytest.approx(0.5) and f[99] == pytest.approx(0.05)
    assert lr_factor(0, 10, "cosine") == 1.0 and lr_factor(5, 10, "cosine") == pytest.approx(0.5)


def test_attention_learns_in_context_recall_on_cpu():
    from eval.mad.training import train_and_evaluate

    torch.set_num_threads(1)
    data = make_dataset(ICR)
    model = build_model(ICR.task, "attention", 16, 64, dim=64, n_heads=4, hidden_dim=128)
    cfg = TrainConfig(epochs=6, batch_size=32, grad_clip=1.0)  # 192 steps; reaches ~0.8
    result = train_and_evaluate(model, data, cfg, lr=5e-3, weight_decay=0.0, num_classes=16)
    assert result["finite"]
    assert result["test_acc"] > 0.45, result  # chance is 1/8
