"""`ringmpi demo`: every collective and algorithm once on random data, checked against the exact
result (numpy, from every rank's input), timed."""
from __future__ import annotations

import argparse

import numpy as np

from .. import schedules
from ..api import group
from ..collectives import SPECS, invoke

__all__ = ["add_parser", "run"]


def add_parser(sub, name: str = "demo", text: str = "") -> None:
    p = sub.add_parser(name, help=text, description=__doc__,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--count", type=int, default=1 << 20, help="elements per rank's input")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from ..mpicomm import library_version
    t = group()
    p, r = t.size, t.rank
    rng = np.random.default_rng(r)
    if r == 0:
        print(f"# ringmpi demo: {p} ranks, {ns.count} float64 per input, {library_version()}")
        print(f"# {'collective':<15}{'algorithm':<20}{'time(us)':>12}{'ok':>5}")
    bad = 0
    for spec in SPECS.values():
        count = spec.nccl_count(ns.count * 8, 8, p)
        x = rng.integers(-1000, 1000, spec.input_count(count, p)).astype(np.float64)  # exact sums in any order
        xs = t.allgather_obj(x)
        want = spec.expected(xs, r, "SUM" if spec.reduces else None, 0)
        for alg in schedules.names(spec.name):
            call = spec.make(r, p, x, op="SUM" if spec.reduces else None, root=0)
            t.barrier()
            t0 = t.wtime()
            invoke(spec, call, t.user_comm, alg)
            dt = max(t.allgather_obj(t.wtime() - t0))
            got = spec.output(call)
            ok = all(t.allgather_obj(want is None or np.array_equal(got, want)))
            bad += not ok
            if r == 0:
                print(f"  {spec.name:<15}{alg:<20}{dt * 1e6:>12.1f}{'yes' if ok else 'NO':>5}")
    return 1 if bad else 0
