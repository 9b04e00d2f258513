"""The parameter server: synchronous on MPI, and the asynchronous staleness study.

Synchronous step (the server is a rank that holds the parameters and computes nothing):
    pull: broadcast the parameters from the server       every worker receives N
    push: reduce the gradients onto the server           every worker sends N
so a worker moves 2N per step whatever K is, and the server 2KN: its link is the
bottleneck that the ring all-reduce removes.
"""
from __future__ import annotations

import numpy as np

from .. import collectives as api
from ..api import group

__all__ = ["ParameterServer", "async_sgd_study"]


class ParameterServer:
    def __init__(self, model, comm=None, server: int = 0, lr: float = 0.1) -> None:
        self.model, self.comm, self.server, self.lr = model, comm, server, lr
        self.t = group(comm)
        self.names = list(model.params)
        self.flat = np.concatenate([model.params[k].reshape(-1) for k in self.names])

    @property
    def is_server(self) -> bool:
        return self.t.rank == self.server

    def _unflatten(self) -> None:
        off = 0
        for k in self.names:
            p = self.model.params[k]
            p[...] = self.flat[off:off + p.size].reshape(p.shape)
            off += p.size

    def step(self, batch) -> float:
        """Pull, compute (workers), push, update (server); returns the global mean loss."""
        c0 = self.t.counters.snapshot()
        api.broadcast(self.flat, self.server, comm=self.comm, algorithm="naive")       # pull
        c1 = self.t.counters.snapshot()
        self._unflatten()
        if self.is_server:
            grad, loss, count = np.zeros_like(self.flat), 0.0, 0
        else:
            loss, grads, count = self.model.loss_and_grads(batch)
            grad = np.concatenate([grads[k].reshape(-1) for k in self.names])
        total = api.allreduce(np.array([loss, count], np.float64), comm=self.comm)
        c2 = self.t.counters.snapshot()
        summed = api.reduce(grad, None, self.server, comm=self.comm, algorithm="naive")  # push
        self.traffic = {"pull_sent": c1.since(c0).bytes_sent,
                        "push_sent": self.t.counters.since(c2).bytes_sent}
        if self.is_server:
            self.flat -= self.lr * summed / total[1]
        return float(total[0] / max(total[1], 1))


def async_sgd_study(taus=(0, 1, 2, 4, 8, 16, 32), lrs=(0.1, 1.0, 8.0), workers: int = 8,
                    computations: int = 400, seed: int = 0) -> list[dict]:
    """Asynchronous SGD with a staleness of tau updates, simulated in one process: update k
    applies a gradient computed on the parameters of update k - tau (K workers computing at
    once make tau about K - 1). Every update uses a mini-batch of `workers` samples' worth,
    so tau = 0 is sequential mini-batch SGD with 8x more updates than synchronous steps."""
    from .data import classification
    from .models import MLP
    x, y = classification(2000, 16, 4, seed=seed, separation=0.4)
    initial = MLP([16, 4], seed=seed).loss_and_grads((x, y))[0] / len(y)
    rows = []
    for lr in lrs:
        for tau in taus:
            model = MLP([16, 4], seed=seed)
            history = [{k: v.copy() for k, v in model.params.items()}]
            rng = np.random.default_rng(seed + 1)
            diverged = False
            for _ in range(computations):
                stale = history[max(0, len(history) - 1 - tau)]
                live = model.params
                model.params = stale
                idx = rng.integers(0, len(y), 32)
                _, g, n = model.loss_and_grads((x[idx], y[idx]))
                model.params = live
                for name in live:
                    live[name] -= lr * g[name] / n
                history.append({k2: v.copy() for k2, v in live.items()})
                history = history[-(tau + 2):]
                if not all(np.all(np.isfinite(v)) for v in live.values()):
                    diverged = True
                    break
            loss = float("inf") if diverged else model.loss_and_grads((x, y))[0] / len(y)
            if not np.isfinite(loss) or loss > 2 * initial:  # worse than twice the starting loss
                diverged = True
            rows.append({"lr": lr, "tau": tau, "final_loss": loss, "initial_loss": initial, "diverged": diverged})
    return rows
