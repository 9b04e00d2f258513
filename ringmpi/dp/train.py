"""Training loops: data-parallel on ringmpi, the single-process whole-batch reference, and
`ringmpi train` (loss per step, replica check, comparisons, measured vs modelled speedup)."""
from __future__ import annotations

import hashlib
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .ddp import DataParallel, partition_indices
from .data import char_sequences, classification
from .models import MLP, CharRNN
from .optim import SGD, Adam

__all__ = ["Task", "make_task", "global_batch", "local_batch", "train_dp", "train_single", "add_parser"]


@dataclass
class Task:
    make_model: Callable[[], Any]
    data: Any
    size: int
    take: Callable[[Any, list[int]], Any]   # batch from indices


def make_task(model: str = "mlp", dtype=np.float64, seed: int = 0, sizes=(16, 32, 32, 4), samples: int = 512) -> Task:
    if model == "mlp":
        x, y = classification(samples, sizes[0], sizes[-1], seed=seed, dtype=dtype)
        return Task(lambda: MLP(list(sizes), seed=seed, dtype=dtype), (x, y), len(y),
                    lambda d, idx: (d[0][idx], d[1][idx]))
    if model == "rnn":
        seqs, vocab = char_sequences(seed=seed)
        return Task(lambda: CharRNN(len(vocab), 24, seed=seed, dtype=dtype), seqs, len(seqs),
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
             on_step: Callable[[int, float], None] | None = None):
    """Data-parallel training; returns (ddp, optimizer, losses)."""
    if ddp is None:
        ddp = DataParallel(task.make_model(), comm, algorithm=algorithm, weighting=weighting)
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
        h.update(np.ascontiguousarray(params[k]).tobytes())
    return h.hexdigest()


def max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[k] - b[k]))) if a[k].size else 0.0 for k in a)


def _run(ns) -> int:
    from .. import cost
    from ..auto import active_profile
    from ..mpicomm import transport
    if ns.staleness:
        from .ps import async_sgd_study
        rows = async_sgd_study()
        print("# asynchronous SGD, 8 workers, 400 gradient computations; final loss "
              f"(initial {rows[0]['initial_loss']:.3f}; DIVERGED = worse than twice the initial)")
        taus = sorted({r["tau"] for r in rows})
        print(f"{'lr':>6} " + " ".join(f"{'tau=' + str(t):>10}" for t in taus))
        for lr in dict.fromkeys(r["lr"] for r in rows):
            cells = ["DIVERGED" if r["diverged"] else f"{r['final_loss']:.4f}" for r in rows if r["lr"] == lr]
            print(f"{lr:>6g} " + " ".join(f"{c:>10}" for c in cells))
        return 0
    t = transport()
    p, r = t.size, t.rank
    dtype = np.dtype(ns.dtype)
    sizes = tuple(int(v) for v in ns.sizes.split(","))
    task = make_task(ns.model, dtype, ns.seed, sizes, ns.samples)
    kw = dict(optimizer=ns.optimizer, lr=ns.lr, momentum=ns.momentum, seed=ns.seed)
    if r == 0 and not ns.quiet:
        print(f"# ringmpi train: {ns.model}, {p} ranks, global batch {ns.batch}, {ns.steps} steps, "
              f"{dtype.name}, all-reduce algorithm {ns.algorithm}")
    t.barrier()
    t0 = time.perf_counter()

    bar = None
    if r == 0 and not ns.quiet and sys.stderr.isatty():
        from rich.progress import Progress
        bar = Progress(transient=True)
        bar.start()
        bar.add_task("training", total=ns.steps)

    def show(s, loss):
        if r == 0 and not ns.quiet:
            print(f"step {s:>5}  loss {loss:.6f}", flush=True)
            if bar:
                bar.advance(bar.task_ids[0])
    try:
        ddp, opt, losses = train_dp(task, ns.steps, ns.batch, algorithm=ns.algorithm, on_step=show, **kw)
    finally:
        if bar:
            bar.stop()
    t.barrier()
    elapsed = time.perf_counter() - t0
    digests = t.allgather_obj(params_digest(ddp.params))
    same = len(set(digests)) == 1
    status = 0 if same else 1
    if r == 0:
        print(f"# replicas bitwise identical on all {p} ranks: {'yes' if same else 'NO'}")
        print(f"# {elapsed / ns.steps * 1e3:.2f} ms per step, {ns.batch * ns.steps / elapsed:.1f} samples/s")
    if ns.compare:
        ref = None
        if r == 0:
            single, _ = train_single(task, ns.steps, ns.batch, **kw)
            ref = single.params
        mpi_ddp, _, _ = train_dp(task, ns.steps, ns.batch, algorithm="mpi", **kw)
        if r == 0:
            d1, d2 = max_diff(ddp.params, ref), max_diff(ddp.params, mpi_ddp.params)
            print(f"# max |param - single-process whole-batch| = {d1:.3g}")
            print(f"# max |param - MPI_Allreduce-averaged run|  = {d2:.3g}")
    if ns.speedup:
        # T1: a whole training step (batch gathering, forward, backward, update) on the
        # whole global batch in one process, timed on rank 0 while the others wait
        t1 = None
        if r == 0:
            train_single(task, 1, ns.batch, **kw)  # warm-up
            a = time.perf_counter()
            train_single(task, 3, ns.batch, **kw)
            t1 = (time.perf_counter() - a) / 3
        t1 = t.bcast_obj(t1, 0)
        grad_bytes = sum(v.nbytes for v in ddp.params.values())
        prof = active_profile(t)
        model = cost.dp_step(t1, p, grad_bytes, prof) if p > 1 else None
        if r == 0:
            step = elapsed / ns.steps
            print(f"# speedup: T1 = {t1 * 1e3:.2f} ms per global batch on one process; measured step "
                  f"{step * 1e3:.2f} ms -> {t1 / step:.2f}x; model T1/p + T_comm = "
                  f"{(model.step if model else t1) * 1e3:.2f} ms -> {(model.speedup if model else 1):.2f}x "
                  f"(gradients {grad_bytes / 1e6:.2f} MB, profile '{prof.name}')")
    return status


def add_parser(sub) -> None:
    a = sub.add_parser("train", help="data-parallel training on ringmpi (run under mpirun)")
    a.add_argument("--model", choices=["mlp", "rnn"], default="mlp")
    a.add_argument("--sizes", default="16,32,32,4", help="MLP layer sizes")
    a.add_argument("--samples", type=int, default=512)
    a.add_argument("--steps", type=int, default=20)
    a.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    a.add_argument("--dtype", default="float64")
    a.add_argument("--algorithm", default="ring", help="all-reduce algorithm for the gradients (default ring)")
    a.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    a.add_argument("--lr", type=float, default=0.1)
    a.add_argument("--momentum", type=float, default=0.9)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--compare", action="store_true", help="also run single-process and MPI_Allreduce training")
    a.add_argument("--speedup", action="store_true", help="measured speedup next to the model's prediction")
    a.add_argument("--staleness", action="store_true", help="the asynchronous SGD staleness table (no MPI)")
    a.add_argument("--quiet", action="store_true")
    a.set_defaults(func=_run)
