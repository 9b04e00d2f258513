"""The drop-in against plain mpi4py in an OSU-style latency loop, in mpi4py's demo style:
`[buf, count, MPI.BYTE]` over an `mmap` buffer, `MPI.IN_PLACE` where the call has it.

    python -m ringmpi.launch -n 2 -- .venv/bin/python benchmarks/osu.py [--max 1M] [--rounds 5]

For every size (powers of two from 1 B) and collective (Allgather in place, Bcast,
Alltoall, Allreduce in place), each round times a loop of the call through
`ringmpi.Comm(MPI.COMM_WORLD)` and through plain `MPI.COMM_WORLD`, in a shuffled order (the
same on every rank); each loop's time per call is the slowest rank's. Printed per size: the
medians and the ratio (median over rounds of drop-in / plain); then per collective the
median ratio over sizes up to 1 KiB and above.
"""
from __future__ import annotations

import argparse
import mmap
import random
import statistics
import time

from mpi4py import MPI

import ringmpi
from ringmpi.units import human_bytes, parse_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", default="1M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1000)
    ns = ap.parse_args()
    plain = MPI.COMM_WORLD
    drop = ringmpi.Comm(MPI.COMM_WORLD)
    p = plain.Get_size()
    top = parse_size(ns.max)
    buf = mmap.mmap(-1, top * p)
    other = mmap.mmap(-1, top * p)
    calls = {
        "Allgather": lambda c, n: c.Allgather(MPI.IN_PLACE, [buf, n, MPI.BYTE]),
        "Bcast": lambda c, n: c.Bcast([buf, n, MPI.BYTE], root=0),
        "Alltoall": lambda c, n: c.Alltoall([buf, n, MPI.BYTE], [other, n, MPI.BYTE]),
        "Allreduce": lambda c, n: c.Allreduce(MPI.IN_PLACE, [buf, n, MPI.BYTE], op=MPI.BOR),
    }
    sizes = []
    n = 1
    while n <= top:
        sizes.append(n)
        n *= 2
    ratios: dict[str, dict[int, float]] = {name: {} for name in calls}
    order = random.Random(3)
    for name, fn in calls.items():
        for n in sizes:
            reps = max(10, min(ns.calls, ns.calls * 4096 // max(n * p, 4096)))
            runs: dict[str, list[float]] = {"ringmpi.Comm": [], "mpi4py": []}
            for _ in range(ns.rounds):
                pair = [("ringmpi.Comm", drop), ("mpi4py", plain)]
                order.shuffle(pair)
                for who, c in pair:
                    for _ in range(min(reps, 20)):
                        fn(c, n)
                    plain.Barrier()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        fn(c, n)
                    runs[who].append(plain.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX))
            r = statistics.median(a / b for a, b in zip(runs["ringmpi.Comm"], runs["mpi4py"]))
            ratios[name][n] = r
            if plain.rank == 0:
                print(f"{name:10s} {human_bytes(n):>8s}  ringmpi.Comm {statistics.median(runs['ringmpi.Comm']) * 1e6:9.2f} us"
                      f"  mpi4py {statistics.median(runs['mpi4py']) * 1e6:9.2f} us  {r:5.2f}x", flush=True)
    if plain.rank == 0:
        for name, by in ratios.items():
            small = [v for n, v in by.items() if n <= 1024]
            large = [v for n, v in by.items() if n > 1024]
            print(f"{name}: median ratio up to 1 KiB {statistics.median(small):.2f}x"
                  + (f", above {statistics.median(large):.2f}x" if large else ""), flush=True)
    served = ringmpi.comm.stats()
    if plain.rank == 0:
        print("served by ringmpi (calls, left to mpi4py):", served)


if __name__ == "__main__":
    main()
