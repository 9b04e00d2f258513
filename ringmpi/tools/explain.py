"""`ringmpi sim` and `ringmpi model`: the lecture's tables, from the simulator and the model.

    ringmpi sim table [--collective allreduce] [--workers 4]      symbolic state after every round
    ringmpi sim traffic [--size 256K] [--workers 2,4,8,16,64]     bytes and rounds per algorithm
    ringmpi sim time --size 1M --workers 8 [--alpha 5us --bandwidth 25GB/s] [--straggler 1.5]
    ringmpi sim accuracy [--workers 2,...,1024] [--plot a.png]  rounding error of every order
    ringmpi model predict --size 64M --workers 8                  every algorithm's time
    ringmpi model segments --size 64e6 --workers 8                best S of the pipelined broadcast
    ringmpi model crossover --workers 8                           where algorithms overtake each other
    ringmpi model speedup --step 20ms --grad 10e6 --workers 8     data-parallel speedup
    ringmpi model scale --params 405e9 --tokens 15.6e12 ...       6ND, memory, GPU-hours, MFU

Sizes are bytes with binary multiples (1K = 1024, 64M = 64 MiB, as nccl-tests); write 64e6
for the lecture's decimal 64 MB. Rates are decimal: 25GB/s = 25e9 bytes per second.
"""
from __future__ import annotations

import argparse
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import cost as cm
from .. import model, schedules
from ..specs import SPECS
from ..units import SIZE_HELP, human_bytes, human_time
from . import args

__all__ = ["add_parser", "symbolic_table", "traffic_table", "parameter_server_traffic"]

NAMES = "abcdefghijklmnopqrstuvwxyz"
WIDTH = 120  # columns of the tables


def _profile(ns) -> cm.Profile:
    name = f"alpha={human_time(ns.alpha)}, B={ns.bandwidth / 1e9:g} GB/s"
    local = {}
    if ns.per_node:
        local = dict(alpha_local=ns.alpha_local if ns.alpha_local is not None else ns.alpha,
                     beta_local=1 / ns.bandwidth_local if ns.bandwidth_local else 1 / ns.bandwidth, per_node=ns.per_node)
        name += (f" between nodes; {ns.per_node} ranks per node at alpha={human_time(local['alpha_local'])}, "
                 f"B={1 / local['beta_local'] / 1e9:g} GB/s")
    return cm.Profile(alpha=ns.alpha, beta=1 / ns.bandwidth, gamma=1 / ns.reduce_rate if ns.reduce_rate else 0.0,
                      name=name, **local)


def _layout(p: int, per_node: int) -> Any:
    """What an algorithm's `unavailable` looks at: the size and every rank's node."""
    return types.SimpleNamespace(size=p, nodes=[r - r % per_node for r in range(p)] if per_node else [0] * p,
                                 on_device=False, nonblocking=False)


def symbolic_table(collective: str = "allreduce", p: int = 4, segments: int = 4, algorithm: str | None = None) -> str:
    """The state of every worker at the start and after every step (lecture 3.1 and 3.2).

    Rank r's input is named by letter (a0 a1 ... on rank 0, b0 b1 ... on rank 1), one symbol
    per block; an algorithm with a segment count gets one symbol per segment, named x as in
    the lecture's pipeline (only the root's data matters there). The simulator runs with
    alpha = 1, beta = gamma = 0, so its clock counts steps and the rows are global steps."""
    from ..sim import Sym, run_collective
    spec = SPECS[collective]
    algorithm = algorithm or spec.taught
    alg = schedules.get(collective, algorithm)
    steps = cm.Profile(alpha=1.0, beta=0.0, gamma=0.0, name="steps")
    segmented = "segments" in alg.tuned(p, 1, 1, steps)
    count = segments if segmented else spec.input_count(spec.nccl_count(p, 1, p), p)
    inputs = []
    for r in range(p):
        a = np.empty(count, dtype=object)
        a[:] = [Sym(f"{'x' if segmented else NAMES[r]}{j}") for j in range(count)]
        inputs.append(a)
    cl, _ = run_collective(collective, algorithm, inputs, params={"segments": segments} if segmented else None,
                           inplace=True, watch=True, profile=steps)
    times = sorted({t for rk in cl.ranks for t, _ in rk.snapshots})

    def state(rk, t):
        return " ".join("-" if v is None else str(v) for v in [s for ts, s in rk.snapshots if ts <= t][-1])
    width = max(len(state(rk, t)) for rk in cl.ranks for t in times) + 2
    per_block = max(1, (WIDTH - 10) // width)  # the workers side by side, in blocks that fit the terminal
    rows: list[str] = []
    for first in range(0, p, per_block):
        ranks = cl.ranks[first:first + per_block]
        rows += [""] if first else []
        rows.append(f"{'':10}" + "".join(f"{'worker ' + str(rk.rank):<{width}}" for rk in ranks))
        for t in times:
            label = "start" if t == 0 else f"step {t:g}"
            rows.append(f"{label:10}" + "".join(f"{state(rk, t):<{width}}" for rk in ranks))
    return "\n".join(rows)


def parameter_server_traffic(workers: int, nbytes: int) -> dict:
    """Simulate one synchronous PS step: K workers push N bytes to a server, pull N back."""
    from ..schedules.naive import fan_in_reduce, fan_out
    from ..sim import VirtualCluster
    cl = VirtualCluster(workers + 1, data=False)   # bytes and rounds only: phantom buffers
    server = workers

    def step(t):
        g = t.empty(nbytes, np.uint8)
        acc = t.empty(nbytes, np.uint8) if t.rank == server else None
        fan_in_reduce(t, g, acc, "SUM", server)
        fan_out(t, acc if t.rank == server else g, server)
    cl.run(step)
    return cl.traffic()


def traffic_table(nbytes: int, workers: list[int]) -> str:
    """Section 3.3: bytes moved by the busiest device and rounds, per algorithm and p."""
    from ..sim import phantoms, run_collective
    lines = [f"# all-reduce of {human_bytes(nbytes)} per device; busiest device sent (and rounds)",
             f"{'p':>4} {'ring':>22} {'naive (all to 0)':>22} {'tree':>22} {'param. server':>26}"]
    for p in workers:
        cells = []
        for alg in ("ring", "naive", "tree"):
            cl, _ = run_collective("allreduce", alg, phantoms(p, nbytes))
            tr = cl.traffic()
            cells.append(f"{human_bytes(tr['busiest_sent'])} ({tr['rounds']})")
        ps = parameter_server_traffic(p, nbytes)
        cells.append(f"{human_bytes(ps['busiest_moved'])} moved ({ps['rounds']})")
        lines.append(f"{p:>4} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22} {cells[3]:>26}")
    lines.append("# ring: 2(p-1)/p N on every device; naive root and tree root grow with p; "
                 "the server moves 2pN (workers 2N)")
    return "\n".join(lines)


def _workers(ns, command: str) -> None:
    """--nodes N with --per-node K: the world sizes are N x K; without --workers, 8 (the
    accuracy study: every power of two to 1024)."""
    if ns.workers is None and command == "sim accuracy":
        from .precision import DEFAULT_WORKERS
        ns.workers = list(DEFAULT_WORKERS)
    elif ns.workers is None:
        ns.workers = [8]
    if ns.nodes:
        if not ns.per_node:
            args.fail(command, f"--nodes {ns.nodes}: give --per-node too (ranks on each node)")
        ns.workers = [ns.nodes * ns.per_node]


def _sim(ns) -> int:
    _workers(ns, "sim " + ns.what)
    if ns.what == "table":
        if ns.workers[0] > len(NAMES):
            args.fail("sim table", f"--workers {ns.workers[0]}: a symbolic table shows at most {len(NAMES)} workers "
                      "(one letter each); use sim traffic or sim time for more")
        print(symbolic_table(ns.collective, ns.workers[0], ns.segments or 4))
    elif ns.what == "traffic":
        print(traffic_table(ns.size, ns.workers))
    elif ns.what == "accuracy":
        from .precision import main
        return main(ns)
    else:
        print(time_table(ns.collective, ns.size, ns.workers, _profile(ns), segments=ns.segments, data=ns.data,
                         straggler=ns.straggler, slow_links=dict(ns.slow_link), overhead=ns.overhead,
                         jobs=ns.jobs))
    return 0


def time_table(collective: str, nbytes: int, workers: list[int], prof: cm.Profile, *, segments: int = 0,
               data: bool = False, straggler: tuple[int | None, float] | None = None,
               slow_links: dict | None = None, overhead: float = 0.0, jobs: int = 0) -> str:
    """Every algorithm of `collective` on the virtual cluster: simulated time against its
    formula, the busiest rank's bytes and the simulator's own wall time. Without `data` the
    buffers are phantoms (timing only); with it, random integers whose result is checked
    against numpy. A straggler (rank, factor: rank None = the last one), slow links and a
    per-message overhead add a column: the time on that network and its ratio to uniform.

    Each row is a simulation of its own, on one core: rows of more than `PARALLEL_MESSAGES`
    messages together run in `jobs` processes at once (0: one per core this process may
    use; 1: all here), the longest first."""
    spec = SPECS[collective]
    itemsize = 4 if data else 1
    params = {"segments": segments} if segments else {}
    knobs = bool(straggler and straggler[1] != 1 or slow_links or overhead)
    lines = [f"# {collective}, {human_bytes(nbytes)}, {prof.name}: simulated vs formula"
             f" ({'random data, checked against numpy' if data else 'no data: phantom buffers'})"]
    rows: list[TimeRow | str] = []
    for p in workers:
        count = spec.nccl_count(nbytes, itemsize, p)
        net = _network(p, straggler, slow_links, overhead, rows) if knobs else None
        for name in schedules.names(collective)[:-1]:
            if not schedules.get(collective, name).why_not(_layout(p, prof.per_node)):
                rows.append(TimeRow(collective, name, p, count, prof, params, data, net))
    tasks = [r for r in rows if isinstance(r, TimeRow)]
    size = {id(t): t.messages() for t in tasks}
    jobs = jobs or len(os.sched_getaffinity(0))
    done: dict[int, str] = {}   # id(row): its line, from the processes
    if jobs > 1 and len(tasks) > 1 and sum(size.values()) > PARALLEL_MESSAGES:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=multiprocessing.get_context(_start_method())) as pool:
            futures = {id(t): pool.submit(t.line) for t in sorted(tasks, key=lambda t: -size[id(t)])}
            done = {k: f.result() for k, f in futures.items()}
    lines += [r if isinstance(r, str) else done.get(id(r)) or r.line() for r in rows]
    return "\n".join(lines)


def _start_method() -> str:
    """How `sim time` starts its processes: forked, so that they need not import numpy and
    ringmpi again, unless this process runs threads or has loaded MPI (a fork of either is
    unsafe: a lock held by another thread, MPI's state): then spawned."""
    import threading
    return "fork" if threading.active_count() == 1 and "mpi4py.MPI" not in sys.modules else "spawn"


#: `sim time` runs its rows in parallel processes when they send more messages than this
#: together (about a second of simulation; a spawned process costs about a third of one)
PARALLEL_MESSAGES = 500_000


@dataclass(frozen=True)
class TimeRow:
    """One row of `sim time`: an algorithm at p ranks, uniform and, with `network`, on it."""
    collective: str
    algorithm: str
    p: int
    count: int
    profile: cm.Profile
    params: dict
    data: bool
    network: Any = None

    def messages(self) -> int:
        """About how many messages its simulation sends: its rounds on every rank."""
        alg = schedules.get(self.collective, self.algorithm)
        if alg.cost is None:
            return self.p
        n = SPECS[self.collective].size(self.count, 1, self.p)
        return self.p * alg.formula(self.p, n, 1, **alg.tuned(self.p, n, 1, self.profile)).rounds

    def line(self) -> str:
        import time as _time

        from ..sim import phantoms, run_collective
        spec, alg, p, prof = SPECS[self.collective], schedules.get(self.collective, self.algorithm), self.p, self.profile
        params, itemsize = self.params or None, 4 if self.data else 1
        n_in = spec.input_count(self.count, p)
        if self.data:
            rng = np.random.default_rng(p)
            inputs = [rng.integers(0, 10, n_in).astype(np.int32) for _ in range(p)]
        else:
            inputs = phantoms(p, n_in, np.uint8)
        t0 = _time.perf_counter()
        cl, outs = run_collective(self.collective, self.algorithm, inputs, profile=prof, params=params,
                                  per_node=prof.per_node)
        wall = _time.perf_counter() - t0
        n = spec.size(self.count, itemsize, p)
        f = alg.predict(p, n, 1, prof, **self.params) - prof.overhead
        row = (f"p={p:<5} {self.algorithm:<19} sim {human_time(cl.time):>10}  formula {human_time(f):>10}  "
               f"busiest {human_bytes(cl.traffic()['busiest_sent']):>9}")
        if self.data:
            bad = sum(not np.array_equal(o, spec.expected(inputs, r, "SUM" if spec.reduces else None))
                      for r, o in enumerate(outs) if o is not None)
            row += "  check " + ("ok" if bad == 0 else f"{bad} ranks WRONG")
        if self.network is not None:
            slow, _ = run_collective(self.collective, self.algorithm, phantoms(p, n_in, np.uint8), profile=prof,
                                     params=params, network=self.network, per_node=prof.per_node)
            row += f"  slowed {human_time(slow.time):>10} ({slow.time / cl.time if cl.time else 1:.2f}x)"
        return row + f"  [{wall:.1f} s]"


def _network(p: int, straggler: tuple[int | None, float] | None, slow_links: dict | None, overhead: float,
             lines: list[str]) -> Any:
    """The simulated network of `sim time`'s knobs at p ranks (a line saying so added to
    `lines`); a straggler of rank None is the last rank."""
    from ..sim import Network
    slow = {} if not straggler or straggler[1] == 1 else \
        {(p - 1 if straggler[0] is None else straggler[0]): straggler[1]}
    net = Network(slow_ranks=slow, slow_links=dict(slow_links or {}), overhead=overhead)
    try:
        net.check(p)
    except ValueError as e:
        args.fail("sim time", f"{e} (p={p})")
    what = ", ".join([*(f"rank {r} x{f:g}" for r, f in net.slow_ranks.items()),
                      *(f"link {a}->{b} x{f:g}" for (a, b), f in net.slow_links.items()),
                      *([f"overhead {human_time(overhead)}/message"] if overhead else [])])
    lines.append(f"# p={p}: {what}")
    return net


def _predict(ns, prof) -> None:
    n = ns.size
    for p in ns.workers:
        print(f"# {ns.collective} of {human_bytes(n)} on {p} workers, {prof.name}")
        for name in schedules.names(ns.collective):
            alg = schedules.get(ns.collective, name)
            if alg.cost is None:
                continue
            params = alg.tuned(p, n, 1, prof)
            c = alg.formula(p, n, 1, **params)
            extra = "  (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else ""
            print(f"  {name:<20}{human_time(c.time(prof)):>12}  rounds {c.rounds:<5} busiest sends "
                  f"{human_bytes(c.busiest_sent)}{extra}")


def _segments(ns, prof) -> None:
    n, a, b = ns.size, prof.alpha, prof.beta
    if a <= 0 or b <= 0:
        args.fail("model segments", "--alpha and --bandwidth must be above 0 (with a free message the best "
                  "segment count has no bound)")
    for p in ns.workers:
        s, star = cm.best_segments(p, n, a, b)
        pow2 = min((1 << k for k in range(40)), key=lambda q: cm.pipeline_time(p, n, q, a, b))
        print(f"p={p}, N={human_bytes(n)} ({n} B), {prof.name}: best S = {s} "
              f"({human_time(cm.pipeline_time(p, n, s, a, b))}); closed form S* = sqrt((p-2) N beta / alpha) = "
              f"{star:.1f}; best power of two {pow2} ({human_time(cm.pipeline_time(p, n, pow2, a, b))}); "
              f"unsegmented {human_time(cm.pipeline_time(p, n, 1, a, b))}")


def _crossover(ns, prof) -> None:
    pairs = [("naive", "tree"), ("tree", "ring"), ("naive", "ring")]
    if prof.per_node:
        pairs.append(("ring", "hierarchical"))
        print(f"# {prof.name}")
    for p in ns.workers:
        for a, b in pairs:
            x = model.crossover("allreduce", a, b, p, prof)
            print(f"p={p}: {b} overtakes {a} at {human_bytes(x) + f' ({x} B)' if x else 'never'}")


def _speedup(ns, prof) -> None:
    print(f"# step {human_time(ns.step)} on one worker, {human_bytes(ns.grad)} of gradients, ring all-reduce, "
          f"{prof.name}")
    for p in ns.workers:
        d = model.dp_step(ns.step, p, ns.grad, prof)
        print(f"p={p:<4} step {human_time(d.step):>10}  comm {human_time(d.comm):>10} "
              f"({d.comm_fraction:.0%})  speedup {d.speedup:.2f}x")


def _scale(ns, prof) -> None:
    n, d = ns.params, ns.tokens
    flops = cm.train_flops(n, d)
    print(f"6ND = {flops:.3g} FLOP; training state 16 B/param = {cm.training_state_bytes(n) / 1e12:.3g} TB")
    if ns.tensor * ns.pipeline > 1:
        print(f"per GPU under TP{ns.tensor} x PP{ns.pipeline}: "
              f"{cm.model_parallel_share(n, ns.tensor, ns.pipeline) / 1e9:.3g} GB")
    if ns.gpu_hours:
        print(f"MFU implied by {ns.gpu_hours:.4g} GPU-hours at {ns.peak:.3g} FLOP/s peak: "
              f"{cm.mfu(n, d, ns.gpu_hours, ns.peak):.1%}")
    print(f"GPU-hours at {ns.peak * ns.mfu:.3g} FLOP/s sustained: {cm.gpu_hours(flops, ns.peak * ns.mfu):.4g}")


MODEL = {"predict": _predict, "segments": _segments, "crossover": _crossover, "speedup": _speedup, "scale": _scale}


def _model(ns) -> int:
    _workers(ns, "model " + ns.what)
    MODEL[ns.what](ns, _profile(ns))
    return 0


def _common(p) -> None:
    p.add_argument("--alpha", type=args.time, default="5us", help="latency per message")
    p.add_argument("--bandwidth", type=args.rate, default="25GB/s",
                   help="link bandwidth B = 1/beta (decimal GB/s)")
    p.add_argument("--reduce-rate", type=args.rate, default=0.0,
                   help="bytes reduced per second (1/gamma; 0: free)")
    p.add_argument("--workers", "-p", type=args.int_list, default=None,
                   help="comma-separated world sizes (default 8; sim accuracy: 2,4,...,1024)")
    p.add_argument("--size", type=args.size, default="64M", help=f"message size ({SIZE_HELP})")
    p.add_argument("--collective", choices=list(SPECS), default="allreduce", help="collective")
    p.add_argument("--segments", type=int, default=0,
                   help="pipeline segments (0: the tuned S; tables use 4)")
    p.add_argument("--per-node", type=args.count, default=0,
                   help="ranks per node: a cluster of nodes, its links inside a node at --alpha-local and "
                        "--bandwidth-local (0: one node, one kind of link)")
    p.add_argument("--nodes", type=args.count, default=0, help="nodes (with --per-node: the world size is their product)")
    p.add_argument("--alpha-local", type=args.time, default=None, help="latency inside a node (default: --alpha)")
    p.add_argument("--bandwidth-local", type=args.rate, default=None,
                   help="bandwidth inside a node (default: --bandwidth)")


def _factor(text: str) -> tuple[int | None, float]:
    """'1.5' (the last rank) or 'R=1.5' (rank R): a straggler."""
    rank, _, f = text.rpartition("=")
    try:
        out = (int(rank) if rank else None, float(f))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FACTOR or RANK=FACTOR (e.g. 1.5 or 3=1.5), got {text!r}") from None
    if not out[1] >= 1 or (out[0] is not None and out[0] < 0):
        raise argparse.ArgumentTypeError(f"expected a factor >= 1 and a rank >= 0, got {text!r}")
    return out


def _link(text: str) -> tuple[tuple[int, int], float]:
    """'A:B=F': the link from rank A to rank B is F times slower."""
    try:
        ends, f = text.split("=")
        a, b = (int(x) for x in ends.split(":"))
        out = ((a, b), float(f))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SRC:DST=FACTOR (e.g. 0:1=2), got {text!r}") from None
    if not out[1] >= 1 or a < 0 or b < 0 or a == b:
        raise argparse.ArgumentTypeError(f"expected two different ranks and a factor >= 1, got {text!r}")
    return out


def add_parser(sub, name: str, text: str = "") -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    if name == "sim":
        s = sub.add_parser("sim", help=text, description=__doc__.split("\n\n")[0], formatter_class=fmt)
        s.add_argument("what", choices=["table", "traffic", "time", "accuracy"], help="which table")
        _common(s)
        s.add_argument("--data", action="store_true",
                       help="time: run with random data and check the results (default: phantom buffers, timing only)")
        s.add_argument("--straggler", type=_factor, default=None, metavar="[RANK=]FACTOR",
                       help="time: one rank FACTOR times slower (default: the last rank); adds a column")
        s.add_argument("--slow-link", type=_link, action="append", default=[], metavar="SRC:DST=FACTOR",
                       help="time: one link direction FACTOR times slower (repeatable)")
        s.add_argument("--overhead", type=args.time, default=0.0, help="time: per-message CPU overhead (LogP's o)")
        s.add_argument("--jobs", type=args.count, default=0,
                       help="time: rows simulated at once, each in its own process (0: one per core; 1: none)")
        s.add_argument("--count", type=args.count, default=4096, help="accuracy: elements per rank")
        s.add_argument("--values", choices=["uniform", "normal"], default="uniform",
                       help="accuracy: the random data (uniform in [0, 1): well conditioned sums)")
        s.add_argument("--plot", default="", metavar="FILE", help="accuracy: also plot the maximum error against p")
        s.set_defaults(func=_sim)
        return
    m = sub.add_parser("model", help=text, description=__doc__.split("\n\n")[0], formatter_class=fmt)
    m.add_argument("what", choices=list(MODEL), help="which estimate")
    _common(m)
    m.add_argument("--step", type=args.time, default="20ms", help="one worker's compute per step")
    m.add_argument("--grad", type=args.size, default="10e6", help="gradient bytes (speedup)")
    m.add_argument("--params", type=float, default=405e9, help="model parameters (scale)")
    m.add_argument("--tokens", type=float, default=15.6e12, help="training tokens (scale)")
    m.add_argument("--gpu-hours", type=float, default=0.0, help="reported GPU-hours (scale: implied MFU)")
    m.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s per GPU")
    m.add_argument("--mfu", type=float, default=1.0, help="assumed utilisation for GPU-hours")
    m.add_argument("--tensor", type=int, default=1, help="tensor-parallel ways")
    m.add_argument("--pipeline", type=int, default=1, help="pipeline-parallel stages")
    m.set_defaults(func=_model)
