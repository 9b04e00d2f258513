"""Data-parallel parts that need no MPI: the partition, gradients vs finite differences."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringmpi.dp import MLP, CharRNN, partition_indices
from ringmpi.dp.data import char_sequences, classification


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 500), world=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_partition_every_sample_exactly_once(size, world, seed):
    shares = [partition_indices(size, world, r, seed) for r in range(world)]
    assert sorted(i for s in shares for i in s) == list(range(size))
    q, r = divmod(size, world)
    assert [len(s) for s in shares] == [q + (k < r) for k in range(world)]


def test_partition_uses_local_generator_only():
    import random
    random.seed(123)
    before = random.random()
    random.seed(123)
    a = partition_indices(100, 4, 1, seed=7)
    assert random.random() == before  # the global state was not touched
    assert a == partition_indices(100, 4, 1, seed=7) != partition_indices(100, 4, 1, seed=8)


def test_partition_lecture_example():
    assert [len(partition_indices(10, 4, r, 0)) for r in range(4)] == [3, 3, 2, 2]


def numeric_grad(model, batch, name, idx, eps=1e-6):
    p = model.params[name]
    old = p[idx]
    p[idx] = old + eps
    lp = model.loss_and_grads(batch)[0]
    p[idx] = old - eps
    lm = model.loss_and_grads(batch)[0]
    p[idx] = old
    return (lp - lm) / (2 * eps)


@pytest.mark.parametrize("make", ["mlp", "rnn"])
def test_gradients_match_finite_differences(make):
    rng = np.random.default_rng(0)
    if make == "mlp":
        model = MLP([5, 7, 6, 3], seed=1)
        x, y = classification(9, 5, 3, seed=2)
        batch = (x, y)
    else:
        seqs, vocab = char_sequences(min_len=3, max_len=9)
        model = CharRNN(len(vocab), hidden=6, seed=1)
        batch = seqs[:3]
    _, grads, _ = model.loss_and_grads(batch)
    for name, g in grads.items():
        for _ in range(4):
            idx = tuple(rng.integers(0, s) for s in g.shape)
            num = numeric_grad(model, batch, name, idx)
            assert g[idx] == pytest.approx(num, rel=1e-6, abs=1e-8), (name, idx)


def test_models_support_float32():
    x, y = classification(8, 4, 2, dtype=np.float32)
    m = MLP([4, 5, 2], dtype=np.float32)
    loss, grads, n = m.loss_and_grads((x, y))
    assert n == 8 and all(g.dtype == np.float32 for g in grads.values())
    seqs, vocab = char_sequences()
    r = CharRNN(len(vocab), 8, dtype=np.float32)
    _, g2, tokens = r.loss_and_grads(seqs[:2])
    assert tokens == sum(len(s) - 1 for s in seqs[:2]) and g2["Whh"].dtype == np.float32
