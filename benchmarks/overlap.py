"""How much of an all-reduce a request hides behind computation, side by side in one run.

    RATE=1gbit RUN_CMD="$PWD/.venv/bin/python benchmarks/overlap.py" bash benchmarks/multihost.sh 2
    python -m ringmpi.launch -n 2 -- .venv/bin/python benchmarks/overlap.py      # one host

Per round, in a shuffled order (the same on every rank), of a float32 all-reduce of
`--size` bytes (default 16 MiB) and numpy work (`--work`: matrix products sized to take
about as long as the all-reduce alone, measured first):

    comm       ringmpi.allreduce alone
    compute    the numpy work alone
    blocking   the all-reduce, then the work
    overlap    ringmpi.iallreduce, the work, then wait()

With `--pieces N` the all-reduce is N requests on consecutive pieces of the buffer, each
begun after its share of the work (as a training step's buckets are begun while backward
goes on), then all waited for; and one more:

    paced      the same N requests begun as far apart, the ranks sleeping in between:
               what the link does with the requests coming one at a time, nothing
               computing beside them

Each is timed on every rank, the slowest rank counts. Printed: medians over rounds (and
the spread), blocking / (compute + comm), overlap / max(compute, comm) and the share of
the communication hidden, (compute + comm - overlap) / comm.
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
    ap.add_argument("--size", default="16M")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--algorithm", default="auto")
    ap.add_argument("--matrix", type=int, default=256, help="side of the matrices multiplied")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="products times this (the estimate from a few products alone can run long: "
                         "4 products timed alone take less each than hundreds beside the other host's)")
    ap.add_argument("--pieces", type=int, default=1,
                    help="the all-reduce as this many requests, begun between equal shares of the work")
    ns = ap.parse_args()
    world = MPI.COMM_WORLD
    n = parse_size(ns.size) // 4
    x = np.random.default_rng(world.rank).standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    a = np.random.default_rng(7).standard_normal((ns.matrix, ns.matrix))
    b = np.empty_like(a)

    def comm():
        ringmpi.allreduce(x, y, algorithm=ns.algorithm)

    def work(k):
        for _ in range(k):
            np.matmul(a, a, out=b)

    def timed(fn):
        world.Barrier()
        t0 = time.perf_counter()
        fn()
        return world.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    for _ in range(3):
        comm()
        ringmpi.iallreduce(x, y, algorithm=ns.algorithm).wait()
    alone = statistics.median(timed(comm) for _ in range(5))
    one = statistics.median(timed(lambda: work(4)) for _ in range(5)) / 4
    k = world.bcast(max(1, round(ns.scale * alone / one)), 0)

    ran = {}
    cuts = [n * i // ns.pieces for i in range(ns.pieces + 1)]
    shares = [k * (i + 1) // ns.pieces - k * i // ns.pieces for i in range(ns.pieces)]

    def overlap(between=work):
        qs = []
        for lo, hi, share in zip(cuts, cuts[1:], shares):
            qs.append(ringmpi.iallreduce(x[lo:hi], y[lo:hi], algorithm=ns.algorithm))
            between(share)
        ringmpi.waitall(qs)
        ran["request"] = qs[-1].label
    runners = {"comm": comm, "compute": lambda: work(k), "blocking": lambda: (comm(), work(k)), "overlap": overlap}
    if ns.pieces > 1:
        runners["paced"] = lambda: overlap(lambda share: time.sleep(share * one))
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = random.Random(1)
    for _ in range(ns.rounds):
        names = list(runners)
        order.shuffle(names)
        for name in names:
            times[name].append(timed(runners[name]))
    if world.rank == 0:
        med = {name: statistics.median(v) for name, v in times.items()}
        spread = {name: f"{min(v) * 1e3:.1f}-{max(v) * 1e3:.1f}" for name, v in times.items()}
        comm_s, comp_s = med["comm"], med["compute"]
        hidden = (comp_s + comm_s - med["overlap"]) / comm_s
        print(f"all-reduce of {ns.size}B float32 in {ns.pieces} request(s) on {world.size} ranks ({ns.algorithm}: blocking ran "
              f"{ringmpi.last_choice()['algorithm']}, the request {ran['request']}), {k} products of {ns.matrix}x{ns.matrix}, {ns.rounds} rounds, medians (spread) in ms:")
        for name in runners:
            print(f"  {name:9s} {med[name] * 1e3:8.1f}  ({spread[name]})")
        print(f"  blocking / (compute + comm) = {med['blocking'] / (comp_s + comm_s):.2f}; "
              f"overlap / max(compute, comm) = {med['overlap'] / max(comp_s, comm_s):.2f}; hidden {hidden:.0%}",
              flush=True)


if __name__ == "__main__":
    main()
