"""The MPI transport: the only module that imports mpi4py.

`MPITransport` implements `ringmpi.transport.Group` over one intracommunicator: the data
plane the schedules use (`sendrecv`: one MPI_Sendrecv, a side that is None being
MPI_PROC_NULL; `exchange`: Isend/Irecv then one Waitall; `empty`/`copy`/`combine` through
the array backend and the scratch pool; `native`: the library's own collective), and the
per-communicator state the layers above keep on it (profile, choice cache, last choice,
the call in flight for the stall inspector).

Messages travel on a private duplicate of the user's communicator, so ringmpi's traffic can
never match the user's own receives, and every call uses its own tag (the call's sequence
number), so a message left over by a call that failed on one rank can never be matched by
the next call. The transport is stored on the user's communicator as an MPI attribute:
it lives exactly as long as the communicator and is freed with it.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from . import stall
from .backend import NUMPY, ArrayBackend, ScratchPool
from .ops import OPS, op_name
from .transport import IN_PLACE, LRU, Counters

__all__ = ["MPI", "MPITransport", "transport", "library_version", "mpi_standard", "mpi4py_version", "INT_MAX"]

INT_MAX = 2**31 - 1
_MPI_OPS = {name: getattr(MPI, name) for name in OPS}
_OTHER_OPS = {n: getattr(MPI, n) for n in ("MAXLOC", "MINLOC", "REPLACE", "NO_OP") if hasattr(MPI, n)}


def library_version() -> str:
    # Open MPI's string ends in a NUL byte, which would make reports binary files
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def mpi_standard() -> str:
    return "%d.%d" % MPI.Get_version()


def mpi4py_version() -> str:
    import mpi4py
    return mpi4py.__version__


def _pieces(buf: np.ndarray | None, max_count: int) -> list[np.ndarray]:
    """Split a message longer than max_count elements (MPI counts are C ints)."""
    if buf is None:
        return []
    if buf.size <= max_count:
        return [buf]
    return [buf[i:i + max_count] for i in range(0, buf.size, max_count)]


class MPITransport:
    """Point-to-point transport and per-communicator state over one intracommunicator."""

    def __init__(self, user: "MPI.Intracomm", *, backend: ArrayBackend = NUMPY, max_count: int = INT_MAX) -> None:
        self.user_comm = user
        self.comm = user.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.backend = backend
        self.max_count = max_count
        self.counters = Counters()
        self.pool = ScratchPool(backend)
        ub = self.comm.Get_attr(MPI.TAG_UB)
        self._tags = max(2, min(ub if isinstance(ub, int) else 32767, 1 << 30))
        self.seq = 0
        self.tag = 0
        self.inflight: tuple[str, float] | None = None
        self.profile: Any = None          # ringmpi.cost.Profile, read once (ringmpi.auto)
        self.choices = LRU(256)           # auto's decisions per call shape
        self.last_choice: dict | None = None
        self.freed = False
        stall.track(self)

    # -- the call bracket: one tag per call, scratch afresh, watched by the stall inspector --
    def begin(self, name: str) -> int:
        self.seq += 1
        self.tag = self.seq % self._tags
        self.pool.reset()
        self.inflight = (name, time.monotonic())
        return self.seq

    def describe(self, label: str) -> None:
        if self.inflight is not None:
            self.inflight = (label, self.inflight[1])

    def end(self) -> None:
        self.inflight = None

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
        tag = self.tag
        for i in range(max(len(sp), len(rp), 1)):
            s = sp[i] if i < len(sp) else None
            r = rp[i] if i < len(rp) else None
            self.comm.Sendrecv(s, MPI.PROC_NULL if s is None else dest, tag,
                               r, MPI.PROC_NULL if r is None else source, tag)
            if s is not None:
                self.counters.messages += 1
                self.counters.bytes_sent += s.nbytes

    def exchange(self, sends: Sequence[tuple[np.ndarray, int]],
                 recvs: Sequence[tuple[np.ndarray, int]]) -> None:
        """Post every receive and send at once, then wait for all (root fan-in / fan-out)."""
        self.counters.calls += 1
        reqs, tag = [], self.tag
        for buf, src in recvs:
            reqs += [self.comm.Irecv(p, src, tag) for p in _pieces(buf, self.max_count)]
        for buf, dest in sends:
            for p in _pieces(buf, self.max_count):
                reqs.append(self.comm.Isend(p, dest, tag))
                self.counters.messages += 1
                self.counters.bytes_sent += p.nbytes
        MPI.Request.Waitall(reqs)

    # -- local work (the array backend) --------------------------------------------------
    def empty(self, n: int, dtype: Any) -> np.ndarray:
        return self.pool.take(n, dtype)

    def copy(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.counters.bytes_copied += dst.nbytes
        self.backend.copy(src, dst)

    def combine(self, op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        self.counters.bytes_reduced += out.nbytes
        self.backend.combine(op, a, b, out)

    # -- the MPI library's own collectives ----------------------------------------------
    def native(self, call: Any) -> None:
        """The library's own collective: the call's spec knows which MPI function it is."""
        call.collective.mpi(self, call)

    def library(self, function: str, *args: Any) -> Any:
        """Call communicator method `function` (e.g. "Allreduce") with ringmpi's arguments:
        IN_PLACE and op names are translated to mpi4py's objects."""
        conv = [MPI.IN_PLACE if a is IN_PLACE else _MPI_OPS[a] if isinstance(a, str) else a for a in args]
        return getattr(self.comm, function)(*conv)

    def op_name(self, op: Any) -> str:
        """'SUM' for MPI.SUM, "sum" or "SUM"; a clear error for other ops."""
        if isinstance(op, MPI.Op):
            for name, mop in _MPI_OPS.items():
                if op == mop:
                    return name
            for name, mop in _OTHER_OPS.items():
                if op == mop:
                    raise ValueError(f"MPI.{name} is not supported by ringmpi; expected one of "
                                     f"{', '.join(_MPI_OPS)}")
            raise ValueError("only MPI's predefined reduction ops are supported "
                             f"({', '.join(_MPI_OPS)}); got a user-defined MPI.Op")
        return op_name(op)

    # -- helpers for the layers above (auto, check, benchmark, calibration, trainer) -----
    def abort(self, code: int = 1) -> None:
        """End every process of the job (MPI_Abort on the user's communicator)."""
        self.user_comm.Abort(code)

    def barrier(self) -> None:
        self.comm.Barrier()

    def wtime(self) -> float:
        return MPI.Wtime()

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root)

    def allgather_obj(self, obj: Any) -> list:
        return self.comm.allgather(obj)

    def hostnames(self) -> list[str]:
        return self.comm.allgather(MPI.Get_processor_name())

    def release(self) -> None:
        """The user's communicator is being freed: free the duplicate and the scratch."""
        self.freed = True
        self.pool = ScratchPool(self.backend)
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


def _delete(_comm: Any, _key: int, t: MPITransport) -> None:
    t.release()
    if _LAST and _LAST[1] is t:
        _LAST.clear()


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
_LAST: list = []   # (user communicator object, its transport): the one-entry fast path


def transport(comm: "MPI.Intracomm | None" = None) -> MPITransport:
    """The transport of `comm` (COMM_WORLD when None), made at its first use."""
    if comm is None:
        comm = MPI.COMM_WORLD
    if _LAST and _LAST[0] is comm and not _LAST[1].freed:
        return _LAST[1]
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        what = "MPI.COMM_NULL" if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL else \
            "an inter-communicator" if isinstance(comm, MPI.Intercomm) else f"{type(comm).__module__}.{type(comm).__name__}"
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {what}")
    t = comm.Get_attr(_KEYVAL)
    if t is None:
        t = MPITransport(comm)
        comm.Set_attr(_KEYVAL, t)
    _LAST[:] = [comm, t]
    return t
