"""Training loops: data-parallel on ringmpi and the single-process whole-batch reference
(`ringmpi train`, the command, is in `ringmpi.tools.train`)."""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .arrays import to_host
from .ddp import DataParallel, partition_indices
from .data import char_sequences, classification
from .models import MLP, CharRNN
from .optim import SGD, Adam

__all__ = ["Task", "make_task", "global_batch", "local_batch", "train_dp", "train_single", "params_digest", "max_diff"]


@dataclass
class Task:
    make_model: Callable[[], Any]
    data: Any
    size: int
    take: Callable[[Any, list[int]], Any]   # batch from indices


def make_task(model: str = "mlp", dtype=np.float64, seed: int = 0, sizes=(16, 32, 32, 4), samples: int = 512,
              device: str = "cpu") -> Task:
    """The data (on the host) and a model factory (parameters on `device`: "cpu" or "cuda")."""
    if model == "mlp":
        x, y = classification(samples, sizes[0], sizes[-1], seed=seed, dtype=dtype)
        return Task(lambda: MLP(list(sizes), seed=seed, dtype=dtype, device=device), (x, y), len(y),
                    lambda d, idx: (d[0][idx], d[1][idx]))
    if model == "rnn":
        seqs, vocab = char_sequences(seed=seed)
        return Task(lambda: CharRNN(len(vocab), 24, seed=seed, dtype=dtype, device=device), seqs, len(seqs),
                    lambda d, idx: [d[i] for i in idx])
    raise ValueError(f"unknown model {model!r}; expected 'mlp' or 'rnn'")


def global_batch(task: Task, step: int, batch: int, seed: int) -> list[int]:
    """The indices of step `step`: consecutive slices of an epoch's shuffled order."""
    per_epoch = max(task.size // batch, 1)
    epoch, k = divmod(step, per_epoch)
    order = list(range(task.size))
    random.Random(seed * 7919 + epoch).shuffle(order)
    return order[k * batch:(k + 1) * batch]


def local_batch(task: Task, step: int, batch: int, seed: int, world: int, rank: int) -> list[int]:
    """This rank's part of the global batch (partition_indices over positions in it)."""
    g = global_batch(task, step, batch, seed)
    return [g[i] for i in partition_indices(len(g), world, rank, seed + step)]


def make_optimizer(name: str, lr: float, momentum: float):
    return SGD(lr, momentum) if name == "sgd" else Adam(lr)


def train_dp(task: Task, steps: int, batch: int, *, comm=None, algorithm="auto", optimizer="sgd", lr=0.1,
             momentum=0.9, seed=0, weighting="global", start=0, ddp=None, opt=None,
             on_step: Callable[[int, float], None] | None = None, overlap: bool | None = None):
    """Data-parallel training; returns (ddp, optimizer, losses)."""
    if ddp is None:
        ddp = DataParallel(task.make_model(), comm, algorithm=algorithm, weighting=weighting, overlap=overlap)
    opt = opt or make_optimizer(optimizer, lr, momentum)
    losses = []
    for s in range(start, start + steps):
        idx = local_batch(task, s, batch, seed, ddp.t.size, ddp.t.rank)
        losses.append(ddp.step(opt, task.take(task.data, idx)))
        if on_step:
            on_step(s, losses[-1])
    return ddp, opt, losses


def train_single(task: Task, steps: int, batch: int, *, optimizer="sgd", lr=0.1, momentum=0.9, seed=0):
    """The reference: one process, the whole global batch each step, loss summed / count."""
    model = task.make_model()
    opt = make_optimizer(optimizer, lr, momentum)
    losses = []
    for s in range(steps):
        loss, grads, n = model.loss_and_grads(task.take(task.data, global_batch(task, s, batch, seed)))
        opt.step(model.params, {k: g / n for k, g in grads.items()})
        losses.append(loss / n)
    return model, losses


def params_digest(params: dict) -> str:
    h = hashlib.sha256()
    for k in params:
        h.update(k.encode())
        h.update(np.ascontiguousarray(to_host(params[k])).tobytes())
    return h.hexdigest()


def max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(to_host(a[k]) - to_host(b[k])))) if a[k].size else 0.0 for k in a)
