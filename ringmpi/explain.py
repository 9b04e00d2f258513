"""`ringmpi sim` and `ringmpi model`: the lecture's tables, from the simulator and the model.

    ringmpi sim table [--collective allreduce] [--workers 4]      symbolic state after every round
    ringmpi sim traffic [--size 256KiB] [--workers 2,4,8,16,64]   bytes and rounds per algorithm
    ringmpi sim time --size 1MB --workers 8 [--alpha 5us --bandwidth 25GB/s]
    ringmpi model predict --size 64MB --workers 8                  every algorithm's time
    ringmpi model segments --size 64MB --workers 8                 best S of the pipelined broadcast
    ringmpi model crossover --workers 8                            where algorithms overtake each other
    ringmpi model speedup --step 20ms --grad 10MB --workers 8      data-parallel speedup
    ringmpi model scale --params 405e9 --tokens 15.6e12 ...        6ND, memory, GPU-hours, MFU
"""
from __future__ import annotations

import numpy as np

from . import cost as cm
from .cli import parse_rate, parse_size, parse_time

__all__ = ["add_parser", "symbolic_table", "traffic_table", "human_bytes", "human_time"]

NAMES = "abcdefghijklmnopqrstuvwxyz"


def human_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def human_time(s: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.4g} {unit}"
    return f"{s * 1e9:.3g} ns"


def _profile(ns) -> cm.Profile:
    return cm.Profile(alpha=parse_time(ns.alpha), beta=1 / parse_rate(ns.bandwidth),
                      gamma=1 / parse_rate(ns.reduce_rate) if ns.reduce_rate else 0.0,
                      name=f"alpha={ns.alpha}, B={ns.bandwidth}")


def symbolic_table(collective: str = "allreduce", p: int = 4, segments: int = 4) -> str:
    """The state of every worker at the start and after every step (lecture 3.1 and 3.2).

    The simulator runs with alpha = 1, beta = gamma = 0, so its clock counts steps and the
    rows are global steps (in the pipeline, worker 3 gets x0 only at step 3)."""
    from .sim import Sym, run_collective, symbolic
    steps = cm.Profile(alpha=1.0, beta=0.0, gamma=0.0, name="steps")
    if collective == "broadcast":
        inputs = []
        for r in range(p):
            a = np.empty(segments, dtype=object)
            a[:] = [Sym(f"x{j}") for j in range(segments)] if r == 0 else [Sym("-")] * segments
            inputs.append(a)
        cl, _ = run_collective("broadcast", "pipeline", inputs, segments=segments, watch=True, profile=steps)
    else:
        cl, _ = run_collective(collective, "ring", symbolic(NAMES, p, p if collective != "allgather" else 1),
                               inplace=True, watch=True, profile=steps)
    times = sorted({t for rk in cl.ranks for t, _ in rk.snapshots})

    def state(rk, t):
        return " ".join(str(v) for v in [s for ts, s in rk.snapshots if ts <= t][-1])
    width = max(len(state(rk, t)) for rk in cl.ranks for t in times)
    rows = [f"{'':10}" + "".join(f"{'worker ' + str(r):<{width + 2}}" for r in range(p))]
    for t in times:
        label = "start" if t == 0 else f"step {t:g}"
        rows.append(f"{label:10}" + "".join(f"{state(rk, t):<{width + 2}}" for rk in cl.ranks))
    return "\n".join(rows)


def parameter_server_traffic(workers: int, nbytes: int) -> dict:
    """Simulate one synchronous PS step: K workers push N bytes to a server, pull N back."""
    from .schedules.naive import fan_in_reduce, fan_out
    from .sim import VirtualCluster
    cl = VirtualCluster(workers + 1)
    server = workers

    def step(t):
        g = np.ones(nbytes, dtype=np.uint8)
        acc = t.empty(nbytes, np.uint8) if t.rank == server else None
        fan_in_reduce(t, g if t.rank != server else np.zeros(nbytes, np.uint8), acc, "SUM", server)
        fan_out(t, acc if t.rank == server else g, server)
    cl.run(step)
    return cl.traffic()


def traffic_table(nbytes: int, workers: list[int]) -> str:
    """Section 3.3: bytes moved by the busiest device and rounds, per algorithm and p."""
    from .sim import run_collective
    lines = [f"# all-reduce of {human_bytes(nbytes)} per device; busiest device sent (and rounds)",
             f"{'p':>4} {'ring':>22} {'naive (all to 0)':>22} {'tree':>22} {'param. server':>26}"]
    for p in workers:
        cells = []
        for alg in ("ring", "naive", "tree"):
            cl, _ = run_collective("allreduce", alg, [np.zeros(nbytes, np.uint8) for _ in range(p)])
            tr = cl.traffic()
            cells.append(f"{human_bytes(tr['busiest_sent'])} ({tr['rounds']})")
        ps = parameter_server_traffic(p, nbytes)
        cells.append(f"{human_bytes(ps['busiest_moved'])} moved ({ps['rounds']})")
        lines.append(f"{p:>4} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} {cells[3]:>26}")
    lines.append("# ring: 2(p-1)/p N on every device; naive root and tree root grow with p; "
                 "the server moves 2pN (workers 2N)")
    return "\n".join(lines)


def _sim(ns) -> int:
    if ns.what == "table":
        print(symbolic_table(ns.collective, ns.workers[0], ns.segments))
    elif ns.what == "traffic":
        print(traffic_table(parse_size(ns.size), ns.workers))
    else:
        from .schedules import names
        from .sim import run_collective
        prof = _profile(ns)
        n = parse_size(ns.size)
        print(f"# {ns.collective}, {human_bytes(n)}, {prof.name}: simulated vs formula")
        for p in ns.workers:
            for alg in names(ns.collective):
                if alg == "mpi":
                    continue
                count = n if ns.collective != "allgather" else n // p
                cl, _ = run_collective(ns.collective, alg, [np.zeros(count, np.uint8) for _ in range(p)],
                                       profile=prof, segments=ns.segments)
                f = cm.cost(ns.collective, alg, p, n, 1, segments=ns.segments).time(prof)
                print(f"p={p:<4} {alg:<20} sim {human_time(cl.time):>10}  formula {human_time(f):>10}  "
                      f"busiest sent {human_bytes(cl.traffic()['busiest_sent'])}")
    return 0


def _model(ns) -> int:
    prof = _profile(ns)
    if ns.what == "predict":
        from .schedules import get, names
        n = parse_size(ns.size)
        for p in ns.workers:
            print(f"# {ns.collective} of {human_bytes(n)} on {p} workers, {prof.name}")
            for alg in names(ns.collective):
                if get(ns.collective, alg).cost is None:
                    continue
                kw = {}
                if alg == "pipeline":
                    kw["segments"] = cm.best_segments(p, n, prof.alpha, prof.beta, n)[0]
                c = cm.cost(ns.collective, alg, p, n, 1, **kw)
                extra = f"  (S={kw['segments']})" if kw else ""
                print(f"  {alg:<20}{human_time(c.time(prof)):>12}  rounds {c.rounds:<5} busiest sends "
                      f"{human_bytes(c.busiest_sent)}{extra}")
    elif ns.what == "segments":
        n = parse_size(ns.size)
        for p in ns.workers:
            s, star = cm.best_segments(p, n, prof.alpha, prof.beta)
            pow2 = min((1 << k for k in range(40)), key=lambda q: cm.pipeline_time(p, n, q, prof.alpha, prof.beta))
            print(f"p={p}, N={human_bytes(n)}, {prof.name}: best S = {s} "
                  f"({human_time(cm.pipeline_time(p, n, s, prof.alpha, prof.beta))}); closed form "
                  f"S* = sqrt((p-2) N beta / alpha) = {star:.1f}; best power of two {pow2} "
                  f"({human_time(cm.pipeline_time(p, n, pow2, prof.alpha, prof.beta))}); "
                  f"unsegmented {human_time(cm.pipeline_time(p, n, 1, prof.alpha, prof.beta))}")
    elif ns.what == "crossover":
        for p in ns.workers:
            for a, b in (("naive", "tree"), ("tree", "ring"), ("naive", "ring")):
                x = cm.crossover("allreduce", a, b, p, prof)
                print(f"p={p}: {b} overtakes {a} at {human_bytes(x) if x else 'never'}")
    elif ns.what == "speedup":
        t1, g = parse_time(ns.step), parse_size(ns.grad)
        print(f"# step {human_time(t1)} on one worker, {human_bytes(g)} of gradients, ring all-reduce, {prof.name}")
        for p in ns.workers:
            d = cm.dp_step(t1, p, g, prof)
            print(f"p={p:<4} step {human_time(d.step):>10}  comm {human_time(d.comm):>10} "
                  f"({d.comm_fraction:.0%})  speedup {d.speedup:.2f}x")
    else:
        n, d = float(ns.params), float(ns.tokens)
        flops = cm.train_flops(n, d)
        print(f"6ND = {flops:.3g} FLOP; training state 16 B/param = {human_bytes(cm.training_state_bytes(n))}")
        if ns.tensor * ns.pipeline > 1:
            print(f"per GPU under TP{ns.tensor} x PP{ns.pipeline}: "
                  f"{human_bytes(cm.model_parallel_share(n, ns.tensor, ns.pipeline))}")
        if ns.gpu_hours:
            print(f"MFU implied by {float(ns.gpu_hours):.4g} GPU-hours at {float(ns.peak):.3g} FLOP/s peak: "
                  f"{cm.mfu(n, d, float(ns.gpu_hours), float(ns.peak)):.1%}")
        print(f"GPU-hours at {float(ns.peak) * ns.mfu:.3g} FLOP/s sustained: "
              f"{cm.gpu_hours(flops, float(ns.peak) * ns.mfu):.4g}")
    return 0


def _common(p) -> None:
    p.add_argument("--alpha", default="5us", help="latency per message (default 5us)")
    p.add_argument("--bandwidth", default="25GB/s", help="link bandwidth B = 1/beta (default 25GB/s)")
    p.add_argument("--reduce-rate", default="", help="bytes reduced per second (1/gamma; default free)")
    p.add_argument("--workers", "-p", type=lambda s: [int(x) for x in s.split(",")], default=[8],
                   help="comma-separated world sizes")
    p.add_argument("--size", default="64MB", help="message size, e.g. 64MB, 256KiB")
    p.add_argument("--collective", default="allreduce")
    p.add_argument("--segments", type=int, default=4)


def add_parser(sub) -> None:
    s = sub.add_parser("sim", help="virtual cluster: symbolic rounds, traffic, simulated time")
    s.add_argument("what", choices=["table", "traffic", "time"])
    _common(s)
    s.set_defaults(func=_sim)
    m = sub.add_parser("model", help="alpha-beta-gamma predictions and the lecture's estimates")
    m.add_argument("what", choices=["predict", "segments", "crossover", "speedup", "scale"])
    _common(m)
    m.add_argument("--step", default="20ms", help="one worker's compute per step (speedup)")
    m.add_argument("--grad", default="10MB", help="gradient bytes (speedup)")
    m.add_argument("--params", default="405e9")
    m.add_argument("--tokens", default="15.6e12")
    m.add_argument("--gpu-hours", default="")
    m.add_argument("--peak", default="989e12", help="peak FLOP/s per GPU")
    m.add_argument("--mfu", type=float, default=1.0, help="assumed utilisation for GPU-hours")
    m.add_argument("--tensor", type=int, default=1)
    m.add_argument("--pipeline", type=int, default=1)
    m.set_defaults(func=_model)
