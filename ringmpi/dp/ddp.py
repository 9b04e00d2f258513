"""The three parts of data parallelism: partition, average gradients, train step."""
from __future__ import annotations

import bisect
import contextlib
import copy
import inspect
import itertools
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .. import collectives as api
from ..api import group, overlaps
from .arrays import module_of, to_host, views_of
from .checkpoint import Snapshot, newest, write
from .hooks import GradBucket

__all__ = ["partition_indices", "DataParallel", "BucketPlan", "CAPS_MB", "state_arrays", "restore", "save_checkpoint", "load_checkpoint"]


def _row_count(a: Any) -> int:
    """How many rows `a` has (its first axis; a 0-d array has one)."""
    return a.shape[0] if a.ndim else 1


def _restore(state: Any, saved: Any) -> None:
    """Put a hook's state back as `saved` (a deep copy of it) in place: its owner holds it."""
    if isinstance(state, dict):
        state.clear()
        state.update(saved)
    elif hasattr(state, "__dict__"):
        vars(state).update(vars(saved))


def partition_indices(size: int, world_size: int, rank: int, seed: int) -> list[int]:
    """This rank's share of range(size): shuffled by a local random.Random(seed) (never the
    global state), split by quotient and remainder (the first size % world_size ranks get
    one more), so every rank computes the same split without communicating and no sample is
    dropped or duplicated."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"partition_indices: rank {rank} is not in [0, {world_size})")
    order = list(range(size))
    random.Random(seed).shuffle(order)
    q, r = divmod(size, world_size)
    start = rank * q + min(rank, r)
    return order[start:start + q + (rank < r)]


@dataclass(frozen=True)
class _Piece:
    """Rows [start, stop) of parameter `name` (a 0-d parameter has one row)."""
    name: str
    start: int
    stop: int


@dataclass(eq=False)
class _Bucket:
    """Gradients all-reduced together: elements [lo, hi) of the gradient buffer (`flat`, a
    view of `DataParallel.flat`), which hold these parameters' rows (`pieces`); how many of
    its elements are not final yet in this backward (`waiting`), and its all-reduce in
    flight (`request`)."""
    lo: int
    hi: int
    flat: Any
    pieces: list[_Piece]
    names: list[str]                 # what a hook is told it holds: "W0", or "W0[0:256]" for a piece
    shapes: list[tuple[int, ...]]
    waiting: int = 0
    request: Any = None


TIE = 0.02   # `tune_buckets`: caps whose step is within 2% of the fastest count as the fastest
CAPS_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 25.0)   # the bucket caps `tune_buckets` weighs


@dataclass(eq=False)
class BucketPlan:
    """What `DataParallel.tune_buckets` measured (the backward's duration, the all-reduce's
    a + b n, and the step with the caps predicted fastest) and predicted (the step for each
    cap, in MB), and the cap it chose."""
    backward: float
    alpha: float
    beta: float
    predicted: dict[float, float] = field(default_factory=dict)
    measured: dict[float, float] = field(default_factory=dict)
    cap_mb: float = 25.0

    def describe(self) -> str:
        ms = lambda d: ", ".join(f"{c:g} MB {v * 1e3:.1f}" for c, v in d.items())   # noqa: E731
        return (f"bucket cap {self.cap_mb:g} MB: step {self.measured[self.cap_mb] * 1e3:.1f} ms measured "
                f"(caps {ms(self.measured)} ms); predicted from backward {self.backward * 1e3:.1f} ms and "
                f"all-reduce {self.alpha * 1e6:.0f} us + {self.beta * 1e9:.2f} ns/B: {ms(self.predicted)} ms")


class DataParallel:
    """Replicas of `model` kept identical: broadcast at construction, averaged gradients after.

    model: has `params` (dict name -> array) and `loss_and_grads(batch) -> (loss_sum,
    grads, count)`, where grads may lack a parameter that got no gradient; with an
    `on_grad` parameter (`models.MLP`) it reports each gradient as it is final
    (`on_grad(name, grad)`), and with a `cuts` parameter in the pieces of rows that the
    buckets cut it into (`on_grad(name, rows, first_row)`).
    weighting="global": SUM the gradient sums and divide by the global count (right for
    uneven shards); "mean": average the per-rank means (the pitfall, kept to show it).

    overlap: each bucket's all-reduce starts as a request the moment its last gradient is
    final, in bucket order (the same on every rank, as MPI needs; DDP's rule too), while
    backward goes on with the earlier layers; everything is waited for before the step. The
    last bucket, final only when backward ends, is a blocking call then (`_start_ready`):
    with one bucket, overlapped training is blocking training.
    None (the default) overlaps where it can hide anything (`ringmpi.api.overlaps`: several
    hosts, or a core to spare for the progress thread) and MPI lets a thread progress it;
    every rank takes the same choice. Where every core computes, the transfer is the CPU's
    memory copies, which a progress thread would take from the computation: blocking there.
    Overlapped and blocking training give the same bits: the same buckets, packed the same
    way, reduced by the same schedule (with a fixed algorithm: `auto` may choose
    differently for requests).
    """

    def __init__(self, model: Any, comm: Any = None, *, algorithm: str = "auto",
                 bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0, weighting: str = "global",
                 find_unused_parameters: bool = False, overlap: bool | None = None,
                 comm_hook: Callable[[Any, GradBucket], Any] | None = None, hook_state: Any = None) -> None:
        if weighting not in ("global", "mean"):
            raise ValueError(f"DataParallel: weighting must be 'global' or 'mean', got {weighting!r}")
        self.model, self.comm, self.algorithm = model, comm, algorithm
        self.weighting, self.find_unused = weighting, find_unused_parameters
        self.params: dict[str, np.ndarray] = model.params
        self.t = group(comm)
        for p in self.params.values():  # every replica starts from rank 0's parameters
            api.broadcast(p, 0, comm=comm, algorithm="auto")
        # one persistent buffer per bucket, in the host's shared memory when every rank is on
        # one host (the shared-memory all-reduce then sends and fills it without a copy, as
        # NCCL does with registered buffers), else a plain array
        # (on a GPU: device buffers, all-reduced on the device, staged or CUDA-aware)
        self.xp = module_of(next(iter(self.params.values()))) if self.params else np
        self.hook, self.hook_state = comm_hook, hook_state
        self._bucketize(bucket_cap_mb, first_bucket_mb)
        want = (overlaps(comm) and self.t.wire) if overlap is None else overlap
        # (a choice every rank must share: the order of the collectives depends on it)
        self.overlap = bool(self.t.size > 1 and weighting == "global"
                            and api.allreduce(np.array([float(want)]), op="min", comm=comm, algorithm="auto")[0])
        takes = inspect.signature(model.loss_and_grads).parameters
        self.streams, self.takes_cuts = "on_grad" in takes, "cuts" in takes
        self.allreduce_calls = 0
        self._sync = True
        self._optimizer = None           # during `step`: updates each parameter as its last bucket is done
        self._next = len(self.buckets)   # the next bucket to start (all started: none in flight)
        self.zero_grad()

    def _bucketize(self, cap_mb: float, first_mb: float) -> None:
        """One gradient buffer for every parameter (`flat`, of their common dtype), laid out
        in reverse order, the order their gradients are final in; each bucket is a run of it
        (`_make_buckets`). Where a bucket boundary falls inside a parameter, the model is asked
        to report its gradient in those pieces (`cuts`: the rows where each is cut)."""
        one_host = self.t.size > 1 and len(set(self.t.nodes)) == 1 and self.xp is np
        order = list(reversed(list(self.params)))
        n = sum(self.params[k].size for k in order)
        dt = np.result_type(*(v.dtype for v in self.params.values())) if self.params else np.dtype(np.float64)
        self.flat = api.shared_empty(n, dt, comm=self.comm) if one_host and n else self.xp.empty(n, dt)
        self.slot = dict(zip(order, views_of(self.flat, [self.params[k].shape for k in order])))
        self.offset = dict(zip(order, itertools.accumulate((self.params[k].size for k in order[:-1]), initial=0)))
        self.buckets, self.cuts = [], {}
        for pieces in self._make_buckets(cap_mb * 1e6, first_mb * 1e6):
            lo, hi = self._span(pieces)
            shapes = [(p.stop - p.start,) + self.params[p.name].shape[1:] if self.params[p.name].ndim else ()
                      for p in pieces]
            names = [p.name if p.stop - p.start == _row_count(self.params[p.name]) else f"{p.name}[{p.start}:{p.stop}]"
                     for p in pieces]
            self.buckets.append(_Bucket(lo, hi, self.flat[lo:hi], pieces, names, shapes))
            if pieces[0].start:
                self.cuts.setdefault(pieces[0].name, []).append(pieces[0].start)
        self.starts = [b.lo for b in self.buckets]
        last = {p.name: i for i, b in enumerate(self.buckets) for p in b.pieces}
        self.completes = [[k for k in order if last[k] == i] for i in range(len(self.buckets))]
        # gradients accumulate straight into their bucket (DDP's gradient_as_bucket_view):
        # no copy into the bucket before its all-reduce, no fresh zeroed arrays each step
        # (`zero_grad` zeroes the buffer); a parameter of another dtype than the buffer
        # keeps an array of its own, copied in (`_pack`)
        self.views = {k: v for k, v in self.slot.items() if self.params[k].dtype == dt}
        self.bucket_cap_mb, self.first_bucket_mb = cap_mb, first_mb

    def _elements(self, name: str, start: int, stop: int) -> tuple[int, int]:
        """Where rows [start, stop) of parameter `name` lie in `flat`."""
        per_row = int(np.prod(self.params[name].shape[1:], dtype=np.int64))
        at = self.offset[name]
        return at + start * per_row, at + stop * per_row

    def _span(self, pieces: list[_Piece]) -> tuple[int, int]:
        """Where a bucket of these consecutive pieces lies in `flat`."""
        first, last = pieces[0], pieces[-1]
        return self._elements(first.name, first.start, first.stop)[0], self._elements(last.name, last.start, last.stop)[1]

    def tune_buckets(self, batch, caps_mb: tuple[float, ...] = CAPS_MB, measure: int | None = None) -> BucketPlan:
        """Choose the byte cap from this model and this link: larger buckets pay the
        all-reduce's fixed cost fewer times, smaller ones start earlier. Measured: when each
        gradient (or piece of one) is final in one backward on `batch`, and the all-reduce's
        time at two sizes (a + b n); predicted, for every cap: the overlapped timeline (a
        bucket starts when its last rows are final, rows of a gradient computed in one piece
        taken as final evenly over its computation, and the one before it is done), the
        slowest rank's; then the caps are timed as steps, in the order of the prediction
        (the first `measure` of them; None: every cap that gives other buckets than those
        before it), backward and average, the hook's state restored after, and the buckets
        are rebuilt with the cap the model predicts fastest among those timed within `TIE` of
        the fastest (a step's time varies by a few percent from one to the next: the timing
        cannot tell them apart; the model, which counts each call's fixed cost, can)."""
        plan = self._predict(batch, caps_mb)
        # the model leaves out what a hook does to each bucket (a cast, PowerSGD's two
        # all-reduces and products) and what the transfers take from the computation beside
        # them: the caps it predicts fastest are timed as steps, and the fastest kept
        shortlist, layouts = [], set()
        for cap in sorted(plan.predicted, key=lambda c: (plan.predicted[c], -c)):
            layout = tuple(map(tuple, self._make_buckets(cap * 1e6, self.first_bucket_mb * 1e6)))
            if layout not in layouts and len(shortlist) < (measure or len(caps_mb)):
                shortlist.append(cap)       # (caps that give the same buckets are timed once)
                layouts.add(layout)
        plan.measured = self._time_caps(batch, shortlist)
        fastest = min(plan.measured.values())
        plan.cap_mb = min((c for c, v in plan.measured.items() if v <= fastest * (1 + TIE)),
                          key=lambda c: (plan.predicted[c], -c))
        self._bucketize(plan.cap_mb, self.first_bucket_mb)
        self.zero_grad()
        return plan

    def _predict(self, batch, caps_mb: tuple[float, ...]) -> BucketPlan:
        """`tune_buckets`' model: one backward on `batch` timed gradient by gradient (piece by
        piece), the all-reduce's a + b n, and each cap's overlapped step predicted from them
        (the slowest rank's)."""
        reports: list[tuple[str, int, int, float]] = []    # parameter, first row, rows, when final
        self._loss_and_grads(batch)   # (a first backward runs 1.5-2x slower: its arrays' pages are new)
        begun = time.perf_counter()

        def on_grad(name: str, g, row: int = 0) -> None:
            reports.append((name, row, _row_count(self.params[name] if g is None else g), time.perf_counter() - begun))
        self._loss_and_grads(batch, on_grad)
        end = time.perf_counter() - begun
        spans: dict[str, list[tuple[int, int, float, float]]] = {}
        before = reports[0][3] if reports else end
        for name, row, n, when in reports:
            spans.setdefault(name, []).append((row, n, before, when))
            before = when

        def ready(p: _Piece) -> float:
            for row, n, t0, t1 in spans.get(p.name, ()):
                if row < p.stop <= row + n:
                    return t0 + (t1 - t0) * (p.stop - row) / n
            return end
        a, b = self._link()
        item = self.flat.dtype.itemsize
        mine = [end]
        for cap in caps_mb:
            t_end = 0.0
            for pieces in self._make_buckets(cap * 1e6, self.first_bucket_mb * 1e6):
                lo, hi = self._span(pieces)
                t_end = max(t_end, max(ready(p) for p in pieces)) + a + b * (hi - lo) * item
            mine.append(max(end, t_end))
        slowest = api.allreduce(np.array(mine), op="max", comm=self.comm, algorithm="auto")
        return BucketPlan(backward=float(slowest[0]), alpha=a, beta=b,
                          predicted={c: float(v) for c, v in zip(caps_mb, slowest[1:])})

    def _time_caps(self, batch, caps_mb: list[float]) -> dict[float, float]:
        """Each cap's overlapped step on `batch` (backward and average; the fastest of the
        last three of four, the slowest rank's), the hook's state as it was after."""
        saved = copy.deepcopy(self.hook_state)
        mine = []
        for cap in caps_mb:
            self._bucketize(cap, self.first_bucket_mb)
            runs = []
            for _ in range(4):      # (the fastest of the last three: this cap's step, not the VM's noise)
                self.zero_grad()
                self.t.barrier()
                t0 = time.perf_counter()
                self.backward(batch)
                runs.append(time.perf_counter() - t0)
            mine.append(min(runs[1:]))
        _restore(self.hook_state, saved)
        slowest = api.allreduce(np.array(mine), op="max", comm=self.comm, algorithm="auto")
        return {c: float(v) for c, v in zip(caps_mb, slowest)}

    def _link(self, small: int = 1 << 18, large: int = 1 << 22, reps: int = 5) -> tuple[float, float]:
        """(a, b): this communicator's all-reduce of n bytes takes a + b n seconds, from
        the medians of `reps` calls at two sizes, made as the buckets' are (requests where
        they overlap); the same on every rank (rank 0's). The smaller size is a bucket's,
        not a latency probe's: a shaped link lets a burst of tens of KB through at once,
        which gave a = 0 and a tuner that chose the smallest buckets (benchmarks/README.md)."""
        dt = self.flat.dtype
        times = []
        for n in (small, large):
            x = self.xp.zeros(max(1, n // dt.itemsize), dt)
            runs = []
            for _ in range(reps + 1):
                self.t.barrier()
                t0 = time.perf_counter()
                if self.overlap:
                    api.iallreduce(x, x, comm=self.comm, algorithm=self.algorithm).wait()
                else:
                    api.allreduce(x, x, comm=self.comm, algorithm=self.algorithm)
                runs.append(time.perf_counter() - t0)
            times.append(float(np.median(runs[1:])))
        b = max(0.0, (times[1] - times[0]) / (large - small))
        a = max(0.0, times[0] - b * small)
        return self.t.bcast_obj((a, b), 0)

    def register_comm_hook(self, state: Any, hook: Callable[[Any, GradBucket], Any] | None) -> None:
        """How each bucket is all-reduced (`ringmpi.dp.hooks`; None: a plain SUM). A hook
        that works on each parameter as a whole (`whole_parameters = True` on the function:
        PowerSGD's rank-r factors of each matrix) gets buckets that cut none."""
        before = self._whole
        self.hook, self.hook_state = hook, state
        if self._whole != before:
            self._bucketize(self.bucket_cap_mb, self.first_bucket_mb)
            self.zero_grad()

    @property
    def _whole(self) -> bool:
        return bool(getattr(self.hook, "whole_parameters", False))

    def _communicate(self, index: int, b: _Bucket, blocking: bool) -> Any:
        """Start bucket `index`'s all-reduce (a request, or a hook's future), or run it now,
        its gradients packed into it first."""
        self._pack(b)
        self.allreduce_calls += 1
        if self.hook is None:
            if blocking:
                return api.allreduce(b.flat, b.flat, comm=self.comm, algorithm=self.algorithm)
            return api.iallreduce(b.flat, b.flat, comm=self.comm, algorithm=self.algorithm)
        future = self.hook(self.hook_state, GradBucket(index, b.flat, b.names, b.shapes, self.comm, self.algorithm))
        return future.wait() if blocking else future

    def _make_buckets(self, cap: float, first: float) -> list[list[_Piece]]:
        """Reverse parameter order (gradients of the last layers are final first), a byte cap
        (the first bucket's `first`: the wire starts as early as it can); a parameter larger
        than the cap is cut into runs of rows of near-equal size under it, so that a layer's
        gradient travels in pieces as backward computes them (DDP keeps a parameter whole, and
        a large last layer's all-reduce then waits for the whole of it). Its last piece ends
        its bucket: the next parameter's gradient is final only after the layer's input
        gradient is computed, and the piece would wait for it. A hook that works on whole
        parameters (`register_comm_hook`) gets none cut: one over the cap is a bucket of
        its own, as in DDP."""
        buckets, cur, size = [], [], 0.0
        limit = min(first, cap)
        for name in reversed(list(self.params)):
            p = self.params[name]
            rows = _row_count(p)
            parts = 1
            if not self._whole:   # (a zero cap: a row a bucket)
                parts = max(1, min(rows, math.ceil(p.nbytes / cap)) if cap > 0 else rows)
            for i in range(parts):
                start, stop = rows * i // parts, rows * (i + 1) // parts
                nb = p.nbytes * (stop - start) / rows if rows else 0.0
                if cur and size + nb > limit:
                    buckets.append(cur)
                    cur, size, limit = [], 0.0, cap
                cur.append(_Piece(name, start, stop))
                size += nb
            if parts > 1:
                buckets.append(cur)
                cur, size, limit = [], 0.0, cap
        if cur:
            buckets.append(cur)
        return buckets

    def zero_grad(self) -> None:
        self.flat[...] = 0
        self.grads = {k: self.views[k] if k in self.views else self.xp.zeros_like(v) for k, v in self.params.items()}
        self.seen = {k: False for k in self.params}
        self.loss_sum, self.count = 0.0, 0

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the backward after the block all-reduces them all."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def backward(self, batch) -> None:
        """Forward + backward on this rank's batch; synchronises unless inside no_sync()
        (overlapped: the buckets start during backward, `average_gradients` waits)."""
        streaming = self._sync and self.overlap
        reported: set[str] = set()
        if streaming:
            for b in self.buckets:
                b.waiting = b.hi - b.lo
            self._next = 0

            def on_grad(name: str, g, row: int = 0) -> None:
                n = self._accumulate(name, g, row)
                reported.add(name)
                self._final(name, row, row + n)
                self._start_ready()
            loss, grads, count = self._loss_and_grads(batch, on_grad)
        else:
            loss, grads, count = self._loss_and_grads(batch)
        if self.weighting == "mean" and count:
            grads = {k: g / count for k, g in grads.items()}
        for k, g in grads.items():
            if k not in reported:
                self._accumulate(k, g)
        self.loss_sum += loss
        self.count += count
        if streaming:   # the rest (and gradients this rank never got: zeros), in order
            for b in self.buckets:
                b.waiting = 0
            self._start_ready()
        if self._sync:
            self.average_gradients()

    def _loss_and_grads(self, batch, on_grad: Callable[..., None] | None = None) -> tuple:
        """The model's forward and backward, told where the buckets cut its gradients and,
        if it can report them as they are final, given `on_grad`."""
        kw: dict[str, Any] = {"cuts": self.cuts} if self.takes_cuts else {}
        if on_grad is not None and self.streams:
            kw["on_grad"] = on_grad
        return self.model.loss_and_grads(batch, **kw)

    def _accumulate(self, name: str, g, row: int = 0) -> int:
        """Add `g`: rows [row, row + len(g)) of parameter `name`'s gradient (the whole of it
        by default; None: it has none); how many rows that reports final."""
        if g is None:
            return _row_count(self.params[name])
        grad = self.grads[name]
        if row or g.shape != grad.shape:
            grad = grad[row:row + g.shape[0]]
        grad += g
        self.seen[name] = True
        return _row_count(g)

    def _final(self, name: str, start: int, stop: int) -> None:
        """Rows [start, stop) of `name`'s gradient are final: the buckets holding them wait
        for that many fewer elements."""
        lo, hi = self._elements(name, start, stop)
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        while i < len(self.buckets) and self.buckets[i].lo < hi:
            b = self.buckets[i]
            b.waiting -= max(0, min(hi, b.hi) - max(lo, b.lo))
            i += 1

    def _start_ready(self) -> None:
        """Start the buckets whose gradients are all final, in bucket order, but the last:
        its gradients (the first layers') are final only when backward ends, so nothing is
        left to hide it behind, and `average_gradients` begins it, as a request behind the
        others in flight, or where none is, by a blocking call, which costs less than a
        request (shared memory's zero-copy algorithms on one host; over TCP a request cost
        1.2-1.4x the blocking call). The same bucket on every rank: the ranks' calls stay in
        one order."""
        while self._next < len(self.buckets) - 1 and self.buckets[self._next].waiting <= 0:
            b = self.buckets[self._next]
            b.request = self._communicate(self._next, b, blocking=False)
            self._next += 1

    def _pack(self, b: _Bucket) -> None:
        """The bucket's part of the buffer holds its gradients: those not in it already
        (`views`) are copied in."""
        for p in b.pieces:
            if p.name not in self.views:
                dst, src = self.slot[p.name], self.grads[p.name]
                if dst.ndim:
                    dst, src = dst[p.start:p.stop], src[p.start:p.stop]
                dst[...] = src

    def average_gradients(self) -> float:
        """One all-reduce per bucket (SUM; begun during backward when overlapped), then
        divide; returns the global mean loss."""
        p = self.t.size
        names = list(self.params)
        if self.hook is not None or any(b.request is not None for b in self.buckets):
            # every bucket not begun, begun now, before the small all-reduce below: behind the
            # buckets in flight on the wire, it would hold back the start of the last one by
            # the time they take (a bucket's time on a 1 Gbit/s link each step), and a hook's
            # casts and products run while the earlier buckets travel
            for i, b in enumerate(self.buckets):
                if b.request is None:
                    b.request = self._communicate(i, b, blocking=False)
        # loss, count and which parameters got a gradient travel in one small all-reduce, so
        # every rank takes the same decision (a rank raising alone would hang the others)
        head = np.array([self.loss_sum, float(self.count)] + [float(self.seen[k]) for k in names])
        head = api.allreduce(head, comm=self.comm, algorithm=self.algorithm)
        scalars, present = head[:2], head[2:]
        if not self.find_unused and np.any(present < p):
            for b in self.buckets:   # (every rank raises: nothing left in flight first)
                if b.request is not None:
                    b.request.wait()
                    b.request = None
            missing = [k for k, c in zip(names, present) if c < p]
            raise RuntimeError(f"DataParallel (rank {self.t.rank}): parameters {missing} got no gradient "
                               "on some ranks; pass find_unused_parameters=True if that is expected")
        scale = 1.0 / scalars[1] if self.weighting == "global" else 1.0 / p
        got = dict(zip(names, present))
        for i, b in enumerate(self.buckets):   # (begun during backward: waited for; the others: now)
            if b.request is not None:
                summed = b.request.wait()
            else:
                summed = self._communicate(i, b, blocking=True)
            b.request = None
            if summed is not b.flat:
                b.flat[...] = summed
            b.flat *= scale
            done = {}
            for k in self.completes[i]:   # the parameters whose last rows were in this bucket
                if got[k] == 0:    # no rank got a gradient for it
                    self.grads[k] = None
                else:
                    done[k] = self.grads[k] = self.views[k] if k in self.views else \
                        self.slot[k].astype(self.params[k].dtype)
            if self._optimizer is not None and done:   # (updated beside the buckets still in flight)
                self._optimizer.update(self.params, done)
        self.global_loss = scalars[0] / max(scalars[1], 1)
        return self.global_loss

    def step(self, optimizer, batch) -> float:
        """train_step: zero grads, forward and loss, backward, average, optimizer update. An
        optimizer that updates a few parameters at a time (`begin` and `update`: SGD, Adam)
        updates each parameter as soon as its last bucket is averaged, beside the
        all-reduces still in flight; the same bits as one update after them all."""
        self.zero_grad()
        stepwise = self._sync and hasattr(optimizer, "begin") and hasattr(optimizer, "update")
        if stepwise:
            optimizer.begin()
            self._optimizer = optimizer
        try:
            self.backward(batch)
        finally:
            self._optimizer = None
        if not stepwise:
            optimizer.step(self.params, {k: g for k, g in self.grads.items() if g is not None})
        return self.global_loss


def state_arrays(ddp: DataParallel, optimizer) -> dict[str, Any]:
    """Parameters as "param:NAME", optimizer state as "opt:NAME": what a checkpoint holds
    besides the step (the data order is a function of the seed and the step: see
    `ringmpi.dp.train.global_batch`, so the step is the data order's position)."""
    arrays = {f"param:{k}": v for k, v in ddp.params.items()}
    arrays.update({f"opt:{k}": v for k, v in optimizer.state.items()})
    return arrays


def restore(ddp: DataParallel, optimizer, snap: Snapshot) -> int:
    """Load `snap` into the replica and its optimizer; returns the step to resume at."""
    xp = ddp.xp
    for k in ddp.params:
        ddp.params[k][...] = xp.asarray(snap.arrays[f"param:{k}"])
    optimizer.load_state({k[4:]: v if k == "opt:t" else xp.asarray(v) for k, v in snap.arrays.items()
                          if k.startswith("opt:")})
    return snap.step


def save_checkpoint(directory: str | Path, ddp: DataParallel, optimizer, step: int, meta: dict | None = None) -> None:
    """Rank 0 writes parameters, optimizer state and the step into `directory`, atomically
    (`ringmpi.dp.checkpoint`); the others wait for it."""
    if ddp.t.rank == 0:
        write(directory, Snapshot(step, {k: to_host(v) for k, v in state_arrays(ddp, optimizer).items()},
                                  meta or {}))
    ddp.t.barrier()


def load_checkpoint(directory: str | Path, ddp: DataParallel, optimizer) -> int | None:
    """The newest checkpoint in `directory` that verifies, read by rank 0 and sent to every
    rank (no shared file system needed, and every replica gets the same bits); returns the
    step to resume at, or None where there is none."""
    found = newest(directory) if ddp.t.rank == 0 else None
    data = ddp.t.bcast_obj(found[1] if found else None, 0)
    return None if data is None else restore(ddp, optimizer, Snapshot.decode(data))
