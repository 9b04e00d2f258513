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

from typing import Any

import numpy as np

from . import auto as _auto
from . import schedules as _alg
from .call import Call
from .errors import RingmpiError, RingmpiUsageError
from .ops import SUPPORTED_DTYPES, check_op_dtype
from .settings import settings

__all__ = ["execute", "Edge", "group", "algorithms", "last_choice", "RingmpiUsageError", "RingmpiError"]

# (kind, itemsize): np.longlong and np.int64 are different chars of the same type
_DTYPE_KEYS = frozenset((d.kind, d.itemsize) for d in SUPPORTED_DTYPES)
_MPI: list[Any] = []


def _mpi() -> Any:
    """The MPI transport module, imported (and MPI initialised) at the first collective
    call, never at `import ringmpi`: the simulator, the model and the CLI's help run without MPI."""
    if not _MPI:
        from . import mpicomm
        _MPI.append(mpicomm)
    return _MPI[0]


def group(comm: Any = None) -> Any:
    """The transport of `comm` (an mpi4py intracommunicator; COMM_WORLD when None)."""
    return _mpi().transport(comm)


def algorithms(collective: str) -> list[str]:
    """The algorithm names of `collective`; algorithm="auto" picks among them."""
    return _alg.names(collective)


def last_choice(comm: Any = None) -> dict | None:
    """The last call on `comm`: its collective, the algorithm that ran and why (for `auto`,
    the predictions behind the choice; see RINGMPI_DEBUG=INFO)."""
    return group(comm).last_choice


class Edge:
    """Argument checks for one call on one rank; errors read 'ringmpi.CALL (rank r of p): ...'."""

    def __init__(self, call: str, t: Any) -> None:
        self.call = call
        self.t = t

    def fail(self, msg: str, kind: type[Exception] = RingmpiUsageError):
        raise kind(f"ringmpi.{self.call} (rank {self.t.rank} of {self.t.size}): {msg}")

    def array(self, name: str, buf: Any, *, writable: bool = False) -> np.ndarray:
        """`buf` as a flat array (a view: ndarray subclasses such as np.matrix are viewed
        as plain arrays), after checking it is one ringmpi can send and, if `writable`,
        write."""
        if not isinstance(buf, np.ndarray):
            self.fail(f"{name}: expected a numpy.ndarray, got {type(buf).__module__}.{type(buf).__name__}")
        if not buf.flags.c_contiguous:
            self.fail(f"{name} must be C-contiguous (got strides {buf.strides} for shape "
                      f"{buf.shape}); pass np.ascontiguousarray({name})")
        dt = buf.dtype
        if (dt.kind, dt.itemsize) not in _DTYPE_KEYS or not dt.isnative:
            self.fail(f"{name} has dtype {buf.dtype}; expected one of "
                      f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
        if writable and not buf.flags.writeable:
            self.fail(f"{name} is read-only; the result needs a writable buffer")
        flat = buf.reshape(-1) if type(buf) is np.ndarray else buf.view(np.ndarray).reshape(-1)
        return flat

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
        if recvbuf is None:
            return np.empty(count, dtype=send.dtype)
        flat = self.array("recvbuf", recvbuf, writable=True)
        if flat.dtype != send.dtype:
            self.fail(f"recvbuf has dtype {flat.dtype}, expected {send.dtype} (the sendbuf's)")
        if flat.size != count:
            self.fail(f"recvbuf has {flat.size} elements, expected {count}")
        if send.size and flat.size and np.may_share_memory(send, flat) and np.shares_memory(send, flat):
            self.fail("recvbuf overlaps sendbuf; pass the same array for in place, or separate buffers")
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


def execute(spec: Any, comm: Any, algorithm: Any, args: dict) -> Any:
    """Run one public collective call: `spec.prepare` validates `args` and returns the
    `Call` and what the public function returns."""
    try:
        t = group(comm)
    except TypeError as e:
        r, p = _mpi().world_position()
        raise RingmpiUsageError(f"ringmpi.{spec.name} (rank {r} of {p} in COMM_WORLD): {e}") from None
    e = Edge(spec.name, t)
    try:
        st = settings()
    except RingmpiUsageError as err:
        e.fail(str(err))
    problem = None
    try:
        call, result = spec.prepare(e, **args)
        if not isinstance(algorithm, str):
            e.fail(f"algorithm must be a name, got {algorithm!r}")
    except RingmpiUsageError as err:
        if not st.check or t.size == 1:
            raise
        call, result, problem = None, None, err
    t.begin(f"{spec.name}/{algorithm}")
    try:
        if st.check and t.size > 1:
            _agree(e, algorithm, call, problem)
        alg, call = _resolve(e, spec, algorithm, call)
        alg.run(t, call)
    finally:
        t.end()
    return result


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


def _resolve(e: Edge, spec: Any, algorithm: str, call: Call) -> tuple[Any, Call]:
    """The algorithm to run (auto's choice, or the named one) and the call with its tunables."""
    t = e.t
    if algorithm == "auto":
        try:
            choice = _auto.choose(t, call)
        except ValueError as err:
            e.fail(str(err))
        name, why = choice["algorithm"], choice
    else:
        name, why = algorithm, None
    try:
        alg = _alg.get(spec.name, name)
    except ValueError as err:
        e.fail(str(err))
    if alg.cost is None and not t.native_serves(call.count, spec.elementwise):
        e.fail(f"algorithm 'mpi' cannot take {call.count} elements: the MPI library's {spec.name} counts are "
               f"C ints (at most {t.max_count}); use one of ringmpi's algorithms or 'auto'")
    if alg.tune is not None:
        tuned = alg.tuned(t.size, call.count, call.itemsize, _auto.profile_of(t))
        given = dict(call.params)
        call = call._replace(params=tuple(sorted({**tuned, **given}.items())))
    t.describe(f"{spec.name}/{name}")
    t.last_choice = why or {"collective": spec.name, "algorithm": name, "why": "requested",
                            "bytes": call.count * call.itemsize}
    return alg, call
