"""ringmpi: the collectives of NCCL and MPI written on MPI_Sendrecv, with a cost model, a
virtual cluster, benchmarks and a data-parallel trainer.

    import ringmpi
    s = ringmpi.allreduce(x, algorithm="ring")      # under mpirun; every rank gets the sum

The collectives: allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall (and
shift, one ring round). `algorithms(name)` lists their algorithms; `last_choice()` says
what the last call ran and why. MPI is initialised at the first collective call, not at
import: `ringmpi.sim`, `ringmpi.model` and `ringmpi.cost` work without MPI.
"""
from __future__ import annotations

import sys as _sys

from . import collectives as _collectives
from .api import algorithms, last_choice
from .collectives import *  # noqa: F401,F403  (the public collective calls, listed in collectives.__all__)
from .errors import RingmpiError, RingmpiUsageError
from .settings import settings as _settings

__version__ = "0.2.0"

__all__ = ["algorithms", "last_choice", "RingmpiUsageError", "RingmpiError", "__version__"]
__all__ += _collectives.__all__


def _excepthook(tp, value, tb, _previous=_sys.excepthook):
    """RINGMPI_ABORT_ON_EXCEPTION=1: once MPI is running, an uncaught exception aborts the
    whole job (the rank and traceback printed first) instead of leaving the others waiting."""
    if "mpi4py.MPI" in _sys.modules:
        from .mpicomm import abort_on_exception
        abort_on_exception(tp, value, tb)
    _previous(tp, value, tb)


try:
    if _settings().abort_on_exception:
        _sys.excepthook = _excepthook
except RingmpiUsageError:  # an invalid RINGMPI_* value: the first call reports it
    pass
