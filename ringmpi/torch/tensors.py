"""Tensors as ringmpi's arrays and back, and the collectives on them (blocking and as
requests whose futures ringmpi's progress thread completes)."""
from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any, Callable

try:
    import torch
except ImportError as _missing:   # the one place that says what to install
    raise ImportError(f"ringmpi.torch needs PyTorch ({_missing}); pip install 'ringmpi[torch]'") from None
import numpy as np

from .. import collectives
from ..api import group, overlaps, request
from ..dp.arrays import device_module

#: the collectives (`ringmpi.specs`), each blocking and nonblocking on tensors (made below)
COLLECTIVES = tuple(collectives.SPECS)

__all__ = ["TensorRequest", "Outcome", "as_array", "as_tensor", "overlaps", "COLLECTIVES",
           *COLLECTIVES, *(f"i{name}" for name in COLLECTIVES)]


def as_array(t: Any, call: str = "ringmpi.torch", what: Any = "buffer") -> Any:
    """The array on `t`'s memory (numpy for a CPU tensor, cupy for a CUDA one); anything
    that is not a tensor passes through unchanged. The array made for a tensor is kept for
    its next call while the tensor's memory and layout stay the same (`_VIEWS`): ringmpi's
    own plan of the last call then finds the very arrays it ran on."""
    if not isinstance(t, torch.Tensor):
        return t
    known = _VIEWS.get(id(t))
    if known is not None:
        ref, ptr, shape, stride, a = known
        if ref() is t and t.data_ptr() == ptr and t.shape == shape and t.stride() == stride:
            return a
    a = _view(t, call, what)
    try:   # (the array holds the tensor's memory: the entry goes when the tensor does)
        ref = weakref.ref(t, functools.partial(_forget, id(t)))
    except TypeError:                 # (a tensor subclass without weak references)
        return a
    if len(_VIEWS) >= 64:             # (the oldest goes: a training loop reuses a few tensors)
        _VIEWS.pop(next(iter(_VIEWS)), None)
    _VIEWS[id(t)] = (ref, t.data_ptr(), t.shape, t.stride(), a)
    return a


#: id(tensor) -> (weak reference, data pointer, shape, strides, array) of recent live tensors
_VIEWS: dict[int, tuple] = {}


def _forget(key: int, ref: Any) -> None:
    known = _VIEWS.get(key)
    if known is not None and known[0] is ref:
        _VIEWS.pop(key, None)      # (a garbage collection on another thread may call this meanwhile)


def _view(t: Any, call: str, what: Any) -> Any:
    """(`what`: the argument's name, or its position from 0)"""
    if isinstance(what, int):
        what = f"argument {what + 1}"
    t = t.detach()
    kind = t.device.type
    if kind == "cuda":
        try:
            cupy = device_module("cuda")
        except ImportError as err:
            raise TypeError(f"{call}: {what} is a CUDA tensor: {err}") from None
        if t.dtype is torch.bfloat16:
            return cupy.asarray(t.view(torch.int16)).view(_bfloat16(call))
        return cupy.asarray(t)
    if kind != "cpu":
        raise TypeError(f"{call}: {what} is a tensor on {t.device}; expected a CPU or CUDA tensor")
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(_bfloat16(call))
    try:
        return t.numpy()
    except (RuntimeError, TypeError) as err:   # (conjugate or negative views, dtypes numpy lacks)
        raise TypeError(f"{call}: {what} (a {t.dtype} tensor) has no numpy view: {err}") from None


def as_tensor(a: Any) -> Any:
    """The tensor on array `a`'s memory (no copy); None stays None."""
    if a is None or isinstance(a, torch.Tensor):
        return a
    bf16 = _bfloat16() if a.dtype.kind == "V" else None     # (ml_dtypes' types are numpy void kinds)
    if isinstance(a, np.ndarray):
        if bf16 is not None and a.dtype == bf16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    if bf16 is not None and a.dtype == bf16:          # (a cupy array)
        return torch.as_tensor(a.view(np.int16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(a, device="cuda")


def _bfloat16(call: str | None = None) -> Any:
    """ml_dtypes' bfloat16 (the numpy extension JAX uses), or None without ml_dtypes (a
    TypeError naming `call` where one is given: a bfloat16 tensor cannot be handed over)."""
    try:
        import ml_dtypes
    except ImportError:
        if call is None:
            return None
        raise TypeError(f"{call}: a bfloat16 tensor needs ml_dtypes for its numpy view (pip install ml_dtypes)") from None
    return np.dtype(ml_dtypes.bfloat16)


class _Arrays:
    """A call's arguments with every tensor replaced by its array (one array per tensor: a
    tensor given twice is in place), and the way back: the result array that is a given
    buffer comes back as that very tensor."""
    __slots__ = ("call", "tensors")

    def __init__(self, call: str) -> None:
        self.call = call
        self.tensors: dict[int, Any] = {}    # id(array) -> tensor

    def of(self, value: Any, what: Any) -> Any:
        """`value`'s array if it is a tensor (`what`: its argument's name or position)."""
        if not isinstance(value, torch.Tensor):
            return value
        a = as_array(value, self.call, what)
        self.tensors[id(a)] = value
        return a

    def back(self, result: Any) -> Any:
        if result is None:
            return None
        t = self.tensors.get(id(result))
        return t if t is not None else as_tensor(result)


def _arguments(call: str, args: tuple, kwargs: dict) -> tuple[_Arrays, tuple, dict]:
    arrays = _Arrays(call)
    args = tuple([arrays.of(a, i) for i, a in enumerate(args)])
    if kwargs:
        kwargs = {k: arrays.of(v, k) for k, v in kwargs.items()}
    return arrays, args, kwargs


def _blocking(name: str) -> Callable:
    fn = getattr(collectives, name)
    where = f"ringmpi.torch.{name}"

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 2 and args[0] is args[1] and isinstance(args[0], torch.Tensor):   # in place: a
            a = as_array(args[0], where, 0)                              # training loop's call, kept short
            out = fn(a, a, **kwargs)
            return args[0] if out is a else as_tensor(out)    # (reduce_scatter's block r: a view; None)
        arrays, args, kwargs = _arguments(where, args, kwargs)
        return arrays.back(fn(*args, **kwargs))
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"`ringmpi.{name}` on tensors (same arguments); returns a tensor.\n\n" + (fn.__doc__ or "")
    return call


class Outcome:
    """Something whose outcome a `torch.futures.Future` holds (`future`): a request on
    tensors, the process group's work. DDP reads the future; `done()` says it is set."""
    __slots__ = ()
    future: Any

    def done(self) -> bool:
        return self.future.done()

    def get_future(self) -> Any:
        return self.future


class TensorRequest(Outcome):
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
        # only ringmpi's progress thread completes a future nobody waits for in Python (DDP waits
        # in C++): where it cannot run beside the caller (one rank; MPI below THREAD_MULTIPLE),
        # the call runs blocking here
        if not overlap or not group(comm).wire:
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
        _at_backward_end().add(self.request)

    def wait(self) -> Any:
        """The result tensor (the call's error, if it failed)."""
        if self.request is not None and not self.request.done:
            self.request.wait()
        return self.future.wait()

    test = Outcome.done


class _BackwardEnd:
    """The requests begun during one backward pass (DDP's buckets, from its hook or from the
    ringmpi process group), waited for by an autograd callback at the pass's end, on the
    thread that ran it. DDP then waits for their futures in C++, where ringmpi cannot see a
    waiter: without this the progress thread would go on napping between its tests while
    the last buckets' messages are the only work left (a caller's wait makes it test
    without a pause). Outside a backward pass there is nothing to queue on."""
    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list = []

    def add(self, req: Any) -> None:
        if not self.pending:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self.drain)
            except RuntimeError:        # ("can only be installed during backward pass")
                return
        self.pending.append(req)

    def drain(self) -> None:
        pending, self.pending = self.pending, []
        for req in pending:
            try:
                req.wait()
            except BaseException:    # noqa: BLE001 (the future holds the error: DDP raises it where it waits)
                pass


_LOCAL = threading.local()


def _at_backward_end() -> _BackwardEnd:
    end = getattr(_LOCAL, "end", None)
    if end is None:
        end = _LOCAL.end = _BackwardEnd()
    return end


class Parameters:
    """A public function's parameters, to bind a call's arguments by name as Python would
    (`inspect.Signature.bind` costs ten times `bind`, for the shapes a call can take): the
    nonblocking calls on tensors hand ringmpi's request the arguments by name."""
    __slots__ = ("signature", "positional", "defaults")

    def __init__(self, fn: Callable) -> None:
        self.signature = sig = inspect.signature(fn)
        self.defaults = {k: v.default for k, v in sig.parameters.items() if v.default is not inspect.Parameter.empty}
        self.positional = [k for k, v in sig.parameters.items() if v.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]

    def bind(self, name: str, args: tuple, kwargs: dict) -> dict:
        """Every argument by name, defaults filled in; TypeError naming call `name` otherwise."""
        known, positional = self.signature.parameters, self.positional
        if len(args) > len(positional) or not kwargs.keys() <= known.keys() or \
                not kwargs.keys().isdisjoint(positional[:len(args)]):
            try:
                self.signature.bind(*args, **kwargs)
            except TypeError as err:
                raise TypeError(f"{name}: {err}") from None
        given = {**self.defaults, **dict(zip(positional, args)), **kwargs}
        if len(given) < len(known):
            missing = [k for k in known if k not in given]
            raise TypeError(f"{name}: missing argument {missing[0]!r}")
        return given


def _nonblocking(name: str) -> Callable:
    blocking = getattr(collectives, name)
    parameters = Parameters(blocking)
    where = f"ringmpi.torch.i{name}"

    def call(*args: Any, **kwargs: Any) -> TensorRequest:
        arrays, args, kwargs = _arguments(where, args, kwargs)
        given = parameters.bind(where, args, kwargs)
        comm, algorithm = given.pop("comm"), given.pop("algorithm")
        return TensorRequest(name, comm, algorithm, given, arrays)
    call.__name__ = call.__qualname__ = f"i{name}"
    call.__doc__ = (f"`ringmpi.{name}` on tensors as a request (MPI's I{name}): a `TensorRequest`, whose "
                    "`wait()` returns the result tensor and `get_future()` a torch Future of it.")
    return call


for _name in COLLECTIVES:
    globals()[_name], globals()[f"i{_name}"] = _blocking(_name), _nonblocking(_name)
