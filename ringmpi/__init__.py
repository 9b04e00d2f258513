"""ringmpi: collective communication algorithms on MPI_Sendrecv, with a cost model,
a simulator, benchmarks and a data-parallel trainer.

The collectives are imported lazily so that `python -m ringmpi model`, the simulator and
the launcher never initialise MPI.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "shift",
           "algorithms", "RingmpiUsageError", "last_choice", "__version__"]


def __getattr__(name: str):
    if name in __all__:
        from . import api
        value = getattr(api, name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'ringmpi' has no attribute {name!r}")
