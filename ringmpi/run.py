"""Run an unchanged mpi4py program on ringmpi's collectives.

    mpirun -n 4 python -m ringmpi.run script.py [args]
    mpirun -n 4 python -m ringmpi.run -m package.module [args]
    mpirun -n 4 python -m ringmpi.run -c "code" [args]

MPI.COMM_WORLD and MPI.COMM_SELF are replaced by `ringmpi.Comm`s before the program runs (the
program's `from mpi4py import MPI` then sees them), so its Allreduce, Bcast, Reduce,
Allgather(v), Alltoall and Reduce_scatter(_block) calls on them, and on the communicators
it makes from them with Dup/Split/Create, run ringmpi's algorithms (auto, or
RINGMPI_ALGO=allreduce=ring,...). Rank 0 says so once on stderr (RINGMPI_QUIET=1: not);
with --stats (or RINGMPI_DEBUG=INFO) it also says at the end which calls ringmpi served.

What this mode cannot reach: communicators made by C code or by mpi4py calls that return
plain objects (Create_cart, Create_intercomm, Get_parent, Spawn, ...), programs that held
on to MPI.COMM_WORLD before ringmpi.run replaced it, and libraries that compare types with
`type(comm) is MPI.Intracomm` (isinstance checks hold: ringmpi.Comm is an MPI.Intracomm, and
C extensions get the same MPI handle).
"""
from __future__ import annotations

import atexit
import copyreg
import os
import runpy
import sys
from typing import Any

from mpi4py import MPI

from .comm import COLLECTIVES, Comm, _predefined, stats
from .settings import settings

__all__ = ["install", "uninstall", "main"]

USAGE = "usage: python -m ringmpi.run [--stats] (script.py | -m module | -c code) [args ...]"


_REPLACED: dict[str, MPI.Intracomm] = {}   # name -> the mpi4py object install() replaced


def install() -> None:
    """Replace MPI.COMM_WORLD and MPI.COMM_SELF by ringmpi communicators (idempotent).

    Pickling still works as in mpi4py: the replaced objects, which mpi4py pickles by name,
    are pickled as the name (unpickled as whatever MPI.COMM_WORLD is now) through a copyreg
    entry for plain Intracomm objects; every other object pickles as mpi4py decides."""
    for name in ("COMM_WORLD", "COMM_SELF"):
        obj = getattr(MPI, name)
        if not isinstance(obj, Comm):
            _REPLACED[name] = obj
            setattr(MPI, name, Comm(obj))
    copyreg.pickle(MPI.Intracomm, _reduce_plain)


def uninstall() -> None:
    """Put mpi4py's own MPI.COMM_WORLD and MPI.COMM_SELF back."""
    for name, obj in _REPLACED.items():
        setattr(MPI, name, obj)
    _REPLACED.clear()
    copyreg.dispatch_table.pop(MPI.Intracomm, None)


def _reduce_plain(comm: MPI.Intracomm) -> Any:
    for name, obj in _REPLACED.items():
        if comm is obj:
            return _predefined, (name,)
    return comm.__reduce__()


def _report() -> None:
    """--stats or RINGMPI_DEBUG=INFO: which of the program's collective calls ringmpi
    served on rank 0 (the rest went to mpi4py unchanged)."""
    if not MPI.Is_finalized() and MPI.COMM_WORLD.Get_rank() == 0:
        rows = ", ".join(f"{m} {n - left}/{n}" for m, (n, left) in stats().items())
        sys.stderr.write(f"ringmpi.run: calls served by ringmpi on rank 0: {rows or 'none'}\n")
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + __doc__.split("\n\n", 2)[2].split("\n\nWhat")[0], file=sys.stderr)
        return 0 if argv else 2
    show_stats = argv[0] == "--stats"
    if show_stats:
        argv = argv[1:]
    if not argv or argv[0] in ("-m", "-c") and len(argv) < 2:
        print(f"ringmpi.run: {argv[0]} needs an argument\n{USAGE}", file=sys.stderr)
        return 2
    install()
    if MPI.COMM_WORLD.Get_rank() == 0 and os.environ.get("RINGMPI_QUIET", "") in ("", "0"):
        calls = ", ".join(c for calls in COLLECTIVES.values() for c in calls)
        print(f"ringmpi.run: MPI.COMM_WORLD is a ringmpi.Comm ({calls} run ringmpi's algorithms)",
              file=sys.stderr, flush=True)
    if show_stats or settings().info:
        atexit.register(_report)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
