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

from . import collectives as _collectives
from .api import algorithms, last_choice
from .collectives import *  # noqa: F401,F403  (the public collective calls, listed in collectives.__all__)
from .errors import RingmpiError, RingmpiUsageError

__version__ = "0.2.0"

__all__ = ["algorithms", "last_choice", "RingmpiUsageError", "RingmpiError", "__version__"]
__all__ += _collectives.__all__
