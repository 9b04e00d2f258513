"""`algorithm="auto"`: learned online on the application's own calls (like STAR-MPI), seeded
and pruned by the cost model, like NCCL's tuner.

Online tuning (RINGMPI_TUNE=1, the default), per (communicator, collective, dtype, op, size
bucket = bit length of the byte count): the first calls of the bucket run the candidates
in two stages (`Tuner`), each candidate's calls back to back: each once untimed and once
timed, then the ones within 2x of the fastest (and MPI's own) once untimed and three times
timed, scored by the mean of those three; the candidates are MPI's own and every algorithm
whose formula predicts at most 3x the best formula's time. Timings are combined across
ranks with MAX, so every rank picks the same winner. The winner is then monitored (one
call in 4 to 256 timed, so that timing costs about 1% of the bucket's time; every 16
samples the median, again MAX over ranks) and replaced by the runner-up only when it is >=
10% slower than the runner-up's tuned time.
A calibrated profile that measured every candidate at that size, or a profile holding what
an earlier run learned (`save_learned`), seeds the choice without exploration.
RINGMPI_TUNE=0 keeps the prediction below alone.

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

import itertools
import math
import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from . import schedules as _alg
from .call import Call
from .cost import Profile
from .device import D2H_BETA
from .settings import Settings, log, settings

__all__ = ["DEFAULT", "MARGIN", "choose", "predict_time", "profile_of", "set_profile", "profile_path", "Tuner",
           "learned", "save_learned"]

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
    the choices made under the previous profile are dropped. The profile learns the
    transport's layout (ranks per node) for the formulas that have two link classes."""
    nodes = getattr(t, "nodes", None)
    if nodes and len(set(nodes)) > 1:
        prof = replace(prof, per_node=max(nodes.count(h) for h in set(nodes)))
    t.profile = prof
    for g in [t, *getattr(t, "devices", {}).values()]:   # the device calls' choices too
        g.choices.clear()
        g.tuners.clear()
    changed()


#: called when choices made so far may be stale (a profile installed, a tuner's switch):
#: the call pipeline empties its plans (`api.forget_plans`)
ON_CHANGE: list = []


def changed() -> None:
    for fn in ON_CHANGE:
        fn()


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


def predict_time(collective: str, algorithm: str, p: int, count: int, itemsize: int, prof: Profile,
                 params: tuple = ()) -> float:
    """Seconds `algorithm` takes under `prof`: the profile's measurement, else the formula
    (with the call's `params`: a 16-bit float's partials), else MPI's own extrapolated."""
    nbytes = count * itemsize
    table = prof.measured.get(collective, {}).get(algorithm) if prof.world_size in (None, p) else None
    if table:
        hit = _interp(table, nbytes)
        if hit is not None:
            return hit
    alg = _alg.get(collective, algorithm)
    if alg.cost is not None:
        return alg.predict(p, count, itemsize, prof, **dict(params))
    if table and len(table) >= 2:  # the MPI library's own beyond the measured range: linear trend
        (b0, s0), (b1, s1) = sorted(table)[-2:] if nbytes > max(b for b, _ in table) else sorted(table)[:2]
        slope = (s1 - s0) / (b1 - b0) if b1 != b0 else 0.0
        return max(s0 + slope * (nbytes - b0), 0.0)
    others = [predict_time(collective, a, p, count, itemsize, prof)
              for a in _alg.names(collective) if _alg.get(collective, a).cost is not None]
    return min(others) - prof.overhead


def _predicted_choice(t: Any, call: Call, prof: Profile, mpi_ok: bool, mpi_extra: float = 0.0) -> dict:
    """The lowest predicted time under `prof`; MPI's own pays `mpi_extra` more (device
    buffers staged whole through the host) and wins near-ties (MARGIN)."""
    collective = call.collective.name
    algs = [_alg.get(collective, a) for a in _alg.names(collective)]
    preds = {a.name: predict_time(collective, a.name, t.size, call.count, call.itemsize, prof, call.params)
             for a in algs if (mpi_ok or a.cost is not None) and not a.refuses(t, call)}
    if "mpi" in preds:
        preds["mpi"] += mpi_extra
    best = min(preds, key=preds.get)
    if "mpi" in preds and best != "mpi" and preds[best] > MARGIN * preds["mpi"]:
        best = "mpi"
    return {"algorithm": best, "predicted_s": preds, "why": f"lowest predicted time under profile '{prof.name}'"}


def _measured_everywhere(prof: Profile, collective: str, names: list[str], p: int, nbytes: int) -> bool:
    """The profile timed every candidate at sizes around `nbytes` at this world size."""
    if prof.world_size != p:
        return False
    table = prof.measured.get(collective, {})
    return all(table.get(a) and _interp(table[a], nbytes) is not None for a in names)


def choose(t: Any, call: Call) -> dict:
    """What `auto` runs for this call (identical on every rank): {"algorithm", "why", ...};
    under online tuning also "tuner" (the bucket's `Tuner`) and "timed" (time this call)."""
    st = settings()
    collective = call.collective.name
    nbytes = call.count * call.itemsize
    # device buffers (t a `device.DeviceGroup`) are tuned and learned apart: "cupy:float32".
    # In place and out of place share the bucket: the ranks of one call can differ there
    # (a rank standing in for a result buffer that aliases its input, `api._fresh`), and
    # every rank must walk the same tuner (MPI's own 16 MiB out of place costs a copy more
    # than in place; the bench times auto both ways)
    where = t.memory if t.on_device else ""
    key = _bucket(t, call)
    forced = st.forced(collective)
    tuner = t.tuners.get(key) if st.tune and forced is None else None
    if tuner is not None:
        return tuner.pick()
    ckey = (collective, call.count, call.itemsize, call.params, st.generation)
    choice = t.choices.get(ckey)
    if choice is None:
        mpi_ok = t.mpi_serves(call)
        if forced is not None:
            _alg.get(collective, forced)  # an unknown name is an error, not ignored
            choice = {"algorithm": forced, "why": "forced by RINGMPI_ALGO"}
        else:
            prof = profile_of(t)
            names = _candidates(t, call, prof, mpi_ok)
            learned = prof.learned.get("/".join(map(str, key[:4]))) if prof.world_size == t.size else None
            if st.tune and learned is None and not _measured_everywhere(prof, collective, names, t.size, nbytes):
                tuner = t.tuners.put(key, Tuner(key, names, t.rank == 0 and st.info))
                return tuner.pick()
            if st.tune and learned is not None:
                tuner = t.tuners.put(key, Tuner(key, names, t.rank == 0 and st.info, learned))
                return tuner.pick()
            staged = 2 * nbytes * D2H_BETA if where and not t.aware else 0.0   # MPI's own on staged whole buffers
            choice = _predicted_choice(t, call, prof, mpi_ok, staged)
        choice.update(collective=collective, bytes=nbytes)
        t.choices.put(ckey, choice)
        if st.info and t.rank == 0:
            preds = choice.get("predicted_s", {})
            table = " ".join(f"{a}={s * 1e6:.1f}us" for a, s in sorted(preds.items(), key=lambda kv: kv[1]))
            log(f"{collective} p={t.size} bytes={nbytes}: {choice['algorithm']} ({choice['why']}) {table}", "INFO")
    return choice


#: a request runs MPI's own nonblocking collective (MPI_Iallreduce ...) only where it is
#: predicted this much faster than ringmpi's best: its predictions are of MPI's blocking
#: collective, and the nonblocking one is another implementation, which need not advance
#: while the caller computes (Open MPI's libnbc hid none of a 16 MiB all-reduce over
#: TCP, the ring four fifths: benchmarks/README.md); where latency rules, MPI's own wins
REQUEST_MARGIN = 2.0


class Margins(NamedTuple):
    """How much faster than ringmpi's best MPI's own nonblocking collective must be for a
    request to run it, as the model predicts it (`predicted`) and as blocking calls measured
    it (`measured`, online tuning). `api.request` passes REQUEST_MARGIN for both where a
    request can hide anything (`api.overlaps`), and measured 1 where nothing runs beside it
    (the fastest measured: what MPI's nonblocking collective costs over its blocking one
    is about what ringmpi's request costs over its blocking call; benchmarks/README.md, "A
    nonblocking call in one frame, and MPI's on two ranks". The model's MPI's own is no
    measurement, and on one host it predicts MPI's own
    where a shared-memory algorithm is faster); the drop-in 1 for both (`comm.AS_ASKED`:
    its caller asked for MPI's own). `seconds`: what a request of ringmpi's algorithm costs
    its caller over the blocking call it was measured as, added to that call's time where
    the two are weighed (the drop-in's generalized request, its parsing and its hand-off
    cost some tens of microseconds, more than ringmpi's algorithm gained over MPI's at
    64 KiB: benchmarks/README.md, "The drop-in's requests weighed as requests")."""
    predicted: float = REQUEST_MARGIN
    measured: float = REQUEST_MARGIN
    seconds: float = 0.0

    def mpi_first(self, margin: float, mpi_s: float, ours_s: float) -> bool:
        """Whether a request runs MPI's own (`mpi_s`, blocking) over ringmpi's best
        (`ours_s`): `margin` (`predicted` or `measured`) times faster than ringmpi's with
        `seconds` added."""
        return margin * mpi_s <= ours_s + self.seconds


def choose_request(view: Any, g: Any, call: Call, margins: Margins = Margins()) -> dict:
    """What `auto` runs for a request (`ringmpi.requests`; `view` its transport): the
    algorithm online tuning settled on for blocking calls of the same bucket when it can
    run as a request, else the lowest predicted time among those that can (`g`: the
    communicator's transport, which keeps the choices). Requests are not
    timed for the tuner: what a request's time includes (the caller's computation, other
    requests) is not the algorithm's. `margins`: how much faster than ringmpi's best MPI's
    own nonblocking collective must be to run."""
    st = settings()
    collective = call.collective.name
    forced = st.forced(collective)
    if forced is not None:
        _alg.get(collective, forced)
        return {"algorithm": forced, "why": "forced by RINGMPI_ALGO", "collective": collective}
    tuner = g.tuners.get(_bucket(view, call)) if st.tune else None
    if tuner is not None and tuner.winner is not None:
        name = _request_winner(tuner, view, call, margins)
        if name is not None:
            choice = tuner.choice(name)
            del choice["tuner"]
            if name == "mpi" and tuner.winner != "mpi":
                choice["why"] = (f"online tuning: MPI's own, within {margins.seconds * 1e6:g} us of {tuner.winner} "
                                 "measured, what a request of ringmpi's costs more")
            elif name != tuner.winner:
                choice["why"] = (f"online tuning: the fastest of ringmpi's measured (MPI's own, {tuner.winner}, "
                                 f"as a nonblocking collective only where {margins.measured:g}x faster)")
            return choice
    ckey = (collective, call.count, call.itemsize, call.params, st.generation, view.on_device, margins)
    choice = g.request_choices.get(ckey)
    if choice is None:
        mpi_ok = g.mpi_serves(call)
        choice = _predicted_choice(view, call, profile_of(g), mpi_ok)
        preds = choice["predicted_s"]
        ours = {a: s for a, s in preds.items() if a != "mpi"}
        best = min(ours, key=ours.get) if ours else None
        if best is not None and "mpi" in preds:
            mpi_first = margins.mpi_first(margins.predicted, preds["mpi"], preds[best])
            if mpi_first != (choice["algorithm"] == "mpi"):
                choice["algorithm"] = "mpi" if mpi_first else best
                choice["why"] += (f"; MPI's own nonblocking collective only where {margins.predicted:g}x faster than "
                                  f"ringmpi's as a request (+{margins.seconds * 1e6:g} us)")
        choice.update(collective=collective, bytes=call.count * call.itemsize)
        g.request_choices.put(ckey, choice)
    return choice


def _request_winner(tuner: "Tuner", view: Any, call: Call, margins: Margins) -> str | None:
    """Of the algorithms a tuner measured (blocking calls, the same times on every rank),
    the one a request runs: the fastest of ringmpi's that can run as a request (the tuner's
    winner where that is it) unless MPI's own comes first by `margins.mpi_first` (its
    nonblocking collective is another implementation, which can be much slower than the
    blocking one it was measured as: benchmarks/README.md, "Requests on the algorithm
    measured"; ringmpi's request costs its caller `margins.seconds` more than its blocking
    call); None where none measured can run."""
    collective, tuned = call.collective.name, tuner.tuned
    runs = [a for a in tuned if not _alg.get(collective, a).refuses(view, call)]
    if not runs:
        return None
    ours = [a for a in runs if a != "mpi"]
    best = tuner.winner if tuner.winner in ours else min(ours, key=tuned.get) if ours else None
    if best is None or "mpi" in runs and margins.mpi_first(margins.measured, tuned["mpi"], tuned[best]):
        return "mpi"
    return best


def _but_the_slowest(seconds: list[float]) -> float:
    """The mean of a candidate's stage-1 calls without the slowest (`Tuner`)."""
    return statistics.fmean(sorted(seconds)[:-1]) if len(seconds) > 2 else statistics.fmean(seconds)


def _bucket(t: Any, call: Call) -> tuple:
    """The online tuner's bucket of a call: (collective, memory and dtype, op, size class,
    tunables)."""
    where = t.memory if t.on_device else ""
    return (call.collective.name, where + str(call.dtype), call.op, (call.count * call.itemsize).bit_length(),
            call.params)


PRUNE = 3.0


def _candidates(t: Any, call: Call, prof: Profile, mpi_ok: bool) -> list[str]:
    """MPI's own (when it can take the count) and every algorithm whose formula predicts at
    most PRUNE x the best formula's time under `prof`: the ones worth trying online."""
    collective = call.collective.name
    algs = [_alg.get(collective, a) for a in _alg.names(collective)]
    preds = {a.name: a.predict(t.size, call.count, call.itemsize, prof, **dict(call.params)) for a in algs
             if not a.refuses(t, call)}
    known = [v for v in preds.values() if v is not None]
    best = min(known) if known else 0.0
    return [a for a, v in preds.items() if (v is None and mpi_ok) or (v is not None and v <= PRUNE * best)]


@dataclass
class Tuner:
    """Online choice for one (collective, dtype, op, size bucket) on one communicator.

    Exploration in two stages, each candidate's calls back to back (a call's time depends on
    what ran before it: a different algorithm leaves the MPI library's queues and the
    caches in another state, so round-robin timings misjudge the steady state).
    Stage 0: every candidate 1 + STAGE0 times, the first call cold (first-touch costs, and
    the switch from another algorithm, which the second call may still pay); the fastest,
    combined across ranks (MAX), keeps a candidate if within PRUNE0 of the fastest (a
    preemption in one call must not rule out the best), and the OURS1 fastest of ringmpi's
    are kept whatever. Stage 1: those again, once untimed (the first call after another
    algorithm's pays for the switch, several times a steady call) and STAGE1 times timed,
    MPI's own always among them (one unlucky call must not rule out the library). A
    candidate's score is the mean of its
    stage-1 calls but the slowest, MAX over ranks; the lowest wins. The mean of calls back
    to back is what a loop of them takes; the fastest calls of a rank are not (the calls it
    came late to, when the others had done their part: scored so, MPI's own all-reduce in
    place looked twice as fast as in a loop, and won where ring_shm was faster;
    benchmarks/README.md). The slowest is left out because one preempted call, or a second
    call still paying for the switch (MPI's own large broadcasts on shared memory), decided
    against the library where it was twice as fast: benchmarks/README.md, "The drop-in's
    kept calls in one frame". A candidate far
    slower than the best thus costs 1 + STAGE0 calls, a close one 2 + STAGE0 + STAGE1. Every
    rank makes the same calls in the same order, so every rank's tuner walks the same
    schedule and exchanges at the same call: the decisions agree by construction. Settled,
    one call in `sample` is timed: the winner gives way to another whose tuned time is
    HYSTERESIS below its steady one, and where none is (their tuned times are as stale as
    its own), a winner REEXPLORE times slower than tuned sends the bucket back to
    exploring."""
    key: tuple
    candidates: list
    verbose: bool = False
    seed: dict | None = None
    PRUNE0, STAGE1, CHECK, HYSTERESIS = 2.0, 4, 16, 1.10
    # the fastest OURS1 of ringmpi's go on to stage 1 however far behind MPI's own: what a
    # request runs is chosen among ringmpi's by their tuned times (`_request_winner`), and
    # stage 0's are of calls just after a switch; and STAGE0 calls after the cold one there,
    # since the switch can cost the second call too (benchmarks/README.md, "Requests that
    # ran a slow algorithm")
    OURS1, STAGE0 = 2, 2
    # a winner whose steady time is REEXPLORE x its tuned one was chosen on times from
    # another state (a cold start, a noisy moment): the candidates are explored again, at
    # most REEXPLORES times a bucket (benchmarks/README.md, "auto settled on a slow algorithm")
    REEXPLORE, REEXPLORES = 2.0, 2
    # monitoring: a timed call costs about SAMPLE_COST more (two clock reads, the tuner's
    # bookkeeping, 1/CHECK of a MAX exchange); one call in `sample` is timed, so that this
    # stays near SHARE of the bucket's time: every 50th of 1 us calls, every 4th of 1 ms ones
    SAMPLE_COST, SHARE, SAMPLE_MIN, SAMPLE_MAX = 5e-7, 0.01, 4, 256
    winner: str | None = None
    stage: int = 0
    tuned: dict = field(default_factory=dict)
    times: dict = field(default_factory=dict)
    samples: list = field(default_factory=list)
    schedule: list = field(default_factory=list)
    sample: int = SAMPLE_MAX  # one call in `sample` is timed once settled (`_settled`)
    # the countdown to the next timed call, the only one (`pick` and every plan take
    # `next(due)`): True at every `sample`-th call; next() of a C iterator costs a plan's
    # hot loop less than a counter's decrement and test
    due: Iterator[bool] = field(init=False, repr=False)
    explored_s: float = 0.0  # time spent in exploration calls (this rank, then MAX over ranks)
    explored_calls: int = 0
    calls: int = 0
    reexplored: int = 0      # times the candidates were explored again (`done`)

    def __post_init__(self) -> None:
        self._rate(0.0)
        if self.seed:
            self.winner, self.tuned = self.seed["winner"], dict(self.seed["tuned"])
            self._settled()
        else:
            self._explore()

    def _explore(self) -> None:
        """Stage 0 from the start: every candidate 1 + STAGE0 times, the first call cold."""
        self.winner, self.stage, self.explored_calls, self.explored_s = None, 0, 0, 0.0
        self.schedule = [(c, r > 0) for c in self.candidates for r in range(1 + self.STAGE0)]
        self.times = {c: [] for c in self.candidates}

    def pick(self) -> dict:
        """The algorithm for the next call of the bucket, and whether to time it."""
        self.calls += 1
        if self.winner is None:   # the next exploration step not yet done (a call that failed is retried)
            name, _ = self.schedule[self.explored_calls]
            return {"algorithm": name, "timed": True, "tuner": self, "why": "online tuning: exploring",
                    "collective": self.key[0]}
        return {**self.choice(self.winner), "timed": next(self.due)}

    def choice(self, name: str) -> dict:
        """What `last_choice()` reports for a call the tuner settled."""
        return {"algorithm": name, "timed": False, "tuner": self, "tuned_s": self.tuned,
                "why": "online tuning: the fastest measured", "collective": self.key[0]}

    def done(self, t: Any, name: str, seconds: float) -> bool:
        """A timed call finished; returns True when the choice changed (plans go stale)."""
        if self.winner is None:
            return self._explored(t, name, seconds)
        self.samples.append(seconds)
        if len(self.samples) < self.CHECK:
            return False
        now = t.allreduce_max([statistics.median(self.samples)])[0]
        self.samples.clear()
        others = sorted((v, a) for a, v in self.tuned.items() if a != self.winner)
        if others and now > self.HYSTERESIS * others[0][0]:
            old = self.winner
            self.tuned[old], self.winner = now, others[0][1]
            self._settled()
            self._say(f"switch {old} -> {self.winner}: {old} now {now * 1e6:.1f} us, "
                      f"{self.winner} tuned {others[0][0] * 1e6:.1f} us")
            return True
        if now > self.REEXPLORE * self.tuned[self.winner] and self.reexplored < self.REEXPLORES and \
                len(self.candidates) > 1:
            self.reexplored, self.seed = self.reexplored + 1, None
            self._say(f"explore again: {self.winner} now {now * 1e6:.1f} us, tuned "
                      f"{self.tuned[self.winner] * 1e6:.1f} us")
            self._explore()
            return True
        self._rate(now)   # from the winner's time in steady state (the exploration's lone calls run cold)
        return False

    def _explored(self, t: Any, name: str, seconds: float) -> bool:
        self.explored_s += seconds
        if self.stage == 0 or self.schedule[self.explored_calls][1]:
            self.times[name].append(seconds)
        self.explored_calls += 1
        if self.explored_calls < len(self.schedule):
            return False
        live = [c for c in self.candidates if self.times.get(c)]
        # (stage 0: the fastest of a candidate's calls, the first one cold: one timed call
        # that a preemption stretched 5x kept the fastest algorithm out of stage 1)
        score = min if self.stage == 0 else _but_the_slowest
        every = t.allreduce_max([score(self.times[c]) for c in live])
        self.tuned.update(zip(live, every))
        if self.stage == 0:
            best = min(every)
            ours = sorted((c for c in live if c != "mpi"), key=self.tuned.get)[:self.OURS1]
            keep = [c for c in live if self.tuned[c] <= self.PRUNE0 * best or c == "mpi" or c in ours]
            if len(keep) > 1:  # stage 1: the close ones again, a settling call then timed ones
                self.stage = 1
                self.times = {c: [] for c in keep}
                self.schedule += [(c, r > 0) for c in keep for r in range(1 + self.STAGE1)]
                return False
        self._decide(t)
        return True

    def _decide(self, t: Any) -> None:
        self.winner = min(self.tuned, key=self.tuned.get)
        self.explored_s = t.allreduce_max([self.explored_s])[0]
        self.schedule = []
        self._settled()
        self._say(f"chose {self.winner} after {self.explored_calls} calls (exploration cost "
                  f"{self.exploration_cost * 1e3:.3f} ms over the winner): " +
                  " ".join(f"{a}={v * 1e6:.1f}us" for a, v in sorted(self.tuned.items(), key=lambda kv: kv[1])))

    def _settled(self) -> None:
        """A winner is set: the monitoring rate from its time."""
        self._rate(self.tuned.get(self.winner) or 0.0)

    def _rate(self, seconds: float) -> None:
        """One call in `sample` timed, for calls of `seconds` each (the same on every rank:
        the tuned and monitored times are MAX over ranks, a seed comes from rank 0's profile).
        A call timed alone while exploring runs cold (several times a call in a loop:
        benchmarks/README.md, "Figures behind constants in the code"); the monitored
        median corrects the rate at every check."""
        want = self.SAMPLE_COST / (self.SHARE * seconds) if seconds > 0 else self.SAMPLE_MAX
        self.sample = round(min(self.SAMPLE_MAX, max(self.SAMPLE_MIN, want)))
        self.due = itertools.cycle((False,) * (self.sample - 1) + (True,))

    def _say(self, text: str) -> None:
        if self.verbose:
            c, dt, op, bucket = self.key[:4]
            log(f"auto {c} {dt} {op or ''} {1 << max(bucket - 1, 0)}-{(1 << bucket) - 1} B: {text}", "INFO")

    @property
    def exploration_cost(self) -> float | None:
        """Seconds the exploration calls took beyond what the winner alone would have taken."""
        if self.winner is None or self.seed:
            return None
        return self.explored_s - self.explored_calls * self.tuned[self.winner]


def learned(t: Any) -> dict:
    """What this communicator's online tuning settled on, in `Profile.learned` form."""
    return {"/".join(map(str, k[:4])): {"winner": tu.winner, "tuned": tu.tuned}
            for k, tu in t.tuners.items() if tu.winner is not None and not k[4]}


def save_learned(t: Any, path: str | Path | None = None) -> Path | None:
    """Merge what was learned into the profile file (rank 0 writes; returns the path there),
    so that the next run starts tuned."""
    table = learned(t)
    if t.rank != 0:
        return None
    dest = Path(path) if path else profile_path(t.size)
    prof = Profile.load(dest) if dest.exists() else Profile(**{**vars(DEFAULT), "name": "learned online",
                                                                "world_size": t.size})
    prof.learned = {**prof.learned, **table}
    prof.save(dest)
    return dest
