"""`ringmpi bench`: collectives x algorithms x sizes, reported the way nccl-tests does.

    mpirun -n 4 python -m ringmpi bench [-b 1K] [-e 16M] [-f 4 | -i 1M] [-C allreduce,broadcast]
                 [-A ring,mpi] [-d float32] [-o sum] [-r 0] [-n ITERS] [-w WARMUP] [-c 1] [-a 1] [-J out.json]

Flags mean what they mean in nccl-tests (-c check, -a average mode, -J json); the
collectives and algorithms are chosen with -C and -A.

One harness owns warm-up, timing, the correctness check and the report; each collective is
a plug-in (its spec in `ringmpi.collectives`: count and size, exact inputs' expected result,
bus-bandwidth factor, the call itself). Timing: the algorithms of one size run in
interleaved rounds (in a new shuffled order every round) and each keeps its median round,
so drift and noise hit every algorithm alike; a round's first call of each algorithm is not
timed (it pays for the switch from another algorithm, which a loop of one collective never
does). The MPI library's own collective is always among them, and every row carries its
ratio to it. After the sweep the alpha-beta-gamma profile is fitted (saved for `auto`),
and `auto` is timed beside the best algorithm and MPI's own at every size, in place too.

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
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from .. import __version__
from .. import schedules
from .. import collectives as _collectives
from ..api import group, mpi_reference
from ..auto import DEFAULT, profile_of, profile_path, set_profile
from ..calibrate import (Sample, copy_runner, fit_measured, fit_quality, measure_copy, measure_gamma, measure_p2p,
                         unphysical)
from ..collectives import SPECS
from ..specs import Collective
from ..errors import RingmpiUsageError
from ..ops import OPS, SUPPORTED_DTYPES, check_op_dtype
from ..units import SIZE_HELP, size_label
from . import args
from .info import environment
from .report import best_bands, write_report

__all__ = ["add_parser", "exact_input", "Case", "Options", "run", "options"]

globals_of_collectives = {name: getattr(_collectives, name) for name in SPECS}
DTYPE_NAMES = [d.name for d in SUPPORTED_DTYPES]


def _alias(name: str) -> bool:
    """A numpy alias of a supported dtype (np.longlong is int64 here, 'f4' is float32)."""
    try:
        return np.dtype(name).name in DTYPE_NAMES
    except TypeError:
        return False


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

    def __init__(self, spec: Collective, nbytes: int, dtype: np.dtype, op: str, root: int, t: Any,
                 register: bool = False, device: Any = None) -> None:
        self.spec, self.dtype, self.op, self.root, self.t = spec, dtype, op if spec.reduces else None, root, t
        self.register = register
        self.device = device    # a device backend (ringmpi.device): the calls' buffers live there
        p, r = t.size, t.rank
        self.count = spec.nccl_count(nbytes, dtype.itemsize, p)
        self.size = spec.size(self.count, dtype.itemsize, p)
        self.n_in = spec.input_count(self.count, p)
        self.x = exact_input(r, p, self.n_in, dtype, self.op)
        self.calls = {ip: self.make(ip) for ip in ((False, True) if spec.has_out_of_place else (True,))}
        self.refs: dict = {}

    def make(self, inplace: bool):
        call = self.spec.make(self.t.rank, self.t.size, self.x, op=self.op, root=self.root, inplace=inplace)
        if self.device is not None:
            return _relocated(call, lambda bases: [self.device.wrap(b.reshape(-1)) for b in bases])
        return _relocated(call, self._shared) if self.register else call

    def host(self, a: Any) -> np.ndarray:
        return np.asarray(a) if self.device is None else self.device.to_host(a)

    def _shared(self, bases: list[np.ndarray]) -> list[np.ndarray]:
        """Copies of `bases` in one shared segment of this rank (collective: one
        `shared_empty` per call on every rank)."""
        pool = _collectives.shared_empty(sum(b.nbytes for b in bases), np.uint8, comm=self.t.user_comm)
        out, off = [], 0
        for b in bases:
            new = pool[off:off + b.nbytes].view(b.dtype)
            new[:] = b.reshape(-1)
            out.append(new)
            off += b.nbytes
        return out

    @functools.cached_property
    def expected(self) -> np.ndarray | None:
        """The exact result on this rank, computed locally from every rank's inputs."""
        p = self.t.size
        xs = [exact_input(q, p, self.n_in, self.dtype, self.op) for q in range(p)]
        return self.spec.expected(xs, self.t.rank, self.op, self.root)

    def runner(self, algorithm: str, inplace: bool, call=None, api: bool = False) -> Callable[[], Any]:
        """One call, ready to repeat: the public ringmpi function a user would call, or for
        "mpi" (unless `api`) MPI's own as lean as ringmpi can call it: the reference."""
        spec, t = self.spec, self.t
        args = spec.args(call or self.calls[inplace])
        if algorithm == "mpi" and not api and self.device is None:
            ref = self.refs.get(inplace) or self.refs.setdefault(inplace, mpi_reference(t, spec, args))
            send, recv = args[spec.send_arg], args.get(spec.recv_arg)
            return lambda: ref(send, recv)
        return functools.partial(globals_of_collectives[spec.name], **args, comm=t.user_comm, algorithm=algorithm)

    def call(self, algorithm: str, inplace: bool, call=None) -> Any:
        return self.runner(algorithm, inplace, call)()

    def wrong(self, algorithm: str, inplace: bool) -> tuple[int, int]:
        """(#wrong on this rank, bytes this rank sent) for one checked call on fresh inputs."""
        call = self.make(inplace)
        before = self.t.counters.snapshot()
        self.call(algorithm, inplace, call)
        sent = self.t.counters.since(before).bytes_sent
        want = self.expected
        bad = 0
        if want is not None:
            out = self.spec.output(call)
            got = self.host(out).reshape(-1) if out is not None else np.empty(0)
            bad = int(np.count_nonzero(got != want)) if got.size == want.size else want.size
        if not inplace and not np.array_equal(self.host(call.send).reshape(self.x.shape), self.x):
            bad += self.x.size  # a send buffer must never change
        return bad, sent


def _relocated(call: Any, place: Callable[[list[np.ndarray]], list[Any]]) -> Any:
    """The call with its buffers' memory replaced by `place(bases)` (flat copies in shared
    or device memory, one per distinct base array), views kept as views."""
    bases: dict[int, np.ndarray] = {}
    for a in (call.send, call.recv):
        if a is not None:
            base = a if a.base is None else a.base
            bases.setdefault(id(base), base)
    moved = dict(zip(bases, zip(bases.values(), place(list(bases.values())))))

    def remap(a: Any) -> Any:
        if a is None:
            return None
        base, new = moved[id(a if a.base is None else a.base)]
        start = (a.ctypes.data - base.ctypes.data) // a.itemsize
        return new[start:start + a.size].reshape(a.shape)
    send = remap(call.send)
    return call._replace(send=send, recv=send if call.recv is call.send else remap(call.recv))


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
            runners[k]()   # untimed: the first call after another runner's pays for the switch
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
    """The report's first lines: where it ran (`info.environment`), the backend, the date."""
    return {**environment(t), "backend": t.backend.name,
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
    dtype: str = _opt("float32", "-d", "--dtype", help=f"element type: {', '.join(DTYPE_NAMES)} or all")
    op: str = _opt("sum", "-o", "--op", help=f"reduction op: {', '.join(o.lower() for o in OPS)} or all")
    root: int = _opt(0, "-r", "--root", type=int, help="root of broadcast and reduce")
    iters: Optional[int] = _opt(None, "-n", "--iters", type=int, help="iterations per size (default: OSU-like, by size)")
    warmup: Optional[int] = _opt(None, "-w", "--warmup", type=int, help="warm-up iterations (default by size)")
    rounds: int = _opt(5, "--rounds", type=int, help="interleaved timing rounds per size (median kept)")
    check: int = _opt(1, "-c", "--check", type=int, help="count #wrong against exact inputs")
    average: int = _opt(1, "-a", "--average", type=int, choices=[0, 1, 2, 3],
                        help="time column over ranks: 0 rank 0, 1 average, 2 min, 3 max")
    json: str = _opt("", "-J", "--json", help="also write every row to this JSON file")
    out: str = _opt("", "--out", help="folder for report.md, bench.json, bench.csv, plots")
    save_profile: bool = _opt(False, "--save-profile", action="store_true",
                              help="save the fitted profile for auto (only `ringmpi calibrate` does by default)")
    force_profile: bool = _opt(False, "--force-profile", action="store_true",
                               help="with --save-profile: save the fit even when it looks unphysical")
    progress: bool = _opt(True, "--no-progress", action="store_false", help="no progress bar")
    quiet: bool = _opt(False, "--quiet", action="store_true", help="footer only, no table")
    register: int = _opt(0, "-R", "--local-register", type=int, choices=[0, 1],
                         help="1: buffers in the host's shared memory (ringmpi.shared_empty, like nccl-tests' "
                              "registered buffers): the shared-memory algorithms send them without a copy")
    device: str = _opt("", "--device", choices=["", "cuda", "fake"],
                       help="buffers on a GPU (cuda: cupy arrays) or on the stand-in device (fake: host memory "
                            "seen only through __cuda_array_interface__, to try the staged path without a GPU); "
                            "'mpi' is then MPI's own on device buffers: whole buffers staged through the host "
                            "unless the MPI is CUDA-aware")
    fresh: bool = _opt(False, "--fresh", action="store_true",
                       help="time auto as on a machine with no profile: online tuning from scratch "
                            "(its exploration cost is reported)")

    def sizes(self) -> list[int]:
        sizes, s = [], self.minbytes
        while s <= self.maxbytes and len(sizes) <= MAX_SIZES:
            sizes.append(s)
            s = s + self.stepbytes if self.stepbytes else max(s + 1, int(s * self.stepfactor))
        return sizes

    def pairs(self) -> list[tuple[np.dtype, str]]:
        """(dtype, op) pairs to run: -d all and -o all as in nccl-tests (valid pairs only)."""
        dts = [np.dtype(d) for d in DTYPE_NAMES] if self.dtype == "all" else [np.dtype(self.dtype)]
        ops = list(OPS) if self.op.lower() == "all" else [self.op.upper()]
        return [(d, op) for d in dts for op in ops if check_op_dtype(op, d) is None or len(ops) == 1]

    def problem(self) -> str | None:
        """Why these options cannot run, or None."""
        colls = list(SPECS) if self.collectives == "all" else [c.strip() for c in self.collectives.split(",")]
        algs = [] if self.algorithms == "all" else [a.strip() for a in self.algorithms.split(",")]
        checks = [
            (self.dtype == "all" or self.dtype in DTYPE_NAMES or _alias(self.dtype),
             f"-d {self.dtype}: expected one of {', '.join(DTYPE_NAMES)} or all"),
            (self.op.lower() == "all" or self.op.upper() in OPS,
             f"-o {self.op}: expected one of {', '.join(o.lower() for o in OPS)} or all"),
            (all(c in SPECS for c in colls), f"-C {self.collectives}: expected some of {', '.join(SPECS)} or all"),
            (all(any(a in schedules.names(c) for c in SPECS) for a in algs),
             f"-A {self.algorithms}: unknown algorithm; the algorithms are "
             f"{', '.join(dict.fromkeys(a for c in SPECS for a in schedules.names(c)))} or all"),
            (not algs or all(any(a in schedules.names(c) for a in algs) for c in colls if c in SPECS),
             f"-A {self.algorithms} -C {self.collectives}: " + "; ".join(
                 f"{c} has none of them (its algorithms: {', '.join(schedules.names(c))})"
                 for c in colls if c in SPECS and not any(a in schedules.names(c) for a in algs))),
            (self.minbytes <= self.maxbytes, f"-b {self.minbytes} is above -e {self.maxbytes}"),
            (self.stepbytes > 0 or self.stepfactor > 1, f"-f {self.stepfactor:g}: the growth factor must be above 1"),
            (len(self.sizes()) <= MAX_SIZES, f"{self.minbytes}..{self.maxbytes} B with -f {self.stepfactor:g} "
             f"-i {self.stepbytes} is more than {MAX_SIZES} sizes; raise -f or -i"),
            (self.iters is None or self.iters >= 1, f"-n {self.iters}: at least one iteration"),
            (self.warmup is None or self.warmup >= 0, f"-w {self.warmup}: warm-up iterations cannot be negative"),
            (self.rounds >= 1, f"--rounds {self.rounds}: at least one round"),
            (self.root >= 0, f"-r {self.root}: the root is a rank, 0 or more"),
            (self.check in (0, 1), f"-c {self.check}: expected 0 or 1"),
        ]
        return next((msg for ok, msg in checks if not ok), None)

    def plan(self, dtype: np.dtype, op: str, t: Any = None) -> list[tuple[Collective, list[str]]]:
        """(collective, algorithms) to run (those that can run on transport `t`); MPI's own
        is always among them."""
        colls = list(SPECS) if self.collectives == "all" else [c.strip() for c in self.collectives.split(",")]
        plan = []
        for coll in colls:
            spec = SPECS[coll]
            if spec.reduces and dtype.kind == "b" and op not in ("LAND", "LOR", "LXOR"):
                continue
            on = t.device(_device_of(self), False) if t is not None and self.device else t
            plan.append((spec, [a for a in schedules.names(coll) if (self.algorithms == "all" or a == "mpi"
                                or a in self.algorithms.split(",")) and not (on and schedules.get(coll, a).why_not(on))]))
        return plan


def _print_banner(info: dict, o: Options, pairs, root, sizes) -> None:
    print(f"# ringmpi bench {__version__}: {info['ranks']} ranks on {len(info['hosts'])} host(s) "
          f"{','.join(info['hosts'])}, backend {info['backend']}, {info['date']}")
    print(f"# {info['mpi_library']} (mpi4py {info['mpi4py']}, numpy {info['numpy']})")
    busiest = max(info["ranks_per_host"].values())
    if busiest > (info["cpus_per_host"] or busiest):
        print(f"# note: {busiest} ranks share {info['cpus_per_host']} CPUs on one host (oversubscribed): "
              "waiting ranks spin, so per-call overheads are amplified; compare ratios, not absolute times")
    kinds = ", ".join(dict.fromkeys(d.name for d, _ in pairs))
    ops = ", ".join(dict.fromkeys(x for _, x in pairs))
    step = f"+{o.stepbytes}" if o.stepbytes else f"x{o.stepfactor:g}"
    print(f"# dtype {kinds}, op {ops}, root {root}, sizes {sizes[0]}..{sizes[-1]} B {step}, "
          f"{o.rounds} interleaved rounds per size, median kept")
    if o.register:
        print("# -R 1: every buffer in the host's shared memory (ringmpi.shared_empty)")
    print(f"# reads CUDA device memory: {'yes' if info['cuda_aware'] else 'no'} ({info['cuda_aware_how']})")
    if info.get("device"):
        how = "straight to MPI (CUDA-aware)" if info["cuda_aware"] else \
            "staged through pinned host memory, chunked and pipelined; 'mpi' stages whole buffers"
        print(f"# --device {info['device']}: buffers on the device, reduced there, {how}; device-to-host copy "
              f"{info['d2h_GBps']:.3g} GB/s (the bound of any staged collective)")
    print(f"# memory copy: {info['copy_GBps']:.3g} GB/s per rank ({size_label(info['copy_bytes'])}B, every rank "
          "copying at once): the bound for collectives within one host")


def _p2p_sizes(sizes: list[int]) -> list[int]:
    """Point-to-point sizes for alpha and beta: 8 B up to the sweep's largest, x16."""
    out, n = [], 8
    while n < max(sizes):
        out.append(n)
        n *= 16
    return out + [max(sizes, default=8)]


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


def _device_of(o: Options) -> Any:
    """The device backend --device names (None: host buffers)."""
    if not o.device:
        return None
    from .. import device as _device
    if o.device == "fake":
        return _device.FAKE
    try:
        return _device.cupy_backend()
    except ImportError as e:
        raise RingmpiUsageError(f"--device cuda needs cupy ({e}); install cupy-cuda12x or cupy-cuda13x") from None


def measure_d2h(backend: Any, nbytes: int, rounds: int = 5) -> float:
    """Device-to-host copy rate (bytes/s, median of `rounds`) into pinned memory: the
    physical bound of any collective staged through the host."""
    src, host = backend.empty(nbytes, np.uint8), backend.pinned(nbytes)
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        backend.d2h(src, host).synchronize()
        times.append(time.perf_counter() - t0)
    return nbytes / max(statistics.median(times[1:]), 1e-9)


#: the pseudo-runner timed beside the largest sizes: one memory copy per rank
COPY = ("memory copy", False)


def _sweep(t, o: Options, plan, sizes, dtype, op, root, prog, info: dict | None = None):
    """Time every (collective, size, algorithm, placement) side by side; check each once.
    At host sizes from half the banner's copy size (`info`), a memory copy of that size is
    timed in the same interleaved rounds: this VM's memory bandwidth drifts by 2x between
    minutes, so the bus bandwidth is compared with the copy rate measured beside it
    (`info["copy_beside_GBps"]`, per size)."""
    rows, samples = [], []
    device = _device_of(o)
    prof = profile_of(t)
    for spec, algs in plan:
        for nbytes in sizes:
            case = Case(spec, nbytes, dtype, op, root, t, bool(o.register), device)
            iters, warm = default_iters(case.size)
            iters, warm = o.iters or iters, o.warmup if o.warmup is not None else warm
            runners = {(a, ip): case.runner(a, ip) for a in algs for ip in case.calls}
            beside = info is not None and device is None and nbytes >= info["copy_bytes"] // 2
            if beside:
                runners[COPY] = copy_runner(info["copy_bytes"])
            timing = time_interleaved(t, runners, iters, warm, o.rounds)
            if beside:
                # the slowest rank's median, as `measure_copy`
                info.setdefault("copy_beside_GBps", {})[f"{spec.name}/{nbytes}"] = \
                    info["copy_bytes"] / timing.pop(COPY)[2] / 1e9
            for (a, ip), tm in timing.items():
                bad, sent = case.wrong(a, ip) if o.check else (0, 0)
                row = _row(case, a, ip, tm, o, sum(t.allgather_obj(bad)), max(t.allgather_obj(sent)), iters)
                rows.append(row)
                if (not ip or not spec.has_out_of_place) and case.count:
                    full = case.size // dtype.itemsize  # with the tunables the call ran with
                    params = schedules.get(spec.name, a).tuned(t.size, full, dtype.itemsize, prof)
                    samples.append(Sample(spec.name, a, full, dtype.itemsize, row["time_us"] / 1e6,
                                          tuple(sorted(params.items()))))
            if prog:
                prog.advance(prog.task_ids[0])
    return rows, samples


def _settle(run: Callable[[], Any], t: Any, limit: int = 1000) -> tuple[int, Any]:
    """Call `run` until auto's online tuning has chosen (every rank loops alike: the
    exploration schedule is the same everywhere); returns (calls, the tuner or None)."""
    for n in range(1, limit + 1):
        run()
        if t.last_choice.get("why") != "online tuning: exploring":
            return n, t.last_choice.get("tuner")
    return limit, t.last_choice.get("tuner")


def _time_auto(t, o: Options, plan, sizes, dtype, op, root, rows) -> list[dict]:
    """After the fit (or, with --fresh, with no profile at all): auto beside the fastest
    candidate (both through ringmpi's API, the same overhead, so the ratio measures the
    choice) and MPI's own (called directly), after auto's exploration if it had one."""
    out = []
    device = _device_of(o)
    for spec, _ in plan:
        # in place too (MPI's own skips a copy there); a rooted collective's in place is the
        # root's alone (reduce) or the only way (broadcast)
        places = ["out", "in"] if spec.has_out_of_place and not spec.rooted else \
            ["out" if spec.has_out_of_place else "in"]
        for nbytes, place in ((n, w) for n in sizes for w in places):
            case = Case(spec, nbytes, dtype, op, root, t, bool(o.register), device)
            if not case.count:
                continue
            ip = place == "in"
            best = min((r for r in rows if r["collective"] == spec.name and r["size"] == case.size
                        and r["placement"] == place), key=lambda r: r["time_us"])["algorithm"]
            runners = {"auto": case.runner("auto", ip), "mpi": case.runner("mpi", ip),
                       "best": case.runner(best, ip, api=True)}
            explored, tuner = _settle(runners["auto"], t)
            chosen = t.last_choice["algorithm"]
            iters, warm = default_iters(case.size)
            tm = {k: v[0] for k, v in time_interleaved(t, runners, o.iters or iters, warm, o.rounds).items()}
            row = dict(collective=spec.name, size=case.size, placement=place, chose=chosen, best=best,
                       auto_us=tm["auto"] * 1e6, best_us=tm["best"] * 1e6, mpi_us=tm["mpi"] * 1e6,
                       auto_over_best=tm["auto"] / tm["best"], auto_over_mpi=tm["auto"] / tm["mpi"])
            if tuner is not None and tuner.exploration_cost is not None:
                slowest = max(tuner.tuned.values())
                row.update(explore_calls=explored, explore_cost_us=tuner.exploration_cost * 1e6,
                           explore_in_slowest_calls=tuner.exploration_cost / slowest, tried=list(tuner.tuned))
            out.append(row)
    return out


def _api_overhead(t: Any, o: Options) -> list[dict]:
    """ringmpi.allreduce on COMM_WORLD as users call it (auto, no comm=, with and without a
    result buffer), and the mpi4py drop-in's `ringmpi.Comm(COMM_WORLD).Allreduce(x, y,
    op=MPI.SUM)`, against mpi4py's own `comm.Allreduce(x, y, op=MPI.SUM)`, float32."""
    from ..comm import Comm   # imports mpi4py, which is running already
    fn, op, *_ = t.mpi_function("Allreduce", "SUM")
    wrapped = Comm(t.user_comm).Allreduce
    allreduce = _collectives.allreduce
    out = []
    for nbytes in (8, 1024, 65536):
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        runners = {"mpi": lambda: fn(x, y, op), "auto": lambda: allreduce(x, y), "auto_new": lambda: allreduce(x),
                   "comm": lambda: wrapped(x, y, op)}
        for name in ("auto", "auto_new", "comm"):
            _settle(runners[name], t)
        tm = {k: v[0] for k, v in time_interleaved(t, runners, o.iters or 2000, 100, max(o.rounds, 5)).items()}
        out.append(dict(size=nbytes, mpi_us=tm["mpi"] * 1e6, auto_us=tm["auto"] * 1e6, auto_new_us=tm["auto_new"] * 1e6,
                        comm_us=tm["comm"] * 1e6, auto_over_mpi=tm["auto"] / tm["mpi"],
                        auto_new_over_mpi=tm["auto_new"] / tm["mpi"], comm_over_mpi=tm["comm"] / tm["mpi"]))
    return out


def _finish(o: Options, info, rows, auto_rows, prof, p, overhead) -> None:
    """Rank 0: table, footer, files, the saved profile."""
    _attach_predictions(rows, prof, p)
    if not o.quiet:
        print_table(rows, auto_rows, p)
    _footer(info, rows, auto_rows, prof, overhead)
    if o.json:
        Path(o.json).write_text(json.dumps({"banner": info, "rows": rows, "auto": auto_rows, "api_overhead": overhead},
                                           indent=1))
        print(f"# JSON: {o.json}")
    if o.out:
        print(f"# Report: {write_report(Path(o.out), info, rows, auto_rows, prof, p, vars(o), overhead)}")
    if o.save_profile:
        _save_profile(o, prof, p)


def _footer(info, rows, auto_rows, prof, overhead) -> None:
    """The summary lines under the tables (nccl-tests' and ringmpi's own)."""
    if overhead:
        print("# API overhead, allreduce float32 (auto through ringmpi's API / MPI_Allreduce called directly): "
              + "; ".join(f"{size_label(r['size'])}B: {r['auto_us']:.2f} us / {r['mpi_us']:.2f} us = "
                          f"{r['auto_over_mpi']:.2f}x ({r['auto_new_over_mpi']:.2f}x with a new result array)"
                          for r in overhead))
        print("# mpi4py drop-in, ringmpi.Comm(comm).Allreduce(x, y, op=MPI.SUM) / mpi4py's comm.Allreduce: "
              + "; ".join(f"{size_label(r['size'])}B: {r['comm_us']:.2f} us / {r['mpi_us']:.2f} us = "
                          f"{r['comm_over_mpi']:.2f}x" for r in overhead))
    explored = [a for a in auto_rows if "explore_cost_us" in a]
    if explored:
        worst = max(explored, key=lambda a: a["auto_over_best"])
        print(f"# online tuning from scratch: auto / fastest <= {worst['auto_over_best']:.2f} at every size "
              f"({worst['collective']} {size_label(worst['size'])}B the worst); exploration cost at most "
              f"{max(a['explore_in_slowest_calls'] for a in explored):.1f} calls of the slowest candidate tried")
    for coll, bands in best_bands(rows).items():
        print(f"# fastest by size band, {coll}: "
              + "; ".join(f"{lo if lo == hi else lo + '-' + hi}: {alg}" for lo, hi, alg in bands))
    top = max((r["size"] for r in rows), default=0)
    at_top = {r["algorithm"]: r["busbw"] for r in rows if r["size"] == top and r["placement"] == "out"
              and r["collective"] == rows[0]["collective"]}
    copy = info.get("copy_beside_GBps", {}).get(f"{rows[0]['collective']}/{top}") if rows else None
    if top >= info["copy_bytes"] // 2 and at_top and (copy or info.get("copy_GBps")):
        how = ("timed in the same interleaved rounds" if copy else "at the start")
        copy = copy or info["copy_GBps"]
        print(f"# {rows[0]['collective']} bus bandwidth at {size_label(top)}B / memory copy "
              f"({copy:.3g} GB/s per rank, every rank copying {size_label(info['copy_bytes'])}B at once, {how}): "
              + ", ".join(f"{a} {bw / copy:.2f}" for a, bw in sorted(at_top.items(), key=lambda kv: -kv[1])))
    wrong = sum(r["wrong"] for r in rows)
    nonzero = [r["busbw"] for r in rows if r["size"]]
    print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    print(f"# Avg bus bandwidth    : {sum(nonzero) / max(len(nonzero), 1):.4g} GB/s")
    inv = lambda x: 1 / x / 1e9 if x else float("inf")  # noqa: E731  (s/byte -> GB/s)
    print(f"# Fitted profile: alpha {prof.alpha * 1e6:.3g} us, B {inv(prof.beta):.3g} GB/s, "
          f"gamma^-1 {inv(prof.gamma):.3g} GB/s, overhead {prof.overhead * 1e6:.3g} us "
          f"(median fit error {prof.meta['fit']['median_rel_err'] or 0:.0%})")


def _save_profile(o: Options, prof, p: int) -> None:
    """--save-profile: the fit becomes auto's profile, unless it looks unphysical."""
    why = unphysical(prof)
    dest = profile_path(p)
    if why and o.force_profile:
        print(f"# profile looks unphysical ({why}); saved anyway (--force-profile)")
    elif why:
        print(f"# profile NOT saved: {why}; auto keeps {dest if dest.exists() else 'its default'}")
        return
    try:
        prof.save(dest)
        print(f"# Profile for auto saved to {dest}")
    except OSError as e:
        print(f"# could not save the profile to {dest}: {e}")


def run(o: Options, comm: Any = None) -> int:
    """The benchmark on `comm` (COMM_WORLD): every rank runs it; rank 0 prints and writes.
    Nothing on the machine changes unless asked (--save-profile); returns the exit status."""
    t = group(comm)
    p, lead = t.size, t.rank == 0
    if o.root >= p:
        if lead:
            print(f"ringmpi bench: error: -r {o.root}: the root must be a rank below {p}", file=sys.stderr)
        return 2
    _device_of(o)   # --device cuda without cupy: a usage error before anything runs
    pairs, sizes, info, root = o.pairs(), o.sizes(), banner(t), o.root
    info["copy_bytes"] = min(64 << 20, max(sizes[-1], 1 << 20))
    info["copy_GBps"] = measure_copy(t, info["copy_bytes"]) / 1e9
    if o.device:
        info["device"], info["backend"] = o.device, _device_of(o).name
        info["d2h_GBps"] = measure_d2h(_device_of(o), info["copy_bytes"]) / 1e9
    dtype, op = pairs[0]
    if lead:
        _print_banner(info, o, pairs, root, sizes)
    prog = _progress(sum(len(o.plan(d, x, t)) for d, x in pairs) * len(sizes), lead and o.progress)
    rows, samples = [], []
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # repeated in-place sums overflow
            for d, x in pairs:  # -d all / -o all: every valid pair, as nccl-tests
                r, smp = _sweep(t, o, o.plan(d, x, t), sizes, d, x, root, prog, info)
                rows, samples = rows + r, samples + smp
            prof = _fit(t, samples, sizes, dtype, info)
            set_profile(t, DEFAULT if o.fresh else prof)  # --fresh: auto learns online, from nothing
            auto_rows = _time_auto(t, o, o.plan(dtype, op, t), sizes, dtype, op, root, rows)
            overhead = _api_overhead(t, o)
    finally:
        if prog:
            prog.stop()
    if lead:
        _finish(o, info, rows, auto_rows, prof, p, overhead)
    return 1 if sum(r["wrong"] for r in rows) else 0


def _fit(t: Any, samples: list, sizes: list[int], dtype: np.dtype, info: dict) -> Any:
    """Each constant where it lives (point-to-point rounds: alpha, beta; the reduction
    alone: gamma), then the rest from the sweep; fitted on rank 0, the same on every rank."""
    samples = samples + measure_p2p(t, _p2p_sizes(sizes)) + measure_gamma(t, dtype if dtype.kind in "iuf" else "f4")
    prof = None
    if t.rank == 0:
        prof = fit_measured(samples, t.size, name=f"fitted by ringmpi bench on {info['date']}", meta=info)
        prof.meta["fit"] = fit_quality([s for s in samples if s.collective != "p2p"], prof, t.size)
    return t.bcast_obj(prof, 0)


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


def _cells(r: dict | None) -> str:
    if r is None:
        return f"{'-':>9} {'-':>7} {'-':>6} {'-':>5}"
    return f"{r['time_us']:9.1f} {r['busbw']:7.3f} {r['wrong']:6d} {_fmt(r['ratio_mpi'], '{:5.2f}'):>5}"


def print_table(rows, auto_rows, p) -> None:
    """nccl-tests' columns, one table per collective, dtype and op, within 120 columns
    (the bytes each algorithm sent and the rest are in the JSON and CSV files)."""
    done: set = set()
    for key in dict.fromkeys((r["collective"], r["type"], r["redop"], r["root"]) for r in rows):
        coll, dtype, redop, root = key
        spec = SPECS[coll]
        sel = [r for r in rows if (r["collective"], r["type"], r["redop"], r["root"]) == key]
        print(f"#\n# {coll}, {dtype}" + (f", op {redop}" if spec.reduces else "") + (f", root {root}" if spec.rooted else "")
              + f": busbw = algbw x {spec.busbw} = {spec.busbw_factor(p):.3g}; xMPI = time / MPI's own "
              "(below 1: faster)")
        print(f"# {'':10} {'':10} {'':20} {'out of place':^30} | {'in place':^30}")
        print(f"# {'size(B)':>10} {'count':>10} {'algorithm':<20} {'time(us)':>9} {'busbw':>7} {'#wrong':>6} "
              f"{'xMPI':>5} | {'time(us)':>9} {'busbw':>7} {'#wrong':>6} {'xMPI':>5} {'model(us)':>9}")
        for size in sorted({r["size"] for r in sel}):
            here = [r for r in sel if r["size"] == size]
            for alg in dict.fromkeys(r["algorithm"] for r in here):
                o = next((r for r in here if r["algorithm"] == alg and r["placement"] == "out"), None)
                i = next((r for r in here if r["algorithm"] == alg and r["placement"] == "in"), None)
                head = o or i
                print(f"  {size:>10} {head['count']:>10} {alg:<20} {_cells(o)} | {_cells(i)} "
                      f"{_fmt(head['predicted_us'], '{:9.1f}'):>9}")
        for a in (a for a in auto_rows if a["collective"] == coll and coll not in done):
            where = " in place" if a["placement"] == "in" and _collectives.SPECS[coll].has_out_of_place else ""
            print(f"# auto at {size_label(a['size'])}B{where}: {a['chose']}, {a['auto_over_best']:.2f}x the fastest "
                  f"({a['best']}), {a['auto_over_mpi']:.2f}x MPI's own")
        done.add(coll)


def add_parser(sub, name: str = "bench", text: str = "") -> None:
    b = sub.add_parser(name, help=text, description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in fields(Options):
        b.add_argument(*f.metadata["flags"], dest=f.name, default=f.default, help=f.metadata["help"],
                       **f.metadata["kw"])
    b.set_defaults(func=lambda ns: run(options(ns, b.error)))


MAX_SIZES = 64


def options(ns: argparse.Namespace, fail: Callable[[str], None] | None = None) -> Options:
    """The command line's options, checked: anything that cannot run is a usage error now,
    before MPI starts (`fail` prints it with the usage and exits 2)."""
    o = Options(**{f.name: getattr(ns, f.name) for f in fields(Options) if hasattr(ns, f.name)})
    problem = o.problem()
    if problem:
        (fail or _raise)(problem)
    return o


def _raise(msg: str) -> None:
    raise ValueError(msg)
