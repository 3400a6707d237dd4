"""In-context recall generators: plain (ICR), noisy (NCR) and fuzzy (FCR).

Token layout (multi-query recall, MAD's default): keys ``[0, n/2)``, values ``[n/2, n)``,
noise ``[n, n + noise_vocab_size)`` with ``n = vocab_size - noise_vocab_size``. A sequence of
``seq_len`` tokens holds ``seq_len / 2`` slots; each slot is a key-value pair (the key-value map
is drawn afresh per sequence) or, with probability ``frac_noise``, two noise tokens. The last
slot repeats a key shown earlier. Model inputs are tokens ``[:-1]``; training targets are the
next tokens ``[1:]``; test targets keep only the values whose key appeared in an earlier slot
(every other position is ``IGNORE``).

All arrays are int64 numpy arrays of shape (num_examples, seq_len - 1).
"""

from __future__ import annotations

import numpy as np

IGNORE = -100


def _check(cond: bool, name: str, value, expected: str) -> None:
    if not cond:
        raise ValueError(f"{name}={value!r}; expected {expected}")


def _guaranteed_slot(rng, batch: int, slots: int) -> np.ndarray:
    # One pair among the first slots is never noise, so the final query always has a key to repeat.
    return rng.integers(0, slots - 1, size=batch)


def _noise_mask(rng, batch: int, slots: int, frac_noise: float) -> np.ndarray:
    noise = rng.random((batch, slots)) < frac_noise
    noise[np.arange(batch), _guaranteed_slot(rng, batch, slots)] = False
    noise[:, -1] = False
    return noise


def _final_query_keys(rng, keys: np.ndarray, noise: np.ndarray, n_keys: int) -> np.ndarray:
    """A key drawn uniformly from the distinct keys of slots [:-1] that are not noise."""
    batch = keys.shape[0]
    seen = np.zeros((batch, n_keys), dtype=bool)
    rows = np.repeat(np.arange(batch), keys.shape[1] - 1)
    live = ~noise[:, :-1].reshape(-1)
    seen[rows[live], keys[:, :-1].reshape(-1)[live]] = True
    scores = np.where(seen, rng.random((batch, n_keys)), -1.0)
    return scores.argmax(axis=1)


def _repeat_slots(keys: np.ndarray, noise: np.ndarray, n_keys: int) -> np.ndarray:
    """True at slots whose key already appeared in an earlier non-noise slot of the row."""
    batch, slots = keys.shape
    key_ids = np.where(noise, n_keys, keys)  # noise slots map to a dummy column
    first = np.full((batch, n_keys + 1), slots, dtype=np.int64)
    slot_idx = np.broadcast_to(np.arange(slots), (batch, slots))
    np.minimum.at(first, (np.repeat(np.arange(batch), slots), key_ids.reshape(-1)), slot_idx.reshape(-1))
    return (slot_idx > np.take_along_axis(first, key_ids, axis=1)) & ~noise


def in_context_recall(rng: np.random.Generator, num_examples: int, vocab_size: int = 16,
                      seq_len: int = 128, noise_vocab_size: int = 0, frac_noise: float = 0.0):
    """Multi-query associative recall with seq_len / 2 key-value slots (noisy when frac_noise > 0).

    Returns (inputs, train_targets, test_targets), each (num_examples, seq_len - 1) int64.
    """
    _check(seq_len >= 4 and seq_len % 2 == 0, "seq_len", seq_len, "an even number >= 4")
    _check(0.0 <= frac_noise < 1.0, "frac_noise", frac_noise, "0 <= frac_noise < 1")
    _check(noise_vocab_size >= 0, "noise_vocab_size", noise_vocab_size, ">= 0")
    _check(frac_noise == 0 or noise_vocab_size > 0, "noise_vocab_size", noise_vocab_size,
           "> 0 when frac_noise > 0")
    n = vocab_size - noise_vocab_size
    _check(n >= 4, "vocab_size", vocab_size, f"at least noise_vocab_size + 4 = {noise_vocab_size + 4}")
    n_keys = n // 2
    slots = seq_len // 2
    kv_map = rng.integers(n_keys, n, size=(num_examples, n_keys))
    keys = rng.integers(0, n_keys, size=(num_examples, slots))
    noise = _noise_mask(rng, num_examples, slots, frac_noise)
    keys[:, -1] = _final_query_keys(rng, keys, noise, n_keys)
    values = np.take_along_axis(kv_map, keys, axis=1)
    pairs = np.stack([keys, values], axis=2)
    if noise_vocab_size:
        noise_tokens = rng.integers(n, n + noise_vocab_size, size=(num_examples, slots, 2))
        pairs = np.where(noise[..., None], noise_tokens, pairs)
    tokens = pairs.reshape(num_examples, seq_len)
    scored = np.zeros((num_examples, slots, 2), dtype=bool)
    scored[..., 1] = _repeat_slots(keys, noise, n_keys)
    test = np.where(scored.reshape(num_examples, seq_len), tokens, IGNORE)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy(), test[:, 1:].copy()


def _motif_table(rng, vocab: np.ndarray, rows: int, width: int) -> list:
    """rows x width distinct tokens per row, uniform over ordered tuples; a motif of size s is
    a row's first s tokens. Token j is drawn from the len(vocab) - j tokens not yet taken."""
    picks = np.empty((rows, width), dtype=np.int64)
    for j in range(width):
        draw = rng.integers(0, len(vocab) - j, size=rows)
        for taken in np.sort(picks[:, :j], axis=1).T:  # skip taken indices, smallest first
            draw += draw >= taken
        picks[:, j] = draw
    return vocab[picks].tolist()


def _fuzzy_sequence(rng, key_vocab, value_vocab, seq_len, k_motif_size, v_motif_size, training, pad):
    """One fuzzy-recall sequence of seq_len + 1 tokens and its test targets (unshifted).

    Candidate pair i has key size ks[i] and value size vs[i]; pair 0 is the probe.
    """
    rows = seq_len // 2 + 2  # every pair has >= 2 tokens, so this bounds the pairs that fit
    ks = rng.integers(1 if training else k_motif_size, k_motif_size + 1, size=rows).tolist()
    vs = rng.integers(1, v_motif_size + 1, size=rows).tolist()
    keys = _motif_table(rng, key_vocab, rows, k_motif_size)
    vals = _motif_table(rng, value_vocab, rows, v_motif_size)
    probe_k, probe_v = tuple(keys[0][: ks[0]]), tuple(vals[0][: vs[0]])
    budget = seq_len + 1 - 2 * (len(probe_k) + len(probe_v))  # the probe appears twice
    kv_map, pairs, used = {probe_k: probe_v}, [], 0
    for i in range(1, rows):
        k = tuple(keys[i][: ks[i]])
        v = kv_map.setdefault(k, tuple(vals[i][: vs[i]]))
        if used + len(k) + len(v) > budget:
            break
        pairs.append((k, v))
        used += len(k) + len(v)
    pairs.insert(int(rng.integers(0, len(pairs) + 1)), (probe_k, probe_v))
    pairs.append((probe_k, probe_v))
    tokens, test, seen = [], [], set()
    for k, v in pairs:
        tokens += [*k, *v]
        test += [IGNORE] * len(k) + (list(v) if k in seen else [IGNORE] * len(v))
        seen.add(k)
    n_pad = seq_len + 1 - len(tokens)
    return [pad] * n_pad + tokens, [IGNORE] * n_pad + test


def fuzzy_in_context_recall(rng: np.random.Generator, num_examples: int, vocab_size: int = 16,
                            seq_len: int = 128, k_motif_size: int = 3, v_motif_size: int = 3,
                            training: bool = True):
    """Recall with keys/values of 1..k_motif_size / 1..v_motif_size distinct adjacent tokens.

    Pad token ``vocab_size - 1`` (left padding); keys ``[0, n/2)``, values ``[n/2, n)``,
    ``n = vocab_size - 1``. Test sequences (``training=False``) use keys of exactly
    ``k_motif_size`` tokens, as in MAD. The probe pair appears once inside the sequence and
    again at its end. Returns (inputs, train_targets, test_targets), (num_examples, seq_len) int64.
    """
    _check(k_motif_size >= 1, "k_motif_size", k_motif_size, ">= 1")
    _check(v_motif_size >= 1, "v_motif_size", v_motif_size, ">= 1")
    n = vocab_size - 1
    key_vocab, value_vocab = np.arange(n // 2), np.arange(n // 2, n)
    _check(len(key_vocab) >= k_motif_size and len(value_vocab) >= v_motif_size, "vocab_size", vocab_size,
           f"enough tokens for key motifs of {k_motif_size} and value motifs of {v_motif_size}")
    _check(seq_len >= 4 * (k_motif_size + v_motif_size), "seq_len", seq_len,
           f">= 4 * (k_motif_size + v_motif_size) = {4 * (k_motif_size + v_motif_size)}")
    rows = [_fuzzy_sequence(rng, key_vocab, value_vocab, seq_len, k_motif_size, v_motif_size, training, n)
            for _ in range(num_examples)]
    tokens = np.array([r[0] for r in rows], dtype=np.int64)
    test = np.array([r[1] for r in rows], dtype=np.int64)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy(), test[:, 1:].copy()
