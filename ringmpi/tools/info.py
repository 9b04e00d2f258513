"""`ringmpi info`: what this installation runs on: the MPI library and the standard it
implements, mpi4py, numpy, the ranks and hosts of the job, whether the MPI library can read
CUDA device memory and how that was decided, what device arrays ringmpi would take (cupy,
when importable), and which all-reduce algorithms can run on this communicator."""
from __future__ import annotations

import argparse
import importlib.util
import platform
from typing import Any

import numpy as np

from .. import __version__
from ..api import algorithms, group


def add_parser(sub: Any, name: str = "info", text: str = "") -> None:
    p = sub.add_parser(name, help=text, description=__doc__,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.set_defaults(func=run)


def environment(t: Any) -> dict:
    """Where a job runs (collective: every rank calls it): versions, the job's hosts and
    ranks per host, whether the MPI library reads CUDA device memory and how that was
    decided. `ringmpi info` prints it; every benchmark report starts with it."""
    from ..mpicomm import cuda_support, library_version, mpi4py_version, mpi_standard
    hosts = t.hostnames()
    support = cuda_support()
    return {"ringmpi": __version__, "mpi_library": library_version(), "mpi4py": mpi4py_version(),
            "numpy": np.__version__, "python": platform.python_version(), "ranks": t.size,
            "hosts": sorted(set(hosts)), "ranks_per_host": {h: hosts.count(h) for h in sorted(set(hosts))},
            "mpi_version": mpi_standard(), "cuda_aware": support.aware, "cuda_aware_how": support.how}


def facts(t: Any) -> dict:
    """The facts `ringmpi info` prints: the environment, what device arrays would take,
    which all-reduce algorithms can run on this communicator."""
    f = environment(t)
    cupy = importlib.util.find_spec("cupy") is not None
    f["device_arrays"] = (("cupy importable" if cupy else "cupy not installed") + "; staged through pinned host "
                          "memory" + (" unless CUDA-aware" if not f["cuda_aware"] else " (not needed: CUDA-aware)"))
    f["allreduce_here"] = algorithms("allreduce", t.user_comm)
    return f


def run(ns: argparse.Namespace) -> int:
    t = group()
    f = facts(t)
    if t.rank == 0:
        print(f"ringmpi {f['ringmpi']} (python {f['python']}, numpy {f['numpy']}, mpi4py {f['mpi4py']})")
        print(f"MPI library: {f['mpi_library']} (MPI {f['mpi_version']})")
        print(f"job: {f['ranks']} rank(s) on " + ", ".join(f"{h} ({n})" for h, n in f["ranks_per_host"].items()))
        print(f"reads CUDA device memory: {'yes' if f['cuda_aware'] else 'no'} ({f['cuda_aware_how']})")
        print(f"device arrays: {f['device_arrays']}")
        print(f"all-reduce algorithms that can run here: {', '.join(f['allreduce_here'])}")
    return 0
