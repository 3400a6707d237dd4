"""1 rank vs 2 FSDP2 ranks with an optimizer whose step is proportional to the gradient.

AdamW and Muon normalise the gradient away, so they cannot tell a gradient averaged over the
data-parallel ranks from one summed over them. Plain SGD without momentum can: a sum would double
every step. The configs allow Muon and AdamW only; AdamW with beta1 = 0, no weight decay and
eps = 1e6 (far above every |g|) steps by lr * g / (sqrt(v) + eps) = (lr / eps) g (1 + O(|g| / eps)),
plain SGD at lr / eps = 0.3 to about 1e-6 relative. Clipping is off (max_norm 1e9): it too
normalises the gradient.
"""

from __future__ import annotations

import json
import os

import pytest

from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer
from tests._train_runs import losses, train
from tests.test_train_cpu import SEQ_LEN, text_of_exact_length

EPS = 1e6


def sgd(lr: float) -> tuple[str, ...]:
    """Arguments that make the run plain SGD without momentum at learning rate ``lr``."""
    return ("--optimizer.name", "AdamW", "--optimizer.beta1", "0", "--optimizer.eps", str(EPS),
            "--optimizer.lr", str(lr * EPS), "--optimizer.weight_decay", "0", "--training.max_norm", "1e9",
            "--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay_ratio", "0")


@pytest.mark.slow
def test_sgd_two_ranks_average_the_gradient_like_one_rank(tmp_path):
    """Every sample is the same sequence, so the 1-rank batch of 4 and the 2-rank batches of 2 have
    one mean gradient: the losses agree. A sum over ranks would take the 1-rank run's steps at twice
    the learning rate, whose losses differ by far more than the tolerance."""
    tokenizer = PretrainTokenizer(TINY_TOKENIZER_PATH)
    data = tmp_path / "same.jsonl"
    text = text_of_exact_length(tokenizer, SEQ_LEN)
    data.write_text("".join(json.dumps({"content": text}) + "\n" for _ in range(64)))
    seed = tmp_path / "seed"
    train(seed, "--training.dataset", "default_corpus", "--checkpoint.create_seed_checkpoint")
    start = ("--checkpoint.initial_load_path", os.path.join(seed, "checkpoint", "step-0"))

    def run(nproc: int, name: str, lr: float) -> dict[int, float]:
        dump = tmp_path / name
        train(dump, *start, *sgd(lr), "--training.steps", "3", "--training.local_batch_size", str(4 // nproc),
              "--training.seq_len", str(SEQ_LEN), "--training.dataset_path", str(data), nproc=nproc)
        return losses(dump)

    one, two, doubled = run(1, "one", 0.3), run(2, "two", 0.3), run(1, "doubled", 0.6)
    assert sorted(one) == sorted(two) == [1, 2, 3]
    for step in (1, 2, 3):
        assert two[step] == pytest.approx(one[step], rel=1e-5), (one, two)
    assert one[3] < one[1] - 0.05  # SGD moved the model
    assert abs(doubled[3] - one[3]) > 1e-3 * abs(one[3]), (one, doubled)  # what a summed gradient gives
