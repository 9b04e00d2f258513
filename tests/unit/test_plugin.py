"""A collective added from outside the package by its spec and its schedule alone
(`tests/plugin_suffix.py`): its public calls exist, with the arguments its spec's
`prepare` takes, and the simulator runs it: results equal to numpy, time and traffic
equal to its formula. (Under MPI: tests/mpi/test_plugin_mpi.py.)"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import ringmpi
from ringmpi import specs
from ringmpi.cost import Profile
from ringmpi.model import cost
from ringmpi.sim import run_collective

from plugin_suffix import NAME, installed

PROF = Profile(alpha=5e-6, beta=1 / 25e9, gamma=1 / 50e9)


def test_a_plugged_collective_has_every_call_and_leaves_none_behind():
    with installed():
        for call in (NAME, f"i{NAME}", f"{NAME}_init"):
            fn = getattr(ringmpi, call)
            want = [p for p in inspect.signature(getattr(ringmpi, call.replace(NAME, "allreduce"))).parameters]
            assert list(inspect.signature(fn).parameters) == want, call
        assert "suffix scan" in ringmpi.suffix_scan.__doc__
    assert NAME not in specs.SPECS
    assert not hasattr(ringmpi, NAME) and NAME not in ringmpi.collectives.__all__
    with pytest.raises(ValueError, match="a new collective needs a name of its own"):
        specs.add(specs.SPECS["allreduce"])


@pytest.mark.parametrize("inplace", [False, True])
def test_the_simulator_runs_a_plugged_collective(inplace):
    rng = np.random.default_rng(3)
    with installed() as spec:
        for p in range(1, 8):
            for n in (0, 1, 5):
                xs = [rng.integers(-50, 50, n).astype(np.int64) for _ in range(p)]
                for op in ("SUM", "MAX", "BXOR"):
                    _, outs = run_collective(NAME, "linear", xs, op=op, inplace=inplace)
                    for r, o in enumerate(outs):
                        assert np.array_equal(o, spec.expected(xs, r, op)), (p, n, op, r)
        for p in (1, 2, 3, 8, 16):
            inputs = [np.zeros(1000, np.float32) for _ in range(p)]
            cl, _ = run_collective(NAME, "linear", inputs, profile=PROF)
            c = cost(NAME, "linear", p, 1000, 4)
            assert cl.time == pytest.approx(c.time(PROF) - PROF.overhead, rel=1e-12, abs=1e-15), p
            assert cl.traffic()["busiest_sent"] == c.busiest_sent, p
