"""Algorithm registry: every (collective, name) maps to its body, its cost formula and its
tunables.

A body is `body(t, call)`: `t` a transport (`ringmpi.transport.Transport`: the MPI
transport or a virtual rank of the simulator), `call` the validated `ringmpi.call.Call`.
Next to each body its module registers `cost(p, count, itemsize, **params) -> Cost` (the
alpha-beta-gamma formula of exactly that code) and, where the algorithm has a knob,
`tune(p, count, itemsize, profile) -> params` (the pipeline's segment count). Modules in
this package are found and loaded on first use: adding an algorithm is adding a module.
Every collective also has `mpi`, the MPI library's own (`Transport.native`).
"""
from __future__ import annotations

import importlib
import pkgutil
import threading
from dataclasses import dataclass
from typing import Callable

from ..call import Call, block_counts, cdiv, lg, offsets
from ..cost import FREE, Cost, Profile
from ..transport import Transport

__all__ = ["Algorithm", "register", "get", "names", "collectives", "block_counts", "offsets",
           "cdiv", "lg", "binomial"]

NATIVE = "mpi"


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

    def why_not(self, t: Transport) -> str | None:
        return None if self.unavailable is None or t.size == 1 else self.unavailable(t)

    def run(self, t: Transport, call: Call) -> None:
        """Run the body; on one rank every collective is a local copy (or nothing). AVG is
        a SUM (the bodies reduce with it as with SUM) divided by the rank count at the end,
        once, where the result is: the same bits on every rank."""
        if t.size == 1:
            if not call.inplace and call.recv is not None:
                t.copy(call.send, call.recv)
        else:
            self.body(t, call)
        if call.op == "AVG" and call.recv is not None:
            t.scale(call.recv, t.size)

    def tuned(self, p: int, count: int, itemsize: int, prof: Profile) -> dict:
        """The tunables this algorithm picks for the call under `prof` ({} if it has none)."""
        return self.tune(p, count, itemsize, prof) if self.tune is not None else {}

    def formula(self, p: int, count: int, itemsize: int, **params) -> Cost:
        if self.cost is None:
            raise ValueError(f"{self.collective}/{self.name} has no formula (the MPI library's own is measured)")
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
             unavailable: Callable[[Transport], str | None] | None = None):
    """Decorator: register `body(t, call)` as algorithm `name` of `collective`."""
    def deco(fn: Callable[[Transport, Call], None]) -> Callable[[Transport, Call], None]:
        _REGISTRY[(collective, name)] = Algorithm(collective, name, fn, cost, tune, unavailable)
        return fn
    return deco


def _native(t: Transport, call: Call) -> None:
    t.native(call)


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
        for coll in dict.fromkeys(c for c, _ in list(_REGISTRY)):
            _REGISTRY.setdefault((coll, NATIVE), Algorithm(coll, NATIVE, _native))
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
    found = [n for (c, n) in _REGISTRY if c == collective and n != NATIVE]
    if not found:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(collectives())}")
    return found + [NATIVE]


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
