"""Queries of the alpha-beta-gamma model over the registered algorithms: the cost of one
algorithm, its predicted time, where two algorithms cross over, and the data-parallel step
time T1/p + T_comm (the lecture's speedup model)."""
from __future__ import annotations

from dataclasses import dataclass

from . import schedules
from .cost import LECTURE, Cost, Profile

__all__ = ["cost", "predict", "crossover", "DPStep", "dp_step"]


def cost(collective: str, algorithm: str, p: int, count: int, itemsize: int = 1, **params) -> Cost:
    """The registered formula of `algorithm` (with its tunables as given)."""
    return schedules.get(collective, algorithm).formula(p, count, itemsize, **params)


def predict(collective: str, algorithm: str, p: int, nbytes: int, prof: Profile = LECTURE, **params) -> float:
    """Predicted seconds for `nbytes` (the whole vector; count = nbytes at itemsize 1), with
    the algorithm's tuned parameters under `prof` unless given."""
    alg = schedules.get(collective, algorithm)
    t = alg.predict(p, nbytes, 1, prof, **params)
    if t is None:
        raise ValueError(f"{collective}/{algorithm} has no formula (the MPI library's own is measured)")
    return t


def crossover(collective: str, a: str, b: str, p: int, prof: Profile = LECTURE,
              lo: int = 1, hi: int = 1 << 40) -> int | None:
    """Smallest message size (bytes) from which `b` is at least as fast as `a`, or None."""
    def faster_b(n: int) -> bool:
        return predict(collective, b, p, n, prof) <= predict(collective, a, p, n, prof)
    if faster_b(lo):
        return lo
    if not faster_b(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if faster_b(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class DPStep:
    workers: int
    compute: float      # T1 / p
    comm: float         # ring all-reduce of the gradients
    step: float
    speedup: float
    comm_fraction: float


def dp_step(t1: float, p: int, grad_bytes: float, prof: Profile = LECTURE, algorithm: str = "ring") -> DPStep:
    """Data-parallel step without overlap: T1/p + T_comm; speedup T1 / that."""
    comm = predict("allreduce", algorithm, p, int(grad_bytes), prof) - prof.overhead if p > 1 else 0.0
    step = t1 / p + comm
    return DPStep(p, t1 / p, comm, step, t1 / step, comm / step)
