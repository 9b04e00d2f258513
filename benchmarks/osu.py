"""The drop-in against plain mpi4py in an OSU-style latency loop, in mpi4py's demo style:
`[buf, count, MPI.BYTE]` over an `mmap` buffer, `MPI.IN_PLACE` where the call has it.

    python -m ringmpi.launch -n 2 -- .venv/bin/python benchmarks/osu.py [--max 1M] [--rounds 5] \
        [--nonblocking | --persistent]

For every size (powers of two from 1 B) and collective (Allgather in place, Bcast,
Alltoall, Allreduce in place), each round times a loop of the call through
`ringmpi.Comm(MPI.COMM_WORLD)` and through plain `MPI.COMM_WORLD`, in that style and on bare
numpy arrays of the same size (the form the drop-in was first made fast for), the four loops
in a shuffled order (the same on every rank); each loop's time per call is the slowest
rank's. Printed per size: the medians, the ratio (median over rounds of drop-in / plain)
and what the drop-in adds to plain mpi4py's call (median over rounds of the difference),
in each form; then per collective the medians over sizes up to 1 KiB and above: the goal is
that the drop-in costs the same over plain mpi4py in either form. `--nonblocking`: each
call's nonblocking form instead, its request waited for at once (OSU's osu_iallgather and
the like, with nothing to overlap). `--persistent`: each call's MPI-4 persistent form
(`Allgather_init`, ...), bound at its first call and then started and waited for at once
(OSU's osu_allreduce_persistent and the like).
"""
from __future__ import annotations

import argparse
import mmap
import random
import statistics
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi.units import human_bytes, parse_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", default="1M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--nonblocking", action="store_true",
                    help="the nonblocking forms, each waited for at once (Iallgather(...).Wait(), ...: "
                         "OSU's osu_iallgather and the like with nothing to overlap)")
    ap.add_argument("--persistent", action="store_true",
                    help="the persistent forms, bound once, each start waited for at once (Allgather_init, ...: "
                         "OSU's osu_allgather_persistent and the like)")
    ns = ap.parse_args()
    plain = MPI.COMM_WORLD
    drop = ringmpi.Comm(MPI.COMM_WORLD)
    p = plain.Get_size()
    top = parse_size(ns.max)
    buf = mmap.mmap(-1, top * p)
    other = mmap.mmap(-1, top * p)
    views = {}   # size -> arrays of their own (made once: a slice each call would cost more than the call)
    demo = {
        "Allgather": lambda c, n: c.Allgather(MPI.IN_PLACE, [buf, n, MPI.BYTE]),
        "Bcast": lambda c, n: c.Bcast([buf, n, MPI.BYTE], root=0),
        "Alltoall": lambda c, n: c.Alltoall([buf, n, MPI.BYTE], [other, n, MPI.BYTE]),
        "Allreduce": lambda c, n: c.Allreduce(MPI.IN_PLACE, [buf, n, MPI.BYTE], op=MPI.BOR),
    }
    bare = {
        "Allgather": lambda c, n: c.Allgather(MPI.IN_PLACE, views[n][1]),
        "Bcast": lambda c, n: c.Bcast(views[n][0], root=0),
        "Alltoall": lambda c, n: c.Alltoall(views[n][1], views[n][2]),
        "Allreduce": lambda c, n: c.Allreduce(MPI.IN_PLACE, views[n][0], op=MPI.BOR),
    }
    if ns.nonblocking:   # (each call's nonblocking form, its request waited for at once)
        demo = {
            "Iallgather": lambda c, n: c.Iallgather(MPI.IN_PLACE, [buf, n, MPI.BYTE]).Wait(),
            "Ibcast": lambda c, n: c.Ibcast([buf, n, MPI.BYTE], root=0).Wait(),
            "Ialltoall": lambda c, n: c.Ialltoall([buf, n, MPI.BYTE], [other, n, MPI.BYTE]).Wait(),
            "Iallreduce": lambda c, n: c.Iallreduce(MPI.IN_PLACE, [buf, n, MPI.BYTE], op=MPI.BOR).Wait(),
        }
        bare = {
            "Iallgather": lambda c, n: c.Iallgather(MPI.IN_PLACE, views[n][1]).Wait(),
            "Ibcast": lambda c, n: c.Ibcast(views[n][0], root=0).Wait(),
            "Ialltoall": lambda c, n: c.Ialltoall(views[n][1], views[n][2]).Wait(),
            "Iallreduce": lambda c, n: c.Iallreduce(MPI.IN_PLACE, views[n][0], op=MPI.BOR).Wait(),
        }
    if ns.persistent:   # (each call's persistent form, bound at its first call; started, waited for)
        bound: dict[tuple, MPI.Prequest] = {}

        def again(c: MPI.Intracomm, key: tuple, bind: object) -> None:
            q = bound.get((id(c), *key))
            if q is None:
                q = bound[id(c), *key] = bind()
            q.Start()
            q.Wait()
        demo = {
            "Allgather_init": lambda c, n: again(c, ("ag", n), lambda: c.Allgather_init(MPI.IN_PLACE,
                                                                                         [buf, n, MPI.BYTE])),
            "Bcast_init": lambda c, n: again(c, ("bc", n), lambda: c.Bcast_init([buf, n, MPI.BYTE], root=0)),
            "Alltoall_init": lambda c, n: again(c, ("aa", n), lambda: c.Alltoall_init([buf, n, MPI.BYTE],
                                                                                       [other, n, MPI.BYTE])),
            "Allreduce_init": lambda c, n: again(c, ("ar", n), lambda: c.Allreduce_init(
                MPI.IN_PLACE, [buf, n, MPI.BYTE], op=MPI.BOR)),
        }
        bare = {
            "Allgather_init": lambda c, n: again(c, ("ag", n, 0), lambda: c.Allgather_init(MPI.IN_PLACE, views[n][1])),
            "Bcast_init": lambda c, n: again(c, ("bc", n, 0), lambda: c.Bcast_init(views[n][0], root=0)),
            "Alltoall_init": lambda c, n: again(c, ("aa", n, 0), lambda: c.Alltoall_init(views[n][1], views[n][2])),
            "Allreduce_init": lambda c, n: again(c, ("ar", n, 0), lambda: c.Allreduce_init(
                MPI.IN_PLACE, views[n][0], op=MPI.BOR)),
        }
    sizes = []
    n = 1
    while n <= top:
        sizes.append(n)
        views[n] = np.zeros(n, np.uint8), np.zeros(n * p, np.uint8), np.zeros(n * p, np.uint8)
        n *= 2
    forms = {"[buf, n, BYTE]": demo, "numpy": bare}
    # per collective and form: size -> (ratio, microseconds the drop-in adds)
    found: dict[str, dict[str, dict[int, tuple[float, float]]]] = {name: {f: {} for f in forms} for name in demo}
    order = random.Random(3)
    for name in demo:
        for n in sizes:
            reps = max(10, min(ns.calls, ns.calls * 4096 // max(n * p, 4096)))
            loops = [(form, who, c) for form in forms for who, c in (("ringmpi.Comm", drop), ("mpi4py", plain))]
            runs: dict[tuple[str, str], list[float]] = {(form, who): [] for form, who, _ in loops}
            for _ in range(ns.rounds):
                order.shuffle(loops)
                for form, who, c in loops:
                    fn = forms[form][name]
                    for _ in range(min(reps, 20)):
                        fn(c, n)
                    plain.Barrier()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        fn(c, n)
                    runs[form, who].append(plain.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX))
            line = f"{name:10s} {human_bytes(n):>8s}"
            for form in forms:
                d, m = runs[form, "ringmpi.Comm"], runs[form, "mpi4py"]
                r = statistics.median(a / b for a, b in zip(d, m))
                extra = statistics.median(a - b for a, b in zip(d, m))
                found[name][form][n] = r, extra
                line += (f"   {form}: ringmpi.Comm {statistics.median(d) * 1e6:7.2f} us  mpi4py "
                         f"{statistics.median(m) * 1e6:7.2f} us  {r:5.2f}x  {extra * 1e6:+6.2f} us")
            if plain.rank == 0:
                print(line, flush=True)
    if plain.rank == 0:
        for name, by_form in found.items():
            parts = []
            for form, by in by_form.items():
                for where, keep in (("up to 1 KiB", lambda n: n <= 1024), ("above", lambda n: n > 1024)):
                    got = [v for n, v in by.items() if keep(n)]
                    if got:
                        parts.append(f"{form} {where} {statistics.median(r for r, _ in got):.2f}x, "
                                     f"{statistics.median(e for _, e in got) * 1e6:+.2f} us")
            print(f"{name}: median over sizes: " + "; ".join(parts), flush=True)
    if ns.persistent:
        for q in bound.values():
            q.Free()
    served = ringmpi.comm.stats()
    if plain.rank == 0:
        print("served by ringmpi (calls, left to mpi4py):", served)


if __name__ == "__main__":
    main()
