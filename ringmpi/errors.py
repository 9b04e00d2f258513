"""The exceptions ringmpi raises (a leaf: every layer may import it)."""
from __future__ import annotations

__all__ = ["RingmpiUsageError", "RingmpiError", "RankFailure"]


class RingmpiUsageError(ValueError):
    """Bad arguments or settings, found before any message is sent (or, for a buffer one rank
    alone may have got wrong, after that rank took part with fresh buffers, so that the other
    ranks are not left waiting: `api._stand_in`). The message names the call and the rank:
    ``ringmpi.allreduce (rank 2 of 4): recvbuf has 10 elements, expected 12``."""


class RingmpiError(RuntimeError):
    """A collective call that failed while running (on this rank or, with RINGMPI_CHECK, on
    another one): every rank that took part raises it."""


class RankFailure(RingmpiError):
    """A rank of the communicator died during the call (an MPI with ULFM fault tolerance:
    Open MPI 5 under `mpirun --with-ft ulfm`). Every communicator of ringmpi's transport
    has been revoked, so every surviving rank's call ends with this error too, whichever
    rank it was waiting for; `ringmpi.shrink(comm)` then gives the survivors' communicator.
    `failed`: the ranks of `comm` known to have failed (as far as this rank knows)."""

    def __init__(self, message: str, failed: list[int] | None = None) -> None:
        super().__init__(message)
        self.failed = list(failed or [])
