"""`algorithm="auto"`: the candidate with the lowest predicted time, like NCCL's tuner.

Prediction per (collective, algorithm, world size, bytes):
  1. inside the sizes the active profile measured: log-log interpolation of the measured
     times (a tuning table, exact where it was measured);
  2. elsewhere: the algorithm's alpha-beta-gamma formula under the fitted profile; for the
     MPI library's own collective (no formula) the nearest measured trend, or, with no
     measurement at all, the best formula without ringmpi's Python overhead.
The MPI library's own collective is kept unless another is predicted >= 10% faster, so an
uncalibrated machine gets MPI's choice. Every rank must choose the same algorithm, so the
profile is read on rank 0 and broadcast.

Environment (read at the first auto call; `reload_env()` rereads it): RINGMPI_ALGO forces a choice ("ring" everywhere it exists, or per collective
"allreduce=ring,broadcast=pipeline"); RINGMPI_DEBUG=INFO prints each choice and why;
RINGMPI_CHECK=1 compares every call's arguments across ranks first (see api);
RINGMPI_PROFILE names the profile file (default ~/.cache/ringmpi/profile-p{P}.json).
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from . import schedules as _alg
from .cost import Profile, best_segments

__all__ = ["DEFAULT", "choose", "env", "reload_env", "predict_time", "active_profile", "set_profile",
           "default_segments", "profile_path", "LAST"]

#: Used until `ringmpi calibrate` or `ringmpi bench` has measured this machine.
DEFAULT = Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9, overhead=20e-6,
                  name="built-in default (uncalibrated)")
MARGIN = 0.9
LAST: dict = {}
_CACHE: dict = {}


def profile_path(p: int) -> Path:
    env = os.environ.get("RINGMPI_PROFILE")
    if env:
        path = Path(env)
        return path / f"profile-p{p}.json" if path.is_dir() else path
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ringmpi" / f"profile-p{p}.json"


def active_profile(t) -> Profile:
    """The profile of transport `t`: read by rank 0 once, broadcast to every rank."""
    prof = getattr(t, "_ringmpi_profile", None)
    if prof is None:
        data = None
        if t.rank == 0:
            path = profile_path(t.size)
            try:
                data = Profile.load(path) if path.exists() else None
            except (OSError, ValueError, TypeError) as e:
                print(f"ringmpi: ignoring unreadable profile {path}: {e}", file=sys.stderr)
        data = t.bcast_obj(data, 0) if t.size > 1 else data
        prof = data or DEFAULT
        t._ringmpi_profile = prof
    return prof


def set_profile(t, prof: Profile) -> None:
    """Install `prof` on transport `t` (same object on every rank, e.g. after a fit)."""
    t._ringmpi_profile = prof


def _interp(points: list, n: int) -> float | None:
    pts = sorted((max(b, 1), s) for b, s in points)
    x = max(n, 1)
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if b0 <= x <= b1:
            if b1 == b0:
                return s0
            w = (math.log(x) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp((1 - w) * math.log(max(s0, 1e-12)) + w * math.log(max(s1, 1e-12)))
    return pts[0][1]


def predict_time(collective: str, algorithm: str, p: int, count: int, itemsize: int,
                 prof: Profile, **params) -> float:
    nbytes = count * itemsize
    if prof.world_size in (None, p):
        table = prof.measured.get(collective, {}).get(algorithm)
        if table:
            hit = _interp(table, nbytes)
            if hit is not None:
                return hit
    alg = _alg.get(collective, algorithm)
    if alg.cost is not None:
        if collective == "broadcast" and algorithm == "pipeline" and "segments" not in params:
            params["segments"] = best_segments(p, nbytes, prof.alpha, prof.beta, max(count, 1))[0]
        return alg.cost(p, count, itemsize, **params).time(prof)
    table = prof.measured.get(collective, {}).get(algorithm) if prof.world_size in (None, p) else None
    if table and len(table) >= 2:  # the MPI library's own beyond the measured range: linear trend
        (b0, s0), (b1, s1) = sorted(table)[-2:] if nbytes > max(b for b, _ in table) else sorted(table)[:2]
        slope = (s1 - s0) / (b1 - b0) if b1 != b0 else 0.0
        return max(s0 + slope * (nbytes - b0), 0.0)
    others = [predict_time(collective, a, p, count, itemsize, prof, **params)
              for a in _alg.names(collective) if _alg.get(collective, a).cost is not None]
    return min(others) - prof.overhead


ENV: dict = {}


def reload_env() -> None:
    """Read RINGMPI_ALGO, RINGMPI_DEBUG and RINGMPI_CHECK again (they are read once, at the
    first call, like NCCL's variables; call this after changing them in a running program)."""
    ENV["algo"] = os.environ.get("RINGMPI_ALGO", "")
    ENV["debug"] = os.environ.get("RINGMPI_DEBUG", "")
    ENV["check"] = os.environ.get("RINGMPI_CHECK", "")


def env(key: str) -> str:
    """One of the variables above ('algo', 'debug', 'check'), read on first use."""
    value = ENV.get(key)
    if value is None:
        reload_env()
        value = ENV[key]
    return value


def _forced(collective: str, spec: str) -> str | None:
    spec = spec.strip()
    if not spec:
        return None
    for part in spec.split(","):
        key, _, val = part.strip().rpartition("=")
        if key in ("", collective) and val in _alg.names(collective):
            return val
    return None


def choose(collective: str, t, count: int, itemsize: int, **params) -> str:
    """The algorithm `auto` runs for this call (identical on every rank)."""
    spec, debug = env("algo"), env("debug")
    prof = getattr(t, "_ringmpi_profile", None) or active_profile(t)
    key = (collective, t.size, count, itemsize, spec, tuple(sorted(params.items())) if params else ())
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is prof:  # the entry holds its profile: no stale reuse
        choice = hit[1]
    else:
        forced = _forced(collective, spec)
        if forced is not None:
            choice = {"algorithm": forced, "why": "forced by RINGMPI_ALGO"}
        else:
            preds = {a: predict_time(collective, a, t.size, count, itemsize, prof, **params)
                     for a in _alg.names(collective)}
            best = min(preds, key=preds.get)
            if "mpi" in preds and best != "mpi" and preds[best] > MARGIN * preds["mpi"]:
                best = "mpi"
            choice = {"algorithm": best, "predicted_s": preds,
                      "why": f"lowest predicted time under profile '{prof.name}'"}
        choice.update(collective=collective, bytes=count * itemsize)
        _CACHE[key] = (prof, choice)
    LAST["choice"] = choice
    if debug and t.rank == 0 and debug.upper() in ("INFO", "DEBUG"):
        preds = choice.get("predicted_s", {})
        table = " ".join(f"{a}={s * 1e6:.1f}us" for a, s in sorted(preds.items(), key=lambda kv: kv[1]))
        print(f"ringmpi INFO {collective} p={t.size} bytes={count * itemsize}: "
              f"{choice['algorithm']} ({choice['why']}) {table}", file=sys.stderr, flush=True)
    return choice["algorithm"]


def default_segments(p: int, count: int, itemsize: int, t=None) -> int:
    """The S minimising (p-2+S)(alpha + n/(S B)) under the active (or default) profile."""
    prof = active_profile(t) if t is not None else DEFAULT
    return best_segments(p, count * itemsize, prof.alpha, prof.beta, max(count, 1))[0]
