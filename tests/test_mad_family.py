"""MAD over the whole family: every mixer is built by name and trains (fla's only on CUDA), the family
takes the attention's heads, and configs/mad/family.toml is the paper protocol over all of them."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from eval.mad.grid import TrainConfig, load_config
from eval.mad.models import MIXERS, build_model, mad_model_args
from eval.mad.recall import IGNORE
from eval.mad.runner import config_id
from eval.mad.tasks import TaskSetting, make_dataset
from eval.mad.training import train_and_evaluate
from parallax_titan.mixers import FAMILY_MIXERS, FLA_MIXERS

FAMILY = ("exact_lla", "value_averaging", "affine_la", "affine_mesanet")
ON_CPU = sorted(m for m, (variant, _) in MIXERS.items() if variant not in FLA_MIXERS)  # fla's need CUDA
SETTING = TaskSetting("in-context-recall", 16, 32, num_train_examples=64, num_test_examples=32, seed=1)


def train_loss(model, x, y) -> float:
    with torch.no_grad():
        logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE).item()


def trains_a_few_steps(mixer: str, device: str, precision: str) -> None:
    """16 Muon steps on a small in-context-recall set lower the training loss by more than 0.2."""
    data = make_dataset(SETTING)
    x, y = (torch.as_tensor(a, device=device) for a in data["train"])
    model = build_model(SETTING.task, mixer, 16, 32, device=device, dim=32, n_heads=4, hidden_dim=64)
    before = train_loss(model, x, y)
    result = train_and_evaluate(model, data, TrainConfig(epochs=4, batch_size=16, precision=precision), lr=5e-3,
                                weight_decay=0.0, num_classes=16, device=device)
    assert result["finite"] and result["steps"] == 16, result
    assert train_loss(model, x, y) < before - 0.2, (before, result)


@pytest.mark.parametrize("mixer", ON_CPU)
def test_every_mixer_with_cpu_kernels_trains_on_cpu(mixer):
    torch.set_num_threads(1)
    trains_a_few_steps(mixer, "cpu", "fp32")


@pytest.mark.gpu
@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_every_mixer_trains_on_cuda_in_bf16(mixer):
    """As the family grid runs them: on the GPU under bf16 autocast, fla's mixers included."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if MIXERS[mixer][0] in FLA_MIXERS and importlib.util.find_spec("fla") is None:
        pytest.skip("needs flash-linear-attention")
    trains_a_few_steps(mixer, "cuda", "bf16")


@pytest.mark.parametrize("mixer", FAMILY)
def test_family_takes_the_attentions_heads(mixer):
    """mad-lab's width 128 with 16 heads of 8, as attention and Parallax (the family runs in PyTorch
    at any head size); the model is the language model's family variant."""
    args = mad_model_args(mixer, 16, 128)
    assert (args.dim, args.n_heads, args.n_kv_heads, args.head_dim, args.mixer) == (128, 16, 16, 8, mixer)
    model = build_model("compression", mixer, 16, 32, dim=32, n_heads=4, hidden_dim=64)
    assert isinstance(model.lm.layers["0"].attention, FAMILY_MIXERS[mixer])
    assert model(torch.randint(0, 16, (2, 32))).shape == (2, 32, 16)


def test_exact_lla_runs_mad_sizes_above_the_language_model_bound():
    """MAD's longest settings (batch 128 x 1024 tokens, 16 heads of 8) cost 1.385e11 multiply-adds, above
    the 2^37 bound of language-model configs: MAD builds exact LLA without it."""
    assert mad_model_args("exact_lla", 16, 1024).lla_max_cost is None
    assert mad_model_args("attention", 16, 1024).lla_max_cost == 2 ** 37


def test_family_grid_is_the_paper_protocol_over_every_mixer():
    family, paper = load_config("configs/mad/family.toml"), load_config("configs/mad/paper_baseline.toml")
    assert family.mixers == ["attention", "parallax", *FAMILY, "gated_deltanet", "kda", "mamba2", "mesa_net"]
    assert config_id(family) == config_id(paper)  # same runs: paper_baseline's results count here
    assert (family.sweep, family.selective_copy, len(family.settings())) == ("mad", "mad_lab_cached", 66)
    assert (family.train.lrs, family.train.weight_decays, family.train.epochs) == ([5e-3, 1e-3, 5e-4], [0.0, 0.1], 60)


def test_batch_order_moves_to_the_device_once_per_epoch(monkeypatch):
    """Each epoch's order reaches the device in one copy, not one per step: on a GPU a copy from
    pageable host memory first waits for every queued kernel, so a copy per step synchronises."""
    import eval.mad.training as training

    class Tracked(torch.Tensor):
        moves = 0

        def to(self, *args, **kwargs):
            Tracked.moves += 1
            return super().to(*args, **kwargs)

    real = torch.randperm
    monkeypatch.setattr(training.torch, "randperm", lambda *a, **k: real(*a, **k).as_subclass(Tracked))
    data = make_dataset(SETTING)
    model = build_model(SETTING.task, "attention", 16, 32, dim=32, n_heads=4, hidden_dim=64)
    result = train_and_evaluate(model, data, TrainConfig(epochs=3, batch_size=16), lr=5e-3, weight_decay=0.0,
                                num_classes=16)
    assert result["steps"] == 3 * 4 and Tracked.moves == 3
