"""The public collectives: validation at the edge, then one registered algorithm body.

Every call checks its arguments on the calling rank before any message is sent, and
raises `RingmpiUsageError` naming the call, the rank, what was expected and what came.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import auto as _auto
from . import schedules as _alg
from . import stall as _stall
from .auto import choose, default_segments
from .backend import backend_for
from .mpicomm import MPI, MPITransport, normalize_op, transport
from .ops import SUPPORTED_DTYPES, check_op_dtype

__all__ = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "shift",
           "algorithms", "RingmpiUsageError", "last_choice"]


# (kind, itemsize): np.longlong and np.int64 are different chars of the same type
_DTYPE_KEYS = frozenset((d.kind, d.itemsize) for d in SUPPORTED_DTYPES)


class RingmpiUsageError(ValueError):
    """Bad arguments to a ringmpi call (raised before any communication)."""


def algorithms(collective: str) -> list[str]:
    """The algorithm names of `collective`; algorithm="auto" picks among them."""
    return _alg.names(collective)


class _Edge:
    """Argument checks for one call on one rank; errors read 'ringmpi.CALL (rank r of p): ...'."""

    def __init__(self, call: str, comm: Any) -> None:
        self.call = call
        self.t: MPITransport = transport(comm)

    def fail(self, msg: str, kind: type[Exception] = RingmpiUsageError):
        raise kind(f"ringmpi.{self.call} (rank {self.t.rank} of {self.t.size}): {msg}")

    def array(self, name: str, buf: Any, *, writable: bool = False) -> np.ndarray:
        try:
            backend_for(buf)
        except TypeError as e:
            self.fail(f"{name}: {e}", RingmpiUsageError)
        if not buf.flags.c_contiguous:
            self.fail(f"{name} must be C-contiguous (got strides {buf.strides} for shape "
                      f"{buf.shape}); pass np.ascontiguousarray({name})")
        dt = buf.dtype
        if (dt.kind, dt.itemsize) not in _DTYPE_KEYS or not dt.isnative:
            self.fail(f"{name} has dtype {buf.dtype}; expected one of "
                      f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
        if writable and not buf.flags.writeable:
            self.fail(f"{name} is read-only; the result needs a writable buffer")
        return buf.reshape(-1)

    def op(self, op: Any, dtype: np.dtype) -> str:
        try:
            name = normalize_op(op)
        except ValueError as e:
            self.fail(str(e))
        why = check_op_dtype(name, dtype)
        if why:
            self.fail(why)
        return name

    def root(self, root: Any) -> int:
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < self.t.size:
            self.fail(f"root must be an integer in [0, {self.t.size}), got {root!r}")
        return int(root)

    def recv(self, recvbuf: Any, sendbuf: np.ndarray, count: int) -> np.ndarray:
        """The flat result buffer: allocated when None, checked otherwise."""
        if recvbuf is None:
            return np.empty(count, dtype=sendbuf.dtype)
        flat = self.array("recvbuf", recvbuf, writable=True)
        if flat.dtype != sendbuf.dtype:
            self.fail(f"recvbuf has dtype {flat.dtype}, expected {sendbuf.dtype} (the sendbuf's)")
        if flat.size != count:
            self.fail(f"recvbuf has {flat.size} elements, expected {count}")
        return flat

    def no_partial_overlap(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> None:
        if sendbuf.size and recvbuf.size and np.may_share_memory(sendbuf, recvbuf) \
                and np.shares_memory(sendbuf, recvbuf):
            self.fail("recvbuf overlaps sendbuf; pass the same array for in place, or separate buffers")

    def counts(self, counts: Any, total: int | None = None) -> list[int]:
        p = self.t.size
        try:
            c = [int(x) for x in counts]
        except TypeError:
            self.fail(f"counts must be a sequence of {p} non-negative integers, got {counts!r}")
        if len(c) != p or any(x < 0 for x in c):
            self.fail(f"counts must hold {p} non-negative integers (one per rank), got {list(counts)!r}")
        if total is not None and sum(c) != total:
            self.fail(f"counts add up to {sum(c)}, expected len(sendbuf) = {total}")
        return c

    def agree(self, alg: _alg.Algorithm, *fields) -> None:
        """With RINGMPI_CHECK=1 (like TORCH_DISTRIBUTED_DEBUG=DETAIL), every rank compares the
        call's fingerprint with the others' first, and all raise together on a mismatch,
        instead of hanging or silently mixing buffers of different lengths."""
        flag = _auto.env("check")
        if flag in ("", "0") or self.t.size == 1:
            return
        mine = (self.call, alg.name) + fields
        every = self.t.allgather_obj(mine)
        if any(f != every[0] for f in every):
            groups: dict = {}
            for r, f in enumerate(every):
                groups.setdefault(f, []).append(r)
            text = "; ".join(f"ranks {g}: {' '.join(map(str, f))}" for f, g in groups.items())
            self.fail(f"ranks disagree on this collective call (RINGMPI_CHECK): {text}")

    def run(self, alg: _alg.Algorithm, *args) -> None:
        """Run the schedule under the stall inspector (a warning, not a silent hang)."""
        with _stall.watch(f"{self.call}/{alg.name}", self.t):
            alg.run(self.t, *args)

    def algorithm(self, collective: str, algorithm: str, count: int, itemsize: int, **kw) -> _alg.Algorithm:
        if not isinstance(algorithm, str):
            self.fail(f"algorithm must be a name, got {algorithm!r}")
        if algorithm == "auto":
            algorithm = choose(collective, self.t, count, itemsize, **kw)
        try:
            alg = _alg.get(collective, algorithm)
        except ValueError as e:
            self.fail(str(e))
        self.t.begin()
        return alg


def _result(recvbuf: Any, flat: np.ndarray, shape: tuple | None = None) -> np.ndarray:
    if recvbuf is not None:
        return recvbuf
    return flat if shape is None else flat.reshape(shape)


def _is_inplace(sendbuf: Any, recvbuf: Any) -> bool:
    return recvbuf is not None and recvbuf is sendbuf


def allreduce(sendbuf: np.ndarray, recvbuf: np.ndarray | None = None, *, op: Any = MPI.SUM,
              comm: Any = None, algorithm: str = "auto") -> np.ndarray:
    """Reduce `sendbuf` over all ranks; every rank gets the same result (same bits)."""
    e = _Edge("allreduce", comm)
    send = e.array("sendbuf", sendbuf)
    opn = e.op(op, send.dtype)
    inplace = _is_inplace(sendbuf, recvbuf)
    recv = send if inplace else e.recv(recvbuf, send, send.size)
    if not inplace:
        e.no_partial_overlap(send, recv)
    alg = e.algorithm("allreduce", algorithm, send.size, send.itemsize)
    e.agree(alg, send.size, send.dtype, opn)
    e.run(alg, recv if inplace else send, recv, opn)
    return _result(recvbuf, recv, sendbuf.shape)


def reduce_scatter(sendbuf: np.ndarray, recvbuf: np.ndarray | None = None, *, op: Any = MPI.SUM,
                   comm: Any = None, algorithm: str = "auto",
                   counts: Sequence[int] | None = None) -> np.ndarray:
    """Reduce over all ranks and leave block r (of `counts`, default an even split) on rank r.

    In place (`recvbuf is sendbuf`): the result is written into block r of the buffer and
    that block (a view) is returned.
    """
    e = _Edge("reduce_scatter", comm)
    send = e.array("sendbuf", sendbuf)
    opn = e.op(op, send.dtype)
    c = _alg.block_counts(send.size, e.t.size) if counts is None else e.counts(counts, send.size)
    r = e.t.rank
    off = _alg.offsets(c)
    if _is_inplace(sendbuf, recvbuf):
        recv = send[off[r]:off[r + 1]]
        recvbuf = recv
    else:
        recv = e.recv(recvbuf, send, c[r])
        e.no_partial_overlap(send, recv)
    alg = e.algorithm("reduce_scatter", algorithm, send.size, send.itemsize)
    e.agree(alg, send.size, send.dtype, opn, tuple(c))
    e.run(alg, send, recv, opn, c)
    return _result(recvbuf, recv)


def allgather(sendbuf: np.ndarray, recvbuf: np.ndarray | None = None, *, comm: Any = None,
              algorithm: str = "auto", counts: Sequence[int] | None = None) -> np.ndarray:
    """Concatenate every rank's `sendbuf` in rank order on every rank.

    `counts` gives per-rank block sizes (default: every rank sends len(sendbuf)). In place
    (`recvbuf is sendbuf`): the buffer is the full result and block r is this rank's input.
    """
    e = _Edge("allgather", comm)
    p, r = e.t.size, e.t.rank
    buf = e.array("sendbuf", sendbuf)
    inplace = _is_inplace(sendbuf, recvbuf)
    if counts is None:
        if inplace:
            if buf.size % p:
                e.fail(f"in-place buffer has {buf.size} elements, expected a multiple of {p} "
                       "(pass counts= for uneven blocks)")
            c = [buf.size // p] * p
        else:
            c = [buf.size] * p
    else:
        c = e.counts(counts)
    off = _alg.offsets(c)
    if inplace:
        if buf.size != off[-1]:
            e.fail(f"in-place buffer has {buf.size} elements, expected sum(counts) = {off[-1]}")
        recv, send = buf, buf[off[r]:off[r + 1]]
    else:
        if buf.size != c[r]:
            e.fail(f"sendbuf has {buf.size} elements, expected counts[{r}] = {c[r]}")
        recv, send = e.recv(recvbuf, buf, off[-1]), buf
        e.no_partial_overlap(send, recv)
    alg = e.algorithm("allgather", algorithm, off[-1], buf.itemsize)
    e.agree(alg, buf.dtype, tuple(c))
    e.run(alg, send, recv, c)
    return _result(recvbuf, recv)


def broadcast(buf: np.ndarray, root: int = 0, *, comm: Any = None, algorithm: str = "auto",
              segments: int | None = None) -> np.ndarray:
    """Copy the root's `buf` into `buf` on every rank (in place, like MPI_Bcast).

    `segments` cuts the buffer into S pieces for the pipelined chain (default: the S that
    minimises (p-2+S)(alpha + n/(S B)) under the active profile).
    """
    e = _Edge("broadcast", comm)
    flat = e.array("buf", buf, writable=True)
    root = e.root(root)
    if segments is not None and (not isinstance(segments, (int, np.integer)) or isinstance(segments, bool)
                                 or segments < 1):
        e.fail(f"segments must be a positive integer or None, got {segments!r}")
    alg = e.algorithm("broadcast", algorithm, flat.size, flat.itemsize)
    e.agree(alg, flat.size, flat.dtype, root, segments)
    if segments is None and alg.name == "pipeline":
        segments = default_segments(e.t.size, flat.size, flat.itemsize, e.t)
    e.run(alg, flat, root, int(segments or 1))
    return buf


def reduce(sendbuf: np.ndarray, recvbuf: np.ndarray | None = None, root: int = 0, *,
           op: Any = MPI.SUM, comm: Any = None, algorithm: str = "auto") -> np.ndarray | None:
    """Reduce over all ranks onto `root`; returns the result there and None elsewhere."""
    e = _Edge("reduce", comm)
    send = e.array("sendbuf", sendbuf)
    opn = e.op(op, send.dtype)
    root = e.root(root)
    at_root = e.t.rank == root
    inplace = _is_inplace(sendbuf, recvbuf)
    recv = None
    if at_root:
        recv = send if inplace else e.recv(recvbuf, send, send.size)
        if not inplace:
            e.no_partial_overlap(send, recv)
    alg = e.algorithm("reduce", algorithm, send.size, send.itemsize)
    e.agree(alg, send.size, send.dtype, opn, root)
    e.run(alg, send, recv, opn, root)
    return _result(recvbuf, recv, sendbuf.shape) if at_root else None


def shift(sendbuf: np.ndarray, recvbuf: np.ndarray | None = None, *, offset: int = 1,
          comm: Any = None) -> np.ndarray:
    """One ring round: send to rank+offset, receive from rank-offset (one MPI_Sendrecv)."""
    e = _Edge("shift", comm)
    send = e.array("sendbuf", sendbuf)
    if not isinstance(offset, (int, np.integer)) or isinstance(offset, bool):
        e.fail(f"offset must be an integer, got {offset!r}")
    recv = e.recv(recvbuf, send, send.size)
    if recvbuf is sendbuf:
        e.fail("shift cannot run in place; pass a separate recvbuf")
    e.no_partial_overlap(send, recv)
    p, r = e.t.size, e.t.rank
    with _stall.watch("shift", e.t):
        e.t.sendrecv(send, (r + offset) % p, recv, (r - offset) % p)
    return _result(recvbuf, recv, sendbuf.shape)


def last_choice() -> dict | None:
    """What the last `auto` call chose and why (see RINGMPI_DEBUG)."""
    from .auto import LAST
    return LAST.get("choice")
