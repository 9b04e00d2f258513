"""The virtual cluster at training scale: wall time and peak memory of the simulator.

    .venv/bin/python benchmarks/sim_scale.py [--stretch] > benchmarks/results/sim-scale.txt

Each case runs in its own process (its peak RSS is its own): the five all-reduce
algorithms at 1024 virtual ranks and 64 MB, the ring at 4096 ranks and 1 GB (about 33 M
exchanges), and with --stretch the ring at 16384 ranks (NCCL's published scale). Every
simulated time is compared with the algorithm's formula. No data: phantom buffers.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = [("allreduce", a, 1024, 64_000_000) for a in ("naive", "ring", "recursive_doubling", "rabenseifner", "tree")]
CASES += [("allreduce", "ring", 4096, 1 << 30)]
STRETCH = [("allreduce", "ring", 16384, 1 << 30)]


def one(collective: str, algorithm: str, p: int, nbytes: int) -> dict:
    from ringmpi.cost import LECTURE
    from ringmpi.model import cost
    from ringmpi.sim import phantoms, run_collective
    t0 = time.perf_counter()
    cl, _ = run_collective(collective, algorithm, phantoms(p, nbytes))
    wall = time.perf_counter() - t0
    formula = cost(collective, algorithm, p, nbytes, 1).time(LECTURE) - LECTURE.overhead
    tr = cl.traffic()
    return dict(collective=collective, algorithm=algorithm, p=p, bytes=nbytes, wall_s=wall, sim_s=cl.time,
                formula_s=formula, equal=abs(cl.time - formula) <= 1e-9 * formula, messages=tr["messages"],
                peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stretch", action="store_true", help="also 16384 ranks")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    o = ap.parse_args()
    if o.one:
        c, a, p, n = o.one
        print(json.dumps(one(c, a, int(p), int(n))))
        return 0
    print(f"# virtual cluster, no data (phantom buffers), {LECTURE_NAME}; one process per case")
    print(f"{'case':<44} {'wall':>9} {'peak RSS':>9} {'messages':>12} {'us/msg':>7}  sim = formula")
    total = {}
    for c, a, p, n in CASES + (STRETCH if o.stretch else []):
        out = subprocess.run([sys.executable, __file__, "--one", c, a, str(p), str(n)], capture_output=True,
                             text=True, check=True).stdout
        r = json.loads(out)
        key = (p, n)
        total[key] = total.get(key, 0.0) + r["wall_s"]
        label = f"{c} {a} p={p} {n / 1e6:g} MB"
        print(f"{label:<44} {r['wall_s']:>7.2f} s {r['peak_rss_mb']:>6.0f} MB {r['messages']:>12,} "
              f"{r['wall_s'] / r['messages'] * 1e6:>7.2f}  {r['sim_s'] * 1e3:.4g} ms = {r['formula_s'] * 1e3:.4g} ms "
              f"{'yes' if r['equal'] else 'NO'}", flush=True)
    for (p, n), s in total.items():
        print(f"# all algorithms above at p={p}, {n / 1e6:g} MB: {s:.1f} s together")
    return 0


LECTURE_NAME = "the lecture's alpha = 5 us, B = 25 GB/s"

if __name__ == "__main__":
    sys.exit(main())
