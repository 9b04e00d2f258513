"""Fixtures for tests that run under mpirun: every rank runs the same test body in lockstep.

A failure on any rank prints its report and aborts the whole job (MPI_Abort), so a rank
left waiting in a collective can never hang the run. Only rank 0 prints pytest's report.
"""
from __future__ import annotations

import sys
import zlib

import numpy as np
import pytest
from mpi4py import MPI

COMM = MPI.COMM_WORLD


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if COMM.rank != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report):
    if report.failed and COMM.size > 1:
        sys.stderr.write(f"\n[rank {COMM.rank}] FAILED {report.nodeid} ({report.when})\n"
                         f"{report.longreprtext}\n")
        sys.stderr.flush()
        COMM.Abort(1)


@pytest.fixture
def comm():
    return COMM


@pytest.fixture
def rng(request):
    """A generator that differs per rank and per test (random per-rank data)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng([seed, COMM.rank])
