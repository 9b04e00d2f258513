"""ringmpi.Comm: an mpi4py intracommunicator whose buffer collectives run ringmpi.

    comm = ringmpi.Comm(MPI.COMM_WORLD)              # the one-line switch
    comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)  # ringmpi's auto (or the algorithm chosen)
    comm.Bcast([weights, MPI.FLOAT], root=0)         # every mpi4py buffer spec is accepted

`Comm` is a subclass of `MPI.Intracomm` holding the same MPI handle as the communicator it
wraps (no MPI_Comm_dup): `isinstance(comm, MPI.Intracomm)` holds, C extensions that take the
communicator's handle work, and every method ringmpi does not override (point-to-point,
the lower-case object collectives, Gather, Scan, non-blocking and persistent calls,
attributes, ...) is mpi4py's own. `Dup`, `Split`, `Split_type`, `Create`, `Create_group`,
`Clone` and `Idup` return `Comm`s with the same algorithm choices.

The overridden calls are Allreduce, Reduce, Bcast, Allgather, Allgatherv (contiguous
displacements), Alltoall, Reduce_scatter_block and Reduce_scatter. Each parses its buffer
specifications as mpi4py does (`buf`, `[buf, type]`, `[buf, count, type]`,
`[buf, (count, displ), type]`, `[buf, count, displ, type]`, `MPI.IN_PLACE` or None) into
numpy views of the same memory, and runs ringmpi's collective on them. A call ringmpi cannot
serve goes to mpi4py unchanged, so the wrapper never makes a working program fail and a bad
call raises mpi4py's own exception: derived or non-numeric datatypes, user-defined or
MPI.REPLACE-like ops, MPI.BOTTOM, DLPack or CUDA-array-interface buffers, buffers that are
not contiguous or not writable where written, mismatched counts or types, aliased send and
receive buffers, zero-size messages, invalid roots.

The decision is made on each rank from its own arguments, as MPI's argument checks are: a
correct program passes matching arguments on every rank, so every rank decides alike. A
program whose ranks describe one message differently (a derived datatype on one rank, the
matching predefined one on another) must set RINGMPI_ALGO=mpi or use plain mpi4py.

This module and ringmpi/mpicomm.py are the only ones that import mpi4py: the wrapper *is* an
mpi4py communicator; it sends nothing itself (its collectives are ringmpi's public calls,
which reach MPI through the transport in mpicomm).
"""
from __future__ import annotations

import operator
import weakref
from collections import Counter
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import collectives as _c
from .api import algorithms
from .errors import RingmpiUsageError
from .ops import SUPPORTED_DTYPES, check_op_dtype
from .transport import GENERATION, LAST

__all__ = ["Comm", "COLLECTIVES", "stats"]

#: the keyword arguments of Comm(...): which ringmpi collective serves which mpi4py calls
COLLECTIVES = {
    "allreduce": ("Allreduce",),
    "reduce": ("Reduce",),
    "broadcast": ("Bcast",),
    "allgather": ("Allgather", "Allgatherv"),
    "alltoall": ("Alltoall",),
    "reduce_scatter": ("Reduce_scatter", "Reduce_scatter_block"),
}
_OPS = ((MPI.SUM, "SUM"), (MPI.PROD, "PROD"), (MPI.MAX, "MAX"), (MPI.MIN, "MIN"), (MPI.LAND, "LAND"),
        (MPI.LOR, "LOR"), (MPI.LXOR, "LXOR"), (MPI.BAND, "BAND"), (MPI.BOR, "BOR"), (MPI.BXOR, "BXOR"))
_OP_IDS = {id(mop): name for mop, name in _OPS}   # the module's constants live as long as MPI
_SUPPORTED = frozenset(SUPPORTED_DTYPES)
_DTYPES: dict[int, np.dtype | None] = {}   # predefined MPI datatype handle -> numpy dtype (finite)
#: calls left to mpi4py unchanged, per method (`stats()`); the rest ran ringmpi's collectives
PASSED: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
_HOT_SIZE = 16      # buffer pairs per communicator whose Allreduce plan is kept (DDP-style buckets)


def stats() -> dict[str, tuple[int, int]]:
    """{method: (calls, of which left to mpi4py)} on this process, for every overridden
    collective called so far (RINGMPI_DEBUG=INFO prints it at the end of `ringmpi.run`).
    Allreduce's repeats on the same arrays (its hot path, which counts nothing) are not
    included: they run as the first such call did."""
    return {m: (n, PASSED[m]) for m, n in sorted(CALLS.items())}


def _op(op: Any, dtype: np.dtype) -> str | None:
    """ringmpi's name of a predefined MPI op valid for `dtype`, or None (left to MPI)."""
    name = _OP_IDS.get(id(op))   # MPI.SUM itself: the common case, one lookup
    if name is None and isinstance(op, MPI.Op):
        name = next((n for mop, n in _OPS if op == mop), None)
    return name if name is not None and check_op_dtype(name, dtype) is None else None


def _dtype(datatype: Any) -> np.dtype | None:
    """The numpy dtype of a predefined, numeric MPI datatype; None for anything else."""
    if not isinstance(datatype, MPI.Datatype) or datatype == MPI.DATATYPE_NULL or not datatype.is_predefined:
        return None
    key = datatype.handle
    if key not in _DTYPES:
        try:
            dt = dtlib.to_numpy_dtype(datatype)
        except (ValueError, TypeError, KeyError):
            dt = None
        _DTYPES[key] = dt if dt in _SUPPORTED and datatype != MPI.PACKED else None
    return _DTYPES[key]


def _array(buf: Any, writable: bool) -> np.ndarray | None:
    """The memory of `buf` as a flat numpy array in memory order (a view), or None."""
    if type(buf) is np.ndarray:
        a = buf
    elif isinstance(buf, np.ndarray):
        a = buf.view(np.ndarray)
    else:
        try:
            a = np.asarray(memoryview(buf))
        except (TypeError, ValueError, BufferError):
            return None
    if writable and not a.flags.writeable:
        return None
    if a.ndim != 1:
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            return None
        a = a.reshape(-1, order="A")
    elif not a.flags.c_contiguous:
        return None
    return a


def _index(x: Any) -> int | None:
    try:
        v = operator.index(x)
    except TypeError:
        return None
    return v if v >= 0 else None


class _Msg:
    """One simple mpi4py message: the whole buffer after the displacement (`flat`) and the
    count given, if any (in datatype entries)."""
    __slots__ = ("flat", "count")

    def __init__(self, flat: np.ndarray, count: int | None) -> None:
        self.flat = flat
        self.count = count

    def take(self, blocks: int = 1) -> np.ndarray | None:
        """`count * blocks` entries (the whole buffer, `blocks` equal parts of it, when no
        count was given); None when the buffer is too short or does not split."""
        if self.count is None:
            return self.flat if self.flat.size % blocks == 0 else None
        n = self.count * blocks
        return self.flat[:n] if n <= self.flat.size else None


def _parts(msg: Any, pairs: tuple) -> tuple | None:
    """(buf, count, displ, dtype) of an mpi4py message specification: buf, [buf, dtype],
    [buf, count], [buf, (count, displ)], [buf, count, dtype], [buf, (count, displ), dtype],
    [buf, count, displ, dtype]; None when malformed. `pairs`: the types a (count, displ)
    pair may have (list or tuple in a simple message, tuple in a vector one, as mpi4py)."""
    if not (type(msg) is list or type(msg) is tuple):
        return msg, None, None, None
    n = len(msg)
    if n == 2:
        buf, count = msg
        dtype = None
        if isinstance(count, (MPI.Datatype, str)):
            return buf, None, None, count
    elif n == 3:
        buf, count, dtype = msg
    elif n == 4:
        return msg[0], msg[1], msg[2], msg[3]
    else:
        return None
    displ = None
    if type(count) in pairs:
        if len(count) != 2:
            return None
        count, displ = count
    return buf, count, displ, dtype


def _reduction(sendbuf: Any, recvbuf: Any, op: Any) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(send view, receive view, op name) when ringmpi serves a reduction into `recvbuf`
    exactly: an array of a dtype the op takes, and IN_PLACE (the same view) or a send array
    like it that does not overlap it; None: mpi4py serves the call."""
    r = _message(recvbuf, True)
    rv = r and r.take()
    if rv is None or not rv.size or not (name := _op(op, rv.dtype)):
        return None
    if _in_place(sendbuf):
        return rv, rv, name
    s = _message(sendbuf, False)
    sv = s and s.take()
    if sv is not None and sv.size == rv.size and sv.dtype == rv.dtype and _apart(sv, rv):
        return sv, rv, name
    return None


def _message(msg: Any, writable: bool) -> _Msg | None:
    """Parse an mpi4py buffer specification as mpi4py's message_simple does."""
    parts = _parts(msg, (tuple, list))
    if parts is None:
        return None
    buf, count, displ, dtype = parts
    if buf is None or buf is MPI.BOTTOM or isinstance(buf, (list, tuple, str)):
        return None
    a = _array(buf, writable)
    if a is None:
        return None
    if dtype is not None:
        dt = _dtype(dtype)
        if dt is None or a.nbytes % dt.itemsize:
            return None
        if a.dtype != dt:
            a = a.view(np.uint8).view(dt)
    elif a.dtype not in _SUPPORTED or not a.dtype.isnative:
        return None
    if count is not None and (count := _index(count)) is None:
        return None
    if displ is not None:
        if (displ := _index(displ)) is None or displ > a.size:
            return None
        a = a[displ:]
    return _Msg(a, count)


def _in_place(x: Any) -> bool:
    return x is None or x is MPI.IN_PLACE


def _apart(a: np.ndarray, b: np.ndarray) -> bool:
    return not np.may_share_memory(a, b)


def _counts(x: Any, p: int) -> list[int] | None:
    if not isinstance(x, (list, tuple, np.ndarray)) or len(x) != p:
        return None
    out = [_index(c) for c in x]
    return None if any(c is None for c in out) else out


class Comm(MPI.Intracomm):
    """An mpi4py intracommunicator whose buffer collectives run ringmpi (see the module doc).

    Parameters:
        comm: the mpi4py intracommunicator to wrap (COMM_WORLD when None); the same MPI
            handle is used, nothing is duplicated, and freeing either frees both.
        allreduce, reduce, broadcast, allgather, alltoall, reduce_scatter: the algorithm
            of that collective on this communicator ("auto" by default: ringmpi's choice
            among its algorithms and the library's own; `ringmpi.algorithms(name)` lists them).

    Raises RingmpiUsageError for an unknown collective or algorithm name, TypeError for a
    communicator that is not an intracommunicator.

    Example (mpirun -n 4):
        >>> comm = ringmpi.Comm(MPI.COMM_WORLD, allreduce="ring")
        >>> comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    """
    _algorithms: dict[str, str] = {}   # class default: objects mpi4py makes itself (Dup) get "auto"
    _hot: dict | None = None           # Allreduce's hot path: id(recvbuf) -> (op, generation, send, recv, plan, in place)

    def __new__(cls, comm: MPI.Intracomm | None = None, **algorithm: str) -> "Comm":
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"ringmpi.Comm: expected an mpi4py intracommunicator, got {type(comm).__name__}")
        return super().__new__(cls, comm)

    def __init__(self, comm: MPI.Intracomm | None = None, **algorithm: str) -> None:
        inherited = getattr(comm, "_algorithms", {})
        for name, alg in algorithm.items():
            if name not in COLLECTIVES:
                raise RingmpiUsageError(f"ringmpi.Comm: unknown collective {name!r}; expected one of "
                                        f"{', '.join(COLLECTIVES)}")
            valid = [*algorithms(name), "auto"]
            if alg not in valid:
                raise RingmpiUsageError(f"ringmpi.Comm: unknown {name} algorithm {alg!r}; expected one of "
                                        f"{', '.join(valid)}")
        self._algorithms = {**inherited, **algorithm}

    def __repr__(self) -> str:
        chosen = ", ".join(f"{k}={v!r}" for k, v in self._algorithms.items())
        return f"<ringmpi.Comm of {self.Get_size()} ranks{': ' + chosen if chosen else ''}>"

    def __reduce__(self) -> tuple:
        """Pickled as mpi4py pickles communicators: the predefined ones by name (unpickled as
        the very object MPI.COMM_WORLD is now), others refused with mpi4py's ValueError."""
        for name in ("COMM_WORLD", "COMM_SELF"):
            if getattr(MPI, name) is self:
                return _predefined, (name,)
        return _rebuild, (MPI.Intracomm(self), self._algorithms)

    def _alg(self, name: str) -> str:
        return self._algorithms.get(name, "auto")

    def _wrap(self, new: Any) -> Any:
        if isinstance(new, MPI.Intracomm) and type(new) in (MPI.Intracomm, Comm) and new != MPI.COMM_NULL:
            return Comm(new, **self._algorithms)
        return new

    # -- communicators made from this one are wrapped too ---------------------------------
    def Dup(self, info: Any = None) -> "Comm":
        return self._wrap(MPI.Intracomm(super().Dup(info)) if info is not None else MPI.Intracomm(super().Dup()))

    def Clone(self) -> "Comm":
        return self.Dup()

    def Dup_with_info(self, info: Any) -> "Comm":
        return self._wrap(MPI.Intracomm(super().Dup_with_info(info)))

    def Idup(self, info: Any = None) -> tuple:
        new, req = super().Idup() if info is None else super().Idup(info)
        return self._wrap(MPI.Intracomm(new)), req

    def Split(self, color: int = 0, key: int = 0) -> Any:
        return self._wrap(super().Split(color, key))

    def Split_type(self, split_type: int, key: int = 0, info: Any = MPI.INFO_NULL) -> Any:
        return self._wrap(super().Split_type(split_type, key, info))

    def Create(self, group: Any) -> Any:
        return self._wrap(super().Create(group))

    def Create_group(self, group: Any, tag: int = 0) -> Any:
        return self._wrap(super().Create_group(group, tag))

    # -- the collectives ringmpi serves ----------------------------------------------------
    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        # the training loop's case first: the same arrays as an earlier call, whose plan
        # (ringmpi's, kept by the allreduce memo) is still current
        hot = self._hot
        if hot is not None:
            hit = hot.get(id(recvbuf))
            if hit is not None and hit[0] is op and hit[1] == GENERATION[0] and hit[2]() is sendbuf and \
                    hit[3]() is recvbuf and recvbuf.dtype is hit[6] and (hit[5] or sendbuf.dtype is hit[7]):
                hit[4](recvbuf if hit[5] else sendbuf, recvbuf)
                return
        CALLS["Allreduce"] += 1
        got = _reduction(sendbuf, recvbuf, op)
        if got is not None:
            sv, rv, name = got
            _c.allreduce(sv, rv, op=name, comm=self, algorithm=self._alg("allreduce"))
            self._remember(sendbuf, recvbuf, op, sv, rv)
            return
        PASSED["Allreduce"] += 1
        super().Allreduce(sendbuf, recvbuf, op)

    def _remember(self, sendbuf: Any, recvbuf: Any, op: Any, sv: np.ndarray, rv: np.ndarray) -> None:
        """Keep the plan ringmpi's allreduce memo holds for these very arrays (plain ndarrays
        that needed no view), so that the next identical call goes straight to it."""
        memo = tuple(LAST["allreduce"])   # one copy: another thread's call may rewrite the memo meanwhile
        in_place = sv is rv
        if rv is not recvbuf or not in_place and sv is not sendbuf or memo[5] is None or memo[0]() is not sv \
                or memo[3] is not self:
            return
        hot = self._hot
        if hot is None or len(hot) >= _HOT_SIZE:
            hot = self._hot = {}
        send_ref = (lambda v=sendbuf: v) if in_place else weakref.ref(sendbuf)
        # (and the arrays' dtypes, which can be set in place)
        hot[id(recvbuf)] = (op, GENERATION[0], send_ref, weakref.ref(recvbuf), memo[5], in_place, recvbuf.dtype,
                            None if in_place else sendbuf.dtype)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0) -> None:
        CALLS["Reduce"] += 1
        rank, p = self.Get_rank(), self.Get_size()
        if type(root) is int and 0 <= root < p:
            if rank == root:
                got = _reduction(sendbuf, recvbuf, op)
                if got is not None:
                    sv, rv, name = got
                    _c.reduce(sv, rv, root, op=name, comm=self, algorithm=self._alg("reduce"))
                    return
            else:
                s = None if _in_place(sendbuf) else _message(sendbuf, False)
                sv = s and s.take()
                if sv is not None and sv.size and (name := _op(op, sv.dtype)):
                    _c.reduce(sv, None, root, op=name, comm=self, algorithm=self._alg("reduce"))
                    return
        PASSED["Reduce"] += 1
        super().Reduce(sendbuf, recvbuf, op, root)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        CALLS["Bcast"] += 1
        p = self.Get_size()
        if type(root) is int and 0 <= root < p:
            sending = self.Get_rank() == root
            m = _message(buf, not sending)
            v = m and m.take()
            if v is not None and v.size:
                if sending and not v.flags.writeable:
                    v = v.copy()      # ringmpi's broadcast takes one writable buffer; the root's is only read
                _c.broadcast(v, root, comm=self, algorithm=self._alg("broadcast"))
                return
        PASSED["Bcast"] += 1
        super().Bcast(buf, root)

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        if not self._blocks("Allgather", _c.allgather, sendbuf, recvbuf, whole_send=False):
            super().Allgather(sendbuf, recvbuf)

    def _blocks(self, name: str, fn: Any, sendbuf: Any, recvbuf: Any, whole_send: bool) -> bool:
        """Allgather and Alltoall through ringmpi's `fn` when both messages are arrays it
        serves exactly (the send buffer one block, or like the receive buffer: `whole_send`);
        False: the caller passes the call to mpi4py."""
        CALLS[name] += 1
        p = self.Get_size()
        r = _message(recvbuf, True)
        rv = r and r.take(p)
        algorithm = self._alg(fn.__name__)
        if rv is not None and rv.size:
            if _in_place(sendbuf):
                fn(rv, rv, comm=self, algorithm=algorithm)
                return True
            s = _message(sendbuf, False)
            sv = s and (s.take(p) if whole_send else s.take())
            if sv is not None and sv.size * (1 if whole_send else p) == rv.size and sv.dtype == rv.dtype \
                    and _apart(sv, rv):
                fn(sv, rv, comm=self, algorithm=algorithm)
                return True
        PASSED[name] += 1
        return False

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        CALLS["Allgatherv"] += 1
        p, rank = self.Get_size(), self.Get_rank()
        got = self._vector(recvbuf, p)
        if got is not None:
            rv, counts = got
            if _in_place(sendbuf):
                _c.allgather(rv, rv, comm=self, algorithm=self._alg("allgather"), counts=counts)
                return
            s = _message(sendbuf, False)
            sv = s and s.take()
            if sv is not None and sv.size == counts[rank] and sv.dtype == rv.dtype and _apart(sv, rv):
                _c.allgather(sv, rv, comm=self, algorithm=self._alg("allgather"), counts=counts)
                return
        PASSED["Allgatherv"] += 1
        super().Allgatherv(sendbuf, recvbuf)

    @staticmethod
    def _vector(msg: Any, p: int) -> tuple[np.ndarray, list[int]] | None:
        """A receive vector spec parsed as mpi4py's message_vector does, when its blocks lie
        back to back: (the buffer, the counts)."""
        parts = _parts(msg, (tuple,))
        if parts is None:
            return None
        buf, counts, displs, dtype = parts
        m = _message(buf if dtype is None else [buf, dtype], True)
        if m is None:
            return None
        size = m.flat.size
        if counts is None:                 # mpi4py: the buffer split evenly, the first blocks one longer
            counts = [size // p + (size % p > q) for q in range(p)]
        elif (c := _index(counts)) is not None:
            counts = [c] * p
        elif (counts := _counts(counts, p)) is None:
            return None
        if displs is not None:
            if (d := _index(displs)) is not None:
                displs = [d * q for q in range(p)]
            elif (displs := _counts(displs, p)) is None:
                return None
            if displs != [sum(counts[:q]) for q in range(p)]:
                return None
        total = sum(counts)
        if total == 0 or total > size:
            return None
        return m.flat[:total], counts

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        if not self._blocks("Alltoall", _c.alltoall, sendbuf, recvbuf, whole_send=True):
            super().Alltoall(sendbuf, recvbuf)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        CALLS["Reduce_scatter_block"] += 1
        p = self.Get_size()
        r = _message(recvbuf, True)
        if r is not None:
            if _in_place(sendbuf):
                full = r.take(p)
                if full is not None and full.size and (name := _op(op, full.dtype)):
                    self._scatter_in_place(full, [full.size // p] * p, name)
                    return
            else:
                rv = r.take()
                s = _message(sendbuf, False)
                sv = s and s.take(p)
                if rv is not None and sv is not None and rv.size and sv.size == rv.size * p and \
                        sv.dtype == rv.dtype and _apart(sv, rv) and (name := _op(op, rv.dtype)):
                    _c.reduce_scatter(sv, rv, op=name, comm=self, algorithm=self._alg("reduce_scatter"))
                    return
        PASSED["Reduce_scatter_block"] += 1
        super().Reduce_scatter_block(sendbuf, recvbuf, op)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
                       op: Any = MPI.SUM) -> None:
        CALLS["Reduce_scatter"] += 1
        p, rank = self.Get_size(), self.Get_rank()
        r = _message(recvbuf, True)
        rv = r and r.take()
        if rv is not None:
            if _in_place(sendbuf):
                counts = _counts(recvcounts, p)
                if counts is not None and sum(counts) == rv.size and rv.size and (name := _op(op, rv.dtype)):
                    self._scatter_in_place(rv, counts, name)
                    return
            else:
                s = _message(sendbuf, False)
                sv = s and s.take()
                if recvcounts is None:   # as mpi4py: every rank's receive count, by MPI_Allgather
                    got = np.zeros(p, np.int64)
                    MPI.Intracomm.Allgather(self, [np.array([rv.size], np.int64), MPI.COUNT], [got, MPI.COUNT])
                    recvcounts = got.tolist()
                counts = _counts(recvcounts, p)
                if sv is not None and counts is not None and sum(counts) == sv.size and sv.size and \
                        counts[rank] == rv.size and sv.dtype == rv.dtype and _apart(sv, rv) and \
                        (name := _op(op, rv.dtype)):
                    _c.reduce_scatter(sv, rv, op=name, comm=self, algorithm=self._alg("reduce_scatter"),
                                      counts=counts)
                    return
        PASSED["Reduce_scatter"] += 1
        super().Reduce_scatter(sendbuf, recvbuf, recvcounts, op)

    def _scatter_in_place(self, full: np.ndarray, counts: list[int], op: str) -> None:
        """MPI's in-place reduce-scatter: the input is the whole receive buffer, this rank's
        block of the result goes to its start, and the rest of the buffer is left as it was."""
        mine = _c.reduce_scatter(full, None, op=op, comm=self, algorithm=self._alg("reduce_scatter"),
                                 counts=None if len(set(counts)) == 1 else counts)
        full[:mine.size] = mine


def _predefined(name: str) -> Any:
    return getattr(MPI, name)


def _rebuild(comm: MPI.Intracomm, algorithms: dict[str, str]) -> Comm:
    return Comm(comm, **algorithms)
