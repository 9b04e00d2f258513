"""The transport seam: the only module that imports mpi4py.

`MPITransport` gives the algorithms what they need and nothing more: rank, size,
`sendrecv` (one MPI_Sendrecv; a side that is None is MPI_PROC_NULL), `exchange` (many
Isend/Irecv then one Waitall, for the root-centric fan-in and fan-out), `combine` and
`empty` (delegated to the array backend), and byte/message counters. The simulator in
`ringmpi.sim` implements the same interface, so one algorithm body serves both.

Messages travel on a private duplicate of the user's communicator (cached on it as an MPI
attribute, freed with it) so ringmpi's traffic can never match the user's own receives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .backend import NUMPY, ArrayBackend
from .ops import OPS

__all__ = ["MPI", "MPITransport", "Counters", "transport", "mpi_op", "normalize_op",
           "library_version", "world", "INT_MAX"]

INT_MAX = 2**31 - 1
_TAG = 7411

_MPI_OPS = {name: getattr(MPI, name) for name in OPS}
_OP_NAMES = {id(o): (o, n) for n, o in _MPI_OPS.items()}
_OP_NAMES.update({id(n): (n, n) for n in OPS})


def mpi_op(name: str) -> "MPI.Op":
    return _MPI_OPS[name]


def normalize_op(op: Any) -> str:
    """'SUM' for MPI.SUM, "sum" or "SUM"; a clear error for user-defined or unknown ops."""
    hit = _OP_NAMES.get(id(op))
    if hit is not None and hit[0] is op:  # the predefined op objects and the common strings
        return hit[1]
    if isinstance(op, MPI.Op):
        for name, mop in _MPI_OPS.items():
            if op == mop:
                return name
        raise ValueError("only MPI's predefined reduction ops are supported "
                         f"({', '.join(_MPI_OPS)}); got a user-defined MPI.Op")
    from .ops import op_name
    return op_name(op)


def library_version() -> str:
    # Open MPI's string ends in a NUL byte, which would make reports binary files
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def world() -> "MPI.Intracomm":
    return MPI.COMM_WORLD


@dataclass
class Counters:
    """What this rank put on the wire through ringmpi: messages, bytes, transport calls."""
    messages: int = 0
    bytes_sent: int = 0
    calls: int = 0

    def snapshot(self) -> "Counters":
        return Counters(self.messages, self.bytes_sent, self.calls)

    def since(self, before: "Counters") -> "Counters":
        return Counters(self.messages - before.messages, self.bytes_sent - before.bytes_sent,
                        self.calls - before.calls)


def _pieces(buf: np.ndarray | None, max_count: int) -> list[np.ndarray]:
    """Split a message longer than max_count elements (MPI counts are C ints)."""
    if buf is None:
        return []
    if buf.size <= max_count:
        return [buf]
    return [buf[i:i + max_count] for i in range(0, buf.size, max_count)]


_KEYVAL: int | None = None


def _private_dup(comm: "MPI.Intracomm") -> "MPI.Intracomm":
    """A duplicate of `comm` cached on it, freed by MPI when `comm` is freed."""
    global _KEYVAL
    if _KEYVAL is None:
        def _free(_comm, _key, dup):
            if dup != MPI.COMM_NULL and not MPI.Is_finalized():
                dup.Free()
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free)
    dup = comm.Get_attr(_KEYVAL)
    if dup is None:
        dup = comm.Dup()
        comm.Set_attr(_KEYVAL, dup)
    return dup


class MPITransport:
    """Point-to-point transport over one intracommunicator."""

    def __init__(self, comm: "MPI.Intracomm | None" = None, *, backend: ArrayBackend = NUMPY,
                 max_count: int = INT_MAX) -> None:
        user = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(user, MPI.Intracomm) or user == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py intracommunicator, got {user!r}")
        self.user_comm = user
        self.comm = _private_dup(user)
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.backend = backend
        self.max_count = max_count
        self.counters = Counters()
        self._pool: list[np.ndarray] = []
        self._cursor = 0

    # -- data movement -------------------------------------------------------------------
    def sendrecv(self, sendbuf: np.ndarray | None, dest: int | None,
                 recvbuf: np.ndarray | None, source: int | None) -> None:
        """One MPI_Sendrecv (split into several when a side exceeds max_count elements)."""
        self.counters.calls += 1
        if dest is None:
            sendbuf = None
        if source is None:
            recvbuf = None
        sp, rp = _pieces(sendbuf, self.max_count), _pieces(recvbuf, self.max_count)
        for i in range(max(len(sp), len(rp), 1)):
            s = sp[i] if i < len(sp) else None
            r = rp[i] if i < len(rp) else None
            self.comm.Sendrecv(s, MPI.PROC_NULL if s is None else dest, _TAG,
                               r, MPI.PROC_NULL if r is None else source, _TAG)
            if s is not None:
                self.counters.messages += 1
                self.counters.bytes_sent += s.nbytes

    def exchange(self, sends: Sequence[tuple[np.ndarray, int]],
                 recvs: Sequence[tuple[np.ndarray, int]]) -> None:
        """Post every receive and send at once, then wait for all (root fan-in / fan-out)."""
        self.counters.calls += 1
        reqs = []
        for buf, src in recvs:
            reqs += [self.comm.Irecv(p, src, _TAG) for p in _pieces(buf, self.max_count)]
        for buf, dest in sends:
            for p in _pieces(buf, self.max_count):
                reqs.append(self.comm.Isend(p, dest, _TAG))
                self.counters.messages += 1
                self.counters.bytes_sent += p.nbytes
        MPI.Request.Waitall(reqs)

    # -- local work ----------------------------------------------------------------------
    def begin(self) -> None:
        """Start of a collective call: scratch buffers are handed out afresh from the pool."""
        self._cursor = 0

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        """Scratch memory, kept between calls (like NCCL's preallocated buffers): a fresh
        multi-MiB allocation per call would pay its page faults every time."""
        dt = np.dtype(dtype)
        need = n * dt.itemsize
        i = self._cursor
        self._cursor += 1
        if i == len(self._pool):
            self._pool.append(self.backend.empty(0, np.uint8))
        if self._pool[i].nbytes < need:
            self._pool[i] = self.backend.empty(need, np.uint8)
        return self._pool[i][:need].view(dt)

    def release_scratch(self) -> None:
        """Give the scratch pool's memory back (it regrows on the next call)."""
        self._pool.clear()

    def combine(self, op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        self.backend.combine(op, a, b, out)

    # -- the MPI library's own collectives (the `mpi` algorithm and the reference) ---------
    def native_allreduce(self, sendbuf, recvbuf, op: str) -> None:
        self.comm.Allreduce(MPI.IN_PLACE if sendbuf is recvbuf else sendbuf, recvbuf, mpi_op(op))

    def native_reduce_scatter(self, sendbuf, recvbuf, counts: Sequence[int], op: str) -> None:
        # MPI's in-place form leaves the result at the front of the buffer, ours at block r.
        # (an empty block still carries the buffer's address, which MPICH rejects as aliased)
        alias = _aliases_block(sendbuf, recvbuf) or (recvbuf.size == 0 and sendbuf.size > 0)
        out = self.backend.empty(recvbuf.size, recvbuf.dtype) if alias else recvbuf
        self.comm.Reduce_scatter(sendbuf, out, list(counts), mpi_op(op))
        if out is not recvbuf:
            recvbuf[...] = out

    def native_allgather(self, sendbuf, recvbuf, counts: Sequence[int]) -> None:
        displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
        send = MPI.IN_PLACE if _aliases_block(sendbuf, recvbuf) else sendbuf
        self.comm.Allgatherv(send, [recvbuf, (list(counts), displs)])

    def native_broadcast(self, buf, root: int) -> None:
        self.comm.Bcast(buf, root)

    def native_reduce(self, sendbuf, recvbuf, op: str, root: int) -> None:
        if self.rank == root and sendbuf is recvbuf:
            self.comm.Reduce(MPI.IN_PLACE, recvbuf, mpi_op(op), root)
        else:
            self.comm.Reduce(sendbuf, recvbuf if self.rank == root else None, mpi_op(op), root)

    # -- helpers for harnesses (benchmark, calibration, trainer) --------------------------
    def abort(self, code: int = 1) -> None:
        """End every process of the job (MPI_Abort on the user's communicator)."""
        self.user_comm.Abort(code)

    def barrier(self) -> None:
        self.comm.Barrier()

    @staticmethod
    def wtime() -> float:
        return MPI.Wtime()

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root)

    def gather_obj(self, obj: Any, root: int = 0) -> Any:
        return self.comm.gather(obj, root)

    def allgather_obj(self, obj: Any) -> list:
        return self.comm.allgather(obj)

    def hostnames(self) -> list[str]:
        return self.comm.allgather(MPI.Get_processor_name())


def _aliases_block(sendbuf: np.ndarray, recvbuf: np.ndarray) -> bool:
    return sendbuf is recvbuf or (sendbuf.size > 0 and np.shares_memory(sendbuf, recvbuf))


_CACHE: dict = {}
_BY_OBJECT: dict[int, MPITransport] = {}


def transport(comm: "MPI.Intracomm | None" = None) -> MPITransport:
    """The cached transport of `comm` (COMM_WORLD when None)."""
    if comm is None:
        t = _CACHE.get("world")
        if t is None:
            t = _CACHE["world"] = transport(MPI.COMM_WORLD)
        return t
    t = _BY_OBJECT.get(id(comm))
    if t is not None and t.user_comm is comm and t.comm != MPI.COMM_NULL:
        return t
    user = comm
    if not isinstance(user, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(user).__name__}")
    key = user.py2f() if user != MPI.COMM_NULL else -1
    t = _CACHE.get(key)
    if t is None or t.user_comm != user or t.comm == MPI.COMM_NULL:
        t = _CACHE[key] = MPITransport(user)
    _BY_OBJECT[id(comm)] = t  # fast path for the next call with this very object
    return t
