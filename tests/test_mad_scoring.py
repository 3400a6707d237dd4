"""MAD scoring and models: oracle = 1.0, constant predictor = chance, models built from the LM code,
a short CPU training run of attention beats chance on in-context recall."""

import dataclasses

import pytest
import torch

from eval.mad.grid import ModelConfig, TrainConfig, load_config
from eval.mad.metrics import AccuracyCounter, evaluate
from eval.mad.models import CompressionModel, PaddedHeadParallax, build_model, mad_model_args
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
    assert acc == {"batch_macro": 1.0, "macro": 1.0, "micro": 1.0}


def test_constant_predictor_scores_chance():
    x, y = (torch.as_tensor(a) for a in make_dataset(ICR)["test"])
    values = y[y != IGNORE]
    acc = evaluate(Constant(int(values[0]), 16), x, y, 16)
    n_values = len(values.unique())
    assert n_values == 8
    assert acc["macro"] == pytest.approx(1 / n_values)  # recall 1 on one class, 0 on the others
    assert acc["micro"] == pytest.approx(float((values == values[0]).float().mean()))
    assert abs(acc["micro"] - 1 / 8) < 0.03


class Lookup(torch.nn.Module):
    """Predicts the given tokens for each input row (rows are identified by their first token)."""

    def __init__(self, predictions: torch.Tensor, vocab: int):
        super().__init__()
        self.predictions, self.vocab = predictions, vocab

    def forward(self, x):
        return torch.nn.functional.one_hot(self.predictions[x[:, 0]], self.vocab).float()


def test_mad_score_is_the_mean_of_per_batch_macro_accuracies():
    """mad-lab: torchmetrics' macro MulticlassAccuracy per test batch, averaged over batches
    (weighted by sequences, as Lightning's on_epoch mean); one wrong prediction into a class that is
    never a target costs a batch's macro more than the whole set's when classes are rare."""
    targets = torch.tensor([[0, 1], [0, 1], [2, 2], [2, 3], [1, 1]])  # rows 0-1: batch 1; 2-3: batch 2; 4: batch 3
    predictions = torch.tensor([[0, 1], [0, 1], [2, 2], [2, 0], [1, 1]])
    inputs = torch.arange(5)[:, None].expand(5, 2).contiguous()
    acc = evaluate(Lookup(predictions, 4), inputs, targets, 4, batch_size=2)
    # batch 1: classes 0, 1 all right -> 1; batch 2: class 2 3/3, class 3 0/1, class 0 predicted
    # but never a target (recall 0, counted) -> (1 + 0 + 0) / 3; batch 3: class 1 -> 1
    assert acc["batch_macro"] == pytest.approx((2 * 1 + 2 * (1 / 3) + 1 * 1) / 5)
    # whole set: class 0 2/2, class 1 4/4, class 2 3/3, class 3 0/1 -> 3 / 4; micro 9 / 10
    assert acc["macro"] == pytest.approx(3 / 4) and acc["micro"] == pytest.approx(9 / 10)


def test_batch_macro_matches_torchmetrics():
    """Where torchmetrics is installed (mad-lab's scorer): MulticlassAccuracy(ignore_index=-100) per batch."""
    tm = pytest.importorskip("torchmetrics.classification")
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        targets = torch.randint(0, 6, (64,), generator=gen)
        targets[torch.rand(64, generator=gen) < 0.3] = IGNORE
        noise = torch.randint(0, 12, (64,), generator=gen)
        preds = torch.where(torch.rand(64, generator=gen) < 0.8, targets.clamp(min=0), noise)
        counter = AccuracyCounter(12)
        counter.update(preds, targets)
        reference = float(tm.MulticlassAccuracy(num_classes=12, ignore_index=IGNORE)(preds, targets))
        assert counter.result()["macro"] == pytest.approx(reference, abs=1e-6)


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


def test_heads_follow_mad_lab():
    """mad-lab's mh-attention at width 128: 16 heads of 8 (configs/layers/mh-attention.yml)."""
    for mixer in ("attention", "parallax"):
        args = mad_model_args(mixer, 16, 128)
        assert (args.dim, args.n_heads, args.n_kv_heads, args.head_dim) == (128, 16, 16, 8)
    assert ModelConfig().n_heads == 16 and load_config("configs/mad/paper_baseline.toml").model.n_heads == 16
    model = build_model("in-context-recall", "parallax", 16, 32)
    assert all(isinstance(layer.attention, PaddedHeadParallax) for layer in model.layers.values())


def padded_heads_case(device: str, dtype: torch.dtype, backend: str = "auto", seq_len: int = 64):
    """PaddedHeadParallax on ``device`` in ``dtype`` against ParallaxAttention (reference backend) in
    fp64 on the CPU, same weights and inputs: (output, reference output, input, reference input)."""
    args = mad_model_args("parallax", 16, seq_len, dim=32, n_heads=4, backend=backend)  # heads of 8
    torch.manual_seed(0)
    plain = ParallaxAttention(dataclasses.replace(args, attn_backend="reference")).double()
    with torch.no_grad():
        plain.init_weights(0.02)
    padded = PaddedHeadParallax(args).to(device, dtype)
    padded.load_state_dict(plain.state_dict())
    x64 = torch.randn(2, seq_len, 32, dtype=torch.float64, requires_grad=True)
    x = x64.detach().to(device, dtype).requires_grad_()
    rope = ParallaxQwen3Model(args).rope_cache
    return padded(x, rope.to(device)), plain(x64, rope), x, x64


def test_padded_heads_fall_back_to_the_reference_on_cpu():
    out, ref, _, _ = padded_heads_case("cpu", torch.float64)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def _interpreted_padded_heads() -> None:
    """Child process (TRITON_INTERPRET=1): the padded path through the fused kernel on the CPU."""
    torch.set_num_threads(1)
    out, ref, x, x64 = padded_heads_case("cpu", torch.float32, backend="triton", seq_len=32)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    grad, grad64 = (torch.autograd.grad(t.square().sum(), inp)[0] for t, inp in ((out, x), (ref, x64)))
    torch.testing.assert_close(grad.double(), grad64, rtol=1e-4, atol=1e-5)
    print("padded heads match")


def test_padded_heads_through_the_interpreted_kernel_match_fp64():
    """Heads of 8 zero-padded to 16, fused kernel under the Triton interpreter (fp32), against the fp64
    reference: output and input gradient (a subprocess: TRITON_INTERPRET must precede triton's import)."""
    import os
    import subprocess
    import sys

    code = "import tests.test_mad_scoring as m; m._interpreted_padded_heads()"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0 and "padded heads match" in result.stdout, result.stderr[-3000:]


@pytest.mark.gpu
def test_padded_heads_match_the_reference_on_cuda():
    """Heads of 8 zero-padded to 16 for the fused kernel (fp32) against the fp64 reference:
    output and input gradient."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out, ref, x, x64 = padded_heads_case("cuda", torch.float32)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-3, atol=2e-4)
    grad, grad64 = (torch.autograd.grad(t.square().sum(), inp)[0] for t, inp in ((out, x), (ref, x64)))
    torch.testing.assert_close(grad.double().cpu(), grad64, rtol=2e-3, atol=2e-4)


def test_wsd_schedule():
    f = [lr_factor(k, 100, "wsd", 0.2) for k in range(100)]
    assert f[:80] == [1.0] * 80 and f[90] == pytest.approx(0.5) and f[99] == pytest.approx(0.05)
    assert lr_factor(0, 10, "cosine") == 1.0 and lr_factor(5, 10, "cosine") == pytest.approx(0.5)


def test_attention_learns_in_context_recall_on_cpu():
    from eval.mad.training import train_and_evaluate

    torch.set_num_threads(1)
    data = make_dataset(ICR)
    model = build_model(ICR.task, "attention", 16, 64, dim=64, n_heads=4, hidden_dim=128)
    cfg = TrainConfig(epochs=6, batch_size=32, grad_clip=1.0, precision="fp32")  # 192 steps; reaches ~0.8
    result = train_and_evaluate(model, data, cfg, lr=5e-3, weight_decay=0.0, num_classes=16)
    assert result["finite"]
    assert result["test_acc"] > 0.45, result  # chance is 1/8
