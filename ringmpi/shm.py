"""A shared-memory transport for the ranks of one host.

Every rank owns POSIX shared-memory segments that every other rank of the host maps: a
scratch arena (grown, never shrunk below what the recent calls used, re-made collectively)
and the arrays users allocate with `ringmpi.shared_empty`. A "message" is not copied into a
queue: the sender publishes where the block lies in its own segment (a segment index, an
offset and a length in a control row of its segment, then a counter), the receiver reads it
straight from the sender's memory into its buffer, or reduces it straight into its output
(`sendrecv_reduce`: out = received op mine, one pass, no intermediate copy), and
acknowledges; the sender returns once its block has been read, so the schedule may reuse it
at once, as after MPI_Sendrecv. Synchronisation is by these counters (flags), spinning and
then yielding the core: no message matching, no lock.

A block to send that does not lie in a shared segment (a user's numpy array) is read by
the receiver straight from the sender's private memory with Linux cross-memory attach
(`ringmpi.cma`: process_vm_readv, one copy, as MPI libraries do for large messages; a
received-then-reduced block lands in the output and is reduced there) where
every rank of the host may read every other's memory, for blocks from CMA_MIN up (below,
the ring runs in parts whose staged copies stay in cache, which costs less); otherwise it
is first copied into the arena. A buffer from `shared_empty` costs nothing extra.

The schedules run on it unchanged (`ringmpi.schedules.shm`: ring all-reduce, reduce-scatter,
all-gather and the pipelined broadcast with their work buffers in the arena). Every rank
reduces the same blocks in the same order as over MPI: the same bits.

Segments are unlinked as soon as every rank has mapped them, so a killed job leaves nothing
in /dev/shm; they are unmapped when the communicator is freed.
"""
from __future__ import annotations

import mmap
import os
import secrets
import time
import weakref
from collections import deque
from typing import Any, Sequence

import numpy as np

from . import cma, requests
from .backend import NUMPY
from .settings import settings
from .transport import CountedMemory, Counters, split_nodes

__all__ = ["SharedTransport", "Segment"]

ALIGN = 64                 # cache line: blocks of different ranks never share one
SPINS = 200                # polls before yielding the core
READ_CHUNK = 1 << 20       # a block read across is read and reduced this much at a time, in the cache
                           # (in place it beats a whole block at once; benchmarks/README.md, "Figures
                           # behind constants in the code")
CMA_MIN = 4 << 20          # smaller private blocks are staged, the ring in parts (schedules.shm): a part's
                           # copy stays in cache, and pinning the pages for a cross-memory read costs more
                           # (the two cross near 4 MiB blocks: benchmarks/README.md, same section)
#: control words per peer: messages published to it, and the last one's segment, offset,
#: length; messages read from it (the acknowledgement)
SENT, SEG, OFF, LEN, ACKED = range(5)
WORDS = 5


class Segment:
    """One POSIX shared-memory segment: created (and later unlinked) by its owner, mapped by
    every rank of the host."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        self.name, self.size = name, size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            import _posixshmem  # CPython's shm_open, without multiprocessing's resource tracker process
            fd = _posixshmem.shm_open("/" + name, flags, 0o600)
            self._unlink = lambda: _posixshmem.shm_unlink("/" + name)
        except ImportError:  # pragma: no cover (a platform without POSIX shared memory)
            path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", name)
            fd = os.open(path, flags, 0o600)
            self._unlink = lambda: os.unlink(path)
        try:
            if create:
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.base = self.array.ctypes.data

    def unlink(self) -> None:
        try:
            self._unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]
        try:
            self.map.close()
        except BufferError:  # a view still alive (a user's shared array): the mapping goes with it
            pass


class SharedTransport(CountedMemory):
    """The transport of the ranks of one host over shared memory (see the module doc).

    `group` is the MPI transport of the same ranks: it carries the collective set-up (segment
    names), the call bracket (sequence number, stall watch) and anything this transport does
    not do itself (`mpi`)."""

    on_device = False
    nonblocking = False

    def __init__(self, group: Any, arena: int = 1 << 20) -> None:
        self.group = group
        self.rank, self.size = group.rank, group.size
        self.backend = NUMPY
        self.counters = Counters()
        self.tag = secrets.token_hex(4)
        self.segments: list[Segment | None] = []   # mine: 0 is control + arena, then user arrays
        self.peers: list[list[Segment | None]] = [[] for _ in range(self.size)]
        self._owners: dict[int, weakref.ref] = {}   # segment index -> the user array it holds
        self._ctl_bytes = _round(WORDS * self.size * 8)
        self.sent = [0] * self.size
        self.read = [0] * self.size
        self._cursor = 0
        self._arena = 0
        self._grow(arena)
        self.pids: list[int] = []
        self._cma = self._probe_cma()
        self._landing: np.ndarray | None = None   # see _scratch
        #: the requests that run on this transport (`mpicomm.RequestView.take_shared`), in the
        #: order they were started, the same on every rank: messages here have no tags, so
        #: one call at a time uses it, the first in the queue; a blocking call waits until
        #: none is left (`drained`)
        self.queue: deque = deque()

    def _await(self, words: memoryview, i: int, target: int) -> None:
        """Until words[i] >= target: spinning for a blocking call (which runs only once the
        queue is empty), else the first request in the queue, the one running here, suspends
        its body (`RequestView.await_word`)."""
        if self.queue:
            self.queue[0].await_word(words, i, target)
        else:
            _wait(words, i, target)

    def drained(self) -> None:
        """Until no request runs or waits on this transport (advancing this thread's): a
        blocking call, or a collective set-up, may use it then."""
        if self.queue:
            requests.engine().alongside(lambda: not self.queue)

    def _probe_cma(self) -> cma.Reader | None:
        """Collective: a reader of the other ranks' private memory if every rank can read
        every other's (each reads a random token from each), else None: every rank then
        stages, so sender and receiver always agree on how a block travels."""
        on = settings().shm_cma
        if on:
            cma.allow_peers()
        reader = cma.Reader()
        token = np.frombuffer(secrets.token_bytes(16), np.uint8).copy()
        every = self.group.allgather_obj((os.getpid(), token.ctypes.data, token.tobytes())
                                         if on and reader.usable else None)
        ok = all(e is not None for e in every) and all(
            reader.probe(*e) for q, e in enumerate(every) if q != self.rank)
        if not all(self.group.allgather_obj(ok)):   # (the token stays alive until every rank has read it)
            return None
        self.pids = [e[0] for e in every]
        return reader

    @property
    def cross_memory(self) -> bool:
        """Whether ordinary arrays are read from the peers' memory (else staged)."""
        return self._cma is not None

    # -- segments ----------------------------------------------------------------------
    def _share(self, size: int) -> Segment:
        """Collective: every rank creates a segment of `size` bytes and maps everyone's."""
        name = f"ringmpi-{os.getpid()}-{self.tag}-{len(self.segments)}-{secrets.token_hex(3)}"
        mine = Segment(name, size, create=True)
        names = self.group.allgather_obj((name, size))
        for q, (n, s) in enumerate(names):
            self.peers[q].append(mine if q == self.rank else Segment(n, s, create=False))
        self.group.barrier()          # everyone has mapped every segment: the names can go
        mine.unlink()
        self.segments.append(mine)
        return mine

    def _grow(self, arena: int) -> None:
        """Collective (every rank asks for the same size at the same call): a new control +
        arena segment of at least `arena` bytes becomes segment 0 on every rank."""
        self.group.barrier()          # no message in flight on the old one
        self._release_ctl()
        self._share(self._ctl_bytes + _round(arena))
        first = len(self.segments) == 1
        for q, lst in enumerate([self.segments, *self.peers]):
            new = lst.pop()
            if first:
                lst.insert(0, new)
                continue
            old, lst[0] = lst[0], new
            if q == 0 or q - 1 != self.rank:   # my own old segment is in both lists: closed once
                old.close()
        self._arena = self.segments[0].size - self._ctl_bytes
        # control words of every rank's segment, as Python ints (a memoryview reads and
        # writes one faster than a numpy scalar): ctl[q][d * WORDS + word]
        self.ctl = [memoryview(self.peers[q][0].map)[:WORDS * self.size * 8].cast("q") for q in range(self.size)]
        self._mine = self.ctl[self.rank]
        self._arena_bytes = self.segments[0].array
        self.sent = [0] * self.size
        self.read = [0] * self.size

    def reserve(self, nbytes: int) -> None:
        """Collective, at the start of a call: scratch for `nbytes` (re-made when too small;
        a request's was made when it started)."""
        self._cursor = 0
        if nbytes > self._arena:
            if self.queue:
                raise RuntimeError(f"shared arena of {self._arena} bytes: a request needs {nbytes}, "
                                   "not reserved when it started (Algorithm.scratch)")
            self._grow(max(nbytes, 2 * self._arena))

    @property
    def arena(self) -> int:
        return self._arena

    def shared_empty(self, n: int, dtype: Any) -> np.ndarray:
        """Collective: an array of n elements in a new shared segment of this rank, which
        every rank maps (a buffer a call can send without copying it into the arena). The
        segments of arrays that have died since the last call are unmapped everywhere first."""
        self._collect()
        dt = np.dtype(dtype)
        seg = self._share(max(_round(n * dt.itemsize), ALIGN))
        out = np.frombuffer(seg.map, dtype=dt, count=n)
        self._owners[len(self.segments) - 1] = weakref.ref(out)
        return out

    def _collect(self) -> None:
        """Collective: unmap, on every rank, the user segments whose arrays are gone on
        their owner (a segment index is never reused: messages name segments by index)."""
        dead = [i for i, ref in self._owners.items() if ref() is None]
        for q, indices in enumerate(self.group.allgather_obj(dead)):
            for i in indices:
                seg = self.peers[q][i]
                if seg is not None:
                    seg.close()
                self.peers[q][i] = None
        for i in dead:
            del self._owners[i]
            self.segments[i] = None

    def _locate(self, buf: np.ndarray) -> tuple[int, int] | None:
        """(segment index, offset) of a contiguous buffer in one of my segments, or None."""
        return self._where(cma.address(buf), buf.nbytes) if buf.flags.c_contiguous else None

    def _where(self, addr: int, nbytes: int) -> tuple[int, int] | None:
        """(segment index, offset) of the bytes [addr, addr + nbytes) in one of my segments."""
        for i, seg in enumerate(self.segments):
            if seg is not None and seg.base <= addr and addr + nbytes <= seg.base + seg.size:
                return i, addr - seg.base
        return None

    def in_shared(self, buf: Any) -> bool:
        return self._locate(buf) is not None

    def reads_across(self, nbytes: int) -> bool:
        """Whether blocks of `nbytes` of ordinary arrays reach peers by cross-memory read
        (from CMA_MIN, where every rank may read every other's memory): the same answer on
        every rank, so the ring sends whole blocks everywhere (`schedules.shm`); a block of a
        shared array is read in its segment either way."""
        return self._cma is not None and nbytes >= CMA_MIN

    @property
    def nodes(self) -> list[int]:
        return [0] * self.size

    def split_nodes(self) -> tuple[Any, Any]:
        """One host: the node group is every rank (a hierarchical schedule's split of it)."""
        return split_nodes(self, self.nodes)

    def shared(self) -> "SharedTransport":
        return self

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        """Scratch in the arena (this call's), so that it can be sent without a copy; a
        plain array once the arena is full."""
        return self._take(n, dtype)[0]

    def _take(self, n: int, dtype: Any) -> tuple[np.ndarray, int | None]:
        dt = np.dtype(dtype)
        nbytes = n * dt.itemsize
        start = self._carve(nbytes)
        if start is None:
            return np.empty(n, dt), None
        return self._arena_bytes[start:start + nbytes].view(dt), start

    def _carve(self, nbytes: int) -> int | None:
        """The offset in my segment 0 of `nbytes` more of this call's arena, or None when it
        has no room left."""
        need = _round(max(nbytes, 1))
        if self._cursor + need > self._arena:
            return None
        start = self._ctl_bytes + self._cursor
        self._cursor += need
        return start

    # -- data movement ------------------------------------------------------------------
    def _publish(self, buf: np.ndarray, dest: int) -> None:
        # (the hot path of every round: a few hundred ns of Python matter at small sizes)
        nbytes, seg, contiguous = buf.nbytes, None, buf.flags.c_contiguous
        if contiguous:
            addr = cma.address(buf)
            where = self._where(addr, nbytes)
            if where is not None:
                seg, off = where
            elif self.reads_across(nbytes):
                seg, off = -1, addr             # private memory the receiver reads across (cma)
        if seg is None:                         # not in shared memory: into the arena first
            off = self._carve(nbytes)
            if off is not None:
                seg = 0
                staged = self._arena_bytes[off:off + nbytes].view(buf.dtype)
                np.copyto(staged if buf.ndim == 1 else staged.reshape(buf.shape), buf)
                self.counters.bytes_copied += nbytes
            elif self._cma is not None and contiguous:
                seg, off = -1, addr             # no room to stage it: read across whatever its size
            else:
                raise MemoryError(f"shared arena of {self._arena} bytes is full (needs {nbytes} more)")
        ctl, at = self._mine, dest * WORDS
        ctl[at + SEG], ctl[at + OFF], ctl[at + LEN] = seg, off, nbytes
        self.sent[dest] = sent = self.sent[dest] + 1
        ctl[at + SENT] = sent                   # the flag last: the receiver reads the row after it
        counters = self.counters
        counters.messages += 1
        counters.bytes_sent += nbytes

    def _incoming(self, source: int, like: np.ndarray) -> np.ndarray | int:
        """Wait for the next block from `source`: a view of it in the sender's shared memory,
        or its address in the sender's private memory (an int: read it with `_read_across`)."""
        ctl, at = self.ctl[source], self.rank * WORDS
        if ctl[at + SENT] <= self.read[source]:
            self._await(ctl, at + SENT, self.read[source] + 1)
        seg, off, nbytes = ctl[at + SEG], ctl[at + OFF], ctl[at + LEN]
        if nbytes != like.nbytes:
            raise RuntimeError(f"rank {source} sent {nbytes} bytes to rank {self.rank}, which expected "
                               f"{like.nbytes} (MPI would truncate or hang)")
        if seg < 0:
            return off
        return self.peers[source][seg].array[off:off + nbytes].view(like.dtype)

    def _receive(self, source: int, buf: np.ndarray) -> None:
        """buf <- the next block from `source`."""
        got = self._incoming(source, buf)
        if isinstance(got, int):
            self._read_across(source, got, buf)
        else:
            np.copyto(buf, got)
        self._done_reading(source)

    def _read_across(self, source: int, address: int, buf: np.ndarray) -> None:
        if buf.flags.c_contiguous:
            self._cma.read(self.pids[source], address, buf)   # type: ignore[union-attr]
        else:
            tmp = np.empty(buf.shape, buf.dtype)
            self._cma.read(self.pids[source], address, tmp)   # type: ignore[union-attr]
            np.copyto(buf, tmp)

    def _reduce_across(self, source: int, address: int, op: str, mine: np.ndarray, out: np.ndarray) -> None:
        """out = (the block at `address` of `source`) op mine, READ_CHUNK bytes at a time: each
        chunk read straight into `out` and reduced there while it is in cache (one kernel
        copy of a megabyte costs little more than of the whole block; a bounce buffer
        between them cost half again as much: benchmarks/README.md), or, where
        `out` overlaps `mine` (in place), into a private buffer kept for the next call."""
        if not (out.flags.c_contiguous and mine.flags.c_contiguous):   # (the schedules' blocks always are)
            got = np.empty(out.shape, out.dtype)
            self._read_across(source, address, got)
            self.combine(op, got, mine, out)
            return
        o, m = out.reshape(-1), mine.reshape(-1)
        into = not np.may_share_memory(out, mine)
        size = out.itemsize
        step = max(1, READ_CHUNK // size)
        pid = self.pids[source]
        for lo in range(0, o.size, step):
            hi = min(o.size, lo + step)
            got = o[lo:hi] if into else self._scratch(o[lo:hi])
            self._cma.read(pid, address + lo * size, got)   # type: ignore[union-attr]
            self.combine(op, got, m[lo:hi], o[lo:hi])

    def _scratch(self, like: np.ndarray) -> np.ndarray:
        """A private buffer shaped like `like`, kept between calls (its pages faulted in once;
        READ_CHUNK bytes at most), freed with the transport."""
        if self._landing is None or self._landing.nbytes < like.nbytes:
            self._landing = np.empty(like.nbytes, np.uint8)
        return self._landing[:like.nbytes].view(like.dtype).reshape(like.shape)

    def _done_reading(self, source: int) -> None:
        self.read[source] = done = self.read[source] + 1
        self._mine[source * WORDS + ACKED] = done

    def _delivered(self, dest: int) -> None:
        """Wait until `dest` has read what was published to it (the block may change after)."""
        ctl, i = self.ctl[dest], self.rank * WORDS + ACKED
        if ctl[i] < self.sent[dest]:
            self._await(ctl, i, self.sent[dest])

    def sendrecv(self, sendbuf: Any, dest: int | None, recvbuf: Any, source: int | None) -> None:
        self.counters.calls += 1
        if dest is not None and sendbuf is not None:
            self._publish(sendbuf, dest)
        if source is not None and recvbuf is not None:
            self._receive(source, recvbuf)
        if dest is not None and sendbuf is not None:
            self._delivered(dest)

    def landing(self, n: int, dtype: Any) -> None:
        """None: `sendrecv_reduce` lands nothing."""
        return None

    def sendrecv_reduce(self, sendbuf: Any, dest: int, landing: Any, source: int, op: str, mine: Any,
                        out: Any) -> None:
        """Send `sendbuf` to dest; out = (the block from source) op mine, read straight from
        the source's memory: one pass, no received copy (no `landing`)."""
        self.counters.calls += 1
        self._publish(sendbuf, dest)
        got = self._incoming(source, out)
        if isinstance(got, int):
            self._reduce_across(source, got, op, mine, out)
        else:
            self.combine(op, got, mine, out)
        self._done_reading(source)
        self._delivered(dest)

    def exchange(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        self.counters.calls += 1
        dests = [d for _, d in sends]
        if len(set(dests)) != len(dests):
            raise ValueError("shared-memory exchange: one message per destination at a time")
        for buf, dest in sends:
            self._publish(buf, dest)
        for buf, source in recvs:
            self._receive(source, buf)
        for dest in dests:
            self._delivered(dest)

    def mpi(self, call: Any) -> None:
        self.group.mpi(call)

    def _release_ctl(self) -> None:
        for words in getattr(self, "ctl", []):
            words.release()       # the mapping can only be closed once no view is left
        self.ctl, self._mine, self._arena_bytes = [], None, None

    def release(self) -> None:
        self._release_ctl()
        for segs in self.peers:   # my own segments are among them
            for seg in segs:
                if seg is not None:
                    seg.close()
        self.peers = [[] for _ in range(self.size)]
        self.segments = []
        self._landing = None


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _wait(words: memoryview, i: int, target: int) -> None:
    """Spin until words[i] >= target, then yield the core between polls (more ranks than
    cores is the laptop case: a spinning rank would starve the one it waits for)."""
    spins = 0
    while words[i] < target:
        spins += 1
        if spins > SPINS:
            requests.yield_core() if spins < 100 * SPINS else time.sleep(50e-6)
            if requests.ACTIVE:       # (MPI's progress rule: the requests of this thread move meanwhile)
                requests.progress()
