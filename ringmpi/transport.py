"""The transport interface: what an algorithm body may do, and nothing more.

Two implementations: `ringmpi.mpicomm.MPITransport` (real MPI processes) and
`ringmpi.sim.VirtualRank` (a rank of the in-process virtual cluster). A schedule receives
one of them as `t` and touches memory and the wire only through it:

- `sendrecv(send, dest, recv, source)`: one round (MPI_Sendrecv; a side that is None is
  MPI_PROC_NULL); `exchange(sends, recvs)`: many messages posted at once, then one wait;
- `empty(n, dtype)`: scratch memory (pooled); `copy(src, dst)`, `combine(op, a, b, out)`
  and `scale(buf, divisor)`: local copies, reductions and the AVG op's division, counted
  and run by the array backend, which is where a device backend plugs in;
- `mpi(call)`: the MPI library's own collective for the call (the simulator runs a
  stand-in algorithm named by the collective's spec).

`Group` adds what the layer above the schedules needs from a communicator (objects across
ranks, barriers, the clock, abort, and the per-communicator state: profile, caches).
This module is a leaf: it imports nothing from ringmpi and never touches mpi4py.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol, Sequence, runtime_checkable

__all__ = ["Counters", "Memory", "Transport", "CountedMemory", "PrivateMemory", "Group", "IN_PLACE", "LRU", "MPIPlan", "ReceiveThenReduce", "SubGroup", "split_nodes"]

class _InPlace:
    """Stands for MPI_IN_PLACE in `Group.mpi_call` calls (translated by the MPI transport)."""

    def __repr__(self) -> str:
        return "IN_PLACE"


IN_PLACE = _InPlace()


class MPIPlan(NamedTuple):
    """MPI's own collective called with the user's arrays as they are (the API's fast
    path), as the MPI transport says it for one call shape (`Group.mpi_plan`):
    `function(send, recv[, op])`, a new result of `shape` (None: the send buffer's) and
    `dtype` where the caller passes none (`copy_in_place`: a copy of the send buffer,
    reduced in place); or, with `build`, `function(*args)` where
    `(args, result) = build(sendbuf, recvbuf)` (None: the call needs the full path)."""
    function: str
    op: str | None = None
    shape: tuple | None = None
    dtype: Any = None
    copy_in_place: bool = False
    build: Callable | None = None


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


class Memory(Protocol):
    """Allocate, copy, reduce into, scale: what both an array backend (`ringmpi.backend`)
    and a transport (counted, on its backend) offer."""

    def empty(self, n: int, dtype: Any) -> Any: ...
    def copy(self, src: Any, dst: Any) -> None: ...
    def combine(self, op: str, a: Any, b: Any, out: Any) -> None: ...
    def scale(self, buf: Any, divisor: int) -> None: ...


@runtime_checkable
class Transport(Memory, Protocol):
    """What a schedule body `body(t, call)` may use."""
    rank: int
    size: int
    counters: Counters
    #: the buffers are device memory (`ringmpi.device`): no host shared memory
    on_device: bool
    #: the body runs as a request (`ringmpi.requests`): each exchange suspends it, so an
    #: algorithm that waits by spinning cannot run
    nonblocking: bool

    def sendrecv(self, sendbuf: Any, dest: int | None, recvbuf: Any, source: int | None) -> None: ...
    def sendrecv_reduce(self, sendbuf: Any, dest: int, landing: Any, source: int, op: str, mine: Any,
                        out: Any) -> None: ...
    def landing(self, n: int, dtype: Any) -> Any: ...
    def exchange(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None: ...
    def mpi(self, call: Any) -> None: ...
    # the host's shared memory (schedules/shm.py): every rank's node, the shared-memory
    # transport of this group (one host only), scratch for a call, and whether a peer can
    # read a buffer where it is
    @property
    def nodes(self) -> list[int]: ...
    def shared(self) -> Any: ...
    def reserve(self, nbytes: int) -> None: ...
    def in_shared(self, buf: Any) -> bool: ...
    def reads_across(self, nbytes: int) -> bool: ...
    def split_nodes(self) -> tuple[Any, Any]: ...


@runtime_checkable
class Group(Transport, Protocol):
    """A transport over a real communicator, as the API, auto and the harnesses use it."""
    def begin(self, name: str) -> int: ...
    def describe(self, label: str) -> None: ...
    def end(self) -> None: ...
    def failed(self, err: BaseException, label: str | None = None, seq: int | None = None) -> BaseException: ...
    def request_view(self, label: str) -> Any: ...
    def waiting(self, label: str, seq: int) -> tuple: ...
    def waited(self, before: tuple) -> None: ...
    def wait_watched(self, request: Any, label: str, seq: int, status: Any = None) -> BaseException | None: ...
    def op_name(self, op: Any) -> str: ...
    def mpi_call(self, function: str, *args: Any) -> Any: ...
    def barrier(self) -> None: ...
    def wtime(self) -> float: ...
    def bcast_obj(self, obj: Any, root: int = 0) -> Any: ...
    def allgather_obj(self, obj: Any) -> list: ...
    def allreduce_max(self, values: list) -> list: ...
    def mpi_function(self, function: str, op: str | None = None, dtype: Any = None) -> tuple: ...
    def mpi_plan(self, call: Any, args: dict) -> MPIPlan | None: ...
    def mpi_serves(self, call: Any) -> bool: ...
    def abort(self, code: int = 1) -> None: ...


class ReceiveThenReduce:
    """The receive-and-reduce step of transports that must land a block before reducing
    it: sendrecv into `landing`, then out = landing op mine. (The shared-memory transport
    reads the block in the sender's memory and reduces it there, in one pass.)"""

    def sendrecv_reduce(self, sendbuf: Any, dest: int, landing: Any, source: int, op: str, mine: Any,
                        out: Any) -> None:
        self.sendrecv(sendbuf, dest, landing, source)  # type: ignore[attr-defined]
        self.combine(op, landing, mine, out)           # type: ignore[attr-defined]

    def landing(self, n: int, dtype: Any) -> Any:
        """Scratch for the blocks `sendrecv_reduce` receives (n elements at most)."""
        return self.empty(n, dtype)                    # type: ignore[attr-defined]


class CountedMemory:
    """Local work through the transport's array backend (`self.backend`), counted in
    `self.counters`: what the schedules' copies and reductions cost (the benchmark's and the
    simulator's byte counts)."""

    def copy(self, src: Any, dst: Any) -> None:
        self.counters.bytes_copied += dst.nbytes      # type: ignore[attr-defined]
        self.backend.copy(src, dst)                    # type: ignore[attr-defined]

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        self.counters.bytes_reduced += out.nbytes     # type: ignore[attr-defined]
        self.backend.combine(op, a, b, out)            # type: ignore[attr-defined]

    def scale(self, buf: Any, divisor: int) -> None:
        self.backend.scale(buf, divisor)               # type: ignore[attr-defined]


class PrivateMemory:
    """A transport whose buffers no peer maps (MPI, device): nothing to reserve in a shared
    arena, no buffer readable in place by peers."""

    def reserve(self, nbytes: int) -> None:
        pass

    def in_shared(self, buf: Any) -> bool:
        return False

    def reads_across(self, nbytes: int) -> bool:
        return False


class SubGroup(ReceiveThenReduce):
    """Some ranks of a transport as a group of their own, renumbered 0..k-1 in the order of
    `members` (parent ranks): the rings of a hierarchical schedule (the ranks of one node,
    or the ranks with the same place on every node) run the ring code unchanged on it. Its
    messages travel on the parent's transport, counted there."""

    def __init__(self, parent: Any, members: Sequence[int]) -> None:
        self.parent = parent
        self.members = list(members)
        self.rank = self.members.index(parent.rank)
        self.size = len(self.members)
        self.backend = parent.backend
        self.on_device, self.nonblocking = parent.on_device, parent.nonblocking

    @property
    def counters(self) -> Counters:
        return self.parent.counters

    def _to(self, q: int | None) -> int | None:
        return None if q is None else self.members[q]

    def sendrecv(self, sendbuf: Any, dest: int | None, recvbuf: Any, source: int | None) -> None:
        self.parent.sendrecv(sendbuf, self._to(dest), recvbuf, self._to(source))

    def exchange(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        self.parent.exchange([(b, self.members[d]) for b, d in sends], [(b, self.members[s]) for b, s in recvs])

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        self.parent.combine(op, a, b, out)

    def copy(self, src: Any, dst: Any) -> None:
        self.parent.copy(src, dst)

    def empty(self, n: int, dtype: Any) -> Any:
        return self.parent.empty(n, dtype)

    def scale(self, buf: Any, divisor: int) -> None:
        self.parent.scale(buf, divisor)

    def mpi(self, call: Any) -> None:
        raise NotImplementedError("a sub-group has no MPI library collective of its own")

    @property
    def nodes(self) -> list[int]:
        every = self.parent.nodes
        return [every[m] for m in self.members]

    def shared(self) -> Any:
        if len(set(self.nodes)) != 1:
            raise ValueError("shared memory needs every rank on one host")
        return self

    def split_nodes(self) -> tuple[Any, Any]:
        return split_nodes(self, self.nodes)

    def reserve(self, nbytes: int) -> None:
        self.parent.reserve(nbytes)

    def in_shared(self, buf: Any) -> bool:
        return self.parent.in_shared(buf)

    def reads_across(self, nbytes: int) -> bool:
        return self.parent.reads_across(nbytes)


def split_nodes(t: Any, nodes: Sequence[int]) -> tuple[SubGroup, SubGroup | None]:
    """The two groups of a hierarchical schedule for rank t.rank, given every rank's node:
    the ranks of its node, and the ranks at its place (index within their node) on every
    node, or None when its node is larger than the smallest one and that place has no
    counterpart everywhere."""
    hosts = list(dict.fromkeys(nodes))
    members = {h: [r for r, n in enumerate(nodes) if n == h] for h in hosts}
    mine = members[nodes[t.rank]]
    place = mine.index(t.rank)
    smallest = min(len(m) for m in members.values())
    cross = SubGroup(t, [members[h][place] for h in hosts]) if place < smallest else None
    return SubGroup(t, mine), cross


_ABSENT = object()


class LRU(OrderedDict):
    """A dict that keeps its `maxsize` most recently used entries (per-communicator caches),
    or with `refresh=False` its `maxsize` most recently made ones: where what is dropped must
    be the same on every rank (a tuner's state), and the lookups a rank makes depend on
    which of its calls the fast path served (it never looks up), which can differ."""

    def __init__(self, maxsize: int = 256, refresh: bool = True) -> None:
        super().__init__()
        self.maxsize, self.refresh = maxsize, refresh

    def get(self, key: Any, default: Any = None) -> Any:
        value = super().get(key, _ABSENT)
        if value is _ABSENT:
            return default
        if self.refresh:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> Any:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)
        return value
