"""`ringmpi demo`: every collective and algorithm once, checked against MPI's own, timed."""
from __future__ import annotations

import numpy as np


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run every algorithm once on random data and check it against MPI")
    p.add_argument("--count", type=int, default=1 << 20, help="elements per buffer (default 1Mi)")
    p.set_defaults(func=run)


def run(ns) -> int:
    from . import api
    from .mpicomm import MPI, library_version, transport
    t = transport()
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.rank)
    x = rng.integers(-1000, 1000, ns.count).astype(np.float64)  # exact sums in any order
    ref = np.empty_like(x)
    comm.Allreduce(x, ref)
    if t.rank == 0:
        print(f"# ringmpi demo: {t.size} ranks, {ns.count} float64 per buffer, {library_version()}")
        print(f"# {'collective':<15}{'algorithm':<20}{'time(us)':>12}{'ok':>5}")
    bad = 0
    for coll in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        for alg in api.algorithms(coll):
            t.barrier()
            t0 = MPI.Wtime()
            if coll == "allreduce":
                ok = np.array_equal(api.allreduce(x, algorithm=alg), ref)
            elif coll == "reduce_scatter":
                out = api.reduce_scatter(x, algorithm=alg)
                ok = np.array_equal(out, np.array_split(ref, t.size)[t.rank])
            elif coll == "allgather":
                part = x[: ns.count // t.size]
                ok = np.array_equal(api.allgather(part, algorithm=alg), np.concatenate(comm.allgather(part)))
            elif coll == "broadcast":
                y = x.copy()
                api.broadcast(y, 0, algorithm=alg)
                ok = np.array_equal(y, comm.bcast(x, 0))
            else:
                out = api.reduce(x, root=0, algorithm=alg)
                ok = t.rank != 0 or np.array_equal(out, ref)
            dt = comm.allreduce(MPI.Wtime() - t0, op=MPI.MAX)
            ok = comm.allreduce(bool(ok), op=MPI.LAND)
            bad += not ok
            if t.rank == 0:
                print(f"  {coll:<15}{alg:<20}{dt * 1e6:>12.1f}{'yes' if ok else 'NO':>5}")
    return 1 if bad else 0
