"""Which array module holds a model: numpy on the host, cupy on a GPU (`device="cuda"`).

The models, the optimizers and `DataParallel` write their arithmetic once against the
module of their parameters (`module_of`), the way cupy's own `get_array_module` is meant
to be used; cupy is imported only for `device="cuda"`."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["module_of", "device_module", "to_host", "views_of", "DEVICES"]

DEVICES = ("cpu", "cuda")


def device_module(device: str) -> Any:
    """numpy for "cpu", cupy for "cuda" (a clear ImportError without it)."""
    if device == "cpu":
        return np
    if device == "cuda":
        try:
            import cupy
        except ImportError as e:
            raise ImportError(f"device 'cuda' needs cupy ({e}); install cupy-cuda12x or cupy-cuda13x") from None
        return cupy
    raise ValueError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)}")


def module_of(a: Any) -> Any:
    """The array module of `a` (numpy unless `a` is a cupy array)."""
    if isinstance(a, np.ndarray) or "cupy" not in sys.modules:
        return np
    return sys.modules["cupy"].get_array_module(a)


def to_host(a: Any) -> np.ndarray:
    """`a` as a numpy array (a copy from the device for cupy arrays)."""
    return a if isinstance(a, np.ndarray) else a.get() if hasattr(a, "get") else np.asarray(a)


def views_of(flat: Any, shapes: list[tuple[int, ...]]) -> list[Any]:
    """Consecutive views of the 1-D array `flat` with these shapes (a bucket's parameters,
    or what one all-reduce carries)."""
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[at:at + n].reshape(shape))
        at += n
    return out
