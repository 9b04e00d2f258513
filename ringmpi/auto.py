"""`algorithm="auto"`: the candidate with the lowest predicted time, like NCCL's tuner.

Prediction per (collective, algorithm, world size, bytes):
  1. inside the sizes the active profile measured: log-log interpolation of the measured
     times (a tuning table, exact where it was measured);
  2. elsewhere: the algorithm's alpha-beta-gamma formula under the fitted profile, with its
     own tunables (`tune`); for the MPI library's own collective (no formula) the nearest
     measured trend, or, with no measurement at all, the best formula without ringmpi's
     Python overhead.
The MPI library's own collective is kept unless another is predicted >= 10% faster, so an
uncalibrated machine gets MPI's choice. Every rank must choose the same algorithm, so the
profile is read on rank 0 and broadcast. The profile and the choices made under it are
state of the communicator's transport (`Group.profile`, `Group.choices`).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from . import schedules as _alg
from .call import Call
from .cost import Profile
from .settings import Settings, log, settings

__all__ = ["DEFAULT", "MARGIN", "choose", "predict_time", "profile_of", "set_profile", "profile_path"]

#: Used until `ringmpi calibrate` has measured this machine.
DEFAULT = Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9, overhead=20e-6,
                  name="built-in default (uncalibrated)")
MARGIN = 0.9


def profile_path(p: int, st: Settings | None = None) -> Path:
    """RINGMPI_PROFILE (a file, or a folder holding profile-pP.json), else the user cache."""
    env = (st or settings()).profile
    if env:
        path = Path(env)
        return path / f"profile-p{p}.json" if path.is_dir() else path
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ringmpi" / f"profile-p{p}.json"


def profile_of(t: Any) -> Profile:
    """The profile of transport `t`: read by rank 0 once, broadcast to every rank."""
    if t.profile is None:
        data = None
        if t.rank == 0:
            path = profile_path(t.size)
            try:
                data = Profile.load(path) if path.exists() else None
            except (OSError, ValueError, TypeError) as e:
                log(f"ignoring unreadable profile {path}: {e}", "WARN")
        data = t.bcast_obj(data, 0) if t.size > 1 else data
        set_profile(t, data or DEFAULT)
    return t.profile


def set_profile(t: Any, prof: Profile) -> None:
    """Install `prof` on transport `t` (the same object on every rank, e.g. after a fit);
    the choices made under the previous profile are dropped."""
    t.profile = prof
    t.choices.clear()


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


def predict_time(collective: str, algorithm: str, p: int, count: int, itemsize: int, prof: Profile) -> float:
    nbytes = count * itemsize
    table = prof.measured.get(collective, {}).get(algorithm) if prof.world_size in (None, p) else None
    if table:
        hit = _interp(table, nbytes)
        if hit is not None:
            return hit
    alg = _alg.get(collective, algorithm)
    if alg.cost is not None:
        return alg.predict(p, count, itemsize, prof)
    if table and len(table) >= 2:  # the MPI library's own beyond the measured range: linear trend
        (b0, s0), (b1, s1) = sorted(table)[-2:] if nbytes > max(b for b, _ in table) else sorted(table)[:2]
        slope = (s1 - s0) / (b1 - b0) if b1 != b0 else 0.0
        return max(s0 + slope * (nbytes - b0), 0.0)
    others = [predict_time(collective, a, p, count, itemsize, prof)
              for a in _alg.names(collective) if _alg.get(collective, a).cost is not None]
    return min(others) - prof.overhead


def choose(t: Any, call: Call) -> dict:
    """What `auto` runs for this call (identical on every rank): {"algorithm", "why", ...}."""
    st = settings()
    collective = call.collective.name
    key = (collective, call.count, call.itemsize, call.params, st.generation)
    choice = t.choices.get(key)
    if choice is None:
        forced = st.forced(collective)
        if forced is not None:
            _alg.get(collective, forced)  # an unknown name is an error, not ignored
            choice = {"algorithm": forced, "why": "forced by RINGMPI_ALGO"}
        else:
            prof = profile_of(t)
            native_ok = getattr(t, "native_serves", lambda n, e: True)(call.count, call.collective.elementwise)
            preds = {a: predict_time(collective, a, t.size, call.count, call.itemsize, prof)
                     for a in _alg.names(collective) if native_ok or _alg.get(collective, a).cost is not None}
            best = min(preds, key=preds.get)
            if "mpi" in preds and best != "mpi" and preds[best] > MARGIN * preds["mpi"]:
                best = "mpi"
            choice = {"algorithm": best, "predicted_s": preds,
                      "why": f"lowest predicted time under profile '{prof.name}'"}
        choice.update(collective=collective, bytes=call.count * call.itemsize)
        t.choices.put(key, choice)
        if st.info and t.rank == 0:
            preds = choice.get("predicted_s", {})
            table = " ".join(f"{a}={s * 1e6:.1f}us" for a, s in sorted(preds.items(), key=lambda kv: kv[1]))
            log(f"{collective} p={t.size} bytes={call.count * call.itemsize}: {choice['algorithm']} "
                f"({choice['why']}) {table}", "INFO")
    return choice
