"""The collectives' public calls: blocking, nonblocking (i...) and persistent (..._init).

Each collective's spec (`ringmpi.specs`) says what is true of it: its counts, its harness
data and expected results, and its public call: the parameters and checks of `prepare`,
and the documentation in its docstring. The calls here are made from the specs, one of
each kind for every spec (`_serve`), written out from a template (`_CALL`, `_INIT`; as
`dataclasses` writes `__init__`): the blocking and the nonblocking one with their memo's
check inline, so that a call on the very same arrays costs what a function written by
hand costs.
"""
from __future__ import annotations

import inspect
import sys
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from . import specs
from .api import CACHE, PLANS, Edge, Memo, execute, group, request, restart, restart_same, settings
from .requests import Persistent, Request, progress, testall, waitall
from .call import Call
from .specs import returned
from .transport import LRU
from .written import written

#: the public calls (re-exported by `ringmpi`); the specs are `SPECS` and `spec(name)`
#: (and each collective's nonblocking and persistent calls, made below from its spec: `_serve`)
__all__ = ["shift", "shared_empty", "Request", "Persistent", "waitall", "testall", "progress"]


#: the specs by name (`ringmpi.specs`: each collective's spec serves the API, the simulator and the harnesses)
SPECS, spec = specs.SPECS, specs.spec


def invoke(spec: specs.Collective, call: Call, comm: Any = None, algorithm: str = "auto") -> Any:
    """The public function on a harness call (`spec.make`): what a user's program runs (a
    collective added after import made at first use, by the module's `__getattr__`)."""
    return getattr(sys.modules[__name__], spec.name)(**spec.args(call), comm=comm, algorithm=algorithm)


# -- the public calls ------------------------------------------------------------------------
# Each call looks first at the last call of the same function (its `api.Memo`: the very same
# arrays and arguments, by identity, as a training loop passes every step), then for a plan
# kept by an earlier call of the same shape (`api.execute`): the key is the collective, the
# communicator, the algorithm, the other arguments, and the buffers' dtype and shape (and
# whether the result buffer is new, the send buffer, or another one). A miss, or anything
# that is not an array, takes the full path.


def _key(keyed: tuple | None, spec: specs.Collective, comm: Any, algorithm: Any, sendbuf: Any,
         recvbuf: Any) -> tuple | None:
    if keyed is None:
        return None
    try:
        return (spec, id(comm), algorithm, keyed, sendbuf.dtype, sendbuf.shape, type(sendbuf),
                None if recvbuf is None else True if recvbuf is sendbuf else (recvbuf.dtype, recvbuf.shape,
                                                                              type(recvbuf)))
    except AttributeError:
        return None


def _remember(m: Memo, plan: Any, sendbuf: Any, recvbuf: Any, extra: Any, comm: Any, algorithm: Any) -> None:
    """Keep this call in memo `m`, once it went through (a call the plan refused raised): a
    MPI plan's checks (overlap, layout) hold for these very arrays from now on, when
    neither is a view (`same_buffers`)."""
    same = getattr(plan, "same_buffers", None)
    if same is not None and not (recvbuf is None or recvbuf is sendbuf or (sendbuf.base is None and
                                                                         recvbuf.base is None)):
        same = None
    try:
        send = weakref.ref(sendbuf)
        recv = None if recvbuf is None else True if recvbuf is sendbuf else weakref.ref(recvbuf)
    except TypeError:   # an array type without weak references: no memo
        m.plan = None
        return
    m.send, m.recv, m.extra, m.comm, m.algorithm, m.plan = send, recv, extra, comm, algorithm, same or plan
    m.send_dtype, m.recv_dtype = sendbuf.dtype, None if recvbuf is None else recvbuf.dtype


def _through(m: Memo, plan: Any, sendbuf: Any, recvbuf: Any, extra: Any, comm: Any, algorithm: Any) -> Any:
    """Run a plan found by its key, and remember the call in memo `m`, unless the arrays
    remembered last had died by this call: a loop that passes new arrays every call would
    pay for remembering them every call and never be served, so the memo then backs off
    (skips 1, 3, 7, ... up to 64 calls before it remembers again; kept arrays are served
    from the call after)."""
    out = plan(sendbuf, recvbuf)
    if m.skip:
        m.skip -= 1
        m.plan = None   # (what it holds died: the next call's check stops at once)
        return out
    if m.send is not None and (m.send() is None or type(m.recv) is weakref.ReferenceType and m.recv() is None):
        m.pause = m.skip = min(2 * m.pause + 1, 64)
    else:
        m.pause = 0
    _remember(m, plan, sendbuf, recvbuf, extra, comm, algorithm)
    return out


def _planned(spec: specs.Collective, m: Memo, extra: tuple, comm: Any, algorithm: Any, args: dict) -> Any:
    """A call its memo `m` missed (`extra`: its other arguments, as the memo compares them):
    the plan kept for its key, run and remembered for the next call; else the full path
    (`api.execute`), which keeps one."""
    sendbuf = args[spec.send_arg]
    recvbuf = args[spec.recv_arg] if spec.recv_arg else None
    plan = PLANS.get(key := _key(_keyed(extra), spec, comm, algorithm, sendbuf, recvbuf))
    if plan is None:
        return execute(spec, comm, algorithm, args, key)
    return _through(m, plan, sendbuf, recvbuf, extra, comm, algorithm)


class _Same:
    """An argument a plan's key holds by identity (an `MPI.Op`, which is unhashable), and
    keeps alive, so that its id is never another object's while the key stands."""
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Same and other.value is self.value


def _keyed(extra: tuple) -> tuple | None:
    """The other arguments as a plan's key holds them: by value, or by identity where they
    have no hash (`_Same`); None (no plan kept) where one is a container the caller may
    change in place between calls (counts as a list or an array)."""
    out = []
    for v in extra:
        if type(v) not in _PLAIN:
            if isinstance(v, (list, dict, set, bytearray, np.ndarray)):
                return None
            try:
                hash(v)
            except TypeError:
                v = _Same(v)
        out.append(v)
    return tuple(out)


_PLAIN = (str, int, float, bool, type(None))   # argument types a plan's key holds as they are


#: a collective's public call, for the names of its spec's `prepare` (`_written`): its memo's
#: plan serves the very same arguments at once (`served`: a blocking plan's result; a
#: nonblocking plan's request, or None where it cannot start one, and the call goes on)
_CALL = """def {name}({params}, comm=None, algorithm="auto"):
    m = memo
    plan = m.plan
    if plan is not None and m.comm is comm and m.algorithm is algorithm and m.send() is {send} and {same} \\
            and {send}.dtype is m.send_dtype and {recv_same}:
        {served}
    return planned(spec, m, {extra}, comm, algorithm, dict({given}))
"""
_SERVED = {False: "return plan({send}, {recv})",
           True: "out = plan({send}, {recv})\n        if out is not None:\n            return out"}


def _written(spec: specs.Collective, kind: str = "blocking") -> Callable:
    """The public call of `spec` of `kind`: "blocking", "nonblocking" (i...) or "persistent"
    (..._init): the parameters of its `prepare` (the same names, kinds and defaults), then
    `comm` and `algorithm`. Written out from `_CALL` (`_INIT`) for these names, as
    `dataclasses` writes `__init__`: the memo's check inline costs what a function written
    by hand costs (benchmarks/README.md, "A collective from its spec alone", and "A
    nonblocking call in one frame")."""
    params = list(inspect.signature(spec.prepare).parameters.values())[1:]   # (but the edge)
    send, recv = spec.send_arg, spec.recv_arg
    others = [p.name for p in params if p.name not in (send, recv)]
    spelled, defaults = [], []
    for p in params:
        if p.kind is p.KEYWORD_ONLY and "*" not in spelled:
            spelled.append("*")
        if p.default is p.empty:
            spelled.append(p.name)
        else:
            spelled.append(f"{p.name}=defaults[{len(defaults)}]")
            defaults.append(p.default)
    if "*" not in spelled:
        spelled.append("*")
    recv_same = (f"({recv} is None if m.recv is None else {recv} is {send} if m.recv is True else "
                 f"m.recv() is {recv} and {recv}.dtype is m.recv_dtype)") if recv else "True"
    nonblocking = kind == "nonblocking"
    name = {"blocking": spec.name, "nonblocking": f"i{spec.name}", "persistent": f"{spec.name}_init"}[kind]
    template = _INIT if kind == "persistent" else _CALL
    source = template.format(name=name, params=", ".join(spelled), send=send, recv=recv or "None",
                             recv_same=recv_same, same=" and ".join(f"m.extra[{i}] is {n}" for i, n in
                                                                   enumerate(others)) or "True",
                             extra=f"({', '.join(others)},)" if others else "()",
                             given=", ".join(f"{p.name}={p.name}" for p in params),
                             served=_SERVED[nonblocking].format(send=send, recv=recv or "None"))
    scope = {"memo": CACHE.memo(name), "spec": spec, "planned": _started if nonblocking else _planned,
             "defaults": defaults, "request": request}
    call = written(source, f"<ringmpi.{name}>", scope, name)
    call.__module__, call.__doc__ = __name__, type(spec).__doc__
    call.__qualname__ = f"ringmpi.{name}"   # (Python's own argument errors name the call so: "ringmpi.iallreduce()")
    if kind != "blocking":
        call.__doc__ = _request_doc(spec, kind == "persistent")
        call.__signature__ = inspect.signature(call).replace(
            return_annotation="ringmpi.Persistent" if kind == "persistent" else "ringmpi.Request")
    return call


# -- requests: the same calls nonblocking (i...) and persistent (..._init) ------------------

#: a collective's persistent call (`_written`): bound at once, each problem raised here
_INIT = """def {name}({params}, comm=None, algorithm="auto"):
    return request(spec, comm, algorithm, dict({given}), True)
"""


def _request_doc(spec: specs.Collective, persistent: bool) -> str:
    what = ("Bind the buffers and arguments of `ringmpi.{0}` once, as a persistent request (MPI-4's "
            "MPI_{1}_init): `start()` begins a call, `wait()` returns its result, as often as wanted; `free()`."
            if persistent else
            "Begin `ringmpi.{0}` as a request (MPI-3's MPI_I{1}): `wait()` returns what `{0}` returns, "
            "`test()` says whether it is complete; computation may run meanwhile.")
    return what.format(spec.name, spec.name.capitalize()) + (
        "\n\nArguments, algorithms and errors as in `ringmpi.{0}`; requests on one communicator begin in the "
        "same order on every rank and complete in any order. The hierarchical algorithms run blocking calls "
        "only.").format(spec.name)


def _started(spec: specs.Collective, m: Memo, extra: tuple, comm: Any, algorithm: Any, args: dict) -> Request:
    """A nonblocking call its memo `m` missed: begun by the spec's `RequestMemo` (the kept
    call on these very arrays started again, else a new one, kept), and, where the call is
    kept, remembered in `m` with what starts it again (`api._Bound.again_plan`), which the
    next call on these arrays runs at once."""
    args["comm"], args["algorithm"] = comm, algorithm
    memo = _KEPT_REQUESTS.get(spec.name)
    if memo is None:
        memo = _KEPT_REQUESTS[spec.name] = RequestMemo(spec)
    req = memo.start(args)
    kept = memo.kept(args)
    if kept is not None and kept is req.source:
        sendbuf = args[spec.send_arg]
        recvbuf = args[spec.recv_arg] if spec.recv_arg else None
        _remember(m, kept.bound.again_plan(kept, sendbuf, recvbuf), sendbuf, recvbuf, extra, comm, algorithm)
    return req


#: each collective's `RequestMemo` (its nonblocking calls kept, `_started`)
_KEPT_REQUESTS: dict[str, "RequestMemo"] = {}


@dataclass(eq=False, slots=True)
class _KeptCall:
    """A nonblocking call kept by `RequestMemo`: its arrays (weakly: the memo keeps no user
    array alive), the other arguments (strongly, so that no other object takes their ids),
    what else it checks, and the persistent request that began the call."""
    send: weakref.ref
    recv: weakref.ref
    held: tuple
    dtypes: tuple
    generation: int
    bound: Persistent


_PEEK = OrderedDict.get


class RequestMemo:
    """A nonblocking function's recent calls, for the next ones on the very same arrays (a
    training loop's buckets, every step): the persistent request that began each, started
    again (its checks, algorithm, tunables, scratch and transport kept) once its last call
    was waited for. Found by the identity of the call's arguments (their ids, in the order
    of the function's parameters), before any checking: an array still alive is the object
    with its id, and the other arguments are held. Only where the call has a result buffer
    of its own (in place, or one given: a new result array each call cannot be kept) on host
    arrays, and the other arguments cannot change in place (strings, numbers, None, the
    communicator); the 32 made last; never under RINGMPI_CHECK, which agrees every call
    afresh. `margins`: `api.request`'s, for the calls it begins (the drop-in's)."""
    __slots__ = ("spec", "calls", "margins")

    def __init__(self, spec: specs.Collective, margins: Any = None) -> None:
        self.spec, self.margins = spec, margins
        self.calls: LRU = LRU(32, refresh=False)   # (a loop over more buckets misses either way)

    def kept(self, given: dict) -> Persistent | None:
        """The persistent request of the call kept for these very arguments (None: none is)."""
        kept = _PEEK(self.calls, tuple(map(id, given.values())))   # (no refresh: the C lookup, not `LRU.get`)
        return None if kept is None or kept.generation != CACHE.generation else kept.bound

    def find(self, key: tuple) -> tuple | None:
        """The persistent request of the call kept for arguments of ids `key`, ready to start
        again, and the call's arrays (send, recv); or None."""
        kept = _PEEK(self.calls, key)
        if kept is None or kept.generation != CACHE.generation:
            return None
        last = kept.bound.request
        send, recv = kept.send(), kept.recv()
        if last is not None and not last.waited or send is None or recv is None or \
                (send.dtype, recv.dtype) != kept.dtypes:
            return None
        return kept.bound, send, recv

    def start(self, given: dict, on_done: Callable | None = None) -> Request:
        """Begin the call of arguments `given` (every one by name, `comm` and `algorithm`
        included): the kept call's request started again where there is one, else a new
        one, kept. `on_done` as `api.request`'s (the drop-in's generalized requests: a kept
        call made with one is started with one)."""
        key = tuple(map(id, given.values()))
        kept = self.find(key)
        if kept is not None:
            out = restart_same(self.spec, *kept, on_done)
            if out is not None:
                return out
        args = dict(given)
        comm, algorithm = args.pop("comm"), args.pop("algorithm")
        out = restart(self.spec, kept[0], args, on_done) if kept is not None else None
        if out is None:
            out = request(self.spec, comm, algorithm, args, on_done=on_done, margins=self.margins)
            self.keep(key, given, out.source)
        return out

    def keep(self, key: tuple, given: dict, bound: Any) -> None:
        spec = self.spec
        send = given[spec.send_arg]
        recv = given.get(spec.recv_arg) if spec.recv_arg else send     # (broadcast: in place)
        held = tuple(v for v in given.values() if v is not send and v is not recv)
        comm = given["comm"]
        st = settings()
        if bound is None or st.check or st.debug == "TRACE" or not isinstance(send, np.ndarray) or \
                not isinstance(recv, np.ndarray) or \
                not all(type(v) in (str, int, bool, type(None)) for v in held if v is not comm):
            return
        try:
            refs = weakref.ref(send), weakref.ref(recv)
        except TypeError:
            return
        self.calls.put(key, _KeptCall(*refs, held, (send.dtype, recv.dtype), CACHE.generation, bound))


def shift(sendbuf: np.ndarray, recvbuf: np.ndarray | None = None, *, offset: int = 1,
          comm: Any = None) -> np.ndarray:
    """One ring round: send to rank+offset, receive from rank-offset (one MPI_Sendrecv)."""
    t = group(comm)
    e = Edge("shift", t)
    send = e.array("sendbuf", sendbuf)
    offset = e.integer("offset", offset, -(1 << 62))
    if recvbuf is sendbuf:
        e.fail("shift cannot run in place; pass a separate recvbuf")
    recv = e.recv(recvbuf, send, send.size)
    p, r = t.size, t.rank
    t.begin("shift")
    try:
        t.sendrecv(send, (r + offset) % p, recv, (r - offset) % p)
    finally:
        t.end()
    return returned(recvbuf, recv, sendbuf.shape)


def _serve(spec: specs.Collective) -> None:
    """Make the public, nonblocking and persistent calls of `spec` (those not written out
    here) and list them in `__all__`."""
    for name, kind in ((spec.name, "blocking"), (f"i{spec.name}", "nonblocking"), (f"{spec.name}_init", "persistent")):
        if name not in globals():
            globals()[name] = _written(spec, kind)
        if name not in __all__:
            __all__.append(name)


def __getattr__(name: str) -> Any:
    """The calls of a collective added after this module (`specs.add`: a plug-in), made at
    first use."""
    base = name[1:] if name.startswith("i") and name[1:] in SPECS else name.removesuffix("_init")
    if base not in SPECS or base in globals():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _serve(SPECS[base])
    return globals()[name]


for _spec in list(SPECS.values()):
    _serve(_spec)


def shared_empty(shape: int | Sequence[int], dtype: Any = np.float64, *, comm: Any = None) -> np.ndarray:
    """An uninitialised array in this rank's shared memory, which every rank of the host
    maps: the shared-memory algorithms (`ring_shm`, `pipeline_shm`) send it and build their
    result in it without copying it anywhere (like NCCL's registered buffers or
    MPI_Win_allocate_shared). Collective over `comm` (every rank calls it with its own
    shape); every rank must be on one host. The memory lives as long as the array and the
    communicator.

    Example (mpirun -n 2):
        >>> grads = ringmpi.shared_empty(1 << 24, np.float32)
        >>> grads[:] = ...; ringmpi.allreduce(grads, grads, algorithm="ring_shm")   # zero-copy
    """
    t = group(comm)
    e = Edge("shared_empty", t)
    try:
        dt = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = int(np.prod(dims, dtype=np.int64))
    except (TypeError, ValueError) as err:
        e.fail(f"expected a shape and a dtype, got {shape!r}, {dtype!r} ({err})")
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        e.fail(f"shape must hold non-negative integers, got {shape!r}")
    try:
        s = t.shared()
    except ValueError as err:
        e.fail(str(err))
    t.begin("shared_empty")
    try:
        return s.shared_empty(n, dt).reshape(dims)
    finally:
        t.end()
