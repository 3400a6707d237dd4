"""End-to-end CPU training through torchrun: 1 rank, 2-rank FSDP2 (gloo) and selective activation
checkpointing agree, loss falls, checkpoints, TensorBoard logs and metrics.jsonl are written."""

from __future__ import annotations

import glob
import json
import os

import pytest

from tests._train_runs import losses, train
from parallax_titan.tokenizer import TINY_TOKENIZER_PATH, PretrainTokenizer

SEQ_LEN = 32
WORDS = "the king and his daughter went to the sea where many ships were waiting for them".split()


def text_of_exact_length(tokenizer, n_tokens: int) -> str:
    """A text that encodes to exactly ``n_tokens`` tokens (eos excluded)."""
    text = ""
    for i in range(10 * n_tokens):
        candidate = (text + " " + WORDS[i % len(WORDS)]).strip()
        if len(tokenizer.encode(candidate, add_bos=False, add_eos=False)) > n_tokens:
            continue
        text = candidate
        if len(tokenizer.encode(text, add_bos=False, add_eos=False)) == n_tokens:
            return text
    raise AssertionError("could not build a text of the requested length")


@pytest.fixture(scope="module")
def identical_samples(tmp_path_factory):
    """Every training sample is the same SEQ_LEN + 1 tokens, so any data split sees one batch."""
    tokenizer = PretrainTokenizer(TINY_TOKENIZER_PATH)
    text = text_of_exact_length(tokenizer, SEQ_LEN)
    path = tmp_path_factory.mktemp("data") / "same.jsonl"
    path.write_text("".join(json.dumps({"content": text}) + "\n" for _ in range(64)))
    return str(path)


def run(nproc: int, dump: str, data: str, steps: int, *extra: str):
    return train(dump, "--training.steps", str(steps), "--training.local_batch_size", str(4 // nproc),
                 "--training.seq_len", str(SEQ_LEN), "--training.dataset_path", data, *extra, nproc=nproc)


def test_two_rank_fsdp_matches_one_rank(tmp_path, identical_samples):
    seed, one, two, ac = (str(tmp_path / name) for name in ("seed", "one", "two", "ac"))
    # Random init of sharded parameters depends on the world size; a seed checkpoint does not.
    run(1, seed, identical_samples, 1, "--checkpoint.create_seed_checkpoint")
    start = ("--checkpoint.initial_load_path", os.path.join(seed, "checkpoint", "step-0"))
    run(1, one, identical_samples, 3, *start)
    run(2, two, identical_samples, 3, *start)
    run(1, ac, identical_samples, 3, *start, "--activation_checkpoint.mode", "selective",
        "--activation_checkpoint.selective_ac_option", "op")
    l1, l2 = losses(one), losses(two)
    assert losses(ac) == pytest.approx(l1, rel=1e-6)  # recomputation changes no number
    assert sorted(l1) == sorted(l2) == [1, 2, 3]
    for step in l1:
        assert l2[step] == pytest.approx(l1[step], rel=1e-4), (l1, l2)
    assert l1[3] < l1[1] - 0.5

    assert glob.glob(os.path.join(one, "checkpoint", "step-3", ".metadata"))
    assert glob.glob(os.path.join(one, "tb", "*", "events.out.tfevents.*"))
