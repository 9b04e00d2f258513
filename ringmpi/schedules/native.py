"""The MPI library's own collectives, as a candidate and as the reference.

Whatever the library picks inside (Open MPI's coll/tuned: recursive doubling below 8 KiB
and Rabenseifner above it for all-reduce at 4-7 ranks; MPICH's own table) stays opaque, so
there is no formula here: its cost comes from measurement (`ringmpi calibrate`/`bench`).
"""
from __future__ import annotations

from . import register


@register("allreduce", "mpi")
def allreduce(t, sendbuf, recvbuf, op):
    t.native_allreduce(sendbuf, recvbuf, op)


@register("reduce_scatter", "mpi")
def reduce_scatter(t, sendbuf, recvbuf, op, counts):
    t.native_reduce_scatter(sendbuf, recvbuf, counts, op)


@register("allgather", "mpi")
def allgather(t, sendbuf, recvbuf, counts):
    t.native_allgather(sendbuf, recvbuf, counts)


@register("broadcast", "mpi")
def broadcast(t, buf, root, segments):
    t.native_broadcast(buf, root)


@register("reduce", "mpi")
def reduce(t, sendbuf, recvbuf, op, root):
    t.native_reduce(sendbuf, recvbuf, op, root)
