"""Cross-memory attach: read another process's memory with one copy (Linux process_vm_readv).

The shared-memory transport (`ringmpi.shm`) lets a rank read a peer's block straight from the
peer's memory when that memory is a shared segment. A user's ordinary numpy array is private
to its process; without this module it is first copied into the sender's shared arena (one
copy more per block, 4.5 bytes of memory traffic per byte of a 2-rank all-reduce instead of
2.5). With it, the receiver copies the block out of the sender's private memory itself, as
Open MPI's smsc/cma and MPICH's CMA path do for large point-to-point messages.

The kernel allows it between processes of one user that may ptrace each other: with Yama's
ptrace_scope 1 (Ubuntu's default) only a descendant may, unless the target declares any
process may (prctl PR_SET_PTRACER_ANY, what Open MPI's CMA component does); container
sandboxes (seccomp without CAP_SYS_PTRACE) refuse it. `probe` tells which: the transport
uses CMA only where every rank could read every other.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Any

import numpy as np

__all__ = ["Reader", "address", "allow_peers"]

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.c_ulong]
    return libc


_LIBC = _libc()
_from_buffer, _addressof = ctypes.c_char.from_buffer, ctypes.addressof


def address(buf: np.ndarray) -> int:
    """The address of a C-contiguous array's first byte. Through ctypes' view of its buffer
    it costs a fifth of numpy's own ways (`.ctypes.data`, `__array_interface__`), which
    build an object first: several a round would be a third of a small shared-memory
    round's time (benchmarks/README.md, "Figures behind constants in the code").
    Read-only and empty arrays (no writable byte to view) take numpy's."""
    try:
        return _addressof(_from_buffer(buf))
    except (TypeError, ValueError, BufferError):
        return buf.ctypes.data


def allow_peers() -> None:
    """Under Yama ptrace_scope 1, let this process's peers (same user) read its memory, as
    Open MPI does for its CMA path; a process attribute for this process's lifetime, no
    machine state. Nothing to do (or possible) elsewhere."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        return
    if scope == "1" and _LIBC is not None:
        _LIBC.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY), 0, 0, 0)


class Reader:
    """Copies from other processes' memory into local numpy arrays."""

    def __init__(self) -> None:
        self._local, self._remote = _Iovec(), _Iovec()
        self._call = _LIBC.process_vm_readv if _LIBC is not None else None

    @property
    def usable(self) -> bool:
        return self._call is not None

    def read(self, pid: int, remote: int, dst: np.ndarray) -> None:
        """dst (C-contiguous) <- dst.nbytes bytes at address `remote` in process `pid`."""
        base, left = address(dst), dst.nbytes
        done = 0
        while done < left:   # a read may stop short (at a page it could not pin): go on from there
            self._local.base, self._local.len = base + done, left - done
            self._remote.base, self._remote.len = remote + done, left - done
            got = self._call(pid, ctypes.byref(self._local), 1, ctypes.byref(self._remote), 1, 0)
            if got <= 0:
                err = ctypes.get_errno()
                raise OSError(err, f"process_vm_readv from pid {pid}: {os.strerror(err) if err else 'no progress'}")
            done += got

    def probe(self, pid: int, remote: int, expect: bytes) -> bool:
        """Whether `expect` can be read at address `remote` in process `pid`."""
        if self._call is None:
            return False
        got = np.zeros(len(expect), np.uint8)
        try:
            self.read(pid, remote, got)
        except OSError:
            return False
        return got.tobytes() == expect
