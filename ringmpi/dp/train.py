"""Training loops: data-parallel on ringmpi and the single-process whole-batch reference
(`ringmpi train`, the command, is in `ringmpi.tools.train`)."""
from __future__ import annotations

import functools
import hashlib
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .arrays import to_host
from .data import char_sequences, classification
from .ddp import DataParallel, partition_indices
from .hooks import named
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
              device: str = "cpu", label_noise: float = 0.0, separation: float = 1.5) -> Task:
    """The data (on the host) and a model factory (parameters on `device`: "cpu" or "cuda");
    `label_noise` and `separation` for the MLP's data (`data.classification`)."""
    if model == "mlp":
        x, y = classification(samples, sizes[0], sizes[-1], seed=seed, dtype=dtype, label_noise=label_noise,
                              separation=separation)
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
    return list(_epoch_order(task.size, seed, epoch)[k * batch:(k + 1) * batch])


@functools.lru_cache(maxsize=2)
def _epoch_order(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    """An epoch's shuffled order, made once: shuffled anew at every step, a large data set
    cost each step more Python than its computation, the one-process step `--speedup` times
    included (benchmarks/README.md, "PowerSGD in the bucket's dtype, gradients in their
    buckets, and losses of learning")."""
    order = list(range(size))
    random.Random(seed * 7919 + epoch).shuffle(order)
    return tuple(order)


def local_batch(task: Task, step: int, batch: int, seed: int, world: int, rank: int) -> list[int]:
    """This rank's part of the global batch (partition_indices over positions in it)."""
    g = global_batch(task, step, batch, seed)
    return [g[i] for i in partition_indices(len(g), world, rank, seed + step)]


def make_optimizer(name: str, lr: float, momentum: float):
    return SGD(lr, momentum) if name == "sgd" else Adam(lr)


def train_dp(task: Task, steps: int, batch: int, *, comm=None, algorithm="auto", optimizer="sgd", lr=0.1,
             momentum=0.9, seed=0, weighting="global", start=0, ddp=None, opt=None,
             on_step: Callable[[int, float], None] | None = None, overlap: bool | None = False,
             hook: str = "allreduce"):
    """Data-parallel training (`hook`: a name of `hooks.HOOKS`); returns (ddp, optimizer, losses)."""
    if ddp is None:
        fn, state = named(hook)
        ddp = DataParallel(task.make_model(), comm, algorithm=algorithm, weighting=weighting, overlap=overlap,
                           comm_hook=fn, hook_state=state)
    opt = opt or make_optimizer(optimizer, lr, momentum)
    losses = []
    for s in range(start, start + steps):
        idx = local_batch(task, s, batch, seed, ddp.t.size, ddp.t.rank)
        losses.append(ddp.step(opt, task.take(task.data, idx)))
        if on_step:
            on_step(s, losses[-1])
    return ddp, opt, losses


def time_overlap(task: Task, batch: int, seed: int, replica: Callable[[bool], DataParallel],
                 optimizer: Callable[[], Any], rounds: int = 5) -> dict[str, float]:
    """What overlap hides, measured on fresh replicas (`replica(overlap)`) trained on the
    first batches: computation per step (forward, backward and update on this rank's share,
    no communication), communication per step timed alone (the step's all-reduces on its
    gradients), and the step with and without overlap, interleaved; medians of `rounds`
    (after one to warm up), the slowest rank's. hidden = (computation + communication -
    overlapped step) / communication."""
    replicas = {o: replica(o) for o in (True, False)}
    t = replicas[True].t
    opts = {o: optimizer() for o in replicas}
    alone, alone_opt = task.make_model(), optimizer()
    times: dict[str, list[float]] = {"compute": [], "communication": [], "overlapped": [], "blocking": []}

    def timed(key: str, fn: Callable[[], Any]) -> None:
        t.barrier()
        a = time.perf_counter()
        fn()
        times[key].append(time.perf_counter() - a)

    def compute() -> None:
        _, grads, _ = alone.loss_and_grads(data)
        alone_opt.step(alone.params, grads)

    def gradient_sums() -> DataParallel:
        """A replica holding this step's gradient sums, not yet averaged: what a step's
        all-reduces carry (averaged ones are ~1/batch of them, and float16 converts values
        below its normal range many times slower)."""
        ddp = replicas[False]
        ddp.zero_grad()
        with ddp.no_sync():
            ddp.backward(data)
        return ddp

    for s in range(rounds + 1):
        data = task.take(task.data, local_batch(task, s, batch, seed, t.size, t.rank))
        # the two modes in turn first: the first step of a round ran slower on one host,
        # which made overlap look slower where both modes made the same calls
        # (benchmarks/README.md, "The last bucket blocking, and the two modes timed in turn")
        for o in ((True, False) if s % 2 == 0 else (False, True)):
            timed("overlapped" if o else "blocking", lambda o=o: replicas[o].step(opts[o], data))
        timed("compute", compute)
        timed("communication", gradient_sums().average_gradients)
        if s == 0:
            for v in times.values():
                v.clear()
    med = {k: max(t.allgather_obj(float(np.median(v)))) for k, v in times.items()}
    comm = med["communication"]
    med["hidden"] = (med["compute"] + comm - med["overlapped"]) / comm if comm > 0 else 0.0
    return med


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
