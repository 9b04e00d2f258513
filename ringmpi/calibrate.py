"""Fit alpha, beta, gamma (and ringmpi's per-call overhead) to measured timings.

Each measured (algorithm, size) contributes one equation
    t = overhead + alphas*alpha + beta_bytes*beta + gamma_bytes*gamma
whose counts come from the algorithm's registered formula; the system is solved by
non-negative least squares, each row divided by its time so that 1 KiB and 64 MiB weigh
alike. The MPI library's own collective has no formula, so it only enters the tuning table
(`Profile.measured`) that `auto` interpolates. (`ringmpi calibrate`, the command, is in
`ringmpi.tools.calibrate`.)
"""
from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import schedules
from .cost import Profile

__all__ = ["Sample", "nnls", "fit_profile", "fit_quality", "measure_p2p"]


@dataclass(frozen=True)
class Sample:
    collective: str
    algorithm: str
    count: int
    itemsize: int
    seconds: float
    params: tuple = ()


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns: best feasible subset."""
    k = a.shape[1]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale  # columns span 1 to 1e9 (counts vs bytes): equilibrate before solving
    best, best_res = np.zeros(k), float(np.sum(b * b))
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.all(x >= 0):
                full = np.zeros(k)
                full[list(cols)] = x
                res = float(np.sum((a @ full - b) ** 2))
                if res < best_res * (1 - 1e-9):
                    best, best_res = full, res
    return best / scale


def _rows(samples, p):
    rows, ys = [], []
    for s in samples:
        if s.collective == "p2p":  # one MPI_Sendrecv round: alpha + n beta
            rows.append([1.0, 1.0, float(s.count * s.itemsize), 0.0])
            ys.append(s.seconds)
            continue
        alg = schedules.get(s.collective, s.algorithm)
        if alg.cost is None or s.seconds <= 0:
            continue
        c = alg.formula(p, s.count, s.itemsize, **dict(s.params))
        rows.append([1.0, c.alphas, c.beta_bytes, c.gamma_bytes])
        ys.append(s.seconds)
    return np.array(rows, float), np.array(ys, float)


def fit_profile(samples: list[Sample], p: int, name: str = "fitted", meta: dict | None = None) -> Profile:
    """A profile for world size p: NNLS fit of the formulas plus the tuning table."""
    a, y = _rows(samples, p)
    if len(y) >= 2:
        w = 1.0 / y
        overhead, alpha, beta, gamma = nnls(a * w[:, None], y * w)
    else:
        overhead = alpha = beta = gamma = 0.0
    measured: dict = {}
    for s in samples:
        if s.params or s.collective == "p2p":  # e.g. a fixed segment count: not the algorithm's default behaviour
            continue
        measured.setdefault(s.collective, {}).setdefault(s.algorithm, []).append([s.count * s.itemsize, s.seconds])
    for coll in measured.values():
        for alg, pts in coll.items():
            coll[alg] = sorted(pts)
    return Profile(alpha=float(alpha), beta=float(beta), gamma=float(gamma), overhead=float(overhead),
                   name=name, world_size=p, measured=measured, meta=meta or {})


def fit_quality(samples: list[Sample], prof: Profile, p: int) -> dict:
    """Median and worst relative error of the fitted formula over the samples it used."""
    a, y = _rows(samples, p)
    if not len(y):
        return {"median_rel_err": None, "max_rel_err": None, "n": 0}
    pred = a @ np.array([prof.overhead, prof.alpha, prof.beta, prof.gamma])
    rel = np.abs(pred - y) / y
    return {"median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max()), "n": int(len(y))}


def measure_p2p(t: Any, sizes: list[int], iters: int = 20, rounds: int = 3) -> list[Sample]:
    """Point-to-point rounds on group `t`: every rank sends n bytes right and receives n
    from the left (one ring round, as in every ring step), median of rounds, max over ranks."""
    out = []
    for n in sizes:
        a, b = np.zeros(n, np.uint8), np.empty(n, np.uint8)
        right, left = (t.rank + 1) % t.size, (t.rank - 1) % t.size
        per = []
        for _ in range(rounds):
            t.barrier()
            t.begin("calibrate/p2p")
            t0 = t.wtime()
            try:
                for _ in range(iters):
                    t.sendrecv(a, right, b, left)
            finally:
                t.end()
            per.append((t.wtime() - t0) / iters)
        worst = max(t.allgather_obj(statistics.median(per)))
        out.append(Sample("p2p", "sendrecv", n, 1, worst))
    return out
