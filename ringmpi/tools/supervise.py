"""One rank of a job under `ringmpi.launch --restarts`: run the rank's command as a child and
write down how it ended, so the launcher can say which rank failed and how.

    python -m ringmpi.tools.supervise STATUS_DIR -- CMD...      (started by mpirun, per rank)

A launcher knows a failed job only by its exit status: Open MPI's names the rank in prose,
MPICH's hydra gives a pid and an exit code, a killed rank's own process can say nothing.
This parent of the rank can: it writes `STATUS_DIR/rank-R.json` when the rank starts (pid,
host) and again when it ends (exit status or signal, seconds since start). It forwards
the signals a launcher sends (SIGTERM, SIGINT, SIGHUP, SIGUSR1/2, SIGCONT) to the child, and
on Linux the child gets SIGKILL if this process dies first (PR_SET_PDEATHSIG), so no rank
outlives its supervisor. MPI finds the rank through the environment the launcher set
(PMIx/PMI variables), which the child inherits unchanged; the supervisor never calls MPI.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["rank_from_environment", "main", "FORWARDED"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MPI_LOCALRANKID")


def rank_from_environment() -> int | None:
    """This process's rank in the job, as the launcher wrote it into the environment."""
    for var in RANK_VARIABLES[:3]:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the supervisor dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _record(path: Path, fields: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fields))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m ringmpi.tools.supervise STATUS_DIR -- CMD...", file=sys.stderr)
        return 2
    status_dir, cmd = Path(argv[0]), argv[2:]
    rank = rank_from_environment()
    path = status_dir / f"rank-{rank if rank is not None else os.getpid()}.json"
    start = time.time()
    # close_fds=False: the launcher's descriptors are the rank's (MPICH's hydra hands PMI_FD
    # down as an open descriptor; without it MPI_Init fails: "PMI_Init returned -1")
    child = subprocess.Popen(cmd, close_fds=False,
                             preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    fields = {"rank": rank, "pid": child.pid, "host": socket.gethostname(), "start": start}
    _record(path, fields)
    for s in FORWARDED:
        signal.signal(s, lambda num, _frame: child.send_signal(num))
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:   # a forwarded signal arrived during the wait
            continue
    fields.update(end=time.time(), returncode=code)
    _record(path, fields)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
