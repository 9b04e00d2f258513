"""Per-call cost of ringmpi against MPI's own all-reduce, side by side in one run.

    python -m ringmpi.launch -n 2 -- .venv/bin/python benchmarks/overhead.py [--rounds 15] [--sizes 8,1K,64K,1M]

Each round times, in a fresh shuffled order, a loop of `comm.Allreduce(x, y)` on plain
mpi4py, `ringmpi.allreduce(x, y)`, `ringmpi.Comm(...).Allreduce(x, y)`, a persistent
`ringmpi.allreduce_init(x, y)` started and waited, `ringmpi.iallreduce(x, y).wait()` and the
drop-in's `Iallreduce(x, y).Wait()` (nothing to overlap: what a request costs over a blocking
call) on the same arrays (float32 SUM); each loop is timed on every rank and the slowest
rank counts.
Printed: the median over rounds of each and the ratios to MPI's own, with the spread
(lowest-highest round), the request's ratio to ringmpi's blocking call, and what a
request ran (auto's choice). With PYTHONPATH pointing at another checkout, the same script times
that tree's ringmpi: alternate the two in one shell loop to compare versions.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi.units import parse_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--label", default="")
    ap.add_argument("--sizes", default="8,1K")
    ns = ap.parse_args()
    world = MPI.COMM_WORLD
    drop = ringmpi.Comm(world)
    rows = []
    for nbytes in (parse_size(v) for v in ns.sizes.split(",")):
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        runners = {"mpi": lambda: world.Allreduce(x, y),
                   "ringmpi.allreduce": lambda: ringmpi.allreduce(x, y),
                   "ringmpi.Comm": lambda: drop.Allreduce(x, y)}
        bound = ringmpi.allreduce_init(x, y) if hasattr(ringmpi, "allreduce_init") else None   # (an older tree)
        if bound is not None:
            def persistent() -> None:
                bound.start()
                bound.wait()
            runners.update({"allreduce_init start+wait": persistent,
                            "iallreduce().wait()": lambda: ringmpi.iallreduce(x, y).wait(),
                            "Comm.Iallreduce().Wait()": lambda: drop.Iallreduce(x, y).Wait()})
        times: dict[str, list[float]] = {k: [] for k in runners}
        rng = random.Random(nbytes)   # the same order on every rank
        calls = max(20, min(ns.calls, int(ns.calls * 4096 / max(nbytes, 4096))))
        for _ in range(ns.rounds):
            order = list(runners)
            rng.shuffle(order)
            for name in order:
                fn = runners[name]
                for _ in range(min(50, calls)):
                    fn()
                world.Barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                per = (time.perf_counter() - t0) / calls
                times[name].append(world.allreduce(per, op=MPI.MAX))
        ran = ""
        if bound is not None:
            bound.free()
            last = ringmpi.iallreduce(x, y)
            last.wait()
            ran = f" (a request ran {last.label.split('/')[-1]})"
        rows.append((nbytes, times, ran))
    if world.rank == 0:
        for nbytes, times, ran in rows:
            mpi = statistics.median(times["mpi"])
            parts = [f"{ns.label}{nbytes} B: mpi {mpi * 1e6:.2f} us"]
            for name in list(times)[1:]:
                ratios = [a / b for a, b in zip(times[name], times["mpi"])]
                parts.append(f"{name} {statistics.median(times[name]) * 1e6:.2f} us = "
                             f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
            if "iallreduce().wait()" in times:   # (what a request costs over ringmpi's own blocking call)
                ratios = [a / b for a, b in zip(times["iallreduce().wait()"], times["ringmpi.allreduce"])]
                parts.append(f"iallreduce().wait() / ringmpi.allreduce {statistics.median(ratios):.2f}x "
                             f"({min(ratios):.2f}-{max(ratios):.2f})")
            print("; ".join(parts) + ran, flush=True)


if __name__ == "__main__":
    main()
