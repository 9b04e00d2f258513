"""Where a small device all-reduce's time goes (run on a GPU machine, 2 ranks):
    python3 -m ringmpi.launch -n 2 -- python3 benchmarks/gpu_percall.py
Per-call medians of ringmpi.allreduce on cupy buffers (ring, MPI's own staged whole, auto)
beside the primitives a staged exchange is made of (stream synchronisation, a 1 KiB copy each
way with its event, a reduction kernel, MPI's Sendrecv of pinned host memory), then rank 0's
profile of the ring's calls."""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time

import cupy as cp
import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi.device import cupy_backend

COMM = MPI.COMM_WORLD
R = COMM.rank


def median_us(f, n=200):
    for _ in range(10):
        f()
    ts = []
    for _ in range(n):
        COMM.Barrier()
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main() -> None:
    be = cupy_backend()
    rows = []
    for nbytes in (1 << 10, 1 << 16, 1 << 20):
        x = cp.ones(nbytes // 4, cp.float32)
        y = cp.empty_like(x)
        for a in ("ring", "mpi", "auto"):
            rows.append((f"allreduce {nbytes >> 10} KiB {a}", median_us(lambda: ringmpi.allreduce(x, y, algorithm=a))))
    d = cp.ones(256, cp.float32)
    host = be.pinned(1024)
    out = cp.empty_like(d)
    peer = 1 - R if COMM.size > 1 else R
    prim = {
        "stream synchronize": lambda: be.ready(),
        "d2h 1 KiB + event sync": lambda: be.d2h(d, host).synchronize(),
        "h2d 1 KiB + event sync": lambda: be.h2d(host, d).synchronize(),
        "add kernel 256 floats + sync": lambda: (be.combine("SUM", d, d, out), be.ready()),
        "event record": lambda: be.d2h_stream.record(),
        "MPI Sendrecv 1 KiB pinned": lambda: COMM.Sendrecv(host, peer, 7, np.empty(1024, np.uint8), peer, 7),
    }
    for name, f in prim.items():
        rows.append((name, median_us(f)))
    for name, us in rows:
        worst = COMM.allreduce(us, MPI.MAX)
        if R == 0:
            print(f"{name:40s} {worst:10.1f} us (slowest rank's median)")
    x = cp.ones(256, cp.float32)
    y = cp.empty_like(x)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        ringmpi.allreduce(x, y, algorithm="ring")
    prof.disable()
    if R == 0:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print("# rank 0, 300 ring all-reduces of 1 KiB on the device, by own time")
        print(s.getvalue())


if __name__ == "__main__":
    main()
