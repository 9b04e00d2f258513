"""Tensors as ringmpi's arrays and back, and the collectives on them (blocking and as
requests whose futures ringmpi's progress thread completes)."""
from __future__ import annotations

import os
from typing import Any, Callable

try:
    import torch
except ImportError as _missing:   # the one place that says what to install
    raise ImportError(f"ringmpi.torch needs PyTorch ({_missing}); pip install 'ringmpi[torch]'") from None
import numpy as np

from .. import collectives
from ..api import group, request

__all__ = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall",
           "iallreduce", "ireduce_scatter", "iallgather", "ibroadcast", "ireduce", "ialltoall",
           "TensorRequest", "as_array", "as_tensor", "overlaps", "COLLECTIVES"]

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall")


def as_array(t: Any, call: str = "ringmpi.torch", what: str = "buffer") -> Any:
    """The array on `t`'s memory (numpy for a CPU tensor, cupy for a CUDA one); anything
    that is not a tensor passes through unchanged."""
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    kind = t.device.type
    if kind == "cuda":
        try:
            import cupy
        except ImportError as err:
            raise TypeError(f"{call}: {what} is a CUDA tensor; ringmpi's device path needs cupy ({err})") from None
        if t.dtype is torch.bfloat16:
            return cupy.asarray(t.view(torch.int16)).view(_bfloat16())
        return cupy.asarray(t)
    if kind != "cpu":
        raise TypeError(f"{call}: {what} is a tensor on {t.device}; expected a CPU or CUDA tensor")
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(_bfloat16())
    try:
        return t.numpy()
    except (RuntimeError, TypeError) as err:   # (conjugate or negative views, dtypes numpy lacks)
        raise TypeError(f"{call}: {what} (a {t.dtype} tensor) has no numpy view: {err}") from None


def as_tensor(a: Any) -> Any:
    """The tensor on array `a`'s memory (no copy); None stays None."""
    if a is None or isinstance(a, torch.Tensor):
        return a
    if isinstance(a, np.ndarray):
        if a.dtype == _bfloat16():
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    if a.dtype == _bfloat16():          # (a cupy array)
        return torch.as_tensor(a.view(np.int16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(a, device="cuda")


def _bfloat16() -> Any:
    """ml_dtypes' bfloat16 (ml_dtypes comes with ringmpi's reduced-precision support)."""
    try:
        import ml_dtypes
    except ImportError:
        return np.dtype("V2")           # (compares unequal to every array dtype a tensor gives)
    return np.dtype(ml_dtypes.bfloat16)


class _Arrays:
    """A call's arguments with every tensor replaced by its array (one array per tensor: a
    tensor given twice is in place), and the way back: the result array that is a given
    buffer comes back as that very tensor."""
    __slots__ = ("tensors", "arrays")

    def __init__(self) -> None:
        self.tensors: dict[int, Any] = {}    # id(array) -> tensor
        self.arrays: dict[int, Any] = {}     # id(tensor) -> (tensor, array)

    def of(self, value: Any, call: str, what: str) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        known = self.arrays.get(id(value))
        if known is not None:
            return known[1]
        a = as_array(value, call, what)
        self.tensors[id(a)] = value
        self.arrays[id(value)] = (value, a)
        return a

    def back(self, result: Any) -> Any:
        if result is None:
            return None
        t = self.tensors.get(id(result))
        return t if t is not None else as_tensor(result)


def _arguments(name: str, args: tuple, kwargs: dict) -> tuple[_Arrays, tuple, dict]:
    arrays = _Arrays()
    call = f"ringmpi.torch.{name}"
    args = tuple(arrays.of(a, call, f"argument {i + 1}") for i, a in enumerate(args))
    kwargs = {k: arrays.of(v, call, k) for k, v in kwargs.items()}
    return arrays, args, kwargs


def _blocking(name: str) -> Callable:
    fn = getattr(collectives, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        arrays, args, kwargs = _arguments(name, args, kwargs)
        return arrays.back(fn(*args, **kwargs))
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"`ringmpi.{name}` on tensors (same arguments); returns a tensor.\n\n" + (fn.__doc__ or "")
    return call


def overlaps(comm: Any = None) -> bool:
    """Whether a collective beside computation can hide anything on `comm`: where it spans
    several hosts (the wire does the waiting), or where this host has a core to spare for
    ringmpi's progress thread beside every rank's computation. Within a host whose cores
    all compute, the transfer is the CPU's memory copies: the progress thread takes them
    from the computation it runs beside, and a step gets slower, not faster
    (benchmarks/README.md, "PyTorch"); the collective then runs blocking, at once."""
    t = group(comm)
    nodes = t.nodes
    if len(set(nodes)) > 1:
        return True
    here = nodes.count(nodes[t.rank])
    try:
        mine = len(os.sched_getaffinity(0))
    except AttributeError:          # (no affinity on this platform: every core)
        mine = os.cpu_count() or 1
    return mine >= 2 and (os.cpu_count() or 1) >= 2 * here


class TensorRequest:
    """A collective on tensors in flight: `wait()` returns its result tensor (or raises
    what the call raised), `test()` says whether it is complete, `get_future()` gives a
    `torch.futures.Future` whose value is that tensor. Completed on ringmpi's progress
    thread (or by `wait()` on the caller's, whichever comes first); with `overlap` False,
    run blocking here and complete when made."""
    __slots__ = ("request", "future", "__weakref__")

    def __init__(self, name: str, comm: Any, algorithm: str, given: dict, arrays: _Arrays,
                 then: Callable[[Any], Any] | None = None, overlap: bool = True) -> None:
        self.future = future = torch.futures.Future()
        self.request = None
        if not overlap:
            out = arrays.back(getattr(collectives, name)(**given, comm=comm, algorithm=algorithm))
            future.set_result(then(out) if then is not None else out)
            return

        def done(ring: Any) -> None:
            ring.waited = True          # (the future holds the outcome from here)
            try:
                if ring.error is not None:
                    future.set_exception(ring.error)
                else:
                    out = arrays.back(ring.result)
                    future.set_result(then(out) if then is not None else out)
            except BaseException as err:   # noqa: BLE001 (on the progress thread: nobody else would see it)
                if not future.done():
                    future.set_exception(err)
        self.request = request(collectives.spec(name), comm, algorithm, given, on_done=done)

    def wait(self) -> Any:
        """The result tensor (the call's error, if it failed)."""
        if self.request is not None and not self.request.done:
            self.request.wait()
        return self.future.wait()

    def test(self) -> bool:
        return self.future.done()

    def get_future(self) -> Any:
        return self.future


def _nonblocking(name: str) -> Callable:
    blocking = getattr(collectives, name)
    parameters = collectives.Parameters(blocking)

    def call(*args: Any, **kwargs: Any) -> TensorRequest:
        arrays, args, kwargs = _arguments("i" + name, args, kwargs)
        given = parameters.bind(f"ringmpi.torch.i{name}", args, kwargs)
        comm, algorithm = given.pop("comm"), given.pop("algorithm")
        return TensorRequest(name, comm, algorithm, given, arrays)
    call.__name__ = call.__qualname__ = f"i{name}"
    call.__doc__ = (f"`ringmpi.{name}` on tensors as a request (MPI's I{name}): a `TensorRequest`, whose "
                    "`wait()` returns the result tensor and `get_future()` a torch Future of it.")
    return call


allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall = (_blocking(n) for n in COLLECTIVES)
iallreduce, ireduce_scatter, iallgather, ibroadcast, ireduce, ialltoall = (_nonblocking(n) for n in COLLECTIVES)
