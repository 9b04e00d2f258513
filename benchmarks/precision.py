"""Reproducible sums and 16-bit payloads on real ranks, side by side in one run.

    python -m ringmpi.launch -n 2 -- .venv/bin/python benchmarks/precision.py [--rounds 11] [--sizes 1M,4M,16M,64M]

Part 1, the price of the deterministic mode: each round times, in a fresh shuffled order, a
loop of float32 SUM all-reduces with MPI's own (mpi4py's Allreduce), the ring, `ordered` (the rank-order fold: an
all-to-all reduce-scatter and the ring's all-gather) and with `auto` in the deterministic
mode; the slowest rank counts. Printed: the median over rounds and the spread
(lowest-highest round), and the ratios ordered / ring and ordered / MPI's own.

Part 2, the wire: bytes this rank sent per call (ringmpi's counters, as the transport put
them on MPI) and the time of a ring all-reduce of the same vector as float32, as float16
with float32 partial sums (the default) and with 16-bit hops (partials 2), side by side
with MPI's own float32 all-reduce of that vector.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import settings
from ringmpi.api import group
from ringmpi.units import human_bytes, parse_size


def timed(world, fn, calls: int) -> float:
    """Seconds per call of `fn`, the slowest rank's."""
    fn()
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return world.allreduce((time.perf_counter() - t0) / calls, op=MPI.MAX)


def rounds(world, runners: dict, n: int, calls: int, seed: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in runners}
    rng = random.Random(seed)   # the same order on every rank
    for _ in range(n):
        order = list(runners)
        rng.shuffle(order)
        for name in order:
            times[name].append(timed(world, runners[name], calls))
    return times


def spread(ts: list[float]) -> str:
    return f"{statistics.median(ts) * 1e3:8.3f} ms ({min(ts) * 1e3:.3f}-{max(ts) * 1e3:.3f})"


def ratio(times: dict, a: str, b: str) -> str:
    """The median, lowest and highest over rounds of a's time over b's in the same round."""
    r = [x / y for x, y in zip(times[a], times[b])]
    return f"{statistics.median(r):.3f} ({min(r):.2f}-{max(r):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ns = ap.parse_args()
    world = MPI.COMM_WORLD
    p, out = world.size, world.rank == 0
    rng = np.random.default_rng([3, world.rank])
    if out:
        print(f"# {p} ranks, {MPI.Get_library_version().splitlines()[0].strip()}; medians over {ns.rounds} rounds "
              "(lowest-highest), the slowest rank's time")
        print("# part 1: float32 SUM, deterministic (the rank-order fold) against the ring")
        print(f"{'size':>8} {'MPI_Allreduce':>28} {'ring':>28} {'ordered':>28} {'auto, deterministic':>28} "
              f"{'ordered/ring':>19} {'ordered/MPI':>19}")
    for nbytes in (parse_size(v) for v in ns.sizes.split(",")):
        x = rng.standard_normal(nbytes // 4).astype(np.float32)
        y = np.empty_like(x)
        runners = {"mpi": lambda: world.Allreduce(x, y),
                   "ring": lambda: ringmpi.allreduce(x, y, algorithm="ring"),
                   "ordered": lambda: ringmpi.allreduce(x, y, algorithm="ordered"),
                   "auto": lambda: ringmpi.allreduce(x, y, deterministic=True)}
        calls = max(3, int(64e6 // max(nbytes, 1) // 8))
        times = rounds(world, runners, ns.rounds, calls, nbytes)
        if out:
            print(f"{human_bytes(nbytes):>8} {spread(times['mpi']):>28} {spread(times['ring']):>28} "
                  f"{spread(times['ordered']):>28} {spread(times['auto']):>28} {ratio(times, 'ordered', 'ring'):>19} "
                  f"{ratio(times, 'ordered', 'mpi'):>19}", flush=True)
    t = group(world)
    if out:
        print("# part 2: the ring all-reduce of one vector as float32 and as float16: bytes this rank sent per call")
        print(f"{'size':>8} {'payload':<44} {'bytes sent':>12} {'x float32':>10} {'time':>28} {'x MPI float32':>19}")
    for nbytes in (parse_size(v) for v in ns.sizes.split(",")):
        x32 = rng.standard_normal(nbytes // 4).astype(np.float32)
        x16 = x32.astype(np.float16)
        y32, y16 = np.empty_like(x32), np.empty_like(x16)
        cases = {"ring, float32": (x32, y32, 32), "ring, float16, float32 partials": (x16, y16, 32),
                 "ring, float16, 16-bit hops (RINGMPI_PARTIALS=16)": (x16, y16, 16)}
        sent, runners = {}, {}
        for name, (a, b, bits) in cases.items():
            def run(a=a, b=b, bits=bits):
                # the partials are a setting: the ring's call made under it (its plan keeps it)
                if settings.settings().partials != bits:
                    settings.reload({**os.environ, "RINGMPI_PARTIALS": str(bits)})
                ringmpi.allreduce(a, b, algorithm="ring")
            runners[name] = run
            run()
            before = t.counters.bytes_sent
            run()
            sent[name] = t.counters.bytes_sent - before
        runners["MPI_Allreduce, float32"] = lambda: world.Allreduce(x32, y32)
        calls = max(3, int(64e6 // max(nbytes, 1) // 8))
        times = rounds(world, runners, ns.rounds, calls, nbytes + 1)
        if out:
            for name in runners:
                got = f"{sent[name]:>12,} {sent[name] / sent['ring, float32']:>10.3f}" if name in sent else f"{'-':>12} {'-':>10}"
                print(f"{human_bytes(nbytes):>8} {name:<44} {got} {spread(times[name]):>28} "
                      f"{ratio(times, name, 'MPI_Allreduce, float32'):>19}", flush=True)
    settings.reload()


if __name__ == "__main__":
    main()
