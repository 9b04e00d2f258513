"""Data made or shipped by the project: a synthetic classification set and a small corpus."""
from __future__ import annotations

import numpy as np

__all__ = ["classification", "CORPUS", "char_sequences"]


def classification(n: int, features: int = 16, classes: int = 4, seed: int = 0, dtype=np.float64,
                   separation: float = 1.5, label_noise: float = 0.0):
    """Gaussian clusters with correlated features: (x [n, features], y [n]). `label_noise`:
    the share of samples whose label is drawn anew at random, so that the training loss
    stays well above zero for as long as the model cannot memorise the noise (a loss that
    has reached zero compares nothing)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, features)) * separation
    mix = rng.standard_normal((features, features)) / np.sqrt(features)
    y = rng.integers(0, classes, n)
    x = (centers[y] + rng.standard_normal((n, features))) @ mix
    if label_noise:
        flip = rng.random(n) < label_noise
        y[flip] = rng.integers(0, classes, int(flip.sum()))
    return x.astype(dtype), y


CORPUS = """\
All-reduce sums a vector over every worker and leaves the sum on each of them.
The ring does it in two passes: a reduce-scatter, then an all-gather.
Each worker sends to its right neighbour and receives from its left one.
Every round moves one block of n over p bytes on every link at once.
So each worker sends two times p minus one over p of the data, whatever p is.
That is why the ring is called bandwidth optimal; the price is its many rounds.
A tree needs few rounds but sends the whole vector across every edge.
Small messages favour few rounds; large messages favour the ring.
Data parallelism keeps one replica of the model on each worker.
Each replica sees its own shard of the batch and computes a local gradient.
The gradients are averaged by an all-reduce, and every replica takes the same step.
Uneven shards must be weighted by their sample counts, or some samples count more.
Gradient accumulation splits a batch in time, data parallelism splits it in space.
"""


def char_sequences(text: str = CORPUS, min_len: int = 8, max_len: int = 40, seed: int = 0):
    """Variable-length token sequences cut from the corpus, and the vocabulary."""
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in text], dtype=np.int64)
    rng = np.random.default_rng(seed)
    seqs, pos = [], 0
    while pos < len(ids) - min_len:
        n = int(rng.integers(min_len, max_len + 1))
        seqs.append(ids[pos:pos + n])
        pos += n
    return seqs, vocab
