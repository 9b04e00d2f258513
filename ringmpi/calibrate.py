"""Fit alpha, beta, gamma (and ringmpi's per-call overhead) to measured timings.

Each measured (algorithm, size) contributes one equation
    t = overhead + alphas*alpha + beta_bytes*beta + gamma_bytes*gamma
whose counts come from the algorithm's registered formula; the system is solved by
non-negative least squares, each row divided by its time so that 1 KiB and 64 MiB weigh
alike. The MPI library's own collective has no formula, so it only enters the tuning table
(`Profile.measured`) that `auto` interpolates.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .cost import Profile

__all__ = ["Sample", "nnls", "fit_profile", "fit_quality"]


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
    from .schedules import get
    rows, ys, used = [], [], []
    for s in samples:
        if s.collective == "p2p":  # one MPI_Sendrecv round: alpha + n beta
            rows.append([1.0, 1.0, float(s.count * s.itemsize), 0.0])
            ys.append(s.seconds)
            used.append(s)
            continue
        alg = get(s.collective, s.algorithm)
        if alg.cost is None or s.seconds <= 0:
            continue
        c = alg.cost(p, s.count, s.itemsize, **dict(s.params))
        rows.append([1.0, c.alphas, c.beta_bytes, c.gamma_bytes])
        ys.append(s.seconds)
        used.append(s)
    return np.array(rows, float), np.array(ys, float), used


def fit_profile(samples: list[Sample], p: int, name: str = "fitted", meta: dict | None = None) -> Profile:
    """A profile for world size p: NNLS fit of the formulas plus the tuning table."""
    a, y, _ = _rows(samples, p)
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
    a, y, _ = _rows(samples, p)
    if not len(y):
        return {"median_rel_err": None, "max_rel_err": None, "n": 0}
    pred = a @ np.array([prof.overhead, prof.alpha, prof.beta, prof.gamma])
    rel = np.abs(pred - y) / y
    return {"median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max()), "n": int(len(y))}


def measure_p2p(t, sizes: list[int], iters: int = 20, rounds: int = 3) -> list[Sample]:
    """Point-to-point rounds: every rank sends n bytes right and receives n from the left
    (one ring round, as in every ring step), median of interleaved rounds, max over ranks."""
    import statistics
    out = []
    for n in sizes:
        a, b = np.zeros(n, np.uint8), np.empty(n, np.uint8)
        right, left = (t.rank + 1) % t.size, (t.rank - 1) % t.size
        per = []
        for _ in range(rounds):
            t.barrier()
            t0 = t.wtime()
            for _ in range(iters):
                t.sendrecv(a, right, b, left)
            per.append((t.wtime() - t0) / iters)
        worst = max(t.allgather_obj(statistics.median(per)))
        out.append(Sample("p2p", "sendrecv", n, 1, worst))
    return out


def add_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="measure this machine and save the profile auto uses")
    c.add_argument("-b", "--minbytes", default="1K")
    c.add_argument("-e", "--maxbytes", default="4M")
    c.add_argument("-f", "--stepfactor", type=float, default=4)
    c.add_argument("-C", "--collectives", default="all")
    c.add_argument("-d", "--dtype", default="float32")
    c.add_argument("--out", default="", help="also write the benchmark report here")
    c.set_defaults(func=_run)


def _run(ns) -> int:
    from .bench import run
    ns.algorithms, ns.op, ns.root, ns.iters, ns.warmup, ns.rounds = "all", "sum", 0, 0, None, 3
    ns.check, ns.no_save_profile, ns.no_progress, ns.quiet, ns.p2p = 1, False, False, True, True
    ns.average, ns.json, ns.stepbytes = 1, "", ""
    return run(ns)
