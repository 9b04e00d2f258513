"""Algorithm registry: every (collective, name) maps to its body and its cost formula.

Bodies take a transport first (`ringmpi.mpicomm.MPITransport` or the simulator's
`VirtualRank`) and flat 1-D buffers; validation has already happened at the API edge.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["COLLECTIVES", "Algorithm", "register", "get", "names", "block_counts", "offsets"]

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


@dataclass(frozen=True)
class Algorithm:
    collective: str
    name: str
    run: Callable
    cost: Callable | None  # (p, count, itemsize, **params) -> ringmpi.cost.Cost; None: measured only


_REGISTRY: dict[tuple[str, str], Algorithm] = {}


def register(collective: str, name: str, cost: Callable | None = None):
    def deco(fn: Callable) -> Callable:
        _REGISTRY[(collective, name)] = Algorithm(collective, name, fn, cost)
        return fn
    return deco


_LOADED = False


def _load() -> None:
    global _LOADED
    if not _LOADED:
        from . import naive, native, recursive, ring, tree  # noqa: F401  (registration)
        _LOADED = True


def get(collective: str, name: str) -> Algorithm:
    try:
        return _REGISTRY[(collective, name)]
    except KeyError:
        _load()
        if (collective, name) in _REGISTRY:
            return _REGISTRY[(collective, name)]
        raise ValueError(f"unknown algorithm {name!r} for {collective}; expected one of "
                         f"{', '.join(names(collective))} or 'auto'") from None


def names(collective: str) -> list[str]:
    _load()
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    return [n for (c, n) in _REGISTRY if c == collective]


def block_counts(count: int, p: int) -> list[int]:
    """Even split: the first count % p blocks hold one element more."""
    q, r = divmod(count, p)
    return [q + (i < r) for i in range(p)]


def offsets(counts: list[int]) -> list[int]:
    """Prefix sums, length len(counts)+1: block i is [off[i], off[i+1])."""
    off = [0]
    for c in counts:
        off.append(off[-1] + c)
    return off
