"""Array backends behind one tiny interface (allocate, copy, reduce-into, synchronise,
to-host) and the scratch pool every transport hands out memory from.

Schedules never touch numpy for arithmetic or copies: they call the transport, which
delegates here. That is what lets the simulator count every byte copied and reduced, and
what a device backend (cupy) plugs into.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .ops import OPS, convert
from .transport import Memory

__all__ = ["ArrayBackend", "NumpyBackend", "NUMPY", "Phantom", "phantom", "PhantomBackend", "PHANTOM",
           "ScratchPool"]


class ArrayBackend(Memory, Protocol):
    name: str

    def synchronize(self) -> None: ...
    def to_host(self, a: Any) -> np.ndarray: ...


class NumpyBackend:
    """Host buffers. `combine` writes `out = a op b` in one memory pass."""

    name = "numpy"

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        return np.empty(n, dtype=dtype)

    def copy(self, src: np.ndarray, dst: np.ndarray) -> None:
        """dst = src; between dtypes (a 16-bit float and its float32 accumulator) a
        conversion, rounding to nearest even where it narrows (`ops.convert`)."""
        if src.dtype is dst.dtype:
            np.copyto(dst, src)
        else:
            convert(src, dst)

    def combine(self, op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        if op == "PROD" and out.dtype.kind == "c" and (np.shares_memory(out, a) or np.shares_memory(out, b)):
            # numpy's complex multiply takes an FMA path whose last bit depends on whether the
            # output aliases an input; computing into fresh memory keeps every rank bitwise equal.
            out[...] = np.multiply(a, b)
            return
        OPS[op](a, b, out=out)

    def scale(self, buf: np.ndarray, divisor: int) -> None:
        np.true_divide(buf, divisor, out=buf)

    def synchronize(self) -> None:
        pass

    def to_host(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)


NUMPY = NumpyBackend()


class Phantom(np.ndarray):
    """A stand-in buffer for timing without data: an array with a size, a dtype and no
    memory (every element is one shared element, stride 0). Slices, views and `copy()` stay
    phantoms, so the schedules' code runs unchanged on it and every byte it would move is
    counted from `nbytes`; the simulator copies and reduces nothing (`PhantomBackend`)."""

    def copy(self, order: str = "C") -> "Phantom":  # type: ignore[override]
        return phantom(self.size, self.dtype)


def phantom(n: int, dtype: Any) -> Phantom:
    """A phantom of n elements of `dtype` (one element of memory, whatever n is)."""
    dt = np.dtype(dtype)   # (the constructor, not `as_strided`: a quarter of its cost, a few per rank)
    return np.ndarray.__new__(Phantom, (n,), dt, np.zeros(1, dt), 0, (0,))


class PhantomBackend:
    """The backend of data-free simulation: allocation gives phantoms, the rest does nothing."""

    name = "phantom"

    def empty(self, n: int, dtype: Any) -> Phantom:
        return phantom(n, dtype)

    def copy(self, src: Any, dst: Any) -> None:
        pass

    def combine(self, op: str, a: Any, b: Any, out: Any) -> None:
        pass

    def scale(self, buf: Any, divisor: int) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a)


PHANTOM = PhantomBackend()


class ScratchPool:
    """Scratch memory kept between calls, like NCCL's preallocated buffers: a fresh
    multi-MiB allocation per call would pay its page faults every time.

    Slot i is the i-th scratch request of a call. Every `window` calls the pool trims
    itself: a slot no call used in the window is freed, and one more than twice as large as
    the largest request it served is shrunk, so memory follows the recent calls instead of
    the largest call ever made.
    """

    def __init__(self, backend: ArrayBackend = NUMPY, window: int = 16) -> None:
        self.backend = backend
        self.window = window
        self._slots: list[Any] = []
        self._peak: list[int] = []
        #: per slot, the last view handed out, as (elements, dtype, view): a call that asks
        #: what the last one asked gets it again (slicing and viewing the slot cost more than
        #: a small call's message; benchmarks/README.md, "A round of a schedule in less Python")
        self._views: list[tuple | None] = []
        self._cursor = 0
        self._calls = 0

    def reset(self) -> None:
        """Start of a collective call: slots are handed out afresh."""
        self._cursor = 0
        self._calls += 1
        if self._calls % self.window == 0:
            self.trim()

    def take(self, n: int, dtype: Any) -> Any:
        i = self._cursor
        self._cursor = i + 1
        if i < len(self._views):
            last = self._views[i]
            if last is not None and last[0] == n and last[1] is dtype:
                return last[2]
        else:
            self._slots.append(None)
            self._peak.append(0)
            self._views.append(None)
        dt = np.dtype(dtype)
        need = n * dt.itemsize
        if self._slots[i] is None or self._slots[i].nbytes < need:
            self._slots[i] = self.backend.empty(need, np.uint8)
        self._peak[i] = max(self._peak[i], need)
        view = self._slots[i][:need].view(dt)
        self._views[i] = (n, dtype, view)
        return view

    def trim(self) -> None:
        """Every `window` calls: the slots no call used since the last trim freed, those far
        larger than their largest use shrunk (and the views kept forgotten: the next use of
        a slot counts towards its peak again)."""
        self._views = [None] * len(self._slots)
        for i, buf in enumerate(self._slots):
            if buf is None:
                continue
            if self._peak[i] == 0:
                self._slots[i] = None
            elif buf.nbytes > 2 * self._peak[i]:
                self._slots[i] = self.backend.empty(self._peak[i], np.uint8)
            self._peak[i] = 0
        while self._slots and self._slots[-1] is None:
            self._slots.pop()
            self._peak.pop()
            self._views.pop()

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._slots if b is not None)
