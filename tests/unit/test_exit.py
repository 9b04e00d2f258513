"""A process that met a rank failure (ULFM) leaves even when MPI_Finalize does not return:
Open MPI 5's finalize can wait for the dead rank for ever (open-mpi/ompi#11404). Here the
finalize is a stand-in that never returns; the real hang is what tests/readme's survivors
example met in about one exit in eight before."""
from __future__ import annotations

import subprocess
import sys
import time

SCRIPT = """
import ctypes, sys, time, types
from ringmpi import mpicomm
def never_returns():
    time.sleep(120)
mpicomm.ctypes = types.SimpleNamespace(CDLL=lambda path: types.SimpleNamespace(MPI_Finalize=never_returns),
                                       c_int=ctypes.c_int)
mpicomm.FINALIZE_DEADLINE = 0.5
if sys.argv[1] == "failed":
    mpicomm.RANK_FAILED.set()
print("work done", flush=True)
"""


def run(arg: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, arg], capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - start


def test_after_a_rank_failure_a_finalize_that_never_returns_is_left_behind():
    proc, took = run("failed")
    assert proc.returncode == 0, proc.stderr
    assert "work done" in proc.stdout and "leaving without it" in proc.stderr
    assert took < 30


def test_without_a_failure_finalize_is_mpi4pys_own():
    proc, _ = run("fine")
    assert proc.returncode == 0, proc.stderr
    assert "work done" in proc.stdout and "leaving without it" not in proc.stderr
