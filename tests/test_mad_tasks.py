"""MAD task generators: each task's defining properties, determinism, grid sizes."""

import dataclasses

import numpy as np
import pytest

from eval.mad.grid import MAD_CHANGES, task_settings
from eval.mad.recall import IGNORE, fuzzy_in_context_recall, in_context_recall
from eval.mad.tasks import (TASKS, TaskSetting, compression, make_dataset, memorization_map,
                            selective_copying)


def _slots(tokens_full):
    return tokens_full.reshape(len(tokens_full), -1, 2)


def _full(inputs, train_targets):
    return np.concatenate([inputs, train_targets[:, -1:]], axis=1)


@pytest.mark.parametrize("vocab,noise_vocab,frac", [(16, 0, 0.0), (32, 16, 0.2), (48, 16, 0.6)])
def test_recall_keys_values_disjoint_and_queries_seen(vocab, noise_vocab, frac):
    rng = np.random.default_rng(0)
    x, y, t = in_context_recall(rng, 200, vocab, 64, noise_vocab, frac)
    assert x.shape == y.shape == t.shape == (200, 63)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # train targets are the next tokens
    n = vocab - noise_vocab
    pairs = _slots(_full(x, y))
    noise = pairs[..., 0] >= n
    keys, values = pairs[..., 0][~noise], pairs[..., 1][~noise]
    assert keys.max() < n // 2 <= values.min() and values.max() < n
    for row in range(200):
        kv = {}
        for slot, (k, v) in enumerate(pairs[row]):
            # the value of slot s is full token 2s + 1, i.e. test target index 2s
            if k >= n:
                assert v >= n and t[row, 2 * slot] == IGNORE
                continue
            assert t[row, 2 * slot] == (v if k in kv else IGNORE)
            assert kv.setdefault(k, v) == v  # one value per key within a sequence
        final_key = pairs[row, -1, 0]
        assert final_key in pairs[row, :-1, 0][pairs[row, :-1, 0] < n]  # the query was shown before
        assert t[row, -1] == pairs[row, -1, 1]
    scored = t != IGNORE
    assert np.all(t[scored] >= n // 2) and np.all(t[:, 1::2] == IGNORE)  # key positions are never scored


def test_noise_fraction():
    x, y, _ = in_context_recall(np.random.default_rng(1), 400, 48, 256, 16, 0.6)
    pairs = _slots(_full(x, y))
    frac = (pairs[:, :-1, 0] >= 32).mean()
    slots = pairs.shape[1] - 1
    assert abs(frac - 0.6 * (slots - 1) / slots) < 0.01


def test_fuzzy_recall_targets_are_values_of_repeated_keys():
    rng = np.random.default_rng(2)
    x, y, t = fuzzy_in_context_recall(rng, 50, 16, 128, 3, 3, training=False)
    assert x.shape == (50, 128)
    full = _full(x, y)
    n = 15
    for row in range(50):
        scored = np.nonzero(t[row] != IGNORE)[0]
        assert len(scored) >= 1 and scored[-1] == 127  # the final value is always queried
        assert np.all(full[row, scored + 1] >= n // 2) and np.all(full[row, scored + 1] < n)
        np.testing.assert_array_equal(t[row, scored], full[row, scored + 1])
        # the final probe key (3 tokens at test time) appears earlier in the sequence
        tail = full[row, -(len(_trailing_value(full[row], n)) + 3):][:3]
        body = full[row, : -(len(_trailing_value(full[row], n)) + 3)]
        windows = np.lib.stride_tricks.sliding_window_view(body, 3)
        assert (windows == tail).all(axis=1).any()


def _trailing_value(seq, n):
    i = len(seq)
    while seq[i - 1] >= n // 2 and seq[i - 1] < n:
        i -= 1
    return seq[i:]


def test_selective_copying_targets_are_nonblank_tokens_in_order():
    x, y, t = selective_copying(np.random.default_rng(3), 100, 16, 64, 8)
    np.testing.assert_array_equal(y, t)
    for row in range(100):
        prefix = x[row, :64 - 8 - 1]
        assert x[row, 64 - 8 - 1] == 15 and np.all(x[row, -8:] == 14)
        kept = prefix[prefix != 14]
        np.testing.assert_array_equal(kept, t[row, -8:])
        assert np.all(t[row, :-8] == IGNORE)


def test_selective_copying_places_blanks_as_mad_lab():
    """mad-lab inserts each of the seq_len - 2n - 1 blanks before a content token drawn uniformly,
    so none follows the last content token and each content token has (seq_len - 2n - 1) / n
    blanks before it on average."""
    seq_len, n, rows = 64, 8, 4000
    x, _, t = selective_copying(np.random.default_rng(5), rows, 16, seq_len, n)
    prefix = x[:, :seq_len - n - 1]
    assert np.all(prefix[:, -1] != 14)  # the last content token sits next to the copy token
    positions = np.array([np.flatnonzero(row != 14) for row in prefix])
    assert positions.shape == (rows, n)
    gaps = np.diff(np.concatenate([np.full((rows, 1), -1), positions], axis=1), axis=1) - 1
    expected = (seq_len - 2 * n - 1) / n  # 47 / 8
    np.testing.assert_allclose(gaps.mean(axis=0), expected, rtol=0.05)
    # the first content token comes first only when no blank is inserted before it: (7/8)^47
    assert (positions[:, 0] == 0).mean() < 0.01


def test_selective_copying_in_mad_lab_cached_data_copies_16():
    """mad-lab before 35772e8 (its cached data, which seed 001 used) ignored num_tokens_to_copy."""
    cached = task_settings("selective-copying", "mad", selective_copy="mad_lab_cached")
    current = task_settings("selective-copying", "mad")
    assert len({s.label() for s in cached}) == len(cached) == len(current) == 13
    assert sorted({s.num_tokens_to_copy for s in cached}) == [16, 32, 64, 96]
    for old, new in zip(cached, current):
        small = {"num_train_examples": 4, "num_test_examples": 4}
        copied = (make_dataset(dataclasses.replace(old, **small))["test"][1] != IGNORE).sum(axis=1)
        assert np.all(copied == 16)
        copied = (make_dataset(dataclasses.replace(new, **small))["test"][1] != IGNORE).sum(axis=1)
        assert np.all(copied == new.num_tokens_to_copy)


def test_memorization_map_fixed_across_samples_and_splits():
    data = make_dataset(TaskSetting("memorization", 64, 16, num_train_examples=100, num_test_examples=50, seed=7))
    kv = {}
    for x, y in (data["train"], data["test"]):
        assert np.all(x[:, 1::2] == 63) and np.all(y[:, ::2] == IGNORE)
        for k, v in zip(x[:, ::2].ravel(), y[:, 1::2].ravel()):
            assert kv.setdefault(k, v) == v
    mapping = memorization_map(64, 7)
    assert len(set(mapping.tolist())) == len(mapping) == 31 and mapping.min() >= 31
    assert not np.array_equal(mapping, memorization_map(64, 8))


def test_compression_targets_are_inputs():
    x, y, t = compression(np.random.default_rng(4), 10, 16, 32)
    np.testing.assert_array_equal(x, y)
    assert np.all(x[:, -1] == 15) and x[:, :-1].max() < 15


@pytest.mark.parametrize("task", TASKS)
def test_deterministic_from_seed(task):
    s = task_settings(task, "baseline", seed=5, num_train_examples=16, num_test_examples=8)[0]
    a, b = make_dataset(s), make_dataset(s)
    c = make_dataset(TaskSetting(**{**s.__dict__, "seed": 6}))
    for split in ("train", "test"):
        for u, v in zip(a[split], b[split]):
            np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a["train"][0], c["train"][0])


def test_grid_sizes_and_errors():
    assert len(task_settings("in-context-recall", "mad")) == 1 + sum(map(len, MAD_CHANGES["in-context-recall"].values()))
    assert sum(len(task_settings(t, "mad")) for t in TASKS) == 66
    # mad-lab configs/tasks/*.yml: baseline + each change value
    counts = {"compression": 11, "in-context-recall": 11, "fuzzy-in-context-recall": 11,
              "noisy-in-context-recall": 14, "memorization": 6, "selective-copying": 13}
    assert {t: len(task_settings(t, "mad")) for t in TASKS} == counts
    assert [s.seq_len for s in task_settings("selective-copying", "hard")][-1] == 2048
    with pytest.raises(ValueError, match="frac_noise"):
        in_context_recall(np.random.default_rng(0), 2, 32, 64, 16, 1.0)
    with pytest.raises(ValueError, match="seq_len"):
        selective_copying(np.random.default_rng(0), 2, 16, 16, 8)
    with pytest.raises(ValueError, match="task"):
        TaskSetting("recall", 16, 32)
