"""Functions written out from a text, as `dataclasses` writes `__init__`: the hot calls
whose checks must stand in one frame (the public calls, `collectives._CALL`; the MPI plans'
runs, `api._MPI_PLAN_RUN`; the drop-in's kept calls, `comm._KEPT_CALL`). Their source is
kept where tracebacks and `inspect.getsource` look (`linecache`), as attrs keeps its own."""
from __future__ import annotations

import linecache
from typing import Any, Callable

__all__ = ["compiled", "written"]


def compiled(source: str, filename: str) -> Any:
    """`source` compiled as the module `filename` (a name in angle brackets), its lines
    registered for tracebacks."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


def written(source: str, filename: str, scope: dict, name: str) -> Callable:
    """The function `name` that `source` defines, its global names `scope`."""
    exec(compiled(source, filename), scope)   # noqa: S102 (our own texts, never a user's)
    return scope[name]
