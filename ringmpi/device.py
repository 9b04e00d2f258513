"""Device buffers (CUDA): recognised by `__cuda_array_interface__`, reduced on the device,
sent straight from device memory when the MPI library can read it, staged otherwise.

A device array is anything that exposes `__cuda_array_interface__` and is not a numpy
array: a cupy array, or this module's `FakeDeviceArray` (host memory that exposes only the
CUDA array interface and refuses the buffer protocol, as mpi4py's own tests do with their
fake GPU arrays), which lets every path below run and be tested on a machine without a GPU.
cupy is imported only when a cupy array is passed: `import ringmpi` never needs it.

`DeviceGroup` is the transport of one call on device buffers, over the communicator's
transport (the same role as `transport.SubGroup`): the schedules run on it unchanged.
Memory comes from the device backend (scratch kept between calls on the device),
reductions run there, and a message either goes straight to MPI_Sendrecv (a CUDA-aware
MPI, after the device work that produced it is complete) or is staged through pinned host
buffers in chunks, so that the device-to-host copy of chunk k+1, the transfer of chunk k
and the host-to-device copy of chunk k-1 overlap:

    chunk        0      1      2      3
    D2H        [0]    [1]    [2]    [3]
    MPI               [0]    [1]    [2]    [3]
    H2D                      [0]    [1]    [2]    [3]

n bytes in K chunks, each stage alpha_s + (n/K) beta_s with the slowest stage's beta_max:
T(K) = (K + 2)(alpha + n/K beta_max), least at K = sqrt(2 n beta_max / alpha), a chunk of
sqrt(n alpha / (2 beta_max)) bytes (`chunk_bytes`; RINGMPI_STAGE_CHUNK fixes it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .backend import NUMPY, ScratchPool
from .transport import LRU, CountedMemory, Counters, PrivateMemory, ReceiveThenReduce

__all__ = ["is_device", "device_backend", "FakeDeviceArray", "OpaqueFakeDeviceArray", "FakeDeviceBackend", "CupyBackend", "DeviceGroup",
           "Support", "chunk_bytes", "cupy_backend", "cai_span", "D2H_BETA"]

#: a PCIe Gen4 x16 link's copy rate as the default device<->host staging cost (s/byte)
D2H_BETA = 1 / 25e9
MIN_CHUNK, MAX_CHUNK = 64 << 10, 16 << 20


def is_device(buf: Any) -> bool:
    """A device array: it has the CUDA array interface and is not a numpy array."""
    return not isinstance(buf, np.ndarray) and hasattr(type(buf), "__cuda_array_interface__")


def cai_span(buf: Any) -> tuple[int, int]:
    """(first byte address, one past the last) of a contiguous device array."""
    ptr = buf.__cuda_array_interface__["data"][0]
    return ptr, ptr + buf.nbytes


def cai_contiguous(buf: Any) -> bool:
    cai = buf.__cuda_array_interface__
    strides = cai.get("strides")
    if strides is None:
        return True
    expect, step = [], np.dtype(cai["typestr"]).itemsize
    for d in reversed(cai["shape"]):
        expect.append(step)
        step *= d
    return all(s == e for s, e, d in zip(strides, reversed(expect), cai["shape"]) if d > 1)


def cai_readonly(buf: Any) -> bool:
    return bool(buf.__cuda_array_interface__["data"][1])


@dataclass(frozen=True)
class Support:
    """Whether the MPI library can read device memory, and how that was decided."""
    aware: bool
    how: str

    def __str__(self) -> str:
        return f"{'yes' if self.aware else 'no'} ({self.how})"


def chunk_bytes(nbytes: int, alpha: float, beta_max: float) -> int:
    """The staging pipeline's chunk (bytes): sqrt(n alpha / (2 beta_max)), within
    [64 KiB, 16 MiB] and never above n (module docstring)."""
    if nbytes <= 0:
        return MIN_CHUNK
    c = math.sqrt(nbytes * max(alpha, 1e-7) / (2 * max(beta_max, 1e-13)))
    return int(min(max(c, MIN_CHUNK), MAX_CHUNK, max(nbytes, 1)))


# -- the stand-in device array and its backend ---------------------------------------------

class FakeDeviceArray:
    """Host memory seen only through `__cuda_array_interface__` (no buffer protocol, no
    `__array__`): what ringmpi sees of a GPU array, on a machine without a GPU. numpy
    functions refuse it, so a path that forgot to stage or to use the device backend fails
    instead of passing by accident. `.get()` returns a numpy copy (as cupy's does)."""

    __slots__ = ("_a", "__weakref__")

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._a!r})"

    @classmethod
    def from_host(cls, a: Any) -> "FakeDeviceArray":
        return cls(np.array(a, copy=True, order="C"))

    def _new(self, a: np.ndarray) -> "FakeDeviceArray":
        return type(self)(a)

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, not a.flags.writeable),
                "strides": None if a.flags.c_contiguous else a.strides, "version": 3}

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)

    def __len__(self) -> int:
        return len(self._a)

    def __getitem__(self, key: Any) -> "FakeDeviceArray":
        return self._new(self._a[key])

    def reshape(self, *shape: Any) -> "FakeDeviceArray":
        return self._new(self._a.reshape(*shape))

    def view(self, dtype: Any) -> "FakeDeviceArray":
        return self._new(self._a.view(dtype))

    def get(self) -> np.ndarray:
        return self._a.copy()

    def set_readonly(self) -> "FakeDeviceArray":
        self._a.setflags(write=False)
        return self


class OpaqueFakeDeviceArray(FakeDeviceArray):
    """A stand-in that plays memory the MPI library must not be handed (as a real GPU's is
    for an MPI that is not CUDA-aware): forcing the CUDA-aware path on it is refused."""


class _Event:
    """A completed-at-once event (the stand-in's copies are synchronous)."""

    def synchronize(self) -> None:
        pass


class FakeDeviceBackend:
    """The device backend of `FakeDeviceArray`: the same interface as `CupyBackend`, the
    work done by numpy on the wrapped host memory. Its memory is host memory, which any MPI
    can read (`host_readable`), so it also exercises the CUDA-aware path."""

    def __init__(self, cls: type = FakeDeviceArray, host_readable: bool = True) -> None:
        self.cls = cls
        self.host_readable = host_readable
        self.name = "fake-device" if host_readable else "fake-device-opaque"

    def empty(self, n: int, dtype: Any) -> FakeDeviceArray:
        return self.cls(np.empty(n, dtype))

    def copy(self, src: Any, dst: Any) -> None:
        np.copyto(dst._a, src._a)

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        NUMPY.combine(op, a._a, b._a, out._a)

    def scale(self, buf: Any, divisor: int) -> None:
        np.true_divide(buf._a, divisor, out=buf._a)

    def synchronize(self) -> None:
        pass

    def to_host(self, a: Any) -> np.ndarray:
        return a._a.copy()

    def pinned(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def ptr(self, buf: Any) -> int:
        """The buffer's address (what a CUDA-aware MPI is handed)."""
        return buf._a.ctypes.data

    def d2h(self, src: Any, host: np.ndarray) -> _Event:
        """Copy device `src` into the host bytes `host` (pinned), asynchronously: the event."""
        np.copyto(host.view(src.dtype), src._a.reshape(-1))
        return _Event()

    def h2d(self, host: np.ndarray, dst: Any) -> _Event:
        """Copy the host bytes `host` into device `dst`, asynchronously: the event."""
        np.copyto(dst._a.reshape(-1), host.view(dst.dtype))
        return _Event()

    def ready(self) -> None:
        """The work queued on the compute stream is done (before MPI reads device memory)."""

    def wrap(self, host: np.ndarray) -> FakeDeviceArray:
        """A device array holding a copy of `host` (tests, benchmarks)."""
        return self.cls.from_host(host)


FAKE = FakeDeviceBackend()
FAKE_OPAQUE = FakeDeviceBackend(OpaqueFakeDeviceArray, host_readable=False)


class CupyBackend:
    """cupy arrays: element-wise kernels for the reductions (the same ufuncs as numpy's,
    so every rank computes the same bits from the same operands), asynchronous copies to
    and from pinned host memory on two streams of their own, events between them."""

    name = "cupy"
    host_readable = False

    def __init__(self) -> None:
        import cupy  # only reached when a cupy array was passed
        self.cp = cupy
        self.d2h_stream = cupy.cuda.Stream(non_blocking=True)
        self.h2d_stream = cupy.cuda.Stream(non_blocking=True)
        # the same element-wise operations as the host's (ringmpi.ops.OPS): MAX and MIN
        # propagate NaN as numpy's maximum/minimum do, every rank computes the same bits
        self._ops = {"SUM": cupy.add, "PROD": cupy.multiply, "MAX": cupy.maximum, "MIN": cupy.minimum,
                     "LAND": cupy.logical_and, "LOR": cupy.logical_or, "LXOR": cupy.logical_xor,
                     "BAND": cupy.bitwise_and, "BOR": cupy.bitwise_or, "BXOR": cupy.bitwise_xor,
                     "AVG": cupy.add}

    def empty(self, n: int, dtype: Any) -> Any:
        return self.cp.empty(n, dtype)

    def copy(self, src: Any, dst: Any) -> None:
        self.cp.copyto(dst, src)

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        self._ops[op](a, b, out=out)

    def scale(self, buf: Any, divisor: int) -> None:
        self.cp.true_divide(buf, divisor, out=buf)

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def to_host(self, a: Any) -> np.ndarray:
        return self.cp.asnumpy(a)

    def pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(mem, np.uint8, nbytes)

    def ready(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def ptr(self, buf: Any) -> int:
        return buf.data.ptr

    def d2h(self, src: Any, host: np.ndarray) -> Any:
        with self.d2h_stream:
            src.get(stream=self.d2h_stream, out=host.view(src.dtype), blocking=False)
            return self.d2h_stream.record()

    def h2d(self, host: np.ndarray, dst: Any) -> Any:
        with self.h2d_stream:
            dst.set(host.view(dst.dtype), stream=self.h2d_stream)
            return self.h2d_stream.record()

    def wrap(self, host: np.ndarray) -> Any:
        return self.cp.asarray(host)


_CUPY: list = []


def cupy_backend() -> CupyBackend:
    """The process's cupy backend (its streams), made at first use; ImportError without cupy."""
    if not _CUPY:
        _CUPY.append(CupyBackend())
    return _CUPY[0]


def device_backend(buf: Any) -> Any:
    """The backend of a device array (cupy's is made at the first cupy array)."""
    if isinstance(buf, FakeDeviceArray):
        return FAKE_OPAQUE if isinstance(buf, OpaqueFakeDeviceArray) else FAKE
    if type(buf).__module__.split(".")[0] == "cupy":
        return cupy_backend()
    return None


# -- the transport of one call on device buffers -------------------------------------------

class DeviceGroup(CountedMemory, PrivateMemory, ReceiveThenReduce):
    """The communicator's transport for calls on device buffers of one backend (kept on
    that transport: `parent.device(backend, aware)`). `aware`: messages go to MPI as
    device addresses; otherwise through `chunk`-byte pinned host buffers, pipelined."""

    def __init__(self, parent: Any, backend: Any, aware: bool, alpha: float, beta: float) -> None:
        self.parent = parent
        self.rank, self.size = parent.rank, parent.size
        self.backend = backend
        self.aware = aware
        self.pool = ScratchPool(backend)
        self.alpha, self.beta = alpha, beta
        self.chunk_fixed = 0            # RINGMPI_STAGE_CHUNK (bytes), 0: chunk_bytes()
        # pinned host buffers, grow-only, reused by every staged operation (each one's copies
        # end before it returns): slots 0-3 the pipeline's two send and two receive chunks,
        # whole buffers (MPI's own, fan-in/out) from slot 0 on
        self._slots: list[np.ndarray] = []
        self.staged_bytes = 0
        self.memory = backend.name + ":"    # auto tunes device calls apart from host ones
        self.tuners = LRU(1024, refresh=False)              # online tuning of auto on this memory (ringmpi.auto)
        # (dropped in the order made: the same on every rank, whatever the fast path served)
        self.choices = LRU(256)

    on_device = True    # the shared-memory and hierarchical algorithms say they cannot run here

    @property
    def nonblocking(self) -> bool:
        return self.parent.nonblocking

    @property
    def counters(self) -> Counters:
        return self.parent.counters

    # -- what auto needs of a transport: the communicator's profile and control messages --
    @property
    def profile(self) -> Any:
        return self.parent.profile

    @profile.setter
    def profile(self, prof: Any) -> None:
        self.parent.profile = prof

    #: the communicator's control plane, used as it is: agreement, limits, layout
    _PARENT = frozenset({"bcast_obj", "allreduce_max", "mpi_serves", "nodes", "max_count"})

    def __getattr__(self, name: str) -> Any:
        if name in DeviceGroup._PARENT:
            return getattr(self.parent, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def begin(self) -> None:
        self.pool.reset()

    # -- memory --------------------------------------------------------------------------
    def empty(self, n: int, dtype: Any) -> Any:
        return self.pool.take(n, dtype)

    def shared(self) -> Any:
        raise ValueError("device buffers do not go through the host's shared memory")

    def split_nodes(self) -> tuple[Any, Any]:
        raise ValueError("device buffers: hierarchical is not available")

    def chunk(self, nbytes: int) -> int:
        return self.chunk_fixed or chunk_bytes(nbytes, self.alpha, max(self.beta, D2H_BETA))

    # -- messages ------------------------------------------------------------------------
    def sendrecv(self, sendbuf: Any, dest: int | None, recvbuf: Any, source: int | None) -> None:
        if dest is None:
            sendbuf = None
        if source is None:
            recvbuf = None
        if self.aware:   # addresses, not arrays: mpi4py would parse each array's interface (microseconds)
            self.backend.ready()
            ptr = self.backend.ptr
            self.parent.sendrecv_bytes(None if sendbuf is None else (ptr(sendbuf), sendbuf.nbytes), dest,
                                       None if recvbuf is None else (ptr(recvbuf), recvbuf.nbytes), source)
            return
        self._staged(sendbuf, dest, recvbuf, source)

    def _staged(self, sendbuf: Any, dest: int | None, recvbuf: Any, source: int | None) -> None:
        """Chunk k's D2H overlaps chunk k-1's transfer, whose H2D overlaps chunk k+1's
        transfer (two buffers per direction; a buffer is reused only after its copy ended).
        A message is cut by its own size alone (`_cut`), so its sender and its receiver cut
        it alike: a ring's blocks differ by an element, and a chunk size taken from both
        buffers of an exchange made one rank send chunks the other received as longer or
        shorter ones (MPI_ERR_TRUNCATE, or a chunk's end never written)."""
        s_el, ce_s = self._cut(sendbuf)
        r_el, ce_r = self._cut(recvbuf)
        k_n = max(-(-s_el // ce_s), -(-r_el // ce_r), 1)
        item = (sendbuf if sendbuf is not None else recvbuf).dtype.itemsize if (s_el or r_el) else 1
        hs = tuple(self._whole(i, ce_s * item, np.uint8) for i in (0, 1))
        hr = tuple(self._whole(i, ce_r * item, np.uint8) for i in (2, 3))
        self.backend.ready()                             # the data to send is complete

        def part(buf: Any, n: int, ce: int, k: int) -> Any:
            lo = min(k * ce, n)
            return buf[lo:min(lo + ce, n)] if buf is not None else None

        def d2h(k: int) -> Any:
            p = part(sendbuf, s_el, ce_s, k)
            if p is None or p.size == 0:
                return None
            self.staged_bytes += p.nbytes
            return self.backend.d2h(p, hs[k % 2][:p.nbytes])

        pending_d2h = d2h(0)
        h2d: list = [None, None]
        for k in range(k_n):
            nxt = d2h(k + 1) if k + 1 < k_n else None
            if pending_d2h is not None:
                pending_d2h.synchronize()
            sp, rp = part(sendbuf, s_el, ce_s, k), part(recvbuf, r_el, ce_r, k)
            if h2d[k % 2] is not None:                   # receive buffer k%2 is free again
                h2d[k % 2].synchronize()
                h2d[k % 2] = None
            hsend = hs[k % 2][:sp.nbytes].view(sp.dtype) if sp is not None else None
            hrecv = hr[k % 2][:rp.nbytes].view(rp.dtype) if rp is not None else None
            self.parent.sendrecv(hsend, dest if sp is not None else None, hrecv, source if rp is not None else None)
            if rp is not None and rp.size:
                self.staged_bytes += rp.nbytes
                h2d[k % 2] = self.backend.h2d(hr[k % 2][:rp.nbytes], rp)
            pending_d2h = nxt
        for ev in h2d:
            if ev is not None:
                ev.synchronize()

    def _cut(self, buf: Any) -> tuple[int, int]:
        """(elements, elements per chunk) of one message: from its size alone, the same on
        the rank that sends it and the rank that receives it."""
        if buf is None:
            return 0, 1
        item = buf.dtype.itemsize
        return buf.size, max(1, self.chunk(buf.nbytes) // item)

    def exchange(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        """Root fan-in / fan-out: staged whole (each buffer once through the host)."""
        if self.aware:
            self.backend.ready()
            self.parent.exchange(sends, recvs)
            return
        self.backend.ready()
        hsends = [(self._host_copy(b, i), d) for i, (b, d) in enumerate(sends)]
        hrecvs = [(self._whole(len(sends) + i, b.size, b.dtype), s) for i, (b, s) in enumerate(recvs)]
        self.parent.exchange(hsends, hrecvs)
        for (h, _), (b, _) in zip(hrecvs, recvs):
            self.staged_bytes += h.nbytes
            self.backend.h2d(h.view(np.uint8), b).synchronize()

    def _whole(self, slot: int, n: int, dtype: Any) -> np.ndarray:
        """n elements of pinned host memory kept in `slot` between calls (grow-only): a fresh
        allocation per call would pay its page faults, and the MPI library its registration
        of new addresses, which cost more than the transfer itself at 1 MiB
        (benchmarks/README.md, "Figures behind constants in the code")."""
        nbytes = n * np.dtype(dtype).itemsize
        while len(self._slots) <= slot:
            self._slots.append(self.backend.pinned(0))
        if self._slots[slot].nbytes < nbytes:
            self._slots[slot] = self.backend.pinned(max(nbytes, 2 * self._slots[slot].nbytes))
        return self._slots[slot][:nbytes].view(dtype)

    def _host_copy(self, buf: Any, slot: int = 0) -> np.ndarray:
        out = self._whole(slot, buf.size, buf.dtype)
        self.staged_bytes += out.nbytes
        self.backend.d2h(buf, out.view(np.uint8)).synchronize()
        return out

    def mpi(self, call: Any) -> None:
        """The MPI library's own collective on device buffers: straight when the MPI reads
        device memory (and its NaN rule does not need the host), else the whole buffers
        staged through the host around it (what mpi4jax and others do)."""
        nan_rule = call.op in ("MAX", "MIN") and call.dtype.kind == "f"
        self.backend.ready()
        if self.aware and not nan_rule:
            self.parent.mpi_through(call, self)    # its scratch and copies on the device, its MPI call on ours
            return
        bufs = [b for b in (call.send, call.recv) if b is not None]
        if call.inplace:    # one buffer, the other a view of it (or itself): one host copy of the larger
            whole = max(bufs, key=lambda b: b.size)
            host = self._host_copy(whole)
            send = _same_view(host, whole, call.send)
            recv = _same_view(host, whole, call.recv) if call.recv is not None else None
            out, target = host, whole
        else:
            send = self._host_copy(call.send)
            recv = self._whole(1, call.recv.size, call.recv.dtype) if call.recv is not None else None
            out, target = recv, call.recv
        self.parent.mpi(call._replace(send=send, recv=recv))
        if target is not None and out.size:
            self.staged_bytes += out.nbytes
            self.backend.h2d(out.view(np.uint8), target).synchronize()

    def mpi_call(self, function: str, *args: Any) -> None:
        """The library's own collective with device buffers (CUDA-aware MPI only)."""
        self.parent.mpi_call(function, *args)


def _same_view(host: np.ndarray, dev: Any, view: Any) -> np.ndarray:
    """The slice of `host` (a copy of `dev`) that `view` is of `dev`."""
    if view is dev:
        return host
    lo = (cai_span(view)[0] - cai_span(dev)[0]) // dev.dtype.itemsize if view.size else 0
    return host[lo:lo + view.size]
