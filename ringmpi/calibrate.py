"""Measure alpha, beta, gamma where each lives, then fit what is left (ringmpi's per-call
overhead) to the collectives' timings.

Each measured (algorithm, size) of a collective is one equation
    t = overhead + alphas*alpha + beta_bytes*beta + gamma_bytes*gamma
whose counts come from the algorithm's registered formula. Fitting all four constants to
those equations at once trades one against another (every all-reduce moves 2 bytes per byte
it reduces, so beta and gamma are not separable there; over a shaped link the fit put
numpy's reduction rate two orders of magnitude too low: benchmarks/README.md, "Figures behind
constants in the code"). So, when the measurements are there:

    gamma   from the array backend's own reduction on this rank (no network), the worst rank
    alpha,  from point-to-point ring rounds (every rank sendrecv's n bytes right), small and
    beta    large n: t = alpha + n beta, weighted least squares (relative error)
    overhead  the median of what the formulas leave unexplained in the collectives' timings

and otherwise non-negative least squares on the collectives alone (`fit_profile`). The MPI
library's own collective has no formula: it only enters the tuning table
(`Profile.measured`) that `auto` interpolates. (`ringmpi calibrate`, the command, is in
`ringmpi.tools.calibrate`.)
"""
from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import schedules
from .cost import Profile

__all__ = ["Sample", "nnls", "fit_profile", "fit_quality", "copy_runner", "measure_p2p", "measure_gamma",
           "fit_measured", "unphysical", "MAX_FIT_ERROR"]

@dataclass(frozen=True)
class Sample:
    """One measurement the fit reads: a call of `collective` by `algorithm` (with its
    tunables, `params`) on `count` items of `itemsize` bytes took `seconds`, the slowest
    rank's median."""
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
        if s.collective == "gamma":
            continue
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
    return Profile(alpha=float(alpha), beta=float(beta), gamma=float(gamma), overhead=float(overhead),
                   name=name, world_size=p, measured=_table(samples), meta=meta or {})


def _table(samples: list[Sample]) -> dict:
    """{collective: {algorithm: [[bytes, seconds], ...]}} of the collectives' samples."""
    measured: dict = {}
    for s in samples:
        if s.collective in ("p2p", "gamma"):
            continue
        measured.setdefault(s.collective, {}).setdefault(s.algorithm, []).append([s.count * s.itemsize, s.seconds])
    for coll in measured.values():
        for alg, pts in coll.items():
            coll[alg] = sorted(pts)
    return measured


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) >= 0 of t = a + n b through (n, t), least squares of the relative
    error (each point weighted 1/t, so that 8 B and 16 MiB count alike)."""
    n = np.array([x for x, _ in points], float)
    y = np.array([v for _, v in points], float)
    a = np.stack([np.ones_like(n), n], axis=1) / y[:, None]
    return tuple(float(v) for v in nnls(a, np.ones_like(y)))


#: how strongly the final fit keeps alpha and gamma at their direct measurements (the
#: weight of one pseudo-observation "multiplier = 1" against the samples' relative errors)
ANCHOR = 0.3


def fit_measured(samples: list[Sample], p: int, name: str = "measured", meta: dict | None = None) -> Profile:
    """alpha and beta from the point-to-point samples, gamma from the reduction samples;
    then what is left: the per-call overhead and a multiplier on alpha and on gamma, fitted
    to the collectives' timings by non-negative least squares with both multipliers held
    near 1 (`ANCHOR`, clipped to [0.5, 4]). beta stays what the exchanges measured: it is
    the link's rate, and letting the collectives move it trades it against gamma again
    (over a shaped link the collectives alone put it above the link's rate). Falls back to
    `fit_profile` without the direct samples."""
    p2p = [(s.count * s.itemsize, s.seconds) for s in samples if s.collective == "p2p"]
    red = [(s.count * s.itemsize, s.seconds) for s in samples if s.collective == "gamma"]
    if len(p2p) < 2 or len(red) < 2:
        return fit_profile(samples, p, name, meta)
    alpha, beta = _line(p2p)
    gamma = _line(red)[1]
    a, y = _rows([s for s in samples if s.collective != "p2p"], p)
    k = np.array([0.0, 1.0, 1.0])  # overhead, alpha multiplier, gamma multiplier
    if len(y):
        w = 1.0 / y
        cols = np.stack([a[:, 0], a[:, 1] * alpha, a[:, 3] * gamma], axis=1)
        prior = ANCHOR * np.diag([0.0, 1.0, 1.0])
        k = nnls(np.vstack([cols * w[:, None], prior]), np.concatenate([(y - a[:, 2] * beta) * w, prior.sum(axis=1)]))
        k[1:] = np.clip(k[1:], 0.5, 4.0)  # corrections, not replacements: alpha stays near the measured latency
    info = {"alpha": alpha, "beta": beta, "gamma": gamma, "multipliers": [float(k[1]), 1.0, float(k[2])],
            "p2p": p2p, "reduction": red}
    return Profile(alpha=float(k[1] * alpha), beta=float(beta), gamma=float(k[2] * gamma), overhead=float(k[0]),
                   name=name, world_size=p, measured=_table(samples), meta={**(meta or {}), "direct": info})


def fit_quality(samples: list[Sample], prof: Profile, p: int) -> dict:
    """Median and worst relative error of the fitted formula over the samples it used."""
    a, y = _rows(samples, p)
    if not len(y):
        return {"median_rel_err": None, "max_rel_err": None, "n": 0}
    pred = a @ np.array([prof.overhead, prof.alpha, prof.beta, prof.gamma])
    rel = np.abs(pred - y) / y
    return {"median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max()), "n": int(len(y))}


def measure_gamma(t: Any, dtype: Any = np.float32, sizes: tuple = (1 << 16, 1 << 18, 1 << 20, 1 << 22),
                  rounds: int = 5) -> list[Sample]:
    """The backend's reduction alone (out = a + b, as the algorithms' combine does), on every
    rank at once, median of `rounds`, the slowest rank: what gamma costs here."""
    import time
    dt = np.dtype(dtype)
    out = []
    for nbytes in sizes:
        n = nbytes // dt.itemsize
        a, b, c = np.ones(n, dt), np.ones(n, dt), np.empty(n, dt)
        per = []
        t.barrier()
        for _ in range(rounds):
            t0 = time.perf_counter()
            t.backend.combine("SUM", a, b, c)
            per.append(time.perf_counter() - t0)
        worst = max(t.allgather_obj(statistics.median(per)))
        out.append(Sample("gamma", "combine", n, dt.itemsize, worst))
    return out


def copy_runner(nbytes: int) -> Callable[[], Any]:
    """One memory copy of `nbytes` per call, its pages touched once already."""
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    np.copyto(dst, src)
    return lambda: np.copyto(dst, src)


def measure_copy(t: Any, nbytes: int = 64 << 20, rounds: int = 5) -> float:
    """Bytes per second one core copies (np.copyto of `nbytes`) while every rank copies at
    once: the host's memory bandwidth as a rank sees it during a collective, the physical
    reference for an all-reduce over shared memory (2 ranks move about 2.5 bytes of memory
    traffic per byte reduced where a copy moves 2). Median over rounds, the slowest rank."""
    import time
    copy = copy_runner(nbytes)
    per = []
    for _ in range(rounds):
        t.barrier()
        t0 = time.perf_counter()
        copy()
        per.append(time.perf_counter() - t0)
    return nbytes / max(t.allgather_obj(statistics.median(per)))


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


#: a fit whose formulas miss the measurements by more than this (median) is not saved
MAX_FIT_ERROR = 0.5


def unphysical(prof: Profile) -> str | None:
    """Why a fitted profile must not be saved for `auto` (None: it may): a constant at its
    bound, a bandwidth no exchange measured, or formulas that do not describe the machine."""
    direct = prof.meta.get("direct")
    fit = prof.meta.get("fit", {})
    if direct is None:
        return "alpha, beta and gamma were not measured directly (point-to-point and reduction samples missing)"
    if prof.alpha <= 0 or prof.beta <= 0 or prof.gamma <= 0:
        return f"a constant at its bound (alpha {prof.alpha:.3g} s, beta {prof.beta:.3g} s/B, gamma {prof.gamma:.3g} s/B)"
    if prof.bandwidth > 2 / direct["beta"]:
        return (f"fitted bandwidth {prof.bandwidth / 1e9:.3g} GB/s is twice what the exchanges measured "
                f"({1 / direct['beta'] / 1e9:.3g} GB/s)")
    err = fit.get("median_rel_err")
    if err is not None and err > MAX_FIT_ERROR:
        return f"the formulas miss the measurements by {err:.0%} (median; at most {MAX_FIT_ERROR:.0%} is saved)"
    return None
