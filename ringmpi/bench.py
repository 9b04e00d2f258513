"""`ringmpi bench`: collectives x algorithms x sizes, reported the way nccl-tests does.

    mpirun -n 4 python -m ringmpi bench [-b 1K] [-e 16M] [-f 4 | -i 1M] [-C allreduce,broadcast]
                 [-A ring,mpi] [-d float32] [-o sum] [-r 0] [-n ITERS] [-w WARMUP] [-c 1] [-a 1] [-J out.json]

Flags mean what they mean in nccl-tests (-c check, -a average mode, -J json); the
collectives and algorithms are chosen with -C and -A.

One harness owns warm-up, timing, the correctness check and the report; each collective is
a small plug-in (`Spec`: buffer sizes, exact inputs, expected output, bus-bandwidth factor).
Timing: the algorithms of one size run in interleaved rounds (in a new shuffled order
every round) and each keeps its median round, so drift and noise hit every algorithm alike; the
MPI library's own collective is always among them, and every row carries its ratio to it.
After the sweep the alpha-beta-gamma profile is fitted (saved for `auto`), and `auto` is
timed beside the best algorithm and MPI's own at every size.

Sizes use nccl-tests' K/M/G = 2^10/2^20/2^30. `size` is the bytes of the full vector:
count x itemsize for all-reduce, broadcast, reduce; count x itemsize x nranks for
all-gather and reduce-scatter, where `count` is per rank. algbw = size / time (GB = 1e9 B)
and busbw = algbw x factor: 2(n-1)/n all-reduce, (n-1)/n all-gather and reduce-scatter, 1
broadcast and reduce. #wrong counts elements that differ from the exact expected result.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import __version__
from .schedules import block_counts, get, names, offsets

__all__ = ["add_parser", "SPECS", "parse_nccl_size", "exact_input"]

COLLS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


def parse_nccl_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def exact_input(rank: int, p: int, n: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Inputs whose reduction is exact in any order, known to every rank without messages."""
    i = np.arange(n, dtype=np.int64)
    if dtype.kind == "b":
        v = ((i + rank) % 3) != 0
        return v
    if op == "PROD":  # one rank contributes 2 per element, the others 1: product exactly 2
        v = np.where((i + rank) % p == 0, 2, 1)
    elif op in ("BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR"):
        v = (i * 7 + rank * 13) % 64
    else:  # small integers: sums stay exact in float16..complex and inside int8 for p <= 21
        v = (i * 7 + rank * 3) % 13 - 6 if dtype.kind != "u" else (i * 7 + rank * 3) % 6
    return v.astype(dtype)


@dataclass(frozen=True)
class Spec:
    """A collective as the harness sees it."""
    name: str
    factor: Callable[[int], float]
    reduces: bool
    per_rank_count: bool   # count column is per rank (all-gather, reduce-scatter)
    has_out_of_place: bool = True


SPECS = {
    "allreduce": Spec("allreduce", lambda p: 2 * (p - 1) / p, True, False),
    "reduce_scatter": Spec("reduce_scatter", lambda p: (p - 1) / p, True, True),
    "allgather": Spec("allgather", lambda p: (p - 1) / p, False, True),
    "broadcast": Spec("broadcast", lambda p: 1.0, False, False, has_out_of_place=False),
    "reduce": Spec("reduce", lambda p: 1.0, True, False),
}
FACTOR_TEXT = {"allreduce": "2(n-1)/n", "reduce_scatter": "(n-1)/n", "allgather": "(n-1)/n",
               "broadcast": "1", "reduce": "1"}


class Case:
    """Buffers, expected result and one call of (collective, size) on this rank."""

    def __init__(self, coll: str, nbytes: int, dtype: np.dtype, op: str, root: int, t) -> None:
        self.coll, self.dtype, self.op, self.root, self.t = coll, dtype, op, root, t
        p, r = t.size, t.rank
        item = dtype.itemsize
        spec = SPECS[coll]
        self.count = max(nbytes // item // (p if spec.per_rank_count else 1), 0)
        full = self.count * (p if spec.per_rank_count else 1)
        self.size = full * item
        self.full = full
        if coll == "allgather":
            self.inputs = exact_input(r, p, self.count, dtype, op)
        elif coll == "broadcast":
            self.inputs = exact_input(root, p, full, dtype, op) if r == root else np.zeros(full, dtype)
        else:
            self.inputs = exact_input(r, p, full, dtype, op)
        self.send = self.inputs.copy()
        out = full if coll != "reduce_scatter" else block_counts(full, p)[r]
        self.recv = np.empty(out, dtype) if coll != "broadcast" else self.send
        self.inbuf = np.empty(full, dtype)
        self.reset_inplace()

    @functools.cached_property
    def expected(self) -> np.ndarray:
        """The exact result on this rank, computed locally from every rank's inputs."""
        from .ops import OPS
        p, r, dt, op, full = self.t.size, self.t.rank, self.dtype, self.op, self.full
        if self.coll == "allgather":
            return np.concatenate([exact_input(q, p, self.count, dt, op) for q in range(p)])
        if self.coll == "broadcast":
            return exact_input(self.root, p, full, dt, op)
        acc = exact_input(0, p, full, dt, op)
        for q in range(1, p):
            OPS[op](acc, exact_input(q, p, full, dt, op), out=acc)
        if self.coll == "reduce_scatter":
            off = offsets(block_counts(full, p))
            acc = acc[off[r]:off[r + 1]]
        return acc

    def reset_inplace(self) -> None:
        r = self.t.rank
        if self.coll == "allgather":
            self.inbuf[:] = 0
            self.inbuf[r * self.count:(r + 1) * self.count] = self.inputs
        else:
            self.inbuf[:] = self.inputs

    def call(self, algorithm: str, inplace: bool) -> np.ndarray | None:
        if algorithm == "mpi":
            return self.call_mpi(inplace)
        return self.call_api(algorithm, inplace)

    def call_api(self, algorithm: str, inplace: bool) -> np.ndarray | None:
        from . import api
        c = self.t.user_comm
        kw = dict(comm=c, algorithm=algorithm)
        if self.coll == "allreduce":
            return api.allreduce(self.inbuf, self.inbuf, op=self.op, **kw) if inplace else \
                api.allreduce(self.send, self.recv, op=self.op, **kw)
        if self.coll == "reduce_scatter":
            return api.reduce_scatter(self.inbuf, self.inbuf, op=self.op, **kw) if inplace else \
                api.reduce_scatter(self.send, self.recv, op=self.op, **kw)
        if self.coll == "allgather":
            return api.allgather(self.inbuf, self.inbuf, **kw) if inplace else \
                api.allgather(self.send, self.recv, **kw)
        if self.coll == "broadcast":
            return api.broadcast(self.inbuf, self.root, **kw)
        if inplace:
            return api.reduce(self.inbuf, self.inbuf, self.root, op=self.op, **kw)
        return api.reduce(self.send, self.recv if self.t.rank == self.root else None, self.root, op=self.op, **kw)

    def call_mpi(self, inplace: bool) -> np.ndarray | None:
        """The MPI library's own collective through its registered body (schedules/native.py),
        skipping ringmpi's argument checks: the reference carries none of the API's overhead."""
        args, result = self._body_args(inplace)
        get(self.coll, "mpi").run(self.t, *args)
        return result

    def _body_args(self, inplace: bool) -> tuple[tuple, np.ndarray | None]:
        """(the flat arguments the API would hand a schedule body, the result buffer)."""
        p, r, op, root = self.t.size, self.t.rank, self.op, self.root
        src = self.inbuf if inplace else self.send
        if self.coll == "allreduce":
            out = self.inbuf if inplace else self.recv
            return (src, out, op), out
        if self.coll == "reduce_scatter":
            counts = block_counts(self.inbuf.size, p)
            off = offsets(counts)
            out = self.inbuf[off[r]:off[r + 1]] if inplace else self.recv
            return (src, out, op, counts), out
        if self.coll == "allgather":
            mine = self.inbuf[r * self.count:(r + 1) * self.count] if inplace else self.send
            out = self.inbuf if inplace else self.recv
            return (mine, out, [self.count] * p), out
        if self.coll == "broadcast":
            return (self.inbuf, root, 1), self.inbuf
        out = (self.inbuf if inplace else self.recv) if r == root else None
        return (src, out, op, root), out

    def wrong(self, algorithm: str, inplace: bool) -> tuple[int, int]:
        """(#wrong on this rank, bytes this rank sent) for one checked call on fresh inputs."""
        self.reset_inplace()
        self.send[:] = self.inputs
        before = self.t.counters.snapshot()
        out = self.call(algorithm, inplace)
        sent = self.t.counters.since(before).bytes_sent
        if self.coll == "reduce" and self.t.rank != self.root:
            bad = 0
        else:
            got = np.asarray(out).reshape(-1)
            bad = int(np.count_nonzero(got != self.expected)) if got.size == self.expected.size else self.expected.size
        if not np.array_equal(self.send, self.inputs):
            bad += self.send.size  # a send buffer must never change
        return bad, sent


def default_iters(nbytes: int) -> tuple[int, int]:
    """OSU-like: many iterations for small messages, fewer for large ones."""
    if nbytes <= 8 << 10:
        return 200, 20
    if nbytes <= 1 << 20:
        return 50, 5
    if nbytes <= 16 << 20:
        return 20, 2
    return 10, 1


def time_interleaved(t, runners: dict[str, Callable[[], object]], iters: int, warmup: int,
                     rounds: int) -> dict[str, tuple[float, float, float]]:
    """Median-of-rounds seconds per call for each runner: (avg, min, max) over ranks."""
    keys = list(runners)
    for k in keys:
        for _ in range(warmup):
            runners[k]()
    per = max(1, iters // rounds)
    samples: dict[str, list[float]] = {k: [] for k in keys}
    for rnd in range(rounds):
        # a fresh order each round (the same on every rank): neither position nor the
        # algorithm run just before favours anyone systematically
        order = keys[:]
        random.Random(rnd).shuffle(order)
        for k in order:
            t.barrier()
            t0 = t.wtime()
            for _ in range(per):
                runners[k]()
            samples[k].append((t.wtime() - t0) / per)
    mine = {k: statistics.median(v) for k, v in samples.items()}
    everyone = t.allgather_obj(mine)
    return {k: (sum(d[k] for d in everyone) / len(everyone), min(d[k] for d in everyone),
                max(d[k] for d in everyone), everyone[0][k]) for k in keys}


def banner(t) -> dict:
    from .mpicomm import MPI, library_version
    import mpi4py
    hosts = t.hostnames()
    return {"ringmpi": __version__, "mpi_library": library_version(), "mpi4py": mpi4py.__version__,
            "numpy": np.__version__, "python": platform.python_version(), "ranks": t.size,
            "hosts": sorted(set(hosts)), "ranks_per_host": {h: hosts.count(h) for h in sorted(set(hosts))},
            "backend": t.backend.name, "mpi_version": "%d.%d" % MPI.Get_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.machine(), "cpus_per_host": os.cpu_count()}


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None
    from rich.console import Console
    prog = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
    prog.start()
    prog.add_task("bench", total=total)
    return prog


def _sizes(ns) -> list[int]:
    sizes, s = [], parse_nccl_size(ns.minbytes)
    step = parse_nccl_size(ns.stepbytes) if ns.stepbytes else 0
    while s <= parse_nccl_size(ns.maxbytes):
        sizes.append(s)
        s = s + step if step else max(s + 1, int(s * ns.stepfactor))
    return sizes


def _plan(ns, dtype: np.dtype, op: str) -> list[tuple[str, list[str]]]:
    """(collective, algorithms) to run; MPI's own is always among them."""
    colls = [c.strip() for c in ns.collectives.split(",")] if ns.collectives != "all" else list(COLLS)
    plan = []
    for coll in colls:
        if SPECS[coll].reduces and dtype.kind == "b" and op not in ("LAND", "LOR", "LXOR"):
            continue
        plan.append((coll, [a for a in names(coll) if ns.algorithms == "all" or a == "mpi"
                            or a in ns.algorithms.split(",")]))
    return plan


def _print_banner(info: dict, ns, dtype, op, root, sizes) -> None:
    print(f"# ringmpi bench {__version__}: {info['ranks']} ranks on {len(info['hosts'])} host(s) "
          f"{','.join(info['hosts'])}, backend {info['backend']}, {info['date']}")
    print(f"# {info['mpi_library']} (mpi4py {info['mpi4py']}, numpy {info['numpy']})")
    busiest = max(info["ranks_per_host"].values())
    if busiest > (info["cpus_per_host"] or busiest):
        print(f"# note: {busiest} ranks share {info['cpus_per_host']} CPUs on one host (oversubscribed): "
              "waiting ranks spin, so per-call overheads are amplified; compare ratios, not absolute times")
    print(f"# dtype {dtype.name}, op {op}, root {root}, sizes {sizes[0]}..{sizes[-1]} B x{ns.stepfactor:g}, "
          f"{ns.rounds} interleaved rounds per size, median kept")


def _sweep(t, ns, plan, sizes, dtype, op, root, prog):
    """Time every (collective, size, algorithm, placement) side by side; check each once."""
    from .calibrate import Sample
    p = t.size
    rows, samples = [], []
    for coll, algs in plan:
        spec = SPECS[coll]
        for nbytes in sizes:
            case = Case(coll, nbytes, dtype, op, root, t)
            iters, warm = default_iters(case.size)
            iters, warm = ns.iters or iters, ns.warmup if ns.warmup is not None else warm
            places = [False, True] if spec.has_out_of_place else [True]
            runners = {(a, ip): (lambda a=a, ip=ip: case.call(a, ip)) for a in algs for ip in places}
            timing = time_interleaved(t, runners, iters, warm, ns.rounds)
            for (a, ip), (tavg, tmin, tmax, t0) in timing.items():
                tsel = (t0, tavg, tmin, tmax)[ns.average]
                bad, sent = case.wrong(a, ip) if ns.check else (0, 0)
                bad = sum(t.allgather_obj(bad))
                sent = max(t.allgather_obj(sent))
                algbw = case.size / tsel / 1e9 if tsel > 0 else 0.0
                rows.append(dict(collective=coll, algorithm=a, placement="in" if ip else "out",
                                 size=case.size, count=case.count, type=dtype.name,
                                 redop=op if spec.reduces else "none",
                                 root=root if coll in ("broadcast", "reduce") else -1,
                                 time_us=tsel * 1e6, time_avg_us=tavg * 1e6, time_min_us=tmin * 1e6,
                                 time_max_us=tmax * 1e6, time_rank0_us=t0 * 1e6,
                                 algbw=algbw, busbw=algbw * spec.factor(p), wrong=bad,
                                 sent_bytes=sent if a != "mpi" else None,
                                 sent_busbw=(sent / tsel / 1e9) if a != "mpi" and tsel > 0 else None,
                                 iters=iters))
                if (not ip or not spec.has_out_of_place) and case.count:
                    samples.append(Sample(coll, a, case.full, dtype.itemsize, tsel))
            if prog:
                prog.advance(prog.task_ids[0])
    return rows, samples


def _time_auto(t, ns, plan, sizes, dtype, op, root, rows) -> list[dict]:
    """After the fit: auto beside the fastest candidate (both through ringmpi's API, the same
    overhead, so the ratio measures the choice) and MPI's own (called directly)."""
    from .auto import choose
    out = []
    for coll, _ in plan:
        spec = SPECS[coll]
        place = "out" if spec.has_out_of_place else "in"
        for nbytes in sizes:
            case = Case(coll, nbytes, dtype, op, root, t)
            if not case.count:
                continue
            ip = place == "in"
            best = min((r for r in rows if r["collective"] == coll and r["size"] == case.size
                        and r["placement"] == place), key=lambda r: r["time_us"])["algorithm"]
            chosen = choose(coll, t, case.full, dtype.itemsize)
            runners = {"auto": lambda: case.call("auto", ip), "best": lambda: case.call_api(best, ip),
                       "mpi": lambda: case.call("mpi", ip)}
            iters, warm = default_iters(case.size)
            tm = {k: v[0] for k, v in time_interleaved(t, runners, ns.iters or iters, warm, ns.rounds).items()}
            out.append(dict(collective=coll, size=case.size, chose=chosen, best=best,
                            auto_us=tm["auto"] * 1e6, best_us=tm["best"] * 1e6, mpi_us=tm["mpi"] * 1e6,
                            auto_over_best=tm["auto"] / tm["best"], auto_over_mpi=tm["auto"] / tm["mpi"]))
    return out


def _finish(ns, info, rows, auto_rows, prof, p) -> None:
    """Rank 0: table, footer, files, the saved profile."""
    _attach_predictions(rows, prof, p)
    if not ns.quiet:
        print_table(rows, auto_rows, p)
    for coll, bands in best_bands(rows).items():
        print(f"# fastest by size band, {coll}: "
              + "; ".join(f"{lo if lo == hi else lo + '-' + hi}: {alg}" for lo, hi, alg in bands))
    wrong = sum(r["wrong"] for r in rows)
    nonzero = [r["busbw"] for r in rows if r["size"]]
    print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    print(f"# Avg bus bandwidth    : {sum(nonzero) / max(len(nonzero), 1):.4g} GB/s")
    inv = lambda x: 1 / x / 1e9 if x else float("inf")  # noqa: E731  (s/byte -> GB/s)
    print(f"# Fitted profile: alpha {prof.alpha * 1e6:.3g} us, B {inv(prof.beta):.3g} GB/s, "
          f"gamma^-1 {inv(prof.gamma):.3g} GB/s, overhead {prof.overhead * 1e6:.3g} us "
          f"(median fit error {prof.meta['fit']['median_rel_err'] or 0:.0%})")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"banner": info, "rows": rows, "auto": auto_rows}, indent=1))
        print(f"# JSON: {ns.json}")
    if ns.out:
        from .report import write_report
        print(f"# Report: {write_report(Path(ns.out), info, rows, auto_rows, prof, p, vars(ns))}")
    if not ns.no_save_profile:
        from .auto import profile_path
        dest = profile_path(p)
        try:
            prof.save(dest)
            print(f"# Profile for auto saved to {dest}")
        except OSError as e:
            print(f"# could not save the profile to {dest}: {e}")


def run(ns) -> int:
    from .auto import set_profile
    from .calibrate import fit_profile, fit_quality
    from .mpicomm import transport
    t = transport()
    p, lead = t.size, t.rank == 0
    dtype, op, root = np.dtype(ns.dtype), ns.op.upper(), ns.root % t.size
    sizes, plan, info = _sizes(ns), _plan(ns, dtype, op), banner(t)
    if lead:
        _print_banner(info, ns, dtype, op, root, sizes)
    prog = _progress(len(plan) * len(sizes), lead and not ns.no_progress)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # repeated in-place sums overflow
            rows, samples = _sweep(t, ns, plan, sizes, dtype, op, root, prog)
            if ns.p2p:
                from .calibrate import measure_p2p
                samples += measure_p2p(t, sizes)
            prof = None
            if lead:  # fit once, broadcast: every rank must hold the same profile for auto
                prof = fit_profile(samples, p, name=f"fitted by ringmpi bench on {info['date']}", meta=info)
                prof.meta["fit"] = fit_quality(samples, prof, p)
            prof = t.bcast_obj(prof, 0)
            set_profile(t, prof)
            auto_rows = _time_auto(t, ns, plan, sizes, dtype, op, root, rows)
    finally:
        if prog:
            prog.stop()
    if lead:
        _finish(ns, info, rows, auto_rows, prof, p)
    return 1 if sum(r["wrong"] for r in rows) else 0


def _size_label(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def best_bands(rows: list[dict]) -> dict[str, list[tuple[str, str, str]]]:
    """Per collective, consecutive sizes with the same fastest algorithm: (from, to, name)."""
    out: dict = {}
    for coll in dict.fromkeys(r["collective"] for r in rows):
        sel = [r for r in rows if r["collective"] == coll and r["size"]]
        place = "out" if any(r["placement"] == "out" for r in sel) else "in"
        bands: list = []
        for size in sorted({r["size"] for r in sel}):
            best = min((r for r in sel if r["size"] == size and r["placement"] == place),
                       key=lambda r: r["time_us"])["algorithm"]
            if bands and bands[-1][2] == best:
                bands[-1][1] = size
            else:
                bands.append([size, size, best])
        out[coll] = [(_size_label(a), _size_label(b), alg) for a, b, alg in bands]
    return out


def _attach_predictions(rows, prof, p) -> None:
    for r in rows:
        alg = get(r["collective"], r["algorithm"])
        n = r["count"] * (p if SPECS[r["collective"]].per_rank_count else 1)
        itemsize = np.dtype(r["type"]).itemsize
        if alg.cost is None or not n:
            r["predicted_us"] = None
            continue
        kw = {}
        if r["algorithm"] == "pipeline":
            from .cost import best_segments
            kw["segments"] = best_segments(p, n * itemsize, prof.alpha, prof.beta, n)[0]
        r["predicted_us"] = alg.cost(p, n, itemsize, **kw).time(prof) * 1e6
    for r in rows:  # ratio to the MPI library's own collective, same size and placement
        ref = next((q for q in rows if q["collective"] == r["collective"] and q["size"] == r["size"]
                    and q["placement"] == r["placement"] and q["algorithm"] == "mpi"), None)
        r["ratio_mpi"] = r["time_us"] / ref["time_us"] if ref and ref["time_us"] > 0 else None


def _fmt(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def print_table(rows, auto_rows, p) -> None:
    for coll in dict.fromkeys(r["collective"] for r in rows):
        spec = SPECS[coll]
        print(f"#\n# {coll}: 'mpi' = the MPI library's own collective, called directly; busbw = algbw x {FACTOR_TEXT[coll]} = {spec.factor(p):.3g}; "
              f"xMPI = time / MPI's own (below 1: faster than MPI); sent = bytes this algorithm put "
              f"on the wire per rank (max), sentbw = sent / time in GB/s")
        print(f"# {'size(B)':>10} {'count':>10} {'type':>7} {'redop':>5} {'root':>4} {'algorithm':<19}"
              f"{'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'sent(B)':>10} {'sentbw':>7} {'xMPI':>6} {'pred(us)':>9}"
              f" |{'in-place':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'xMPI':>6}")
        sizes = sorted({r["size"] for r in rows if r["collective"] == coll})
        for size in sizes:
            for alg in dict.fromkeys(r["algorithm"] for r in rows if r["collective"] == coll):
                o = next((r for r in rows if r["collective"] == coll and r["size"] == size
                          and r["algorithm"] == alg and r["placement"] == "out"), None)
                i = next((r for r in rows if r["collective"] == coll and r["size"] == size
                          and r["algorithm"] == alg and r["placement"] == "in"), None)
                head = o or i
                left = (f"{_fmt(o['time_us'], '{:10.1f}')} {o['algbw']:7.3f} {o['busbw']:7.3f} {o['wrong']:6d} "
                        f"{_fmt(o['sent_bytes'], '{:10d}'):>10} {_fmt(o['sent_busbw'], '{:7.3f}'):>7} "
                        f"{_fmt(o['ratio_mpi'], '{:6.2f}'):>6} {_fmt(o['predicted_us'], '{:9.1f}'):>9}") if o else \
                    f"{'-':>10} {'-':>7} {'-':>7} {'-':>6} {_fmt(i['sent_bytes'], '{:10d}'):>10} " \
                    f"{_fmt(i['sent_busbw'], '{:7.3f}'):>7} {'-':>6} {_fmt(i['predicted_us'], '{:9.1f}'):>9}"
                right = (f"{i['time_us']:10.1f} {i['algbw']:7.3f} {i['busbw']:7.3f} {i['wrong']:6d} "
                         f"{_fmt(i['ratio_mpi'], '{:6.2f}'):>6}") if i else ""
                print(f"  {size:>10} {head['count']:>10} {head['type']:>7} {head['redop']:>5} {head['root']:>4} "
                      f"{alg:<19}{left} |{right}")
        picks = [a for a in auto_rows if a["collective"] == coll]
        if picks:
            print(f"# auto ({coll}): " + "; ".join(
                f"{a['size']}B->{a['chose']} {a['auto_over_best']:.2f}x fastest({a['best']})" for a in picks))


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark collectives x algorithms x sizes (nccl-tests style)")
    b.add_argument("-b", "--minbytes", default="1K", help="smallest size (K/M/G suffixes, default 1K)")
    b.add_argument("-e", "--maxbytes", default="16M", help="largest size (default 16M)")
    b.add_argument("-f", "--stepfactor", type=float, default=4, help="size growth factor (default 4)")
    b.add_argument("-i", "--stepbytes", default="", help="grow sizes by this many bytes instead of -f")
    b.add_argument("-C", "--collectives", default="all", help="comma-separated, default all")
    b.add_argument("-A", "--algorithms", default="all", help="comma-separated (mpi always included)")
    b.add_argument("-a", "--average", type=int, default=1, choices=[0, 1, 2, 3],
                   help="time column over ranks: 0 rank 0, 1 average (default), 2 min, 3 max")
    b.add_argument("-J", "--json", default="", help="also write every row to this JSON file")
    b.add_argument("-d", "--dtype", default="float32")
    b.add_argument("-o", "--op", default="sum")
    b.add_argument("-r", "--root", type=int, default=0)
    b.add_argument("-n", "--iters", type=int, default=0, help="iterations per size (default OSU-like by size)")
    b.add_argument("-w", "--warmup", type=int, default=None)
    b.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per size (median kept)")
    b.add_argument("-c", "--check", type=int, default=1, help="count #wrong against exact inputs (default 1)")
    b.add_argument("--out", default="", help="folder for report.md, bench.json, bench.csv, plots")
    b.add_argument("--no-save-profile", action="store_true", help="do not save the fitted profile for auto")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--p2p", action="store_true", help="add point-to-point rounds to the fit")
    b.add_argument("--quiet", action="store_true", help="footer only, no table")
    b.set_defaults(func=run)
