"""`ringmpi bench`: collectives x algorithms x sizes, reported the way nccl-tests does.

    mpirun -n 4 python -m ringmpi bench [-b 1K] [-e 16M] [-f 4 | -i 1M] [-C allreduce,broadcast]
                 [-A ring,mpi] [-d float32] [-o sum] [-r 0] [-n ITERS] [-w WARMUP] [-c 1] [-a 1] [-J out.json]

Flags mean what they mean in nccl-tests (-c check, -a average mode, -J json); the
collectives and algorithms are chosen with -C and -A.

One harness owns warm-up, timing, the correctness check and the report; each collective is
a plug-in (its spec in `ringmpi.collectives`: count and size, exact inputs' expected result,
bus-bandwidth factor, the call itself). Timing: the algorithms of one size run in
interleaved rounds (in a new shuffled order every round) and each keeps its median round,
so drift and noise hit every algorithm alike; the MPI library's own collective is always
among them, and every row carries its ratio to it. After the sweep the alpha-beta-gamma
profile is fitted (saved for `auto`), and `auto` is timed beside the best algorithm and
MPI's own at every size.

Sizes use nccl-tests' K/M/G = 2^10/2^20/2^30. `size` is the bytes of the full vector:
count x itemsize for all-reduce, broadcast, reduce, all-to-all (one rank's send buffer);
count x itemsize x nranks for all-gather and reduce-scatter, where `count` is per rank.
algbw = size / time (GB = 1e9 B) and busbw = algbw x the collective's factor: 2(n-1)/n
all-reduce, (n-1)/n all-gather, reduce-scatter and all-to-all, 1 broadcast and reduce.
#wrong counts elements that differ from the exact expected result.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import platform
import random
import statistics
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from .. import __version__
from .. import schedules
from ..api import group
from ..auto import profile_path, set_profile
from ..calibrate import Sample, fit_profile, fit_quality, measure_p2p
from ..collectives import SPECS, Collective
from ..units import SIZE_HELP
from . import args
from .report import best_bands, write_report

__all__ = ["add_parser", "exact_input", "Case", "Options", "run", "options"]


def exact_input(rank: int, p: int, n: int, dtype: np.dtype, op: str | None) -> np.ndarray:
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


class Case:
    """One (collective, size) on this rank: its harness calls and their expected result."""

    def __init__(self, spec: Collective, nbytes: int, dtype: np.dtype, op: str, root: int, t: Any) -> None:
        self.spec, self.dtype, self.op, self.root, self.t = spec, dtype, op if spec.reduces else None, root, t
        p, r = t.size, t.rank
        self.count = spec.nccl_count(nbytes, dtype.itemsize, p)
        self.size = spec.size(self.count, dtype.itemsize, p)
        self.n_in = spec.input_count(self.count, p)
        self.x = exact_input(r, p, self.n_in, dtype, self.op)
        self.calls = {ip: self.make(ip) for ip in ((False, True) if spec.has_out_of_place else (True,))}

    def make(self, inplace: bool):
        return self.spec.make(self.t.rank, self.t.size, self.x, op=self.op, root=self.root, inplace=inplace)

    @functools.cached_property
    def expected(self) -> np.ndarray | None:
        """The exact result on this rank, computed locally from every rank's inputs."""
        p = self.t.size
        xs = [exact_input(q, p, self.n_in, self.dtype, self.op) for q in range(p)]
        return self.spec.expected(xs, self.t.rank, self.op, self.root)

    def call(self, algorithm: str, inplace: bool, call=None) -> Any:
        """One call: the MPI library's own called directly (no ringmpi API in between), or
        the public ringmpi function a user would call."""
        call = call or self.calls[inplace]
        if algorithm == "mpi":
            t = self.t
            t.begin("bench/mpi")  # scratch (MPICH's aliasing rule) comes from the pool
            try:
                self.spec.mpi(t, call)
            finally:
                t.end()
            return None
        return self.spec.invoke(call, self.t.user_comm, algorithm)

    def wrong(self, algorithm: str, inplace: bool) -> tuple[int, int]:
        """(#wrong on this rank, bytes this rank sent) for one checked call on fresh inputs."""
        call = self.make(inplace)
        before = self.t.counters.snapshot()
        self.call(algorithm, inplace, call)
        sent = self.t.counters.since(before).bytes_sent
        want = self.expected
        bad = 0
        if want is not None:
            got = np.asarray(self.spec.output(call)).reshape(-1)
            bad = int(np.count_nonzero(got != want)) if got.size == want.size else want.size
        if not inplace and not np.array_equal(call.send, self.x):
            bad += self.x.size  # a send buffer must never change
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


def banner(t: Any) -> dict:
    from ..mpicomm import library_version, mpi4py_version, mpi_standard
    hosts = t.hostnames()
    return {"ringmpi": __version__, "mpi_library": library_version(), "mpi4py": mpi4py_version(),
            "numpy": np.__version__, "python": platform.python_version(), "ranks": t.size,
            "hosts": sorted(set(hosts)), "ranks_per_host": {h: hosts.count(h) for h in sorted(set(hosts))},
            "backend": t.backend.name, "mpi_version": mpi_standard(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.machine(), "cpus_per_host": os.cpu_count()}


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    prog = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
    prog.start()
    prog.add_task("bench", total=total)
    return prog


def _opt(default: Any, *flags: str, help: str, **kw: Any) -> Any:
    """A benchmark option: its default, its command-line flags and help, in one place."""
    return field(default=default, metadata=dict(flags=flags, help=help, kw=kw))


@dataclass
class Options:
    """What one benchmark run does (the command line's flags, or calibrate's fixed choice)."""
    minbytes: int = _opt(1 << 10, "-b", "--minbytes", type=args.size, help=f"smallest size ({SIZE_HELP})")
    maxbytes: int = _opt(16 << 20, "-e", "--maxbytes", type=args.size, help="largest size")
    stepfactor: float = _opt(4.0, "-f", "--stepfactor", type=float, help="size growth factor")
    stepbytes: int = _opt(0, "-i", "--stepbytes", type=args.size, help="grow sizes by this many bytes instead of -f")
    collectives: str = _opt("all", "-C", "--collectives", help=f"comma-separated: {', '.join(SPECS)} or all")
    algorithms: str = _opt("all", "-A", "--algorithms", help="comma-separated (mpi always included)")
    dtype: str = _opt("float32", "-d", "--dtype", help="element type")
    op: str = _opt("sum", "-o", "--op", help="reduction op")
    root: int = _opt(0, "-r", "--root", type=int, help="root of broadcast and reduce")
    iters: int = _opt(0, "-n", "--iters", type=int, help="iterations per size (0: OSU-like by size)")
    warmup: Optional[int] = _opt(None, "-w", "--warmup", type=int, help="warm-up iterations (default by size)")
    rounds: int = _opt(5, "--rounds", type=int, help="interleaved timing rounds per size (median kept)")
    check: int = _opt(1, "-c", "--check", type=int, help="count #wrong against exact inputs")
    average: int = _opt(1, "-a", "--average", type=int, choices=[0, 1, 2, 3],
                        help="time column over ranks: 0 rank 0, 1 average, 2 min, 3 max")
    json: str = _opt("", "-J", "--json", help="also write every row to this JSON file")
    out: str = _opt("", "--out", help="folder for report.md, bench.json, bench.csv, plots")
    save_profile: bool = _opt(True, "--no-save-profile", action="store_false",
                              help="do not save the fitted profile for auto")
    progress: bool = _opt(True, "--no-progress", action="store_false", help="no progress bar")
    p2p: bool = _opt(False, "--p2p", action="store_true", help="add point-to-point rounds to the fit")
    quiet: bool = _opt(False, "--quiet", action="store_true", help="footer only, no table")

    def sizes(self) -> list[int]:
        sizes, s = [], self.minbytes
        while s <= self.maxbytes:
            sizes.append(s)
            s = s + self.stepbytes if self.stepbytes else max(s + 1, int(s * self.stepfactor))
        return sizes

    def plan(self, dtype: np.dtype, op: str) -> list[tuple[Collective, list[str]]]:
        """(collective, algorithms) to run; MPI's own is always among them."""
        colls = list(SPECS) if self.collectives == "all" else [c.strip() for c in self.collectives.split(",")]
        plan = []
        for coll in colls:
            spec = SPECS[coll]
            if spec.reduces and dtype.kind == "b" and op not in ("LAND", "LOR", "LXOR"):
                continue
            plan.append((spec, [a for a in schedules.names(coll) if self.algorithms == "all" or a == "mpi"
                                or a in self.algorithms.split(",")]))
        return plan


def _print_banner(info: dict, o: Options, dtype, op, root, sizes) -> None:
    print(f"# ringmpi bench {__version__}: {info['ranks']} ranks on {len(info['hosts'])} host(s) "
          f"{','.join(info['hosts'])}, backend {info['backend']}, {info['date']}")
    print(f"# {info['mpi_library']} (mpi4py {info['mpi4py']}, numpy {info['numpy']})")
    busiest = max(info["ranks_per_host"].values())
    if busiest > (info["cpus_per_host"] or busiest):
        print(f"# note: {busiest} ranks share {info['cpus_per_host']} CPUs on one host (oversubscribed): "
              "waiting ranks spin, so per-call overheads are amplified; compare ratios, not absolute times")
    print(f"# dtype {dtype.name}, op {op}, root {root}, sizes {sizes[0]}..{sizes[-1]} B x{o.stepfactor:g}, "
          f"{o.rounds} interleaved rounds per size, median kept")


def _row(case: Case, a: str, ip: bool, timing: tuple, o: Options, bad: int, sent: int, iters: int) -> dict:
    tavg, tmin, tmax, t0 = timing
    tsel = (t0, tavg, tmin, tmax)[o.average]
    spec, p = case.spec, case.t.size
    algbw = case.size / tsel / 1e9 if tsel > 0 else 0.0
    return dict(collective=spec.name, algorithm=a, placement="in" if ip else "out",
                size=case.size, count=case.count, type=case.dtype.name, redop=case.op or "none",
                root=case.root if spec.rooted else -1,
                time_us=tsel * 1e6, time_avg_us=tavg * 1e6, time_min_us=tmin * 1e6,
                time_max_us=tmax * 1e6, time_rank0_us=t0 * 1e6,
                algbw=algbw, busbw=algbw * spec.busbw_factor(p), wrong=bad,
                sent_bytes=sent if a != "mpi" else None,
                sent_busbw=(sent / tsel / 1e9) if a != "mpi" and tsel > 0 else None, iters=iters)


def _sweep(t, o: Options, plan, sizes, dtype, op, root, prog):
    """Time every (collective, size, algorithm, placement) side by side; check each once."""
    rows, samples = [], []
    for spec, algs in plan:
        for nbytes in sizes:
            case = Case(spec, nbytes, dtype, op, root, t)
            iters, warm = default_iters(case.size)
            iters, warm = o.iters or iters, o.warmup if o.warmup is not None else warm
            runners = {(a, ip): (lambda a=a, ip=ip: case.call(a, ip)) for a in algs for ip in case.calls}
            timing = time_interleaved(t, runners, iters, warm, o.rounds)
            for (a, ip), tm in timing.items():
                bad, sent = case.wrong(a, ip) if o.check else (0, 0)
                row = _row(case, a, ip, tm, o, sum(t.allgather_obj(bad)), max(t.allgather_obj(sent)), iters)
                rows.append(row)
                if (not ip or not spec.has_out_of_place) and case.count:
                    full = case.size // dtype.itemsize
                    samples.append(Sample(spec.name, a, full, dtype.itemsize, row["time_us"] / 1e6))
            if prog:
                prog.advance(prog.task_ids[0])
    return rows, samples


def _time_auto(t, o: Options, plan, sizes, dtype, op, root, rows) -> list[dict]:
    """After the fit: auto beside the fastest candidate (both through ringmpi's API, the same
    overhead, so the ratio measures the choice) and MPI's own (called directly)."""
    out = []
    for spec, _ in plan:
        place = "out" if spec.has_out_of_place else "in"
        for nbytes in sizes:
            case = Case(spec, nbytes, dtype, op, root, t)
            if not case.count:
                continue
            ip = place == "in"
            best = min((r for r in rows if r["collective"] == spec.name and r["size"] == case.size
                        and r["placement"] == place), key=lambda r: r["time_us"])["algorithm"]
            runners = {"auto": lambda: case.call("auto", ip), "mpi": lambda: case.call("mpi", ip),
                       "best": lambda: spec.invoke(case.calls[ip], t.user_comm, best)}
            case.call("auto", ip)
            chosen = t.last_choice["algorithm"]
            iters, warm = default_iters(case.size)
            tm = {k: v[0] for k, v in time_interleaved(t, runners, o.iters or iters, warm, o.rounds).items()}
            out.append(dict(collective=spec.name, size=case.size, chose=chosen, best=best,
                            auto_us=tm["auto"] * 1e6, best_us=tm["best"] * 1e6, mpi_us=tm["mpi"] * 1e6,
                            auto_over_best=tm["auto"] / tm["best"], auto_over_mpi=tm["auto"] / tm["mpi"]))
    return out


def _finish(o: Options, info, rows, auto_rows, prof, p) -> None:
    """Rank 0: table, footer, files, the saved profile."""
    _attach_predictions(rows, prof, p)
    if not o.quiet:
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
    if o.json:
        Path(o.json).write_text(json.dumps({"banner": info, "rows": rows, "auto": auto_rows}, indent=1))
        print(f"# JSON: {o.json}")
    if o.out:
        print(f"# Report: {write_report(Path(o.out), info, rows, auto_rows, prof, p, vars(o))}")
    if o.save_profile:
        dest = profile_path(p)
        try:
            prof.save(dest)
            print(f"# Profile for auto saved to {dest}")
        except OSError as e:
            print(f"# could not save the profile to {dest}: {e}")


def run(o: Options, comm: Any = None) -> int:
    t = group(comm)
    p, lead = t.size, t.rank == 0
    dtype, op, root = np.dtype(o.dtype), o.op.upper(), o.root % t.size
    sizes, plan, info = o.sizes(), o.plan(dtype, op), banner(t)
    if lead:
        _print_banner(info, o, dtype, op, root, sizes)
    prog = _progress(len(plan) * len(sizes), lead and o.progress)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # repeated in-place sums overflow
            rows, samples = _sweep(t, o, plan, sizes, dtype, op, root, prog)
            if o.p2p:
                samples += measure_p2p(t, sizes)
            prof = None
            if lead:  # fit once, broadcast: every rank must hold the same profile for auto
                prof = fit_profile(samples, p, name=f"fitted by ringmpi bench on {info['date']}", meta=info)
                prof.meta["fit"] = fit_quality(samples, prof, p)
            prof = t.bcast_obj(prof, 0)
            set_profile(t, prof)
            auto_rows = _time_auto(t, o, plan, sizes, dtype, op, root, rows)
    finally:
        if prog:
            prog.stop()
    if lead:
        _finish(o, info, rows, auto_rows, prof, p)
    return 1 if sum(r["wrong"] for r in rows) else 0


def _attach_predictions(rows, prof, p) -> None:
    for r in rows:
        spec = SPECS[r["collective"]]
        itemsize = np.dtype(r["type"]).itemsize
        n = spec.size(r["count"], itemsize, p) // itemsize
        pred = schedules.get(r["collective"], r["algorithm"]).predict(p, n, itemsize, prof) if n else None
        r["predicted_us"] = None if pred is None else pred * 1e6
    for r in rows:  # ratio to the MPI library's own collective, same size and placement
        ref = next((q for q in rows if q["collective"] == r["collective"] and q["size"] == r["size"]
                    and q["placement"] == r["placement"] and q["algorithm"] == "mpi"), None)
        r["ratio_mpi"] = r["time_us"] / ref["time_us"] if ref and ref["time_us"] > 0 else None


def _fmt(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def print_table(rows, auto_rows, p) -> None:
    for coll in dict.fromkeys(r["collective"] for r in rows):
        spec = SPECS[coll]
        print(f"#\n# {coll}: 'mpi' = the MPI library's own collective, called directly; busbw = algbw x "
              f"{spec.busbw} = {spec.busbw_factor(p):.3g}; "
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


def add_parser(sub, name: str = "bench", text: str = "") -> None:
    b = sub.add_parser(name, help=text, description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in fields(Options):
        b.add_argument(*f.metadata["flags"], dest=f.name, default=f.default, help=f.metadata["help"],
                       **f.metadata["kw"])
    b.set_defaults(func=lambda ns: run(options(ns)))


def options(ns: argparse.Namespace) -> Options:
    return Options(**{f.name: getattr(ns, f.name) for f in fields(Options) if hasattr(ns, f.name)})
