"""Fault injection for the restart and recovery tests and benchmarks: a SIGKILL sent from
outside to one rank of a running `ringmpi train`, the way a node's out-of-memory killer or
a lost host ends a rank (no chance to clean up, no message)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ringmpi.dp.checkpoint import NAME, checkpoints

__all__ = ["Kill", "killer", "launch", "rank_pid", "clean_environment", "steps_seen", "DIGEST"]


@dataclass
class Kill:
    """The SIGKILL sent to one rank (rank, pid, time.time() when sent), or why none was."""
    rank: int
    pid: int = 0
    at: float = 0.0
    missed: str = ""


#: what the trainer prints last: the digest runs are compared by
DIGEST = re.compile(r"^params sha256 ([0-9a-f]{64})$", re.M)


def clean_environment() -> dict:
    """This environment without an enclosing MPI job's variables or any RINGMPI_* setting."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_COMM", "PMIX", "PRTE", "OMPI_MCA", "PMI_", "HYDRA", "RINGMPI_"))}


def env() -> dict:
    return {**clean_environment(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def steps_seen(out: str) -> list[int]:
    """The steps whose line rank 0 printed ("step     N  loss X")."""
    return [int(m) for m in re.findall(r"^step\s+(\d+)\s", out, re.M)]


def rank_pid(rank: int, marker: str) -> int | None:
    """The pid of the trainer process of `rank` whose command line holds `marker` (not its
    supervisor, not the launcher): found by its command line and its MPI rank variable."""
    names = (f"OMPI_COMM_WORLD_RANK={rank}", f"PMI_RANK={rank}", f"PMIX_RANK={rank}")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            environ = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (marker.encode() in cmd and b"train" in cmd and not any(b"supervise" in c or b"launch" in c for c in cmd)
                and any(n.encode() in environ for n in names)):
            return int(d.name)
    return None


def killer(ckdir: Path, rank: int, delay: float, after: int = 0) -> tuple[threading.Thread, Kill]:
    """A thread that waits for a checkpoint in `ckdir` of step `after` or later (0: the
    first one), then `delay` s, then kills `rank` of the trainer started with `--checkpoint
    ckdir`. (A kill timed from the first checkpoint alone can come after the last step on a
    fast machine: the rank is killed while it exits, and the run has lost nothing.)"""
    kill = Kill(rank)

    def newest_step() -> int:
        found = checkpoints(ckdir)
        return int(NAME.match(found[0].name).group(1)) if found else -1

    def run() -> None:
        end = time.monotonic() + 120
        while newest_step() < max(after, 0) and time.monotonic() < end:
            time.sleep(0.005)
        time.sleep(delay)
        pid = rank_pid(rank, str(ckdir))
        if pid is None:
            kill.missed = "no such process (the run was over?)"
            return
        os.kill(pid, signal.SIGKILL)
        kill.pid, kill.at = pid, time.time()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, kill


def launch(ckdir: Path | None, *flags: str, train: list[str], ranks: int = 4,
           timeout: float = 150) -> tuple[int, str, list[tuple[float, str]]]:
    """`ringmpi train --checkpoint ckdir` (`train`: its other arguments) on `ranks` ranks
    under ringmpi.launch with `flags`; (exit status, output, [(time.time(), line)]). The
    checkpoint directory is also the marker `killer` finds this job's processes by (None:
    no checkpoints)."""
    cmd = [sys.executable, "-m", "ringmpi.launch", "-n", str(ranks), "--timeout", str(timeout), *flags, "--",
           sys.executable, "-m", "ringmpi", "train", *(["--checkpoint", str(ckdir)] if ckdir else []), *train]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(),
                            errors="replace")
    seen = [(time.time(), ln.replace("\0", "").rstrip("\n")) for ln in proc.stdout]
    return proc.wait(timeout=60), "\n".join(ln for _, ln in seen), seen
