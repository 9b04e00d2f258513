"""The transport interface: what an algorithm body may do, and nothing more.

Two implementations: `ringmpi.mpicomm.MPITransport` (real MPI processes) and
`ringmpi.sim.VirtualRank` (a rank of the in-process virtual cluster). A schedule receives
one of them as `t` and touches memory and the wire only through it:

- `sendrecv(send, dest, recv, source)`: one round (MPI_Sendrecv; a side that is None is
  MPI_PROC_NULL); `exchange(sends, recvs)`: many messages posted at once, then one wait;
- `empty(n, dtype)`: scratch memory (pooled); `copy(src, dst)`, `combine(op, a, b, out)`
  and `scale(buf, divisor)`: local copies, reductions and the AVG op's division, counted
  and run by the array backend, which is where a device backend plugs in;
- `native(call)`: the MPI library's own collective for the call (the simulator runs a
  stand-in algorithm named by the collective's spec).

`Group` adds what the layer above the schedules needs from a communicator (objects across
ranks, barriers, the clock, abort, and the per-communicator state: profile, caches).
This module is a leaf: it imports nothing from ringmpi and never touches mpi4py.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

__all__ = ["Counters", "Transport", "Group", "IN_PLACE", "LRU", "PLANS", "LAST", "GENERATION", "forget_plans"]

#: The fast-path plan cache (`ringmpi.api`): a validated call shape -> a callable that serves
#: the next identical calls. Emptied (`forget_plans`) whenever what a plan assumed changes:
#: the settings, a communicator's profile, an online-tuning decision, a freed communicator.
PLANS: dict = {}
#: Per public function, the last call's (weakref to sendbuf, recvbuf: None, True for the
#: send buffer or a weakref, op, comm, algorithm, plan): the fast path's first look, by
#: identity, before any hashing (`ringmpi.allreduce` in a training loop calls it with the
#: same buffers every step).
LAST: dict = {}
#: bumped by forget_plans: a cache that holds plans elsewhere (ringmpi.Comm) checks it
GENERATION = [0]


def forget_plans() -> None:
    """Drop every plan (settings, profile or tuner decision changed; a communicator freed)."""
    GENERATION[0] += 1
    PLANS.clear()
    for memo in LAST.values():
        memo[5] = None


class _InPlace:
    """Stands for MPI_IN_PLACE in `Group.library` calls (translated by the MPI transport)."""

    def __repr__(self) -> str:
        return "IN_PLACE"


IN_PLACE = _InPlace()


@dataclass
class Counters:
    """What this rank did through ringmpi: messages and bytes put on the wire, transport
    calls, and local bytes copied and reduced by the array backend."""
    messages: int = 0
    bytes_sent: int = 0
    calls: int = 0
    bytes_copied: int = 0
    bytes_reduced: int = 0

    def snapshot(self) -> "Counters":
        return Counters(self.messages, self.bytes_sent, self.calls, self.bytes_copied, self.bytes_reduced)

    def since(self, before: "Counters") -> "Counters":
        return Counters(self.messages - before.messages, self.bytes_sent - before.bytes_sent,
                        self.calls - before.calls, self.bytes_copied - before.bytes_copied,
                        self.bytes_reduced - before.bytes_reduced)


@runtime_checkable
class Transport(Protocol):
    """What a schedule body `body(t, call)` may use."""
    rank: int
    size: int
    counters: Counters

    def sendrecv(self, sendbuf: Any, dest: int | None, recvbuf: Any, source: int | None) -> None: ...
    def exchange(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None: ...
    def empty(self, n: int, dtype: Any) -> Any: ...
    def copy(self, src: Any, dst: Any) -> None: ...
    def combine(self, op: str, a: Any, b: Any, out: Any) -> None: ...
    def scale(self, buf: Any, divisor: int) -> None: ...
    def native(self, call: Any) -> None: ...


@runtime_checkable
class Group(Transport, Protocol):
    """A transport over a real communicator, as the API, auto and the harnesses use it."""
    def begin(self, name: str) -> int: ...
    def describe(self, label: str) -> None: ...
    def end(self) -> None: ...
    def op_name(self, op: Any) -> str: ...
    def library(self, function: str, *args: Any) -> Any: ...
    def barrier(self) -> None: ...
    def wtime(self) -> float: ...
    def bcast_obj(self, obj: Any, root: int = 0) -> Any: ...
    def allgather_obj(self, obj: Any) -> list: ...
    def allreduce_max(self, values: list) -> list: ...
    def direct(self, function: str, op: str | None = None) -> tuple: ...
    def abort(self, code: int = 1) -> None: ...


class LRU(OrderedDict):
    """A dict that keeps its `maxsize` most recently used entries (per-communicator caches)."""

    def __init__(self, maxsize: int = 256) -> None:
        super().__init__()
        self.maxsize = maxsize

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def put(self, key: Any, value: Any) -> Any:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)
        return value
