"""The call pipeline behind every public collective: validate once at the edge, agree
across ranks when asked, resolve the algorithm, run it under the stall inspector.

    spec.prepare(edge, args)   local checks; the flat buffers and arguments as a `Call`
    t.begin(name)              from here on the call may wait for other ranks: a fresh tag,
                               fresh scratch, the stall inspector's clock running
    agree (RINGMPI_CHECK=1)    every rank's call (or its validation error) compared
    resolve                    auto / RINGMPI_ALGO / the named algorithm, its tunables
    algorithm.run(t, call)     the schedule body
    t.end()

Errors read 'ringmpi.CALL (rank r of p): what was expected, what came'.
"""
from __future__ import annotations

import functools
import os
import time
import weakref
from typing import Any, Callable

import numpy as np

from . import auto as _auto
from . import schedules as _alg
from . import settings as settings_module
from .call import Call
from .device import cai_contiguous, cai_readonly, cai_span, device_backend, is_device
from .errors import RingmpiError, RingmpiUsageError
from .ops import SUPPORTED_DTYPES, canonical, check_op_dtype, is_half
from .settings import log, settings
from .specs import flat_view
from .transport import MPIPlan
from .written import compiled
from . import requests
from .requests import ACTIVE, progress

__all__ = ["execute", "request", "overlaps", "shrink", "fault_tolerant", "Edge", "CACHE", "PLANS", "Memo", "forget_plans", "group", "algorithms", "last_choice", "label", "send_recv_plan", "call_plan", "mpi_reference",
           "RingmpiUsageError",
           "RingmpiError"]

_MPI: list[Any] = []


class Memo:
    """The last call of one public function, for the fast path's first look (by identity,
    before any hashing: a training loop passes the same arrays every step). Weak
    references: a memo keeps no user array alive."""
    __slots__ = ("send", "recv", "extra", "comm", "algorithm", "plan", "send_dtype", "recv_dtype", "skip", "pause")

    def __init__(self) -> None:
        self.send: Any = None        # weakref to the send buffer
        self.recv: Any = None        # None: a new result; True: in place; else a weakref to the result buffer
        self.extra: Any = None       # the other arguments (op, root, ...)
        self.comm: Any = None
        self.algorithm: Any = None
        self.plan: Any = None        # what serves the call (None: nothing remembered, or forgotten)
        self.send_dtype: Any = None  # the arrays' dtypes then (a dtype set in place keeps the object)
        self.recv_dtype: Any = None
        self.skip = 0                # calls to let pass before remembering again (arrays that die young)
        self.pause = 0               # the last such pause


class PlanCache:
    """The call pipeline's caches: plans by call shape (`execute`'s key), each public
    function's last call (`Memo`), and a generation number that every cache elsewhere
    (ringmpi.Comm's hot path) compares. Emptied (`forget`) whenever what a plan assumed
    changes: the settings, a communicator's profile, an online-tuning decision, a freed
    communicator."""

    def __init__(self) -> None:
        self.plans: dict = {}
        self.memos: dict[str, Memo] = {}
        self.generation = 0
        #: called by `forget`: caches elsewhere that drop their entries then rather than
        #: compare `generation` at every call (ringmpi.Comm's kept forms)
        self.on_forget: list[Callable[[], None]] = []

    def memo(self, name: str) -> Memo:
        return self.memos.setdefault(name, Memo())

    def forget(self) -> None:
        self.generation += 1
        self.plans.clear()
        for memo in self.memos.values():
            memo.plan = None
        for hook in self.on_forget:
            hook()


CACHE = PlanCache()
PLANS = CACHE.plans


def forget_plans() -> None:
    """Drop every plan (settings, profile or tuner decision changed; a communicator freed)."""
    CACHE.forget()


def _mpi() -> Any:
    """The MPI transport module, imported (and MPI initialised) at the first collective
    call, never at `import ringmpi`: the simulator, the model and the CLI's help run without MPI."""
    if not _MPI:
        from . import mpicomm
        mpicomm.ON_FREE.append(forget_plans)
        _MPI.append(mpicomm)
    return _MPI[0]


def group(comm: Any = None) -> Any:
    """The transport of `comm` (an mpi4py intracommunicator; COMM_WORLD when None)."""
    return _mpi().transport(comm)


def overlaps(comm: Any = None) -> bool:
    """Whether a collective beside computation can hide anything on `comm`: where it spans
    several hosts (the wire does the waiting), or where this host has a core to spare for
    ringmpi's progress thread beside every rank's computation. Within a host whose cores
    all compute, the transfer is the CPU's memory copies: the progress thread takes them
    from the computation it runs beside, and a step gets slower, not faster
    (benchmarks/README.md, "PyTorch"); the collective then runs blocking, at once."""
    return _hides(group(comm))


def _hides(t: Any) -> bool:
    """`overlaps` on transport `t` (asked once, kept on it)."""
    if t.hides is None:
        nodes = t.nodes
        here = nodes.count(nodes[t.rank])
        try:
            mine = len(os.sched_getaffinity(0))
        except AttributeError:          # (no affinity on this platform: every core)
            mine = os.cpu_count() or 1
        t.hides = len(set(nodes)) > 1 or mine >= 2 and (os.cpu_count() or 1) >= 2 * here
    return t.hides


def algorithms(collective: str, comm: Any = None) -> list[str]:
    """The algorithm names of `collective`; algorithm="auto" picks among them. With `comm`
    (an mpi4py intracommunicator; collective at its first use), only those that can run on
    it: the shared-memory ones need every rank on one host, `hierarchical` several hosts."""
    names = _alg.names(collective)
    if comm is None:
        return names
    t = group(comm)
    return [a for a in names if not _alg.get(collective, a).why_not(t)]


def last_choice(comm: Any = None) -> dict | None:
    """The last call on `comm`: its collective, the algorithm that ran and why (for `auto`,
    the predictions behind the choice; see RINGMPI_DEBUG=INFO)."""
    return group(comm).last_choice


def shrink(comm: Any = None) -> Any:
    """The survivors of `comm` (COMM_WORLD when None) as a new communicator, after a call
    on it raised RankFailure: ULFM's MPI_Comm_shrink, collective over the survivors, ranks
    renumbered in order. Needs an MPI with ULFM turned on at launch (Open MPI 5:
    `python -m ringmpi.launch --fault-tolerant`); RingmpiUsageError otherwise."""
    return _mpi().shrink(comm)


def fault_tolerant() -> bool:
    """Whether this job can outlive a rank (ULFM on): without it a rank's death ends the
    job, and RankFailure never comes."""
    return _mpi().fault_tolerant()


class Edge:
    """Argument checks for one call on one rank; errors read 'ringmpi.CALL (rank r of p): ...'."""

    def __init__(self, call: str, t: Any) -> None:
        self.call = call
        self.t = t

    def fail(self, msg: str, kind: type[Exception] = RingmpiUsageError, *, stand_in: bool = False):
        """Raise `msg` for this call and rank. `stand_in`: a problem with a buffer this rank
        alone could have got wrong (its layout, its writability, its result buffer), which
        fresh buffers of the same data would not have (see `execute`)."""
        err = kind(f"ringmpi.{self.call} (rank {self.t.rank} of {self.t.size}): {msg}")
        err.stand_in = stand_in   # type: ignore[attr-defined]
        raise err

    def array(self, name: str, buf: Any, *, writable: bool = False) -> np.ndarray:
        """`buf` as a flat array (a view: ndarray subclasses such as np.matrix are viewed
        as plain arrays), after checking it is one ringmpi can send and, if `writable`,
        write."""
        if not isinstance(buf, np.ndarray):
            if is_device(buf):
                return self._device_array(name, buf, writable)
            self.fail(f"{name}: expected a numpy.ndarray or a device array (__cuda_array_interface__), "
                      f"got {type(buf).__module__}.{type(buf).__name__}")
        if not buf.flags.c_contiguous:
            self.fail(f"{name} must be C-contiguous (got strides {buf.strides} for shape "
                      f"{buf.shape}); pass np.ascontiguousarray({name})", stand_in=True)
        canonical = self._canonical(name, buf.dtype)
        if writable and not buf.flags.writeable:
            self.fail(f"{name} is read-only; the result needs a writable buffer", stand_in=True)
        return flat_view(buf, canonical)

    def _canonical(self, name: str, dt: np.dtype) -> np.dtype:
        """The one dtype ringmpi sends for `dt` (see CANONICAL); an error for a dtype MPI lacks."""
        found = canonical(dt)
        if found is None or not dt.isnative:
            self.fail(f"{name} has dtype {dt}; expected one of {', '.join(str(d) for d in SUPPORTED_DTYPES)}")
        return found

    def _device_array(self, name: str, buf: Any, writable: bool) -> Any:
        """A device array (`ringmpi.device`), flat, after the same checks as a host one."""
        if device_backend(buf) is None:
            self.fail(f"{name}: device arrays of {type(buf).__module__}.{type(buf).__name__} are not supported; "
                      "expected a cupy array")
        if not cai_contiguous(buf):
            self.fail(f"{name} must be C-contiguous (got strides "
                      f"{buf.__cuda_array_interface__.get('strides')} for shape {buf.shape})")
        dt = np.dtype(buf.dtype)
        canonical = self._canonical(name, dt)
        if writable and cai_readonly(buf):
            self.fail(f"{name} is read-only; the result needs a writable buffer")
        flat = buf.reshape(-1)
        return flat if dt.char == canonical.char else flat.view(canonical)

    def op(self, op: Any, dtype: np.dtype) -> str:
        try:
            name = self.t.op_name(op)
        except ValueError as e:
            self.fail(str(e))
        why = check_op_dtype(name, dtype)
        if why:
            self.fail(why)
        return name

    def integer(self, name: str, value: Any, lo: int, hi: int | None = None) -> int:
        """An int (or numpy integer, not bool) in [lo, hi)."""
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        if not ok or value < lo or (hi is not None and value >= hi):
            bound = f"in [{lo}, {hi})" if hi is not None else f">= {lo}"
            self.fail(f"{name} must be an integer {bound}, got {value!r}")
        return int(value)

    def root(self, root: Any) -> int:
        return self.integer("root", root, 0, self.t.size)

    def recv(self, recvbuf: Any, send: np.ndarray, count: int) -> np.ndarray:
        """The flat result buffer: allocated when None, checked otherwise."""
        device = not isinstance(send, np.ndarray)
        if recvbuf is None:
            return device_backend(send).empty(count, send.dtype) if device else np.empty(count, dtype=send.dtype)
        flat = self.array("recvbuf", recvbuf, writable=True)
        if device != (not isinstance(flat, np.ndarray)):
            where = ("device", "host") if device else ("host", "device")
            self.fail(f"recvbuf is in {where[1]} memory, expected {where[0]} memory (the sendbuf's)", stand_in=True)
        if flat.dtype != send.dtype:
            self.fail(f"recvbuf has dtype {flat.dtype}, expected {send.dtype} (the sendbuf's)", stand_in=True)
        if flat.size != count:
            self.fail(f"recvbuf has {flat.size} elements, expected {count}", stand_in=True)
        if device:
            (a0, a1), (b0, b1) = cai_span(send), cai_span(flat)
            overlap = send.size and flat.size and a0 < b1 and b0 < a1
        else:
            overlap = send.size and flat.size and np.may_share_memory(send, flat) and np.shares_memory(send, flat)
        if overlap:
            self.fail("recvbuf overlaps sendbuf; pass the same array for in place, or separate buffers",
                      stand_in=True)
        return flat

    def counts(self, counts: Any, total: int | None = None) -> tuple[int, ...]:
        p = self.t.size
        try:
            c = tuple(counts)
        except TypeError:
            c = None
        if c is None or len(c) != p or not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                                               and x >= 0 for x in c):
            self.fail(f"counts must hold {p} non-negative integers (one per rank), got {counts!r}")
        c = tuple(int(x) for x in c)
        if total is not None and sum(c) != total:
            self.fail(f"counts add up to {sum(c)}, expected len(sendbuf) = {total}")
        return c


def execute(spec: Any, comm: Any, algorithm: Any, args: dict, key: tuple | None = None,
            planned: str | None = None) -> Any:
    """Run one public collective call: `spec.prepare` validates `args` and returns the
    `Call` and what the public function returns. With `key` (the call's shape, computed by
    the public function), a plan is kept so that the next identical call skips all this.
    `planned`: the algorithm of the plan that sent the call here (`_slow`), the one the
    other ranks run (see `_stand_in`)."""
    t, e = _edge(spec.name, comm)
    try:
        st = settings()
    except RingmpiUsageError as err:
        e.fail(str(err))
    problem = None
    try:
        call, result = _prepare(spec, e, algorithm, args)
    except RingmpiUsageError as err:
        if _stands_in(t, err):
            _stand_in(spec, comm, planned or algorithm, args, err)
        if not st.check or t.size == 1:
            raise
        call, result, problem = None, None, err
    dev = _device(e, call) if call is not None and not isinstance(call.send, np.ndarray) else None
    t.begin(label(spec, algorithm, call))
    try:
        if st.check and t.size > 1:
            _agree(e, algorithm, call, problem)
        alg, call, choice = _resolve(e, spec, algorithm, call, dev)
        tuner = choice.get("tuner")
        if tuner is None:
            _run_body(t, dev, alg, call)
        else:  # online tuning: run (and time) the candidate as its plan will serve it
            plan = _algorithm_plan(t, spec, args, alg, call, choice, _slow(spec, comm, algorithm, args), dev=dev)
            t.seq -= 1   # the plan opens the call's bracket again: one sequence number (tag) a call, as
            # on the plan path, which other ranks may be on (a rank that stands in for bad buffers)
            t0 = time.perf_counter()
            result = plan(args[spec.send_arg], args.get(spec.recv_arg))
            if choice["timed"] and tuner.done(t, alg.name, time.perf_counter() - t0):
                forget_plans()
    finally:
        t.end()
    if st.debug == "TRACE":
        log(f"{spec.name}/{t.last_choice['algorithm']} rank {t.rank} of {t.size}: {call.count if call else '?'} "
            f"elements, {t.last_choice.get('why')}", "TRACE")
    if key is not None and not st.check and st.debug != "TRACE":  # TRACE: every call through here, logged
        if len(PLANS) >= 4096:
            forget_plans()
        PLANS[key] = _plan(t, spec, comm, algorithm, args, alg, call, choice, dev)
    return result


def _prepare(spec: Any, e: "Edge", algorithm: Any, args: dict) -> tuple:
    """The spec's `(call, result)` for the user's arguments, the algorithm's name checked
    too: each problem a one-line RingmpiUsageError from `e`."""
    call, result = spec.prepare(e, **args)
    if not isinstance(algorithm, str):
        e.fail(f"algorithm must be a name, got {algorithm!r}")
    return call, result


def request(spec: Any, comm: Any, algorithm: Any, args: dict, persistent: bool = False,
            on_done: Callable | None = None, margins: Any = None, bare: bool = True) -> Any:
    """Begin one public collective as a request (`ringmpi.requests.Request`), or bind it as
    a persistent one (`Persistent`, started by the caller). Validated, agreed
    (RINGMPI_CHECK) and resolved as a blocking call is, at this call: errors are raised here,
    before any message; the body is the blocking call's, run on the request's suspending
    transport. A rank whose only problem is a buffer of its own stands in with fresh buffers
    (`_stand_in`): that request runs to its end unseen, and the error is raised here.
    `on_done(request)` runs when a call completes, on whichever thread completed it (the
    drop-in completes MPI generalized requests so); such requests go to the progress
    thread whatever RINGMPI_PROGRESS says, since MPI's own waits cannot advance them. A
    persistent request that MPI's own persistent collective serves (`Persistent.mpi`;
    `bare` False: never, as for a caller with work of its own after each call) is MPI's to
    complete: `on_done` is not called there.
    `margins` (`auto.Margins`): how much faster than ringmpi's best MPI's own nonblocking
    collective must be for `auto` to run it; None: REQUEST_MARGIN where a request can hide
    anything (`overlaps`), else the fastest measured (nothing runs beside it anyway)."""
    t, e = _edge(f"{spec.name}_init" if persistent else f"i{spec.name}", comm)
    try:
        st = settings()
        call, result = _prepare(spec, e, algorithm, args)
    except RingmpiUsageError as err:
        fresh = _fresh(spec, args) if _stands_in(t, err) else None
        if fresh is not None:
            try:
                request(spec, comm, algorithm, fresh).waited = True
                err.stood_in = True   # type: ignore[attr-defined]
            except RingmpiUsageError:
                pass   # not a problem of these buffers alone
        if not settings().check or t.size == 1:
            raise
        call, result, problem = None, None, err
    else:
        problem = None
    if st.check and t.size > 1:
        t.begin(label(spec, algorithm, call))
        try:
            _agree(e, algorithm, call, problem)
        finally:
            t.end()
    _auto.profile_of(t)   # (collective at its first use: read now, while every rank is here)
    hides = _hides(t)
    if margins is None:
        margins = _auto.Margins() if hides else _auto.Margins(measured=1.0)
    bound = _bind(e, spec, algorithm, call, result, on_done, st, margins, hides)
    if persistent:
        return bound.persistent(bound.mpi and bare)
    kept = bound.persistent(False)
    kept.transient = True
    return kept.start().request


def restart_same(spec: Any, kept: Any, send: Any, recv: Any, on_done: Callable | None = None) -> Any:
    """A nonblocking call on the very arrays of an earlier one (`collectives.RequestMemo`):
    its persistent request started again once the spec's `again` checked what can change
    about the same array objects (a quarter of `prepare`'s cost; nothing else is redone:
    the algorithm, tunables and transport are the earlier call's); None where the spec has
    no `again` or the arrays changed (then `restart`). `on_done`: this call's (`request`;
    a nonblocking call's bind lets go of its last one at the start, with its buffers)."""
    bound = kept.bound
    call = spec.again(bound.stripped, send.dtype, bound.canonical, send, recv)
    if call is None:
        return None
    if bound.recipe is not None and on_done is None:
        return bound.relaunch(kept, call, recv)
    bound.call, bound.result, bound.on_done = call, recv, on_done
    return kept.start().request


def restart(spec: Any, kept: Any, args: dict, on_done: Callable | None = None) -> Any:
    """`restart_same` by way of `prepare`: these arguments checked afresh, the earlier call's
    persistent request started again where the call has the same shape; None otherwise
    (the caller takes the full path)."""
    bound = kept.bound
    try:
        call, result = spec.prepare(Edge(f"i{spec.name}", bound.t), **args)
    except RingmpiUsageError:
        return None
    if bound.shape != (call.count, call.dtype, call.op, call.root, call.counts, call.inplace):
        return None
    bound.call, bound.result = call._replace(params=bound.params) if bound.params != call.params else call, result
    bound.on_done = on_done
    return kept.start().request


class _Bound:
    """One request's call bound to its transport: what each start runs (`launch`). A
    persistent request keeps its buffers; a nonblocking call's (`Persistent.transient`)
    hands them to its request at the start, which lets go of them when complete, so that
    the memo keeping it for the next call on the same arrays (`restart_same`) keeps no user
    array alive."""
    __slots__ = ("t", "view", "dev", "alg", "call", "result", "name", "on_done", "thread", "mpi", "lean", "params",
                 "shape", "launched", "stripped", "canonical", "arena", "large", "recipe")

    def __init__(self, t: Any, view: Any, dev: Any, alg: Any, call: Call, result: Any, on_done: Any,
                 thread: bool, hides: bool) -> None:
        self.t, self.view, self.dev, self.alg, self.call, self.result = t, view, dev, alg, call, result
        self.name, self.on_done, self.params = view.label, on_done, call.params
        # (the memo compares the given tunables: the shape leaves them out, `params` has them tuned)
        self.shape = (call.count, call.dtype, call.op, call.root, call.counts, call.inplace)
        self.stripped, self.canonical = call._replace(send=None, recv=None), call.dtype   # (for `restart_same`)
        self.mpi = dev is None and _one_mpi_call(t, call.collective, alg, call)
        # MPI matches its own collectives by the order they are called in, not by tags: a
        # body that calls one (MPI's own on device buffers, staged; in pieces; NaN-keyed
        # MAX/MIN) runs its first step at the start, on the caller's thread, so that it
        # posts it in the order of the starts
        self.thread = thread and (self.mpi or alg.cost is not None)
        # MPI's own where nothing can run beside it (`overlaps`): its own request, tested and
        # waited for in MPI, without the engine (`requests.MPIRequest`; benchmarks/README.md, "What a
        # request of ringmpi's own API costs with nothing to overlap")
        self.lean = self.mpi and on_done is None and not hides
        self.arena = alg.scratch(t.size, call) if dev is None else 0   # (shared memory: `RequestView.take_shared`)
        # worth waking the progress thread for at its start (`requests.Request.wakes`): large,
        # where something can run beside it (where nothing can, each wake only took the GIL and
        # a core from the call: benchmarks/README.md, "A nonblocking call in one frame"; the
        # thread still finds it at its nap's end, and at once where a caller blocks elsewhere)
        self.large = hides and call.count * call.itemsize >= requests.WAKE_BYTES
        self.launched = False      # (a start after the first takes the next sequence number and tag)
        self.recipe: tuple | None = None   # (lean) how the last call was posted: `relaunch`

    def persistent(self, mpi: bool) -> Any:
        """The `requests.Persistent` of this call: MPI-4's own persistent collective where
        `mpi` and the library has one, else one whose starts are `launch`."""
        bound = self.view.bind(self.call) if mpi else None
        if bound is not None:   # (a wait finishes its call once: a wait after a test returns it as is)
            finish = (lambda: self.finish(self.view, self.call, self.result)) if self.call.op == "AVG" else None
            return requests.Persistent(self.name, self.t, self.launch, mpi=bound, bound=self, finish=finish)
        return requests.Persistent(self.name, self.t, self.launch, bound=self)

    def launch(self, p: Any) -> Any:
        """One call: its buffers and transport its own from here (a transient bind lets go
        of them now: the request holds them until it completes)."""
        view, call, result = self.view, self.call, self.result
        if self.launched:           # a persistent request's next start
            if p.request is None or p.request.done:
                view.again(self.name, self.mpi)
            else:                    # (never two calls on one transport: each has its tag and scratch)
                view = self.view = self.t.request_view(self.name)
        self.launched = True
        on_done = self.on_done
        if p.transient:
            self.call = self.result = self.on_done = None
        if self.mpi:
            view.post(call)
            posted, view.posted = view.posted, None   # (it holds the call's arrays)
            if self.lean:
                (inner,), view.pending = view.pending, []
                if view.pool is not None:
                    view.close()   # (its first call's scratch, back to the communicator: MPI's own takes none)
                if p.transient:
                    self.recipe = _recipe(posted, call)
                return requests.MPIRequest(self.name, view.seq, self.t, inner,
                                           functools.partial(self.finish, view, call, result))
            body = functools.partial(self.finish, view, call, result)
        else:
            if self.arena:
                view.take_shared(self.arena)
            body = functools.partial(self.body, view, call, result)
        req = requests.Request(self.name, view.seq, self.t, view, body, on_done=on_done, posted=self.mpi,
                               wakes=self.large or on_done is not None)
        return requests.engine().start(req, self.thread)

    def relaunch(self, p: Any, call: Call, result: Any) -> Any:
        """`launch`'s lean call again, on the arrays of the last one (`restart_same`): MPI's
        nonblocking method posted with the arguments it was posted with then, the buffers
        this call's (`recipe`: a request of ringmpi's API waited for at once costs about what
        the drop-in's does; benchmarks/README.md, "A nonblocking call on the same arrays,
        straight to MPI")."""
        return self._repost(p, call.send, call.recv, functools.partial(self.finish, self.view, call, result))

    def _repost(self, p: Any, send: Any, recv: Any, finish: Callable | None, result: Any = None) -> Any:
        """MPI's nonblocking method posted again as `recipe` says, on `send` and `recv`: `p`'s
        next call, as MPI's own request (`finish`: what completes its result, else `result`)."""
        view = self.view
        view.again(self.name, True)
        method, recipe = self.recipe   # type: ignore[misc]
        inner = method(view.comm, *[send if a is _SEND else recv if a is _RECV else a for a in recipe])
        req = p.request = requests.MPIRequest(self.name, view.seq, self.t, inner, finish, result)
        req.source = p
        return req

    def again_plan(self, p: Any, send: Any, recv: Any) -> Callable:
        """What starts the next nonblocking call on the very arrays `send` and `recv` of
        this one, whose persistent request is `p` (the public call's memo runs it: the
        written-out `i...` call): MPI's nonblocking collective posted with these arrays as
        they are, where the lean call was (`recipe`) and they are what it sends (flat plain
        arrays in their canonical dtype: `specs.flat_view` would return them) and nothing
        is left to finish (no AVG); else `restart_same`. Either returns None where it
        cannot start this call (the last one still in flight, the arrays changed), and the
        call takes the full path."""
        recv = send if recv is None else recv
        if self.recipe is not None and self.stripped.op != "AVG" and _flat(send, self.canonical) and \
                _flat(recv, self.canonical):
            return functools.partial(self.lean_again, p)
        return functools.partial(self.again_same, p)

    def again_same(self, p: Any, send: Any, recv: Any) -> Any:
        """`restart_same` where the call's last one on these arrays is no longer in flight."""
        last = p.request
        if last is not None and not last.waited:
            return None
        return restart_same(self.stripped.collective, p, send, send if recv is None else recv)

    def lean_again(self, p: Any, send: Any, recv: Any) -> Any:
        """`relaunch` on the arrays as the caller passed them (`again_plan`: no `Call` made,
        nothing to finish): a nonblocking call on the same arrays costs about MPI's own."""
        last = p.request
        recv = send if recv is None else recv
        if last is not None and not last.waited or not recv.flags.writeable:
            return None
        return self._repost(p, send, recv, None, recv)

    def body(self, view: Any, call: Call, result: Any) -> Any:
        dev = self.dev
        if dev is not None and dev.parent is not view:   # (a fresh request transport: its own device one)
            dev = view.device(dev.backend, dev.aware)
        _run_body(view, dev, self.alg, call)
        return result

    def finish(self, view: Any, call: Call, result: Any) -> Any:
        """MPI's own collective is complete: AVG's division, then the result."""
        if call.op == "AVG" and call.recv is not None:
            view.scale(call.recv, call.collective.divisor(self.t.size, self.t.rank))
        return result


#: where a posted call's arguments held the call's send and receive buffers (`_recipe`)
_SEND, _RECV = object(), object()


def _flat(a: Any, canonical: Any) -> bool:
    """Array `a` is what ringmpi sends of it (`specs.flat_view(a, canonical) is a`)."""
    return type(a) is np.ndarray and a.ndim == 1 and a.dtype.char == canonical.char


def _recipe(posted: tuple, call: Call) -> tuple | None:
    """The method and arguments a lean call was posted with (`RequestView.posted`), its
    buffers marked (`_SEND`, `_RECV`) so that no user array is kept; None where an argument
    holds another array (a list with counts and displacements: the general path then)."""
    method, args = posted
    marked = [_SEND if a is call.send else _RECV if a is call.recv else a for a in args]
    if any(isinstance(a, (np.ndarray, list, tuple)) for a in marked):
        return None
    return method, marked


def _bind(e: Edge, spec: Any, algorithm: str, call: Call, result: Any, on_done: Any, st: Any,
          margins: Any, hides: bool) -> _Bound:
    """The request's transport and its resolved algorithm (kept per call shape on the
    communicator's transport: what a call resolves to depends on nothing but the key)."""
    t = e.t
    view = t.request_view(label(spec, algorithm, call))
    dev = _device(e, call, view) if not isinstance(call.send, np.ndarray) else None
    key = (spec, algorithm, call.count, call.dtype, call.op, call.root, call.counts, call.params, call.inplace,
           dev is None, margins, st.generation, CACHE.generation)
    known = t.request_plans.get(key)
    if known is None:
        alg, resolved = _resolve_request(e, spec, algorithm, call, view if dev is None else dev, margins)
        known = t.request_plans.put(key, (alg, resolved.params, label(spec, alg.name, resolved)))
    alg, params, name = known
    view.relabel(name)
    thread = (st.progress == "thread" or on_done is not None) and t.wire
    return _Bound(t, view, dev, alg, call._replace(params=params) if params != call.params else call, result, on_done,
                  thread, hides)


def _one_mpi_call(t: Any, spec: Any, alg: Any, call: Call) -> bool:
    """Whether `alg` is MPI's own and its call is one MPI call with nothing after it (the
    library's nonblocking or persistent collective then serves the request as it is): not
    MAX/MIN of floats (NaN keys before and after), nor above the C-int count limit (in
    pieces), nor a reduce-scatter in place or with an empty result (a copy after)."""
    return alg.cost is None and t.size > 1 and call.count <= t.max_count and _library_takes(call) and not (
        spec.name == "reduce_scatter" and (call.inplace or call.recv.size == 0 or len(set(call.counts)) != 1))


def _library_takes(call: Call) -> bool:
    """Whether MPI's own collective takes the call's buffers as they are: not MAX/MIN of
    floats (NaN keys before and after), nor a 16-bit float (16-bit words, widened for a
    reduction: `schedules.Algorithm.run`)."""
    return not (call.op in ("MAX", "MIN") and call.dtype.kind == "f") and not is_half(call.dtype)


def _resolve_request(e: Edge, spec: Any, algorithm: str, call: Call, on: Any, margins: Any) -> tuple[Any, Call]:
    """`_resolve` for a request running on transport `on` (its view, or the view's device
    transport): auto among the algorithms that can run as requests, not timed."""
    if algorithm == "auto":
        try:
            choice = _auto.choose_request(on, e.t, call, margins)
        except ValueError as err:
            e.fail(str(err))
        algorithm = choice["algorithm"]
    return _runnable(e, spec, algorithm, call, on)


def _runnable(e: Edge, spec: Any, name: str, call: Call, on: Any) -> tuple[Any, Call]:
    """Algorithm `name` of the collective, checked to run on transport `on` (its layout,
    MPI's count limit), and the call with its tunables; the error otherwise, on every rank."""
    try:
        alg = _alg.get(spec.name, name)
    except ValueError as err:
        e.fail(str(err))
    why = alg.refuses(on, call)
    if why:
        e.fail(f"algorithm {name!r} cannot run here: {why}")
    if alg.cost is None and not on.mpi_serves(call):
        if call.count <= on.max_count:
            e.fail(f"algorithm 'mpi' cannot run {spec.name}: the MPI library has no function for it; use one of "
                   "ringmpi's algorithms or 'auto'")
        e.fail(f"algorithm 'mpi' cannot take {call.count} elements: the MPI library's {spec.name} counts are "
               f"C ints (at most {on.max_count}); use one of ringmpi's algorithms or 'auto'")
    return alg, _with_tunables(on, alg, call)


def _edge(call: str, comm: Any) -> tuple[Any, Edge]:
    """The transport of `comm` and the argument checks of `call` on it (a communicator that
    is not one: the error names the rank in COMM_WORLD)."""
    try:
        t = group(comm)
    except TypeError as err:
        r, p = _mpi().world_position()
        raise RingmpiUsageError(f"ringmpi.{call} (rank {r} of {p} in COMM_WORLD): {err}") from None
    return t, Edge(call, t)


def _stand_in(spec: Any, comm: Any, algorithm: Any, args: dict, err: Exception) -> None:
    """Without RINGMPI_CHECK, the other ranks cannot know that this rank's buffers failed
    their checks: they are in the collective already, and would wait for this rank, or take
    its next call's data for this one's. So a rank whose only problem is a buffer it alone
    got wrong (layout, writability, its result buffer: `Edge.fail(stand_in=True)`) takes
    part with fresh buffers (`_fresh`), running what the other ranks run, then raises its
    error (which RINGMPI_CHECK=1 raises on every rank instead). The others get the right
    result, and no message is left for the next call."""
    fresh = _fresh(spec, args)
    if fresh is None:
        return
    try:
        execute(spec, comm, algorithm, fresh)
    except RingmpiUsageError:
        return    # not a problem of these buffers alone: this rank's error goes up as it is
    err.stood_in = True   # type: ignore[attr-defined]


def _fresh(spec: Any, args: dict) -> dict | None:
    """`args` with fresh buffers: a C-contiguous, writable copy of the send buffer (in place:
    the buffer, written into, then dropped) and a new result; None for device arrays. A
    result that holds the send buffer's very bytes in another array object (`x[:]`) stands
    in in place, as the others most likely call: MPI's own may not meet an in-place call
    with an out-of-place one (MPICH's all-to-all waits forever)."""
    send = args[spec.send_arg]
    if not isinstance(send, np.ndarray):
        return None
    copy = np.array(send, order="C", copy=True)
    fresh = {**args, spec.send_arg: copy}
    if spec.recv_arg:
        recv = args.get(spec.recv_arg)
        fresh[spec.recv_arg] = copy if recv is send or _aliases(send, recv) else None
    return fresh


def _aliases(a: np.ndarray, b: Any) -> bool:
    """b holds a's bytes in the same order in another array object (x[:], x.reshape(...))."""
    return isinstance(b, np.ndarray) and b.nbytes == a.nbytes and b.ctypes.data == a.ctypes.data and (
        (a.flags.c_contiguous and b.flags.c_contiguous) or (a.shape == b.shape and a.strides == b.strides))


def _stands_in(t: Any, err: Exception) -> bool:
    return t.size > 1 and getattr(err, "stand_in", False) and not settings().check


def label(spec: Any, algorithm: str, call: Call | None) -> str:
    """What a call runs, as the stall inspector names it and the call's tag is salted with:
    "allreduce/ring", "broadcast/pipeline, root 2". Ranks whose labels for one call differ
    (in the collective, the root, or a resolved algorithm) called different things."""
    if spec.rooted and call is not None:
        return f"{spec.name}/{algorithm}, root {call.root}"
    return f"{spec.name}/{algorithm}"


def _run_body(t: Any, dev: Any, alg: Any, call: Call) -> None:
    """The algorithm on the host transport, or on the device one (device buffers). What
    it raises goes through `t.failed`: the other ranks may be waiting for this one."""
    try:
        if dev is None:
            alg.run(t, call)
            return
        dev.begin()
        alg.run(dev, call)
        dev.backend.synchronize()
    except BaseException as err:
        _failed(t, err)


def _failed(t: Any, err: BaseException) -> None:
    """A call raised on this rank after it began (a body, or MPI's own in an MPI plan):
    through `t.failed` (the other ranks may be waiting for this one), then the call is over."""
    raised = t.failed(err)
    t.busy = None
    if raised is err:
        raise err
    raise raised from err


def _fingerprint(algorithm: str, call: Call) -> tuple:
    spec = call.collective
    if algorithm == "auto" and settings().forced(spec.name):
        algorithm = f"auto(RINGMPI_ALGO={settings().forced(spec.name)})"
    return (spec.name, algorithm, call.count, str(call.dtype),
            call.op if spec.reduces else "-", call.root if spec.rooted else "-", call.counts, call.params)


def _agree(e: Edge, algorithm: str, call: Call | None, problem: Exception | None) -> None:
    """RINGMPI_CHECK=1 (like TORCH_DISTRIBUTED_DEBUG=DETAIL): before anything can diverge,
    every rank sends rank 0 its call's fingerprint or its validation error; rank 0 (which
    knows, while it waits, which ranks have not arrived) sends back one verdict, and on any
    difference or error every rank raises the same message naming each rank's call."""
    mine = ("error", str(problem)) if problem is not None else _fingerprint(algorithm, call)
    every = e.t.gather_at(mine, 0)
    verdict = None
    if every is not None and (problem is not None or any(f != every[0] for f in every)
                              or every[0][0] == "error"):
        groups: dict = {}
        for r, f in enumerate(every):
            groups.setdefault(f, []).append(r)
        verdict = "; ".join(f"ranks {g}: {' '.join(map(str, f))}" for f, g in groups.items())
    verdict = e.t.bcast_obj(verdict, 0)
    if verdict is not None:
        e.fail(f"ranks disagree on this collective call (RINGMPI_CHECK): {verdict}")


def _device(e: Edge, call: Call, on: Any = None) -> Any:
    """The transport for a call on device buffers (`ringmpi.device.DeviceGroup`): CUDA-aware
    when the library can read device memory (`mpicomm.cuda_support`), staged otherwise.
    RINGMPI_CUDA_AWARE=1 where the library says it cannot is refused here, on every rank,
    before any message: handing device addresses to such an MPI is a segmentation fault."""
    backend = device_backend(call.send)
    support = _mpi().cuda_support()
    aware = support.aware
    if settings().cuda_aware == "1" and not aware:
        if not backend.host_readable:
            e.fail(f"RINGMPI_CUDA_AWARE=1, but this MPI library cannot read device memory ({support.how}); "
                   "unset RINGMPI_CUDA_AWARE to stage through the host")
        aware = True   # the stand-in device array is host memory: any MPI reads it
    return (e.t if on is None else on).device(backend, aware)


def _resolve(e: Edge, spec: Any, algorithm: str, call: Call, dev: Any = None) -> tuple[Any, Call, dict]:
    """The algorithm to run (auto's choice, or the named one), the call with its tunables,
    and the choice (what `last_choice()` reports; under online tuning it holds the tuner).
    `dev`: the call is on device buffers and runs on this transport."""
    t = e.t
    if algorithm == "auto":
        try:
            choice = _auto.choose(t if dev is None else dev, call)
        except ValueError as err:
            e.fail(str(err))
        name = choice["algorithm"]
    else:
        name, choice = algorithm, {"collective": spec.name, "algorithm": algorithm, "why": "requested",
                                   "bytes": call.count * call.itemsize}
    alg, call = _runnable(e, spec, name, call, t if dev is None else dev)
    t.describe(label(spec, name, call))
    t.last_choice = choice
    return alg, call, choice


# -- the fast path: plans for calls already validated once ----------------------------------

def _with_tunables(t: Any, alg: Any, call: Call) -> Call:
    """The call with the algorithm's tunables (given ones win over tuned ones)."""
    if alg.tune is None:
        return call
    tuned = alg.tuned(t.size, call.count, call.itemsize, _auto.profile_of(t))
    return call._replace(params=tuple(sorted({**tuned, **dict(call.params)}.items())))


def _plan(t: Any, spec: Any, comm: Any, algorithm: str, args: dict, alg: Any, call: Call, choice: dict,
          dev: Any = None):
    """A callable plan(sendbuf, recvbuf) -> result for the next calls with the same shape.
    Plans keep no buffer of the call they were made from (a cache must not keep a user's
    arrays alive): only their shapes, through the key and the arguments' other values."""
    tuner, slow = choice.get("tuner"), _slow(spec, comm, algorithm, spec.with_buffers(args, None, None))
    if tuner is not None and tuner.winner is None:
        stub = call._replace(send=np.empty(0, call.dtype), recv=None)   # the dtype, not the memory
        return ExploringPlan(t, spec, spec.with_buffers(args, None, None), stub, tuner, slow, dev).run
    if tuner is not None:  # auto, settled by online tuning: the winner's plan, monitored
        alg, choice = _alg.get(spec.name, tuner.winner), tuner.choice(tuner.winner)
    return _algorithm_plan(t, spec, args, alg, call, choice, slow, tuner, dev)


class ExploringPlan:
    """auto while online tuning explores: each call runs (and times) the tuner's next
    candidate through that candidate's own plan (`plans`, made at its first call, from that
    call's buffers: the same shapes as every call of this plan), so that exploring costs
    what the candidates cost and no more; the decision empties the plan cache."""
    __slots__ = ("t", "spec", "args", "call", "tuner", "slow", "dev", "plans")

    def __init__(self, t: Any, spec: Any, args: dict, call: Call, tuner: Any, slow: Callable,
                 dev: Any = None) -> None:
        self.t, self.spec, self.args, self.call, self.tuner, self.slow, self.dev = t, spec, args, call, tuner, slow, dev
        self.plans: dict[str, Callable] = {}

    def run(self, sendbuf: Any, recvbuf: Any) -> Any:
        choice = self.tuner.pick()
        name = choice["algorithm"]
        plan = self.plans.get(name)
        if plan is None:
            spec, alg = self.spec, _alg.get(self.spec.name, name)
            plan = self.plans[name] = _algorithm_plan(self.t, spec, spec.with_buffers(self.args, sendbuf, recvbuf),
                                                      alg, _with_tunables(self.t, alg, self.call), choice, self.slow,
                                                      dev=self.dev)
        return _timed(self.t, self.tuner, name, plan, sendbuf, recvbuf)


def _slow(spec: Any, comm: Any, algorithm: str, args: dict) -> Callable:
    """For a plan: anything unexpected goes to the full path, which explains it. Only the
    MPI plans (MPI's own, `Group.mpi_plan`) fall back to it: a rank that stands in
    for bad buffers there runs MPI's own, as the others do."""
    def slow(sendbuf: Any, recvbuf: Any) -> Any:
        return execute(spec, comm, algorithm, spec.with_buffers(args, sendbuf, recvbuf), planned="mpi")
    return slow


def _algorithm_plan(t: Any, spec: Any, args: dict, alg: Any, call: Call, choice: dict, slow: Callable,
                    tuner: Any = None, dev: Any = None) -> Callable:
    """MPI's own called straight with the user's arrays where the transport says how (`mpi_plan`),
    else the body (`BodyPlan`). `dev`: the call is on device buffers, which never go to MPI
    without their transport."""
    if dev is None and alg.cost is None and t.mpi_serves(call) and call.op != "AVG" and \
            _library_takes(call):
        how = t.mpi_plan(call, args)
        if how is not None:
            name = label(spec, "mpi", call)
            if how.build is None:
                return send_recv_plan(t, how, name, choice, slow, tuner)
            return call_plan(t, how, name, choice, slow, tuner)
    return BodyPlan(t, spec, args, alg, call, choice, tuner, dev).run   # (a bound method: calling it costs
    # less than calling an object, a measurable share of a small call)


class BodyPlan:
    """An algorithm's body for the calls of one shape, after a fresh validation of their
    buffers (the other arguments are known good). The last call's arrays are kept (weak
    references) with its `Call` without them and their dtype and canonical dtype: the next
    call with the very same arrays skips what cannot have changed about them
    (`Collective.again`: a quarter of `prepare`'s cost). Under a tuner every call counts down
    to the next timed one (`Tuner.due`)."""
    __slots__ = ("t", "spec", "alg", "choice", "tuner", "dev", "label", "params", "bare", "again",
                 "last_send", "last_recv", "last_call", "last_dtype", "last_canonical")

    def __init__(self, t: Any, spec: Any, args: dict, alg: Any, call: Call, choice: dict, tuner: Any = None,
                 dev: Any = None) -> None:
        self.t, self.spec, self.alg, self.choice, self.tuner, self.dev = t, spec, alg, choice, tuner, dev
        self.label, self.params = label(spec, alg.name, call), call.params
        self.bare = spec.with_buffers(args, None, None)      # (the arguments, no buffer: a plan keeps none)
        self.again = spec.again if dev is None else None
        self.last_send = self.last_recv = self.last_call = self.last_dtype = self.last_canonical = None

    def run(self, sendbuf: Any, recvbuf: Any) -> Any:
        tuner, t = self.tuner, self.t
        if tuner is not None and next(tuner.due):
            return _timed(t, tuner, tuner.winner, self.run, sendbuf, recvbuf)
        c, failed = None, None
        if self.last_call is not None and recvbuf is not None and self.last_send() is sendbuf and \
                self.last_recv() is recvbuf:
            c = self.again(self.last_call, self.last_dtype, self.last_canonical, sendbuf, recvbuf)
            result = recvbuf
        if c is None:
            c, result, failed = self._prepare(sendbuf, recvbuf)
        t.begin(self.label)
        try:
            _run_body(t, self.dev, self.alg, c._replace(params=self.params) if self.params else c)  # (only if needed)
        finally:
            t.end()
        if failed is not None:
            failed.stood_in = True   # type: ignore[attr-defined]
            raise failed
        t.last_choice = self.choice
        return result

    def _prepare(self, sendbuf: Any, recvbuf: Any) -> tuple:
        """The call's `Call` and result checked afresh, and the error of a rank that stands
        in for bad buffers of its own (`_stand_in`: it takes part all the same); these
        arrays kept for the next call where `again` can serve it."""
        spec, failed = self.spec, None
        given = spec.with_buffers(self.bare, sendbuf, recvbuf)
        try:
            c, result = spec.prepare(Edge(spec.name, self.t), **given)
        except RingmpiUsageError as err:
            fresh = _fresh(spec, given) if _stands_in(self.t, err) else None
            if fresh is None:
                raise
            (c, result), failed = spec.prepare(Edge(spec.name, self.t), **fresh), err
        if failed is None and self.again is not None and recvbuf is not None and isinstance(c.send, np.ndarray):
            self.last_send, self.last_recv = weakref.ref(sendbuf), weakref.ref(recvbuf)
            self.last_call, self.last_dtype, self.last_canonical = c._replace(send=None, recv=None), sendbuf.dtype, \
                c.send.dtype
        return c, result, failed


def mpi_reference(t: Any, spec: Any, args: dict) -> Callable:
    """MPI's own collective for calls shaped like `args`, as lean as ringmpi can call it
    (the fast path's MPI plan): the reference a benchmark divides by."""
    call, _ = spec.prepare(Edge(spec.name, t), **args)
    choice = {"collective": spec.name, "algorithm": "mpi", "why": "reference"}
    return _algorithm_plan(t, spec, args, _alg.get(spec.name, "mpi"), call, choice,
                           _slow(spec, t.user_comm, "mpi", args))


def _timed(t: Any, tuner: Any, name: str, plan: Callable, sendbuf: Any, recvbuf: Any) -> Any:
    """plan(sendbuf, recvbuf), its time told to `tuner` as a call of `name` (a decision that
    changes the choice empties the plan cache; it comes at the same call on every rank): an
    exploring call, or a settled plan's call that `next(tuner.due)` marks (the plan called
    again here ticks the countdown once more: one call in `sample` - 1); also when this
    rank stood in for bad buffers and raises: the call ran on every rank, so every rank's
    tuner counts it."""
    t0 = time.perf_counter()
    try:
        out = plan(sendbuf, recvbuf)
    except RingmpiUsageError as err:
        if getattr(err, "stood_in", False) and tuner.done(t, name, time.perf_counter() - t0):
            forget_plans()
        raise
    if tuner.done(t, name, time.perf_counter() - t0):
        forget_plans()
    return out


#: the run of an MPI plan (`send_recv_plan`, `call_plan`): the library's function on the
#: user's arrays inside the call-in-flight state the stall watch reads, written out per
#: kind from this one text (as `collectives._CALL` writes the public calls) and run with
#: the plan's names (`_plan_run`): the fast path's hot loop, where a call through a helper
#: is a measurable share of a small MPI call (benchmarks/README.md, "One call bracket for
#: MPI's own calls"). `{arguments}` makes the function's arguments of the call's buffers
#: (or returns the full path's result); `{call}` calls it, `{result}` is what returns. A
#: buffer mpi4py refuses (its BufferError or ValueError, raised before any message moves)
#: goes to the full path, which explains or serves it.
_MPI_PLAN_RUN = """def run(sendbuf, recvbuf):
    if tuner is not None and next(tuner.due):
        return _timed(t, tuner, tuner.winner, run, sendbuf, recvbuf)
{arguments}
    if ACTIVE:
        progress()
    t.current = t.seq = t.seq + 1
    t.busy = label
    try:
        {call}
    except (BufferError, ValueError):
        t.current = t.seq = t.seq - 1
        t.busy = None
        return slow(sendbuf, recvbuf)
    except BaseException as err:   # (MPI's own error)
        _failed(t, err)
    t.busy = None
    t.last_choice = choice
    return {result}
"""
#: `send_recv_plan`'s arguments: a new result array, IN_PLACE, or the two arrays as they are
#: (`check`: whether they may overlap, and a new result's layout, are tested)
_SEND_RECV_ARGUMENTS = """    if recvbuf is None:
        if copy_in_place and (not check or sendbuf.flags.c_contiguous):  # (copy() would take any layout)
            recvbuf = sendbuf.copy()
            send = in_place
        else:
            recvbuf = empty(sendbuf.shape if shape is None else shape, dtype)
            send = (sendbuf, mpi_type)
    elif recvbuf is sendbuf:
        send = in_place
    elif check and (sendbuf.base is not None or recvbuf.base is not None) and may_share(sendbuf, recvbuf):
        return slow(sendbuf, recvbuf)
    else:
        send = (sendbuf, mpi_type)"""
#: `call_plan`'s arguments: what the plan's `build` makes of the buffers
_BUILT_ARGUMENTS = """    built = build(sendbuf, recvbuf)
    if built is None:
        return slow(sendbuf, recvbuf)"""
_PLAN_RUNS = {
    "send_recv": (_SEND_RECV_ARGUMENTS, "fn(send, (recvbuf, mpi_type), mpi_op) if mpi_op is not None else "
                  "fn(send, (recvbuf, mpi_type))", "recvbuf"),
    "call": (_BUILT_ARGUMENTS, "fn(*built[0])", "built[1]"),
}


@functools.lru_cache(maxsize=None)
def _plan_code(kind: str) -> Any:
    """The compiled run of `kind` (one text, one code object, for every plan of that kind;
    its lines where tracebacks and inspect.getsource look)."""
    arguments, call, result = _PLAN_RUNS[kind]
    return compiled(_MPI_PLAN_RUN.format(arguments=arguments, call=call, result=result), f"<ringmpi.api {kind}_plan>")


def _plan_run(kind: str, **names: Any) -> Callable:
    """A run of `kind` over `names` (the plan's transport, function, labels, ...)."""
    scope = {"ACTIVE": ACTIVE, "progress": progress, "_timed": _timed, "_failed": _failed, **names}
    exec(_plan_code(kind), scope)   # noqa: S102 (our own template)
    return scope["run"]


def send_recv_plan(t: Any, how: MPIPlan, label: str, choice: dict, slow: Callable, tuner: Any = None) -> Callable:
    """The library's `how.function(send, recv[, op])` on the user's arrays: a new result array
    of `how.shape` (None: the send buffer's shape at that call, which `x.shape = ...` can change
    under the same array object) and `how.dtype` when recvbuf is None, IN_PLACE when recvbuf is
    sendbuf. This is the fast path's hot loop (`_MPI_PLAN_RUN`): no validation beyond what
    the plan's key guarantees, and anything the key does not cover (overlapping buffers, a
    read-only result, a buffer mpi4py cannot take) goes to the full path, which explains or
    serves it. Buffers go to MPI with the datatype of the canonical dtype (`mpi_function`),
    so 'l' and 'q' arrays mix. `run.same_buffers` skips the overlap test: for a caller that
    passes the very arrays (by identity) that passed it before (an array's memory never
    moves). `how.copy_in_place` (a small all-reduce whose result is shaped like its input):
    a new result is a copy of the send buffer reduced in place, which costs mpi4py one
    buffer less to parse, more than copying a few hundred bytes costs over allocating them
    (`mpicomm._COPY_IN_PLACE`)."""
    fn, mpi_op, in_place, mpi_type = t.mpi_function(how.function, how.op, how.dtype)
    shape = how.shape[0] if how.shape is not None and len(how.shape) == 1 else how.shape   # (np.empty(n): faster)
    names = dict(t=t, tuner=tuner, label=label, choice=choice, slow=slow, fn=fn, mpi_op=mpi_op, in_place=in_place,
                 mpi_type=mpi_type, shape=shape, dtype=how.dtype, copy_in_place=how.copy_in_place, empty=np.empty,
                 may_share=np.may_share_memory)
    checked = _plan_run("send_recv", check=True, **names)
    checked.same_buffers = _plan_run("send_recv", check=False, **names)  # type: ignore[attr-defined]
    return checked


def call_plan(t: Any, how: MPIPlan, label: str, choice: dict, slow: Callable, tuner: Any = None) -> Callable:
    """The library's `how.function(*args)` with `(args, result) = how.build(sendbuf, recvbuf)`
    (None: the full path) for the collectives whose calls do not fit `send_recv_plan`."""
    return _plan_run("call", t=t, tuner=tuner, label=label, choice=choice, slow=slow,
                     fn=t.mpi_function(how.function)[0], build=how.build)


settings_module.on_reload(forget_plans)
_auto.ON_CHANGE.append(forget_plans)
