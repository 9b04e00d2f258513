"""The virtual cluster at training scale: wall time and peak memory of the simulator.

    .venv/bin/python benchmarks/sim_scale.py [--stretch] > benchmarks/results/sim-scale.txt

Each case runs in its own process (its peak RSS is its own): the ring's cost per message
from 64 to 4096 ranks (a small cluster run again until a second has passed, the median
run reported), the five all-reduce algorithms at 1024 virtual ranks and 64 MB, the ring
at 4096 ranks and 1 GB (about 33 M exchanges), and with --stretch the ring at 16384 ranks
(NCCL's published scale). Every simulated time is compared with the algorithm's formula.
No data: phantom buffers.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

CASES = [("allreduce", "ring", p, 64_000_000) for p in (64, 256)]
CASES += [("allreduce", a, 1024, 64_000_000) for a in ("naive", "ring", "recursive_doubling", "rabenseifner", "tree")]
CASES += [("allreduce", "ring", 4096, 1 << 30)]
STRETCH = [("allreduce", "ring", 16384, 1 << 30)]


def one(collective: str, algorithm: str, p: int, nbytes: int) -> dict:
    from ringmpi.cost import LECTURE
    from ringmpi.model import cost
    from ringmpi.sim import phantoms, run_collective
    walls: list[float] = []
    while not walls or sum(walls) < 1.0 and len(walls) < 101:
        t0 = time.perf_counter()
        cl, _ = run_collective(collective, algorithm, phantoms(p, nbytes))
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
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
    together = 0.0            # the five algorithms at 1024 ranks
    per_message: dict = {}    # the ring's us per message at each p
    for c, a, p, n in CASES + (STRETCH if o.stretch else []):
        out = subprocess.run([sys.executable, __file__, "--one", c, a, str(p), str(n)], capture_output=True,
                             text=True, check=True).stdout
        r = json.loads(out)
        if a == "ring":
            per_message[p] = r["wall_s"] / r["messages"] * 1e6
        if p == 1024:
            together += r["wall_s"]
        label = f"{c} {a} p={p} {n / 1e6:g} MB"
        print(f"{label:<44} {r['wall_s']:>7.2f} s {r['peak_rss_mb']:>6.0f} MB {r['messages']:>12,} "
              f"{r['wall_s'] / r['messages'] * 1e6:>7.2f}  {r['sim_s'] * 1e3:.4g} ms = {r['formula_s'] * 1e3:.4g} ms "
              f"{'yes' if r['equal'] else 'NO'}", flush=True)
    print(f"# the five all-reduce algorithms at p=1024, 64 MB: {together:.1f} s together")
    print("# the ring's us per message: " + ", ".join(f"{p}: {u:.2f}" for p, u in per_message.items()) +
          f"; largest / smallest {max(per_message.values()) / min(per_message.values()):.2f}")
    return 0


LECTURE_NAME = "the lecture's alpha = 5 us, B = 25 GB/s"

if __name__ == "__main__":
    sys.exit(main())
