"""The MPI transport: the only module that imports mpi4py.

`MPITransport` implements `ringmpi.transport.Group` over one intracommunicator: the data
plane the schedules use (`sendrecv`: one MPI_Sendrecv, a side that is None being
MPI_PROC_NULL; `exchange`: Isend/Irecv then one Waitall; `empty`/`copy`/`combine` through
the array backend and the scratch pool; `mpi`: the library's own collective), and the
per-communicator state the layers above keep on it (profile, choice cache, last choice,
the call in flight for the stall inspector).

Messages travel on a private duplicate of the user's communicator, so ringmpi's traffic can
never match the user's own receives, and every call uses its own tag (the call's sequence
number), so a message left over by a call that failed on one rank can never be matched by
the next call. A second duplicate carries control messages (the RINGMPI_CHECK agreement,
the profile, tuning decisions). The transport is stored on the user's communicator as an
MPI attribute: it lives exactly as long as the communicator and is freed with it.

A third channel, the watch tag on the control duplicate, carries the stall inspector's
notes between ranks (`ringmpi.stall`: "where are you?", "I failed in call N", "I finished
after call N"); it needs MPI_THREAD_MULTIPLE (mpi4py's default), since the inspector's
thread sends them while the caller's thread may be inside MPI.

Nothing here waits inside MPI while holding the GIL: mpi4py 4.1.2's pickle-based
reductions (`comm.allreduce(obj)`) duplicate the communicator with the GIL held on first use
(mpi4py issue 784), which froze a process whose two threads set up two communicators at
once; host discovery therefore uses buffer collectives, which release it.

The MPI library's own collectives are called through `mpi_call`, which also makes them
follow ringmpi's rules: above the C-int count limit the element-wise ones (all-reduce,
reduce, broadcast) are cut into pieces, and MAX/MIN on floating types propagate NaN (MPI
libraries compare with `a > b ? a : b`, which drops or keeps a NaN depending on operand
order) by reducing order-preserving integer keys instead of the floats.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import sys
import threading
import time
import traceback
import zlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from mpi4py import MPI

from . import requests, stall
from .backend import NUMPY, ArrayBackend, ScratchPool
from .call import offsets
from .device import DeviceGroup, Support
from .errors import RankFailure, RingmpiError, RingmpiUsageError
from .ops import OPS, canonical, op_name, wire
from .settings import log, settings
from .shm import SPINS
from .transport import (IN_PLACE, LRU, CountedMemory, Counters, MPIPlan, PrivateMemory, ReceiveThenReduce,
                        split_nodes)

__all__ = ["MPI", "MPITransport", "shrink", "fault_tolerant", "RequestView", "transport", "world_position", "abort_on_exception", "selection_default", "library_version", "mpi_standard", "mpi4py_version", "INT_MAX", "cuda_support"]

INT_MAX = 2**31 - 1
_MPI_OPS = {name: getattr(MPI, "SUM" if name == "AVG" else name) for name in OPS}  # AVG: a SUM, then / p
#: numpy type code -> mpi4py's predefined datatype (mpi4py 3 has the table, not the method)
_type_of_code = getattr(MPI.Datatype, "fromcode", None) or MPI._typedict.__getitem__
_OTHER_OPS = {n: getattr(MPI, n) for n in ("MAXLOC", "MINLOC", "REPLACE", "NO_OP") if hasattr(MPI, n)}
#: MPI_Wait on one of MPI's own requests, bound once (`MPITransport.wait_watched`: at a few
#: bytes a persistent call's start and wait cost about MPI's blocking call, and two
#: attribute reads a wait showed in it: benchmarks/README.md, "Figures behind constants")
_WAIT = MPI.Request.Wait


def library_version() -> str:
    # Open MPI's string ends in a NUL byte, which would make reports binary files
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def mpi_standard() -> str:
    return "%d.%d" % MPI.Get_version()


def mpi4py_version() -> str:
    import mpi4py
    return mpi4py.__version__


def cuda_support() -> Any:
    """Whether this MPI library can read CUDA device memory, and how that was decided
    (`device.Support`): the library's answer (`_library_cuda_support`, asked once per
    process) under the setting: RINGMPI_CUDA_AWARE=0 stages regardless; =1 is believed only
    where the library gave no answer."""
    forced = settings().cuda_aware
    said = _library_cuda_support()
    if forced == "0":
        return Support(False, "RINGMPI_CUDA_AWARE=0" + (f"; the library: {said}" if said else ""))
    if forced == "1":
        if said is not None and not said.aware:
            return Support(False, f"RINGMPI_CUDA_AWARE=1 refused: {said.how}")
        return Support(True, "RINGMPI_CUDA_AWARE=1" + (f"; the library: {said.how}" if said else
                                                         ", the library gives no answer"))
    return said if said is not None else Support(False, "the library gives no answer (no "
                                                        "mpi_memory_alloc_kinds, no MPIX_Query_cuda_support)")


@functools.cache
def _library_cuda_support() -> Any:
    """The library's own answer, or None: the MPI-4.1 info key `mpi_memory_alloc_kinds` of
    COMM_WORLD (lists `cuda:device` when it can), then the non-standard
    `MPIX_Query_cuda_support()` resolved with ctypes from the loaded library (Open MPI,
    MPICH)."""
    info = MPI.COMM_WORLD.Get_info()
    try:
        kinds = info.Get("mpi_memory_alloc_kinds")
    finally:
        info.Free()
    if kinds is not None:
        return Support(any(k == "cuda" or k.startswith("cuda:") for k in kinds.split(",")),
                       f"mpi_memory_alloc_kinds = {kinds!r}")
    fn = _c_function("MPIX_Query_cuda_support")
    if fn is None:
        return None
    answer = fn()
    return Support(bool(answer), f"MPIX_Query_cuda_support() = {answer}")


def _c_function(name: str) -> Any:
    """The MPI library's C function `name` (returning int) through ctypes, which lets the
    GIL go while it runs; None where the library has none."""
    try:
        fn = getattr(ctypes.CDLL(MPI.__file__), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    return fn


def _byte_pieces(span: tuple[int, int] | None, max_count: int) -> list:
    """Raw memory (address, bytes) as MPI buffers of at most max_count bytes (MPI_BYTE)."""
    if span is None:
        return []
    address, nbytes = span
    return [MPI.buffer.fromaddress(address + lo, min(max_count, nbytes - lo)) for lo in range(0, nbytes, max_count)] \
        or [MPI.buffer.fromaddress(address or 1, 0)]


def _pieces(buf: np.ndarray | None, max_count: int) -> list[np.ndarray]:
    """Split a message longer than max_count elements (MPI counts are C ints)."""
    if buf is None:
        return []
    buf = wire(buf)
    if buf.size <= max_count:
        return [buf]
    return [buf[i:i + max_count] for i in range(0, buf.size, max_count)]


class _Wire(CountedMemory, PrivateMemory, ReceiveThenReduce):
    """The data plane over `self.comm`, every message with tag `self.tag`: what the blocking
    transport (`MPITransport`) and a request's suspending one (`RequestView`) share. Each
    says how it waits: `_sendrecv` and `exchange` for its messages, `_invoke` for MPI's own
    collective."""
    nonblocking = False
    on_device = False
    comm: Any
    tag: int
    max_count: int
    pool: ScratchPool
    devices: dict
    profile: Any

    def sendrecv(self, sendbuf: np.ndarray | None, dest: int | None,
                 recvbuf: np.ndarray | None, source: int | None) -> None:
        """One MPI_Sendrecv (split into several when a side exceeds max_count elements). A
        side of one piece that is no 16-bit float is listed as it is (`_pieces`' work, inline:
        the round of every schedule passes here)."""
        m = self.max_count
        self._sendrecv([] if dest is None or sendbuf is None else [sendbuf]
                       if sendbuf.size <= m and sendbuf.dtype.itemsize != 2 else _pieces(sendbuf, m), dest,
                       [] if source is None or recvbuf is None else [recvbuf]
                       if recvbuf.size <= m and recvbuf.dtype.itemsize != 2 else _pieces(recvbuf, m), source)

    def sendrecv_bytes(self, send: tuple[int, int] | None, dest: int | None,
                       recv: tuple[int, int] | None, source: int | None) -> None:
        """One MPI_Sendrecv of raw memory given as (address, bytes), MPI_BYTE (a CUDA-aware
        MPI: device addresses; split above the C-int count limit)."""
        self._sendrecv(_byte_pieces(None if dest is None else send, self.max_count), dest,
                       _byte_pieces(None if source is None else recv, self.max_count), source)

    def _sendrecv(self, sp: list, dest: int | None, rp: list, source: int | None) -> None:
        raise NotImplementedError

    def _sendrecv_now(self, sp: list, dest: int | None, rp: list, source: int | None) -> None:
        """Pieces sp[i] and rp[i] in one MPI_Sendrecv each (a missing side: MPI_PROC_NULL)."""
        counters, tag = self.counters, self.tag
        if len(sp) == 1 and len(rp) == 1:   # (the common exchange: one piece each way)
            s = sp[0]
            self.comm.Sendrecv(s, dest, tag, rp[0], source, tag)
            counters.calls += 1
            counters.messages += 1
            counters.bytes_sent += s.nbytes
            return
        counters.calls += 1
        for i in range(max(len(sp), len(rp), 1)):
            s = sp[i] if i < len(sp) else None
            r = rp[i] if i < len(rp) else None
            self.comm.Sendrecv(s, MPI.PROC_NULL if s is None else dest, tag,
                               r, MPI.PROC_NULL if r is None else source, tag)
            if s is not None:
                self.counters.messages += 1
                self.counters.bytes_sent += s.nbytes

    def _post(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> list:
        """Isend/Irecv of every (buffer, peer), pieces of at most max_count elements, counted."""
        self.counters.calls += 1
        reqs, tag, comm = [], self.tag, self.comm
        for buf, src in recvs:
            reqs += [comm.Irecv(p, src, tag) for p in _pieces(buf, self.max_count)]
        for buf, dest in sends:
            for p in _pieces(buf, self.max_count):
                reqs.append(comm.Isend(p, dest, tag))
                self.counters.messages += 1
                self.counters.bytes_sent += p.nbytes
        return reqs

    def _post_pairs(self, sp: list, dest: int | None, rp: list, source: int | None) -> list:
        """`_sendrecv`'s pieces posted at once (Irecv then Isend), counted."""
        return self._post([(s, dest) for s in sp], [(r, source) for r in rp])

    def _invoke(self, function: str, args: list) -> None:
        raise NotImplementedError

    # -- local work (the array backend) --------------------------------------------------
    def empty(self, n: int, dtype: Any) -> np.ndarray:
        return self.pool.take(n, dtype)

    # -- the MPI library's own collectives ----------------------------------------------
    def mpi(self, call: Any) -> None:
        """The library's own collective for `call` (`mpi_through`)."""
        self.mpi_through(call, self)

    @staticmethod
    def mpi_through(call: Any, through: Any) -> None:
        """MPI's own collective for `call`: which library function it is (`_MPI_FUNCTIONS`;
        `_send_recv` for a collective the table does not name), called through
        `through.mpi_call` (this transport, a request's, or a device group's, whose scratch
        and copies are on the device)."""
        _MPI_FUNCTIONS.get(call.collective.name, _send_recv)(through, call)

    def mpi_call(self, function: str, *args: Any) -> None:
        """Call communicator method `function` (e.g. "Allreduce") with ringmpi's arguments
        (arrays, IN_PLACE, op names), following ringmpi's rules for counts and NaN."""
        given = _given(args)
        op = next((a for a in args if isinstance(a, str)), None)
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        if op in ("MAX", "MIN") and arrays and arrays[-1].dtype.kind == "f":
            self._nan_propagating(function, args, op)
            return
        if function in _ELEMENTWISE and max((a.size for a in arrays), default=0) > self.max_count:
            self._in_pieces(function, args, arrays)
            return
        self._invoke(function, given)

    def mpi_plan(self, call: Any, args: dict) -> MPIPlan | None:
        """MPI's own collective for calls shaped like `call` with the user's arrays as they
        are (`_MPI_PLANS`, else as `_send_recv` calls it; the API builds the fast path from
        it), or None where this call shape needs the general path (`mpi`)."""
        spec = call.collective
        plan = _MPI_PLANS.get(spec.name)
        if plan is None:   # (as `_send_recv` calls it: a result shaped like the send buffer)
            return MPIPlan(spec.mpi_methods[0], call.op, None, args[spec.send_arg].dtype) if spec.mpi_methods else None
        return plan(self, call, args)

    def mpi_serves(self, call: Any) -> bool:
        """Whether the library's own collective can take `call`: its counts are C ints, but
        an element-wise one is cut into pieces (`_in_pieces`); a collective the library has
        no function for (its spec names none) it cannot take at all."""
        spec = call.collective
        return spec.name in _CUT or call.count <= self.max_count and (spec.name in _MPI_FUNCTIONS or
                                                                      bool(spec.mpi_methods))

    def device(self, backend: Any, aware: bool) -> Any:
        """The transport for calls on `backend`'s device buffers (`ringmpi.device`), made at
        first use and kept: its device scratch and pinned staging buffers live as long as
        this transport (a communicator's; a request's, whose staging is its own)."""
        g = self.devices.get(backend.name)
        if g is None:
            prof = self.profile
            alpha, beta = (prof.alpha, prof.beta) if prof is not None else (5e-6, 1 / 10e9)
            g = self.devices[backend.name] = DeviceGroup(self, backend, aware, alpha, beta)
        g.aware = aware
        g.chunk_fixed = settings().stage_chunk
        return g

    def _in_pieces(self, function: str, args: tuple, arrays: list) -> None:
        """An element-wise collective above the count limit: the same call on consecutive
        pieces of every buffer."""
        n = max(a.size for a in arrays)
        if settings().info and self.rank == 0:
            log(f"{function} of {n} elements: above the MPI count limit {self.max_count}, "
                      f"called in {-(-n // self.max_count)} pieces")
        for lo in range(0, n, self.max_count):
            self.mpi_call(function, *(a[lo:lo + self.max_count] if isinstance(a, np.ndarray) else a for a in args))

    def _nan_propagating(self, function: str, args: tuple, op: str) -> None:
        """MAX/MIN of floats as the library's MAX/MIN of integer keys that order like the
        floats, NaN (made canonical) being the largest key for MAX and the smallest for MIN."""
        keyed = [_float_keys(self, a, op) if isinstance(a, np.ndarray) else a for a in args]
        self.mpi_call(function, *keyed)
        arrays = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
        if any(a is IN_PLACE for a in args) or len(arrays) > 1:  # the last buffer is the result (not on a reduce's non-root)
            _from_keys(keyed[arrays[-1]], args[arrays[-1]])


class MPITransport(_Wire):
    """Point-to-point transport and per-communicator state over one intracommunicator."""

    def __init__(self, user: "MPI.Intracomm", *, backend: ArrayBackend = NUMPY, max_count: int = INT_MAX) -> None:
        self.user_comm = user
        self.rank = user.Get_rank()
        self.size = user.Get_size()
        self.backend = backend
        self.max_count = max_count
        self.counters = Counters()
        self.pool = ScratchPool(backend)
        self.seq = 0                      # calls begun so far (the same on every rank): the tag
        self.current = 0                  # the call a caller is in or waits for (the stall watch)
        self.tag = 0
        self.waiting_for: list[int] | None = None   # ranks a call is known to wait for (stall messages)
        self.profile: Any = None          # ringmpi.cost.Profile, read once (ringmpi.auto)
        self.choices = LRU(256)           # auto's decisions per call shape
        self.request_choices = LRU(256)   # the same for requests (the hierarchical ones run blocking only)
        self.request_plans = LRU(256)     # a request's call shape -> (algorithm, tunables, label)
        self.hides: bool | None = None    # whether a request can hide anything here (`api.overlaps`), asked once
        self._spare_pools: list = []      # scratch of completed requests, for the next ones
        self.last_choice: dict | None = None
        self.freed = False
        self.wire = False                 # (see below: set once the channels exist)
        self._posted: list = []           # the stall inspector's sends not yet known complete
        self.tuners = LRU(1024, refresh=False)            # online tuning per (collective, dtype, op, size bucket)
        # (dropped in the order made: the same on every rank, whatever the fast path served)
        # the duplicates are collective over the communicator: a rank that never comes is
        # named by the stall inspector like any other waiting call
        self.busy: str | None = "communicator set-up (MPI_Comm_dup)"  # the call in flight, for the stall watch
        stall.track(self)
        # plain mpi4py communicators, whatever `user` is (a ringmpi.Comm's collectives would
        # come back here), made with MPI_Comm_dup itself rather than a subclass's Dup
        self.comm = MPI.Intracomm(MPI.Intracomm.Dup(user))
        self.ctl = MPI.Intracomm(MPI.Intracomm.Dup(user))
        ub = self.comm.Get_attr(MPI.TAG_UB)
        self._tags = max(2, min(ub if isinstance(ub, int) else 32767, 1 << 30))  # call tags: 0 .. _tags-1
        self._watch_tag = self._tags      # the stall inspector's notes on `ctl` (<= TAG_UB)
        #: whether the inspector's thread may use MPI beside the caller's thread
        self.wire = self.size > 1 and MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._nodes: list[int] | None = None
        self._nodes = self.nodes          # collective: every rank's host, found now, while every rank is here
        self.busy = None
        self._shared: Any = None
        self._split: tuple | None = None      # (local group, cross group, node transport, node comm)
        self.devices: dict = {}              # device backend name -> its DeviceGroup (scratch, staging)

    # -- the call bracket: one tag per call, scratch afresh, watched by the stall inspector --
    def begin(self, name: str) -> int:
        """A call begins: its tag is its sequence number and what runs ("allreduce/ring"),
        so no message of one call can match another call, nor a call of another collective
        or algorithm that a mistaken rank makes at the same place (that wait is named and
        ended by the stall inspector instead of giving a silently wrong result)."""
        if requests.ACTIVE:
            requests.progress()
        self.seq += 1
        self.current = self.seq
        self._label_tag(name)
        self.pool.reset()
        self.busy = name
        return self.seq

    def describe(self, label: str) -> None:
        """What the call runs, once resolved (auto's choice), before any of its messages."""
        self.busy = label
        self._label_tag(label)

    def _label_tag(self, label: str) -> None:
        self.tag = _tag(self.seq, label, self._tags)

    def end(self) -> None:
        self.busy = None
        self.waiting_for = None

    def failed(self, err: BaseException, label: str | None = None, seq: int | None = None) -> BaseException:
        """The call in flight raised on this rank after it began (its body, or MPI itself):
        the other ranks may be waiting for this one inside the call, so they are told
        (`stall.announce`: they abort the job if they are still in it a few seconds later,
        naming this rank and the error). An MPI error comes back with ringmpi's prefix and
        what it most likely means; any other exception as it is."""
        label = label or self.busy or "a collective"
        if _is_rank_failure(err):
            return self.lost(err, label)
        if isinstance(err, MPI.Exception):
            why = _MPI_HINTS.get(err.Get_error_class(), "the ranks' calls may differ")
            text = (err.Get_error_string().strip().splitlines() or [""])[0]
            name = _ERROR_CLASSES.get(err.Get_error_class(), f"error class {err.Get_error_class()}")
            err = RingmpiError(f"ringmpi.{label.split('/')[0]} (rank {self.rank} of {self.size}): {label} failed in "
                               f"MPI ({name}: {text}): {why}; RINGMPI_CHECK=1 compares every rank's call before "
                               "any message")
        stall.announce(self, ("fail", self.current if seq is None else seq, f"{type(err).__name__}: {err}"))
        return err

    # -- a rank that died (MPI with ULFM fault tolerance) ------------------------------
    def lost(self, err: BaseException, label: str | None = None) -> RankFailure:
        """A rank of this communicator died (MPI_ERR_PROC_FAILED), or a survivor that saw it
        revoked our communicators (MPI_ERR_REVOKED). Revoke them all, so that every
        survivor's call ends too, whichever rank it waits for (ULFM's rule: a survivor that
        knows tells the others by revoking); stop the stall inspector's notes (none can
        reach a dead rank, and under ULFM no wait is endless); no failure note either: the
        survivors are meant to go on, not to abort."""
        self._revoke()
        RANK_FAILED.set()
        failed = self.failed_ranks()
        label = label or self.busy or "a collective"
        name = _ERROR_CLASSES.get(err.Get_error_class(), "?") if isinstance(err, MPI.Exception) else type(err).__name__
        who = (f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}" if failed
               else "a rank (another survivor revoked the communicator)")
        return RankFailure(f"ringmpi.{label.split('/')[0]} (rank {self.rank} of {self.size}): {label}: {who} of this "
                           f"communicator failed ({name}); its communicators are revoked: ringmpi.shrink(comm) "
                           "gives the survivors' communicator", failed)

    def _revoke(self) -> None:
        """Revoke this transport's communicators (the node split's too); no more notes."""
        self.wire = False
        comms = [self.comm, self.ctl]
        if self._split is not None:
            self._split[2]._revoke()
            comms.append(self._split[3])
        for c in comms:
            try:
                c.Revoke()
            except (MPI.Exception, NotImplementedError):
                pass

    def failed_ranks(self) -> list[int]:
        """The ranks this rank knows to have failed (MPI_Comm_get_failed), [] without ULFM."""
        try:
            g = self.comm.Get_failed()
            try:
                mine = self.comm.Get_group()
                found = MPI.Group.Translate_ranks(g, list(range(g.Get_size())), mine)
                mine.Free()
            finally:
                g.Free()
        except (MPI.Exception, NotImplementedError, AttributeError):
            return []
        return sorted(r for r in found if r != MPI.UNDEFINED)

    @contextlib.contextmanager
    def _survive(self, label: str) -> Iterator[None]:
        """A helper's own MPI call (barrier, object broadcast, ...) that meets a dead rank
        raises RankFailure, as a collective does."""
        try:
            yield
        except MPI.Exception as err:
            if _is_rank_failure(err):
                raise self.lost(err, label) from None
            raise

    # -- the stall inspector's notes (`ringmpi.stall`), sent and read on its thread ------
    def post(self, dest: int, note: tuple) -> None:
        """Send `note` to rank `dest` without waiting (the watch tag of the control channel)."""
        try:
            self._posted = [r for r in self._posted if not r.Test()]
            self._posted.append(self.ctl.isend(note, dest, self._watch_tag))
        except MPI.Exception as err:
            self._note_failed(err)

    def notes(self) -> list[tuple[int, tuple]]:
        """Every note that has arrived, as (source rank, note); waits for none."""
        out, st = [], MPI.Status()
        try:
            while (msg := self.ctl.improbe(MPI.ANY_SOURCE, self._watch_tag, st)) is not None:
                out.append((st.Get_source(), msg.recv()))
        except MPI.Exception as err:
            self._note_failed(err)
        return out

    def _note_failed(self, err: "MPI.Exception") -> None:
        """A note met a dead rank: no more notes on this communicator (its calls will raise)."""
        if not _is_rank_failure(err):
            raise err
        self.wire = False
        self._posted = []

    def flush(self, seconds: float) -> None:
        """Give the notes sent so far up to `seconds` to leave (at MPI_Finalize)."""
        end = time.monotonic() + seconds
        try:
            while self._posted and time.monotonic() < end:
                self._posted = [r for r in self._posted if not r.Test()]
                time.sleep(0.001)
        except MPI.Exception as err:
            self._note_failed(err)

    # -- data movement: blocking (beside requests in flight, tested in turn with them) ---
    def _sendrecv(self, sp: list, dest: int | None, rp: list, source: int | None) -> None:
        if requests.ACTIVE:
            self._beside_requests(self._post_pairs(sp, dest if sp else MPI.PROC_NULL, rp,
                                                   source if rp else MPI.PROC_NULL))
            return
        self._sendrecv_now(sp, dest, rp, source)

    def exchange(self, sends: Sequence[tuple[np.ndarray, int]],
                 recvs: Sequence[tuple[np.ndarray, int]]) -> None:
        """Post every receive and send at once, then wait for all (root fan-in / fan-out)."""
        reqs = self._post(sends, recvs)
        if requests.ACTIVE:
            self._beside_requests(reqs)
            return
        MPI.Request.Waitall(reqs)

    def _invoke(self, function: str, args: list) -> None:
        getattr(self.comm, function)(*args)

    @staticmethod
    def _beside_requests(reqs: list) -> None:
        """Wait for `reqs` while advancing this thread's requests in flight (MPI's progress
        rule: another rank may wait for one of them before it comes to this call)."""
        requests.engine().alongside(lambda: MPI.Request.Testall(reqs))

    def take_pool(self) -> ScratchPool:
        """Scratch for one request in flight (a pool a completed one gave back, or a new one)."""
        try:
            pool = self._spare_pools.pop()   # (list.pop and append are atomic: no lock)
        except IndexError:
            return ScratchPool(self.backend)
        pool.reset()
        return pool

    def give_pool(self, pool: ScratchPool) -> None:
        if len(self._spare_pools) < 8:       # (two threads may both see 7: nine, no harm)
            self._spare_pools.append(pool)

    def waiting(self, label: str, seq: int) -> tuple:
        """A caller waits for call `seq` (a request) outside `begin`/`end`: the stall
        inspector watches it; returns what to hand `waited` after."""
        before = self.busy, self.current
        self.busy, self.current = label, seq
        return before

    def waited(self, before: tuple) -> None:
        self.busy, self.current = before

    def wait_watched(self, request: Any, label: str, seq: int, status: Any = None) -> BaseException | None:
        """MPI_Wait for `request`, one of MPI's own requests (call `seq`, `label`), with the
        stall watch told that the caller waits for that call (`waiting` and `waited` around
        it); MPI's error as `failed` makes it (the other ranks told), or None. The caller
        decides what an error does to its request. An interrupt is raised as it is and
        leaves the call in flight."""
        busy, current = self.busy, self.current
        self.busy, self.current = label, seq
        try:
            _WAIT(request, status)
        except Exception as err:   # noqa: BLE001
            raised = self.failed(err, label, seq)
            if raised is not err:
                raised.__cause__ = err
            return raised
        finally:
            self.busy, self.current = busy, current
        return None

    def request_view(self, label: str) -> "RequestView":
        """A fresh suspending transport for one request of `label` (its sequence number and
        tag taken now: requests begin in the same order on every rank)."""
        self.seq += 1
        return RequestView(self, self.seq, _tag(self.seq, label, self._tags), label)

    def op_name(self, op: Any) -> str:
        """'SUM' for MPI.SUM, "sum" or "SUM"; a clear error for other ops."""
        if isinstance(op, MPI.Op):
            for name, mop in _MPI_OPS.items():
                if op == mop and name != "AVG":
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
        with self._survive("barrier"):
            self.comm.Barrier()

    def subgroup(self, ranks: list[int]) -> "MPI.Intracomm":
        """A new communicator of `ranks` (ranks of this one, in that order), collective over
        them only (MPI_Comm_create_group): torch creates a process group on its members alone."""
        members = self.comm.Get_group().Incl(list(ranks))
        try:
            return self.comm.Create_group(members)
        finally:
            members.Free()

    def wtime(self) -> float:
        return MPI.Wtime()

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        with self._survive("bcast_obj"):
            return self.ctl.bcast(obj, root)

    def allgather_obj(self, obj: Any) -> list:
        with self._survive("allgather_obj"):
            return self.ctl.allgather(obj)

    def allreduce_max(self, values: list) -> list:
        """Element-wise MAX over ranks (auto's timings: every rank then decides alike)."""
        arr = np.array(values, dtype=np.float64)
        busy = self.busy
        self.busy = f"{busy or 'auto'} (tuning exchange)"
        try:
            with self._survive(self.busy):
                self.ctl.Allreduce(MPI.IN_PLACE, arr, MPI.MAX)
        finally:
            self.busy = busy
        return arr.tolist()

    def mpi_function(self, function: str, op: str | None = None, dtype: Any = None) -> tuple[Any, Any, Any, Any]:
        """(the library's communicator method, its op object, its IN_PLACE, the MPI datatype
        of `dtype`) for the fast path's plans, which call MPI with the user's arrays as they
        are. A buffer given as (array, datatype) costs mpi4py less than a bare array (it
        needs no format string from numpy), and the datatype comes from the
        canonical dtype, so 'l' and 'q' arrays give every rank the same MPI type."""
        mpi_type = None
        if dtype is not None:
            dt = np.dtype(dtype)
            mpi_type = _type_of_code((canonical(dt) or dt).char)  # predefined: ops work
        return getattr(self.comm, function), _MPI_OPS[op] if op else None, MPI.IN_PLACE, mpi_type

    def gather_at(self, obj: Any, leader: int = 0) -> list | None:
        """Every rank's `obj` at `leader` (None elsewhere), point to point on the control
        communicator, so that while it waits the leader knows which ranks have not arrived
        (`waiting_for`, named by the stall inspector). Its tag is the call's sequence number
        alone: the ranks may disagree on what the call is (which this is there to find)."""
        if self.rank != leader:
            self.ctl.send(obj, leader, self.seq % self._tags)
            return None
        got: list = [None] * self.size
        got[leader] = obj
        others = [q for q in range(self.size) if q != leader]
        reqs = [self.ctl.irecv(source=q, tag=self.seq % self._tags) for q in others]
        pending = dict(zip(others, reqs))
        while pending:
            self.waiting_for = sorted(pending)
            for q, req in list(pending.items()):
                done, value = req.test()
                if done:
                    got[q] = value
                    del pending[q]
            if pending:
                time.sleep(0.0005 if len(pending) < len(others) else 0.0001)
        self.waiting_for = None
        return got

    @property
    def nodes(self) -> list[int]:
        """The node (shared-memory domain, MPI_COMM_TYPE_SHARED) of every rank, named by its
        lowest rank; found collectively at first use, then kept."""
        if self._nodes is None:   # (buffer collectives: they wait without the GIL; see the module doc)
            node = self.ctl.Split_type(MPI.COMM_TYPE_SHARED)
            lowest = np.array([self.rank], np.int64)
            node.Allreduce(MPI.IN_PLACE, lowest, MPI.MIN)
            node.Free()
            every = np.empty(self.size, np.int64)
            self.ctl.Allgather(lowest, every)
            self._nodes = every.tolist()
        return self._nodes

    def shared(self) -> Any:
        """The shared-memory transport of this communicator for a blocking call, once no
        request runs on it (`SharedTransport.drained`)."""
        s = self.shared_memory()
        s.drained()
        return s

    def shared_memory(self) -> Any:
        """The shared-memory transport of this communicator (`ringmpi.shm`), made at first
        use: collective, and only when every rank is on one host."""
        if self._shared is None:
            if len(set(self.nodes)) != 1:
                raise ValueError(f"shared memory needs every rank on one host; these {self.size} ranks are on "
                                 f"{len(set(self.nodes))}")
            from .shm import SharedTransport
            self._shared = SharedTransport(self)
        return self._shared

    def split_nodes(self) -> tuple[Any, Any]:
        """The groups of a hierarchical schedule (`ringmpi.transport.split_nodes`): the
        ranks of this node, over shared memory when there are several, and the ranks at
        this rank's place on every node (messages on this communicator). Collective at
        first use, then kept."""
        if self._split is None:
            nodes = self.nodes
            node_comm = self.ctl.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            node = MPITransport(node_comm, backend=self.backend, max_count=self.max_count)
            node._nodes = [0] * node.size
            local = node.shared() if node.size > 1 else node
            _, cross = split_nodes(self, nodes)
            self._split = (local, cross, node, node_comm)
        return self._split[0], self._split[1]

    def hostnames(self) -> list[str]:
        return self.ctl.allgather(MPI.Get_processor_name())

    def release(self) -> None:
        """The user's communicator is being freed: free the duplicates and the scratch (the
        duplicates on the stall inspector's thread when it uses them: `stall.free_later`)."""
        self.freed = True
        self.pool = ScratchPool(self.backend)
        self._spare_pools = []
        self.devices.clear()
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.release()
        if self._split is not None:
            _, _, node, node_comm = self._split   # node.release() releases the local shared transport
            node.release()
            if not MPI.Is_finalized():
                node_comm.Free()
            self._split = None
        mine = [c for c in (self.comm, self.ctl) if c != MPI.COMM_NULL and not MPI.Is_finalized()]
        if self.wire:
            stall.free_later(mine)
        else:
            for c in mine:
                c.Free()


class RequestView(_Wire):
    """The transport one request's body runs on (`ringmpi.requests`): the same messages and
    tag rules as the blocking transport, but each exchange posts its messages (or MPI's own
    nonblocking collective, "I" + the function) and suspends the body until the engine finds
    them complete. Its scratch is its own: a blocking call beside it resets the
    communicator's. A shared-memory body (`ringmpi.shm`: messages without tags, one call
    at a time) takes its place in the transport's queue when the request starts, in the
    order of the starts on every rank, runs once it is first, and suspends where a blocking
    call would spin on a flag (`await_word`). The hierarchical schedule runs blocking only."""
    nonblocking = True

    def __init__(self, group: MPITransport, seq: int, tag: int, label: str) -> None:
        self.group, self.label = group, label
        self.comm = group.comm
        self.rank, self.size = group.rank, group.size
        self.backend, self.max_count, self.counters = group.backend, group.max_count, group.counters
        self.pool = group.take_pool()
        self.seq, self.tag = seq, tag
        self.pending: list = []              # the MPI requests the body waits for
        self.suspend: Any = None             # set by the engine: switches back to who advanced the body
        self.posting = self.binding = False  # (`post`, `bind`: MPI's own call posted or bound, no body)
        self.posted: tuple | None = None     # (`post`) the nonblocking method it called and its arguments
        self.failure: BaseException | None = None   # MPI's error met while waiting (`wait_all`)
        self.until: Any = None               # or a test the body waits for instead (shared memory)
        self.devices: dict = {}
        self.queued: Any = None              # the shared-memory transport whose queue holds this call
        self.inline = False                  # the body runs on its waiter's stack (`requests.Engine._inline`)

    def relabel(self, label: str) -> None:
        """What the request runs, resolved (auto's choice): its tag salted with it, as a
        blocking call's is (`MPITransport.describe`)."""
        self.label, self.tag = label, _tag(self.seq, label, self.group._tags)

    def post(self, call: Any) -> None:
        """Post MPI's own nonblocking collective for `call` without suspending (a call that
        is one library call: `api._one_mpi_call`, so none of `mpi_call`'s special cases
        applies); `pending` holds its request, `posted` the method and arguments it was
        posted with (`api._Bound.relaunch` posts the next call on the same arrays so)."""
        self.posting = True
        try:
            self.mpi(call)
        finally:
            self.posting = False

    def mpi_call(self, function: str, *args: Any) -> None:
        if self.posting:   # (see `post`)
            given = _given(args)
            self.posted = (_NONBLOCKING[function], given)
            self._invoke(function, given)
            return
        super().mpi_call(function, *args)

    def bind(self, call: Any) -> Any:
        """MPI's own persistent collective for `call` (MPI-4: MPI_Allreduce_init, ...),
        inactive; None where the library or mpi4py has none."""
        self.binding = True
        try:
            self.mpi(call)
        except (AttributeError, NotImplementedError, MPI.Exception):
            return None
        finally:
            self.binding = False
        bound, self.pending = self.pending[0], []
        return bound

    def failed(self, err: BaseException) -> BaseException:
        """The request's body raised (see `MPITransport.failed`): its own call is named."""
        return self.group.failed(err, self.label, self.seq)

    def again(self, label: str, mpi: bool = False) -> None:
        """A persistent request starts again: the next sequence number and tag, scratch reset
        (`mpi`: a call that is one of MPI's own collectives, which uses neither)."""
        g = self.group
        g.seq += 1
        self.seq, self.label = g.seq, label
        self.inline = False   # (this call's body runs where its first advance finds it)
        if mpi:
            return
        self.tag = _tag(g.seq, label, g._tags)
        if self.pool is None:
            self.pool = g.take_pool()   # (reset)
        else:
            self.pool.reset()

    def close(self) -> None:
        """The call is complete: its scratch goes back to the communicator for the next
        request (a fresh multi-MiB buffer per request would pay its page faults every time:
        it made large requests several times slower than blocking calls; benchmarks/README.md),
        and its place in the shared-memory transport's queue to the next call."""
        s, self.queued = self.queued, None
        if s is not None:
            s.queue.remove(self)
        if self.pool is not None:
            self.group.give_pool(self.pool)
            self.pool = None

    def _await(self, reqs: list) -> None:
        if reqs:
            self.pending = reqs
            if self.posting:
                return
            try:
                self.suspend()
            except BaseException:
                # an MPI error in this round: its other messages may still be in flight and
                # write into this scratch, which is never reused (kept with them, for good)
                _ABANDONED.append((self.pending, self.pool))
                self.pool = None
                raise
            finally:
                self.pending = []

    def _alone(self) -> bool:
        """Whether the body runs on its waiter's stack with no other request in flight: its
        messages then go as a blocking call's (one MPI_Sendrecv, not an Isend, an Irecv and
        their waits: a request waited for at once costs what the blocking call does)."""
        return self.inline and len(requests.ACTIVE) == 1

    def _sendrecv(self, sp: list, dest: int | None, rp: list, source: int | None) -> None:
        if self._alone():
            self._sendrecv_now(sp, dest, rp, source)
            return
        self._await(self._post_pairs(sp, dest, rp, source))

    def exchange(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        self._await(self._post(sends, recvs))

    def _invoke(self, function: str, args: list) -> None:
        if self.binding:
            self.pending = [getattr(self.comm, function + "_init")(*args)]
            return
        if self._alone():
            getattr(self.comm, function)(*args)
            return
        self._await([_NONBLOCKING[function](self.comm, *args)])

    def ready(self) -> bool:
        """Whether the messages in flight are complete (MPI's error in them raised here)."""
        if self.failure is not None:
            err, self.failure = self.failure, None
            raise err
        if self.until is not None:
            return self.until()
        return MPI.Request.Testall(self.pending)

    def wait_all(self) -> None:
        """Block in MPI until this request's messages in flight complete; MPI's error is
        kept for `ready`, which raises it (the engine delivers it into the body). A test
        (shared memory) is polled a while, then the core yielded: the engine tests again."""
        if self.until is not None:
            if not _polled(self.until):
                requests.yield_core()
            return
        try:
            MPI.Request.Waitall(self.pending)
        except MPI.Exception as err:
            self.failure = err

    @property
    def nodes(self) -> list[int]:
        return self.group.nodes

    def take_shared(self, nbytes: int) -> None:
        """At the start, on the caller's thread: this call's place in the shared-memory
        transport's queue, after the arena is grown to `nbytes` where it is smaller (which is
        collective: every rank decides the same at the same start, once the calls before
        have left the transport)."""
        s = self.group.shared_memory()
        if nbytes > s.arena:
            s.drained()
            s.reserve(nbytes)
        s.queue.append(self)
        self.queued = s

    def shared(self) -> Any:
        """The shared-memory transport, once this call is first in its queue (its waits on
        flags then suspend this body: `SharedTransport._await`) until it is complete (`close`)."""
        s = self.queued
        if s is None:
            raise RuntimeError(f"{self.label}: a shared-memory body on a request that took no place at its start")
        if s.queue[0] is not self:
            self._await_until(lambda: s.queue[0] is self)
        return s

    def await_word(self, words: memoryview, i: int, target: int) -> None:
        """Until words[i] >= target (a peer's flag in shared memory): polled a while on a
        caller's thread (a wait that came at once runs at a blocking call's speed), then
        the body suspends until the engine finds it set."""
        self._await_until(lambda: words[i] >= target)

    def _await_until(self, test: Callable[[], bool]) -> None:
        if test() or not requests.on_progress_thread() and _polled(test):
            return
        self.until, self.pending = test, _UNTIL
        try:
            self.suspend()
        finally:
            self.until, self.pending = None, []

    def split_nodes(self) -> tuple[Any, Any]:
        raise ValueError("the hierarchical schedule runs blocking calls only (shared memory inside a host)")

    @property
    def profile(self) -> Any:
        return self.group.profile


def _polled(test: Callable[[], bool]) -> bool:
    """Whether `test()` (a peer's flag in shared memory) came true within as many polls as a
    blocking call spins before it yields the core (`shm.SPINS`)."""
    for _ in range(SPINS):
        if test():
            return True
    return False


_ELEMENTWISE = ("Allreduce", "Reduce", "Bcast")
_CUT = frozenset({"allreduce", "reduce", "broadcast"})   # the collectives whose own call is one of those
_ABANDONED: list = []   # (MPI requests, scratch) of request rounds that failed (`RequestView._await`)
_UNTIL = [None]         # a request's `pending` while it waits for a test, not for MPI requests
_ERROR_CLASSES = {getattr(MPI, n): f"MPI_{n}" for n in sorted(dir(MPI), reverse=True)
                  if n.startswith("ERR_") and isinstance(getattr(MPI, n), int) and n != "ERR_LASTCODE"}


def _given(args: tuple) -> list:
    """ringmpi's arguments of MPI's own collective as mpi4py takes them: an op name as
    MPI's op, an array as MPI may be handed it (`wire`), IN_PLACE as MPI's."""
    return [_MPI_OPS[a] if isinstance(a, str) else wire(a) if isinstance(a, np.ndarray) else
            MPI.IN_PLACE if a is IN_PLACE else a for a in args]


class _Nonblocking(dict):
    """A communicator method's nonblocking one ("Allreduce" -> MPI.Intracomm.Iallreduce),
    looked up once, not built at each request's start."""

    def __missing__(self, function: str) -> Any:
        method = self[function] = getattr(MPI.Intracomm, "I" + function[0].lower() + function[1:])
        return method


_NONBLOCKING = _Nonblocking()


# -- MPI's own collective for a Call: which library function, with which arguments ----------
def _allreduce(t: Any, call: Any) -> None:
    t.mpi_call("Allreduce", IN_PLACE if call.inplace else call.send, call.recv, call.op)


def _reduce_scatter(t: Any, call: Any) -> None:
    # MPI's in-place form leaves the result at the front of the buffer, ours at block r;
    # an empty block still carries the buffer's address, which MPICH rejects as aliased.
    alias = call.inplace or (call.recv.size == 0 and call.send.size > 0)
    if not alias and call.count and len(set(call.counts)) == 1:   # what the plan calls (`_reduce_scatter_plan`)
        t.mpi_call("Reduce_scatter_block", call.send, call.recv, call.op)
        return
    out = t.empty(call.recv.size, call.dtype) if alias else call.recv
    t.mpi_call("Reduce_scatter", call.send, out, list(call.counts), call.op)
    if out is not call.recv:
        t.copy(out, call.recv)


def _allgather(t: Any, call: Any) -> None:
    if len(set(call.counts)) == 1:   # what the plan calls: a rank on the full path meets the others
        t.mpi_call("Allgather", IN_PLACE if call.inplace else call.send, call.recv)
        return
    displs = offsets(call.counts)[:-1]
    t.mpi_call("Allgatherv", IN_PLACE if call.inplace else call.send, [call.recv, (list(call.counts), displs)])


def _broadcast(t: Any, call: Any) -> None:
    t.mpi_call("Bcast", call.recv, call.root)


def _reduce(t: Any, call: Any) -> None:
    t.mpi_call("Reduce", IN_PLACE if call.inplace else call.send, call.recv, call.op, call.root)


def _alltoall(t: Any, call: Any) -> None:
    t.mpi_call("Alltoall", IN_PLACE if call.inplace else call.send, call.recv)


def _send_recv(t: Any, call: Any) -> None:
    # a collective added by its spec alone: MPI's function that its spec names first, taking
    # (send, recv[, op]) and leaving a result shaped like the input, as MPI_Allreduce does
    # (MPI_Scan, MPI_Exscan); a collective of another shape names its own here
    op = (call.op,) if call.op is not None else ()
    t.mpi_call(call.collective.mpi_methods[0], IN_PLACE if call.inplace else call.send, call.recv, *op)


_MPI_FUNCTIONS = {"allreduce": _allreduce, "reduce_scatter": _reduce_scatter, "allgather": _allgather,
                  "broadcast": _broadcast, "reduce": _reduce, "alltoall": _alltoall}


# -- MPI's own collective on the user's arrays as they are (`MPIPlan`: the fast path) ------------
#: a new all-reduce result up to this size is the send buffer's copy reduced in place
#: (`api.send_recv_plan`): the copy costs less than the second buffer mpi4py parses; at
#: 4 KiB it loses (benchmarks/README.md, "Figures behind constants in the code")
_COPY_IN_PLACE = 1024


def _allreduce_plan(t: Any, call: Any, args: dict) -> MPIPlan:
    send = args["sendbuf"]
    return MPIPlan("Allreduce", call.op, None, send.dtype, copy_in_place=send.nbytes <= _COPY_IN_PLACE)


def _reduce_scatter_plan(t: Any, call: Any, args: dict) -> MPIPlan | None:
    if call.inplace or args.get("counts") is not None or not call.count or call.count % t.size:
        return None  # ringmpi's in-place result sits in block r, MPI's at the front
    return MPIPlan("Reduce_scatter_block", call.op, (call.count // t.size,), args["sendbuf"].dtype)


def _allgather_plan(t: Any, call: Any, args: dict) -> MPIPlan | None:
    if args.get("counts") is not None:
        return None
    return MPIPlan("Allgather", None, (call.count,), args["sendbuf"].dtype)


def _broadcast_plan(t: Any, call: Any, args: dict) -> MPIPlan:
    root = call.root
    return MPIPlan("Bcast", build=lambda buf, _: ((buf, root), buf))


def _reduce_plan(t: Any, call: Any, args: dict) -> MPIPlan:
    # as an MPIPlan without `build`, with the root: a result only there (a new array,
    # IN_PLACE, or the user's, which must not overlap the send buffer), the send buffer
    # alone elsewhere
    dtype = args["sendbuf"].dtype
    _, mpi_op, in_place, mpi_type = t.mpi_function("Reduce", call.op, dtype)
    root = call.root
    may_share = np.may_share_memory
    if t.rank != root:
        def build(sendbuf: Any, recvbuf: Any) -> tuple | None:
            return ((sendbuf, mpi_type), None, mpi_op, root), None
    else:
        def build(sendbuf: Any, recvbuf: Any) -> tuple | None:
            if recvbuf is None:
                recvbuf = np.empty(sendbuf.shape, dtype)
            elif recvbuf is sendbuf:
                return (in_place, (recvbuf, mpi_type), mpi_op, root), recvbuf
            elif (sendbuf.base is not None or recvbuf.base is not None) and may_share(sendbuf, recvbuf):
                return None
            return ((sendbuf, mpi_type), (recvbuf, mpi_type), mpi_op, root), recvbuf
    return MPIPlan("Reduce", build=build)


def _alltoall_plan(t: Any, call: Any, args: dict) -> MPIPlan:
    return MPIPlan("Alltoall", None, None, args["sendbuf"].dtype)


_MPI_PLANS = {"allreduce": _allreduce_plan, "reduce_scatter": _reduce_scatter_plan, "allgather": _allgather_plan,
              "broadcast": _broadcast_plan, "reduce": _reduce_plan, "alltoall": _alltoall_plan}

_SALTS = 251                 # (prime) labels per sequence number in the tag space
_SALT: dict[str, int] = {}   # label -> 1 .. _SALTS-1, the same in every process (not hash())


def _tag(seq: int, label: str, tags: int) -> int:
    """The tag of call `seq` running `label`: tags salted by what runs (see `begin`)."""
    return (seq * _SALTS + (_SALT.get(label) or _salt(label))) % tags


def _salt(label: str) -> int:
    value = _SALT[label] = 1 + zlib.crc32(label.encode()) % (_SALTS - 1)
    return value


#: what an MPI error inside a collective most likely means (error class -> hint)
_MPI_HINTS = {MPI.ERR_TRUNCATE: "a message from another rank was longer than this rank expected, so the ranks' "
                                "calls differ (count, dtype, counts, root, algorithm or collective)",
              MPI.ERR_COUNT: "the ranks' counts may differ", MPI.ERR_TYPE: "the ranks' dtypes may differ",
              MPI.ERR_ROOT: "the ranks' roots may differ", MPI.ERR_OP: "the ranks' ops may differ"}
_SIGNED = {4: np.int32, 8: np.int64}


def _float_keys(t: MPITransport, a: np.ndarray, op: str) -> np.ndarray:
    """Integer keys in scratch memory whose order is the floats' order: for non-negative
    floats the bit pattern, for negative ones the pattern with all bits but the sign flipped.
    NaN becomes +qNaN (above +inf) for MAX, -qNaN (below -inf) for MIN."""
    it = _SIGNED[a.itemsize]
    bits = t.empty(a.size, it)
    np.copyto(bits, a.view(it))
    nan = np.isnan(a)
    if nan.any():
        bits[nan] = np.array([np.copysign(np.nan, 1.0 if op == "MAX" else -1.0)], a.dtype).view(it)[0]
    flip = np.iinfo(it).max
    np.bitwise_xor(bits, flip, out=bits, where=bits < 0)
    return bits


def _from_keys(keys: np.ndarray, out: np.ndarray) -> None:
    flip = np.iinfo(keys.dtype).max
    np.bitwise_xor(keys, flip, out=keys, where=keys < 0)
    np.copyto(out, keys.view(out.dtype))


def library_file() -> str | None:
    """The MPI library this process loaded (from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {ln.split()[-1] for ln in fh if "libmpi" in ln and "/" in ln}
    except OSError:
        return None
    return next((q for q in sorted(paths) if "libmpi.so" in q or "libmpi_" not in q), None)


def selection_default() -> dict | None:
    """MPICH's built-in collective selection tree (the JSON its library carries), or None
    under another MPI: the base of an exported MPICH tuning file."""
    import json
    path = library_file()
    if not path or "MPICH" not in library_version():
        return None
    data = open(path, "rb").read()
    best, pos = None, 0
    while (i := data.find(b'{"collective=', pos)) >= 0:
        end = data.find(b"\x00", i)
        pos = end
        blob = data[i:end]
        if b"MPIR_Allreduce_intra" in blob and (best is None or len(blob) > len(best)):
            best = blob
    return json.loads(best) if best else None


def world_position() -> tuple[int, int]:
    """(rank, size) in COMM_WORLD: where an error that has no communicator of its own happened."""
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def abort_on_exception(tp: type, value: BaseException, tb: Any) -> None:
    """sys.excepthook under RINGMPI_ABORT_ON_EXCEPTION=1: the traceback, each line tagged
    with the rank, then MPI_Abort, so the other ranks do not wait forever for this one."""
    if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return   # nobody waits for this rank: Python's own report follows
    r, p = world_position()
    text = "".join(traceback.format_exception(tp, value, tb))
    stall.die("".join(f"[rank {r}] {line}\n" for line in text.splitlines()) +
              f"ringmpi: rank {r} of {p} raised an uncaught {tp.__name__}; aborting the job "
              "(RINGMPI_ABORT_ON_EXCEPTION=0 turns this off)\n", MPI.COMM_WORLD.Abort, 1, r)


#: called when a communicator's transport is freed (the call pipeline forgets its plans)
ON_FREE: list = []


def _delete(_comm: Any, _key: int, t: MPITransport) -> None:
    for fn in ON_FREE:
        fn()
    requests.engine().report(t, "when their communicator was freed")
    t.release()
    global _LAST
    if _LAST is not None and _LAST[1] is t:
        _LAST = None


def _at_finalize(_comm: Any, _key: int, _value: Any) -> None:
    """MPI_Finalize called by the program (COMM_SELF's attributes go first, while MPI still
    works): the stall inspector tells the peers that this rank has finished, then stops
    using MPI. mpi4py's own finalize at exit runs after Python's (Py_AtExit), where no
    Python callback runs: `atexit` does the same for it."""
    stall.finish()


#: a rank of a communicator of this process died (ULFM): MPI_Finalize gets a deadline
RANK_FAILED = threading.Event()
#: seconds MPI_Finalize may take at exit after a rank failure
FINALIZE_DEADLINE = 10.0


def _finalize_after_a_failure() -> None:
    """At exit, after a rank failure, MPI_Finalize under a deadline. Open MPI 5's finalize
    waits in a PMIx fence that can wait for the dead rank for ever (open-mpi/ompi#11404;
    the README's survivors example met it, CHANGELOG). mpi4py finalizes later, from C
    (Py_AtExit), where nothing in Python can run any more; here, before it, a timer still
    can: the work is done, so the process leaves as a program that returned (status 0),
    saying so on stderr."""
    if not RANK_FAILED.is_set() or MPI.Is_finalized():
        return
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()

    def leave() -> None:
        os.write(2, f"ringmpi: MPI_Finalize did not return within {FINALIZE_DEADLINE:g} s after a rank failure "
                    "(Open MPI's ULFM finalize waits for the dead rank): leaving without it\n".encode())
        os._exit(0)
    timer = threading.Timer(FINALIZE_DEADLINE, leave)
    timer.daemon = True
    timer.start()
    finalize = _c_function("MPI_Finalize")   # (the GIL let go for the timer; mpi4py's Finalize keeps it)
    if finalize is not None:
        finalize()
    else:
        MPI.Finalize()
    timer.cancel()


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(delete_fn=_at_finalize), True)
atexit.register(_finalize_after_a_failure)     # (first registered: run after the others)
atexit.register(stall.finish)
atexit.register(lambda: requests.engine().at_exit() if requests.ACTIVE or requests.engine().unwaited else None)
_LAST: "tuple[Any, MPITransport] | None" = None   # (user communicator, its transport): the one-entry fast path
_MAKING = threading.Lock()                    # guards _MAKERS
_MAKERS: "dict[int, threading.Lock]" = {}     # communicator handle -> the lock of its transport's set-up


_RANK_FAILURES = frozenset(getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
                           if isinstance(getattr(MPI, n, None), int))


def _is_rank_failure(err: BaseException) -> bool:
    return isinstance(err, MPI.Exception) and err.Get_error_class() in _RANK_FAILURES


def shrink(comm: "MPI.Intracomm | None" = None) -> "MPI.Intracomm":
    """The survivors of `comm` after a rank failure, as a new communicator (ULFM's
    MPI_Comm_shrink; collective over the survivors, ranks renumbered in order). ringmpi's
    communicators of `comm` are revoked first, so a survivor still inside a ringmpi call
    on it comes out with RankFailure and joins. `comm` itself is not revoked: it is the
    caller's (and may be COMM_WORLD)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    RANK_FAILED.set()
    t = comm.Get_attr(_KEYVAL) if isinstance(comm, MPI.Intracomm) else None
    if t is not None:
        t._revoke()
    try:
        return MPI.Intracomm(comm.Shrink())
    except (NotImplementedError, MPI.Exception) as err:
        r, p = comm.Get_rank(), comm.Get_size()
        raise RingmpiUsageError(f"ringmpi.shrink (rank {r} of {p}): needs an MPI with ULFM fault tolerance, enabled "
                                f"at launch (Open MPI 5: python -m ringmpi.launch --fault-tolerant ...); this one "
                                f"says: {err}") from None


def fault_tolerant() -> bool:
    """Whether this job runs with ULFM fault tolerance on (Open MPI's `--with-ft ulfm` sets
    mpi_ft_enable; without it a rank's death ends the job, whatever the program does)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes") and hasattr(MPI.Comm, "Shrink")


def transport(comm: "MPI.Intracomm | None" = None) -> MPITransport:
    """The transport of `comm` (COMM_WORLD when None), made at its first use. Thread-safe:
    one lock per communicator around the (collective) set-up, never one for all, since two
    threads may set up two communicators in different orders on different ranks."""
    global _LAST
    if comm is None:
        comm = MPI.COMM_WORLD
    last = _LAST      # one read: another thread may replace it meanwhile
    if last is not None and last[0] is comm and not last[1].freed:
        return last[1]
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        what = "MPI.COMM_NULL (a freed communicator?)" if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL else \
            "an inter-communicator" if isinstance(comm, MPI.Intercomm) else f"{type(comm).__module__}.{type(comm).__name__}"
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {what}")
    t = comm.Get_attr(_KEYVAL)
    if t is None:
        handle = MPI._handleof(comm)
        with _MAKING:
            lock = _MAKERS.setdefault(handle, threading.Lock())
        with lock:
            t = comm.Get_attr(_KEYVAL)
            if t is None:
                t = MPITransport(comm)
                comm.Set_attr(_KEYVAL, t)
        with _MAKING:
            _MAKERS.pop(handle, None)
    _LAST = (comm, t)
    return t
