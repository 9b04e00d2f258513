"""Array backends behind one tiny interface: allocate, copy, reduce-into, synchronise, to-host.

The algorithms never touch numpy directly for arithmetic; they call the transport, which
delegates here. That is what lets the simulator swap in symbolic data and count the bytes
reduced, and what a device backend (cupy) plugs into.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .ops import OPS

__all__ = ["ArrayBackend", "NumpyBackend", "NUMPY", "backend_for"]


class ArrayBackend(Protocol):
    name: str

    def empty(self, n: int, dtype: Any) -> Any: ...
    def copy(self, src: Any, dst: Any) -> None: ...
    def combine(self, op: str, a: Any, b: Any, out: Any) -> None: ...
    def synchronize(self) -> None: ...
    def to_host(self, a: Any) -> np.ndarray: ...


class NumpyBackend:
    """Host buffers. `combine` writes `out = a op b` in one memory pass."""

    name = "numpy"

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        return np.empty(n, dtype=dtype)

    def copy(self, src: np.ndarray, dst: np.ndarray) -> None:
        np.copyto(dst, src)

    def combine(self, op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        if op == "PROD" and out.dtype.kind == "c" and (np.shares_memory(out, a) or np.shares_memory(out, b)):
            # numpy's complex multiply takes an FMA path whose last bit depends on whether the
            # output aliases an input; computing into fresh memory keeps every rank bitwise equal.
            out[...] = np.multiply(a, b)
            return
        OPS[op](a, b, out=out)

    def synchronize(self) -> None:
        pass

    def to_host(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)


NUMPY = NumpyBackend()


def backend_for(buf: Any) -> ArrayBackend:
    """The backend that owns `buf` (numpy only for now; see README 'GPU buffers')."""
    if isinstance(buf, np.ndarray):
        return NUMPY
    raise TypeError(f"expected a numpy.ndarray, got {type(buf).__module__}.{type(buf).__name__}")
