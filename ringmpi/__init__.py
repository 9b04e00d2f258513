"""ringmpi: the collectives of NCCL and MPI written on MPI_Sendrecv, with a cost model, a
virtual cluster, benchmarks and a data-parallel trainer.

    import ringmpi
    s = ringmpi.allreduce(x, algorithm="ring")      # under mpirun; every rank gets the sum

An unchanged mpi4py program: `comm = ringmpi.Comm(MPI.COMM_WORLD)` (its Allreduce, Bcast, ...
run ringmpi), or `mpirun -n 4 python -m ringmpi.run script.py` for no change at all.

The collectives: allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, scan
(and shift, one ring round), each also nonblocking (iallreduce, ...) and persistent
(allreduce_init, ...). `algorithms(name)` lists their algorithms; `last_choice()` says
what the last call ran and why. MPI is initialised at the first collective call, not at
import: `ringmpi.sim`, `ringmpi.model` and `ringmpi.cost` work without MPI.
"""
from __future__ import annotations

import sys as _sys

from .errors import RankFailure, RingmpiError, RingmpiUsageError
from .settings import settings as _settings

__version__ = "0.2.0"

try:
    from . import collectives as _collectives
    from .api import algorithms, fault_tolerant, last_choice, shrink
    from .collectives import *  # noqa: F401,F403  (the public collective calls, listed in collectives.__all__)
except ImportError as _missing:  # e.g. numpy absent from a bare python3 that only starts jobs
    _MISSING = _missing         # (`python3 -m ringmpi.launch ...`): the launcher needs none of it

    def __getattr__(name: str):
        raise ImportError(f"ringmpi.{name} needs {_MISSING.name or 'a missing module'}: {_MISSING}") from _MISSING
    __all__ = ["RingmpiUsageError", "RingmpiError", "RankFailure", "__version__"]
else:
    __all__ = ["algorithms", "last_choice", "shrink", "fault_tolerant", "RingmpiUsageError", "RingmpiError", "RankFailure", "__version__"]
    __all__ += _collectives.__all__

    def __getattr__(name: str):
        """`ringmpi.Comm` (the mpi4py drop-in, ringmpi.comm) is imported at first use: it
        subclasses mpi4py's communicator, and importing mpi4py initialises MPI. The calls
        of a collective added later (`ringmpi.specs.add`) are made at first use too."""
        if name == "Comm":
            from .comm import Comm
            return Comm
        try:   # a collective added by its spec after import (`ringmpi.specs.add`)
            return getattr(_collectives, name)
        except AttributeError:
            raise AttributeError(f"module 'ringmpi' has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted([*globals(), "Comm"])


def _excepthook(tp, value, tb, _previous=_sys.excepthook):
    """An uncaught exception, once MPI runs on more than one rank, aborts the whole job (the
    rank and traceback printed first) instead of leaving the others waiting, unless
    RINGMPI_ABORT_ON_EXCEPTION=0. Installed at import, decided when it fires: the settings
    are read at first use, and a program may set them after `import ringmpi`."""
    try:
        wanted = _settings().abort_on_exception
    except RingmpiUsageError:  # an invalid RINGMPI_* value: abort, the default
        wanted = True
    if wanted and "mpi4py.MPI" in _sys.modules:
        from .mpicomm import abort_on_exception
        abort_on_exception(tp, value, tb)
    _previous(tp, value, tb)


_sys.excepthook = _excepthook
