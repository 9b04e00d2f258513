"""Algorithm registry: every (collective, name) maps to its body, its cost formula and its
tunables.

A body is `body(t, call)`: `t` a transport (`ringmpi.transport.Transport`: the MPI
transport or a virtual rank of the simulator), `call` the validated `ringmpi.call.Call`.
Next to each body its module registers `cost(p, count, itemsize, **params) -> Cost` (the
alpha-beta-gamma formula of exactly that code) and, where the algorithm has a knob,
`tune(p, count, itemsize, profile) -> params` (the pipeline's segment count). Modules in
this package are found and loaded on first use: adding an algorithm is adding a module.
Every collective also has `mpi`, the MPI library's own (`Transport.mpi`).

Two call parameters concern the arithmetic rather than an algorithm (`ringmpi.collectives`
sets them): `partials`, the bytes of a 16-bit float's partial sums (4: float32, 2: 16-bit
hops), and `deterministic`, the rank-order fold's bits. A body sees a 16-bit float only
where it can: `run` hands the others the call widened to float32 whole (every message in
float32, one rounding at the end), and MPI's own always (MPI has no 16-bit float to reduce);
an `ordered` body folds in rank order, the only kind `deterministic` admits beyond 2 ranks.
"""
from __future__ import annotations

import importlib
import pkgutil
import threading
from dataclasses import dataclass
from typing import Callable

from ..call import Call, block_counts, cdiv, lg, offsets
from ..cost import FREE, Cost, Profile
from ..ops import ACCUMULATOR, ROUNDING, is_half
from ..transport import Transport

__all__ = ["Algorithm", "register", "get", "names", "collectives", "block_counts", "offsets",
           "cdiv", "lg", "binomial"]

MPI_ALGORITHM = "mpi"


@dataclass(frozen=True)
class Algorithm:
    collective: str
    name: str
    body: Callable[[Transport, Call], None]
    cost: Callable[..., Cost] | None = None  # None: measured only (the MPI library's own)
    tune: Callable[[int, int, int, Profile], dict] | None = None
    #: why this algorithm cannot run on transport t (None: it can); e.g. shared memory needs
    #: every rank on one host. `auto` leaves such algorithms out; asking for one is an error.
    unavailable: Callable[[Transport], str | None] | None = None
    #: the body reduces in rank order, ((x0 + x1) + x2) + ...: the bits `deterministic` asks for
    ordered: bool = False
    #: the body takes a 16-bit float's float32 partial sums (`partials` 4) itself, and sends
    #: what it can in 16 bits (the ring: its all-gather); every other body gets the call
    #: widened whole
    mixed: bool = False
    #: arena(p, call, itemsize): the bytes of the host's shared arena the body reserves (the
    #: shared-memory schedules), reserved before a request's body runs (`scratch`)
    arena: Callable[[int, Call, int], int] | None = None

    def scratch(self, p: int, call: Call) -> int:
        """The bytes of the shared arena the body takes for `call` (0: none). A request
        reserves them when it starts, on the caller's thread, in the order of the starts:
        growing the arena is collective, which a body suspended on another thread cannot be."""
        if self.arena is None or p == 1:
            return 0
        return self.arena(p, call, ACCUMULATOR.itemsize if self.widens(call) else call.itemsize)

    def why_not(self, t: Transport) -> str | None:
        return None if self.unavailable is None or t.size == 1 else self.unavailable(t)

    def refuses(self, t: Transport, call: Call) -> str | None:
        """Why this algorithm cannot serve `call` on `t` (`why_not`, or a deterministic call
        it would add in another order than rank order), or None. Two ranks add in one
        order whatever the algorithm: x0 + x1 and x1 + x0 are the same bits."""
        why = self.why_not(t)
        if why is None and call.param("deterministic") and not self.ordered and t.size > 2:
            keep = [n for n in names(self.collective) if _REGISTRY[(self.collective, n)].ordered]
            why = (f"it adds in its own order, not rank order, so it cannot give the deterministic bits at {t.size} "
                   f"ranks; use {' or '.join(repr(n) for n in keep)}, or 'auto'")
        return why

    def widens(self, call: Call) -> bool:
        """Whether the body gets `call` widened to float32: a 16-bit float whose reduction
        rounds, with float32 partial sums, on a body that is not `mixed`; and MPI's own for
        any reduction of a 16-bit float."""
        if call.op is None or not is_half(call.dtype):
            return False
        if self.name == MPI_ALGORITHM:
            return True
        return call.op in ROUNDING and call.wide_partials and not self.mixed

    def run(self, t: Transport, call: Call) -> None:
        """Run the body; on one rank every collective is a local copy (or nothing). AVG is
        a SUM (the bodies reduce with it as with SUM) divided by the rank count (the spec's
        `divisor`) at the end, once, where the result is: the same bits on every rank. A
        call `widens` runs on float32 copies, divided there, and rounds once into the 16-bit
        result."""
        if t.size > 1 and self.widens(call):
            send = t.empty(call.send.size, ACCUMULATOR)
            t.copy(call.send, send)
            recv = None if call.recv is None else t.empty(call.recv.size, ACCUMULATOR)
            self.run(t, call._replace(send=send, recv=recv, inplace=False))
            if recv is not None:
                t.copy(recv, call.recv)
            return
        if t.size == 1:
            if not call.inplace and call.recv is not None:
                t.copy(call.send, call.recv)
        else:
            self.body(t, call)
        if call.op == "AVG" and call.recv is not None and not (self.mixed and t.size > 1 and call.wide_partials):
            t.scale(call.recv, call.collective.divisor(t.size, t.rank))

    def tuned(self, p: int, count: int, itemsize: int, prof: Profile) -> dict:
        """The tunables this algorithm picks for the call under `prof` ({} if it has none)."""
        return self.tune(p, count, itemsize, prof) if self.tune is not None else {}

    def formula(self, p: int, count: int, itemsize: int, **params) -> Cost:
        """The cost of the body on this call; with `partials` wider than the items (a
        16-bit float with float32 partial sums) a body not `mixed` moves and reduces
        float32 (the widening and the rounding are local copies, outside the model)."""
        if self.cost is None:
            raise ValueError(f"{self.collective}/{self.name} has no formula (the MPI library's own is measured)")
        if params.get("partials", 0) > itemsize and not self.mixed:
            itemsize = params["partials"]
        return FREE if p == 1 else self.cost(p, count, itemsize, **params)

    def predict(self, p: int, count: int, itemsize: int, prof: Profile, **params) -> float | None:
        """Seconds under `prof`, with the tuned parameters unless given; None without a formula.
        Every rank on one node of a profile with node links (per_node >= p): every link is
        the node's."""
        if self.cost is None:
            return None
        c = self.formula(p, count, itemsize, **{**self.tuned(p, count, itemsize, prof), **params})
        if prof.per_node >= p and not c.local_alphas:
            c = c.local()
        return c.time(prof)


_REGISTRY: dict[tuple[str, str], Algorithm] = {}
_LOADED = threading.Event()      # set once every module of the package is imported
_LOADING = threading.RLock()     # (re-entrant: a module that asks the registry while it loads)


def register(collective: str, name: str, cost: Callable[..., Cost] | None = None,
             tune: Callable[[int, int, int, Profile], dict] | None = None,
             unavailable: Callable[[Transport], str | None] | None = None, *, ordered: bool = False,
             mixed: bool = False, arena: Callable[[int, Call, int], int] | None = None):
    """Decorator: register `body(t, call)` as algorithm `name` of `collective` (which then
    has MPI's own, `mpi`, too: the transport says whether the library can run it)."""
    def deco(fn: Callable[[Transport, Call], None]) -> Callable[[Transport, Call], None]:
        _REGISTRY[(collective, name)] = Algorithm(collective, name, fn, cost, tune, unavailable, ordered, mixed,
                                                  arena)
        _REGISTRY.setdefault((collective, MPI_ALGORITHM), Algorithm(collective, MPI_ALGORITHM, _mpi))
        return fn
    return deco


def _mpi(t: Transport, call: Call) -> None:
    t.mpi(call)


def _load() -> None:
    """Import every module of the package once. Under a lock, and marked loaded only when
    done: a second thread asking at the same moment waits for the whole registry instead
    of seeing the part loaded so far."""
    if _LOADED.is_set():
        return
    with _LOADING:
        if _LOADED.is_set():
            return
        for mod in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{mod.name}")
        _LOADED.set()


def collectives() -> list[str]:
    """Every collective with at least one registered algorithm."""
    _load()
    return list(dict.fromkeys(c for c, _ in _REGISTRY))


def get(collective: str, name: str) -> Algorithm:
    _load()
    alg = _REGISTRY.get((collective, name))
    if alg is None:
        raise ValueError(f"unknown algorithm {str(name)!r} for {collective}; expected one of "
                         f"{', '.join(names(collective))} or 'auto'")
    return alg


def names(collective: str) -> list[str]:
    """The algorithms of `collective`, MPI's own last."""
    _load()
    found = [n for (c, n) in _REGISTRY if c == collective and n != MPI_ALGORITHM]
    if not found:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(collectives())}")
    return found + [MPI_ALGORITHM]


def binomial(v: int, p: int) -> tuple[int | None, list[int]]:
    """The binomial tree over relative ranks 0..p-1 rooted at 0, seen from v:
    (the distance m to its parent v - m, or None at the root; the distances m to its
    children v + m, largest first). The root's subtree halves each round, so a broadcast
    sends to the children in this order and a reduce receives from them in reverse."""
    low = v & -v if v else 1 << lg(p)
    children, m = [], low >> 1
    while m:
        if v + m < p:
            children.append(m)
        m >>= 1
    return (low if v else None), children
