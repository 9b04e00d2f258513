"""A collective added from outside the package by its spec and its schedule alone
(`tests/plugin_suffix.py`) under MPI: blocking, as requests (several in flight, completed
in reverse order) and persistent, against numpy's fold of every rank's data; MPI's own,
which has no such function, refused on every rank with a reason."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi

from plugin_suffix import NAME, installed

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank


def test_a_plugged_collective_runs_every_way(rng):
    with installed() as spec:
        for n in (0, 1, 7, 4099):
            x = rng.integers(-1000, 1000, n).astype(np.float64)   # (exact sums in any order)
            xs = COMM.allgather(x)
            for op in ("sum", "max", "avg"):
                want = spec.expected(xs, R, op.upper())
                for algorithm in ("auto", "linear"):
                    what = f"{NAME} n={n} {op} {algorithm}"
                    got = ringmpi.suffix_scan(x, op=op, algorithm=algorithm)
                    assert np.allclose(got, want, rtol=1e-15, atol=0), what
                    out = np.empty_like(x)
                    for _ in range(3):   # (the same arrays again: the memo's call)
                        assert ringmpi.suffix_scan(x, out, op=op, algorithm=algorithm) is out
                        assert np.allclose(out, want, rtol=1e-15, atol=0), what
                    mine = x.copy()
                    ringmpi.suffix_scan(mine, mine, op=op, algorithm=algorithm)
                    assert np.allclose(mine, want, rtol=1e-15, atol=0), what + " in place"
                    outs = [np.empty_like(x) for _ in range(3)]
                    reqs = [ringmpi.isuffix_scan(x, o, op=op, algorithm=algorithm) for o in outs]
                    for q in reversed(reqs):
                        q.wait()
                    assert all(np.allclose(o, want, rtol=1e-15, atol=0) for o in outs), what + " requests"
                    with ringmpi.suffix_scan_init(x, out, op=op, algorithm=algorithm) as bound:
                        for _ in range(2):
                            out[:] = np.nan
                            bound.start()
                            assert bound.wait() is out and np.allclose(out, want, rtol=1e-15, atol=0), what


def test_mpi_s_own_is_refused_for_a_collective_mpi_has_not():
    with installed():
        if P == 1:
            pytest.skip("one rank: every collective is a copy")
        with pytest.raises(ringmpi.RingmpiUsageError, match=rf"ringmpi.{NAME} \(rank {R} of {P}\): algorithm "
                           r"'mpi' cannot run suffix_scan: the MPI library has no function for it"):
            ringmpi.suffix_scan(np.ones(3), algorithm="mpi")
        assert np.array_equal(ringmpi.suffix_scan(np.ones(3)), np.full(3, P - R))   # (the next call is fine)
