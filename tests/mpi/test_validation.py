"""Bad input raises a clear error naming the call, the rank, what was expected and what
came: before any message is sent (the transport counters do not move), or, for a buffer
one rank alone may have got wrong (its layout, writability, result buffer), after that rank
took part with fresh buffers (`api._stand_in`), so that other ranks are never left waiting
or given a stale message."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi
from ringmpi import settings
from ringmpi.mpicomm import transport

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank


def raises_before_sending(fn, *patterns):
    t = transport(COMM)
    before = t.counters.snapshot()
    with pytest.raises(ringmpi.RingmpiUsageError) as info:
        fn()
    msg = str(info.value)
    assert f"(rank {R} of {P})" in msg and msg.startswith("ringmpi."), msg
    for pat in patterns:
        assert pat in msg, f"{pat!r} not in {msg!r}"
    d = t.counters.since(before)
    if P > 1 and getattr(info.value, "stand_in", False):
        assert getattr(info.value, "stood_in", False), "this rank did not take part with fresh buffers"
    else:
        assert d.messages == 0 and d.calls == 0, "a message was sent before the error"
    return msg


X = np.arange(12, dtype=np.float64)


@pytest.mark.parametrize("case", [
    (lambda: ringmpi.allreduce(X, np.empty(11)), ["allreduce", "recvbuf has 11 elements, expected 12"]),
    (lambda: ringmpi.allreduce(X, np.empty(12, np.float32)), ["dtype float32, expected float64"]),
    (lambda: ringmpi.allreduce(np.arange(24.0)[::2]), ["C-contiguous"]),
    (lambda: ringmpi.allreduce(X.astype(complex), op=MPI.MAX), ["op MAX is not defined for dtype complex128"]),
    (lambda: ringmpi.allreduce(X, op=MPI.BAND), ["op BAND is not defined for dtype float64"]),
    (lambda: ringmpi.allreduce(X.astype(bool), op="sum"), ["op SUM is not defined for dtype bool"]),
    (lambda: ringmpi.allreduce(X, op="median"), ["unknown reduction op"]),
    (lambda: ringmpi.allreduce(X.astype(np.longdouble)), ["dtype float128", "float16, bfloat16"]),
    (lambda: ringmpi.allreduce([1.0, 2.0]), ["expected a numpy.ndarray or a device array (__cuda_array_interface__), got builtins.list"]),
    (lambda: ringmpi.alltoall(np.arange(P * 3.0), np.empty(P * 3 + 1)), [f"recvbuf has {P * 3 + 1} elements"]),
    (lambda: ringmpi.allreduce(X, algorithm="butterfly"), ["unknown algorithm 'butterfly' for allreduce"]),
    (lambda: ringmpi.allreduce(X, X[2:]), ["recvbuf has 10 elements"]),
    (lambda: ringmpi.broadcast(X.copy(), root=P), ["root must be an integer in [0,", f"got {P}"]),
    (lambda: ringmpi.broadcast(X.copy(), root=-1), ["root must be"]),
    (lambda: ringmpi.broadcast(X.copy(), segments=0, algorithm="pipeline"), ["segments must be an integer >= 1"]),
    (lambda: ringmpi.broadcast(X.copy(), segments=2.5), ["segments must be an integer >= 1, got 2.5"]),
    (lambda: ringmpi.broadcast(np.arange(3.0)[::-1]), ["C-contiguous"]),
    (lambda: ringmpi.reduce(X, root=P + 3), ["root must be"]),
    (lambda: ringmpi.reduce_scatter(X, counts=[1] * (P + 1)), ["counts must hold", f"{P} non-negative"]),
    (lambda: ringmpi.reduce_scatter(X, counts=[13] + [0] * (P - 1)), ["counts add up to 13, expected len(sendbuf) = 12"]),
    (lambda: ringmpi.reduce_scatter(X, np.empty(99)), ["recvbuf has 99 elements"]),
    (lambda: ringmpi.allgather(X, np.empty(5)), ["recvbuf has 5 elements, expected"]),
    (lambda: ringmpi.allgather(X, counts=[99] * P), [f"sendbuf has 12 elements, expected counts[{R}] = 99"]),
    (lambda: ringmpi.shift(X, X), ["in place"]),
])
def test_bad_input(case):
    fn, patterns = case
    raises_before_sending(fn, *patterns)


@pytest.mark.skipif(P == 1, reason="every size is a multiple of one rank")
def test_alltoall_needs_whole_blocks():
    raises_before_sending(lambda: ringmpi.alltoall(np.arange(P * 3 + 1.0)),
                          f"sendbuf has {P * 3 + 1} elements, expected a multiple of {P} (one block per rank)")


@pytest.mark.parametrize("counts", [[2.9, 2.9] + [8.2] * (P - 2) if P > 2 else [2.5] * P, "abc", [True] * P, None])
def test_counts_must_be_integers(counts):
    if counts is None:
        counts = np.array([12 / P] * P)  # floats that happen to add up
    raises_before_sending(lambda: ringmpi.reduce_scatter(X, counts=counts), "counts must hold", "non-negative integers")


@pytest.mark.parametrize("name", ["MAXLOC", "MINLOC", "REPLACE", "NO_OP"])
def test_unsupported_predefined_ops_are_named(name):
    raises_before_sending(lambda: ringmpi.allreduce(X, op=getattr(MPI, name)), f"MPI.{name} is not supported by ringmpi")


def test_communicator_errors_name_the_call_and_rank():
    inter = None
    if P > 1:
        local = COMM.Split(R % 2, R)
        inter = local.Create_intercomm(0, COMM, 1 - R % 2 if R < 2 else (R + 1) % 2, 77) if P > 1 else None
        local.Free()
    dead = COMM.Dup()
    dead.Free()
    for comm, what in ((MPI.COMM_NULL, "MPI.COMM_NULL"), (dead, "freed communicator"),
                       (inter, "an inter-communicator"), ("world", "builtins.str")):
        if comm is None:
            continue
        with pytest.raises(ringmpi.RingmpiUsageError) as info:
            ringmpi.allreduce(X, comm=comm)
        msg = str(info.value)
        assert msg.startswith(f"ringmpi.allreduce (rank {R} of {P} in COMM_WORLD): comm must be"), msg
        assert what in msg, msg
    if inter is not None:
        inter.Free()


def test_unknown_forced_algorithm_is_an_error(env):
    env(ALGO="allreduce=bogus")
    raises_before_sending(lambda: ringmpi.allreduce(X), "unknown algorithm 'bogus' for allreduce")


@pytest.mark.parametrize("var,value", [("DEBUG", "1"), ("CHECK", "yes"), ("STALL_ABORT", "-3"),
                                       ("ALGO", "allreduce="), ("ABORT_ON_EXCEPTION", "2")])
def test_invalid_settings_are_errors(env, var, value):
    with pytest.raises(ringmpi.RingmpiUsageError, match=f"RINGMPI_{var}="):
        env(**{var: value})


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["MAX", "MIN"])
def test_nan_propagates_in_every_algorithm(dtype, op, env):
    """One rule for MAX and MIN whatever the algorithm (and whatever auto picks at any size):
    NaN on any rank gives NaN there, as numpy, PyTorch and IEEE 754-2019 maximum do. The
    MPI library's own compares with a > b ? a : b, which drops a NaN or not depending on the
    operand order; ringmpi's `mpi` reduces order-preserving integer keys instead."""
    env()
    for n in (6, 1 << 20):
        x = np.full(n, float(R + 1), dtype)
        x[R % n] = -np.nan if R % 2 else np.nan   # each rank its own NaN position (and sign)
        x[-1] = -np.inf if R == 0 else 3.5
        x[-2] = -0.0 if R else 0.0
        want_nan = np.zeros(n, bool)
        want_nan[[q % n for q in range(P)]] = True
        keep = x.tobytes()
        for alg in algos_with_auto("allreduce"):
            out = ringmpi.allreduce(x, op=op, algorithm=alg)
            assert x.tobytes() == keep, (alg, "sendbuf written")
            assert np.array_equal(np.isnan(out), want_nan), (alg, n)
            ok = ~want_nan
            ok[-2:] = False
            want = float(P) if op == "MAX" else 1.0
            assert np.all(out[ok] == want), (alg, n)
            if P > 1:
                assert out[-1] == (3.5 if op == "MAX" else -np.inf), (alg, n)
        for alg in algos_with_auto("reduce"):
            out = ringmpi.reduce(x, root=P - 1, op=op, algorithm=alg)
            assert x.tobytes() == keep, (alg, "sendbuf written")
            if R == P - 1:
                assert np.array_equal(np.isnan(out), want_nan), (alg, n)


def algos_with_auto(collective):
    return ringmpi.algorithms(collective, COMM) + ["auto"]


def test_readonly_recvbuf():
    ro = np.empty(12)
    ro.flags.writeable = False
    raises_before_sending(lambda: ringmpi.allreduce(X, ro), "read-only")


def test_user_defined_op_rejected():
    op = MPI.Op.Create(lambda a, b, dt: None, commute=True)
    try:
        raises_before_sending(lambda: ringmpi.allreduce(X, op=op), "predefined")
    finally:
        op.Free()


def test_bad_comm():
    with pytest.raises(ringmpi.RingmpiUsageError, match="ringmpi.allreduce.*intracommunicator"):
        ringmpi.allreduce(X, comm="world")


@pytest.fixture
def env():
    """Settings read from a given environment; the real one restored afterwards."""
    yield lambda **kw: settings.reload({f"RINGMPI_{k}": v for k, v in kw.items()})
    settings.reload()


def test_forced_algorithm_and_debug(env, capsys):
    """RINGMPI_ALGO forces a choice (like NCCL_ALGO); RINGMPI_DEBUG=INFO explains it."""
    env(ALGO="allreduce=tree,broadcast=naive", DEBUG="INFO")
    out = ringmpi.allreduce(X)
    ref = np.empty_like(X)
    COMM.Allreduce(X, ref)
    assert np.array_equal(out, ref)
    assert ringmpi.last_choice()["algorithm"] == "tree"
    y = X.copy()
    ringmpi.broadcast(y)
    assert ringmpi.last_choice()["algorithm"] == "naive"
    err = capsys.readouterr().err
    if R == 0:
        assert "ringmpi INFO allreduce" in err and "forced by RINGMPI_ALGO" in err


def test_auto_choice_is_valid_and_identical():
    choices = []
    for n in (1, 100, 10_000, 300_000):
        x = np.ones(n, dtype=np.float32)
        out = ringmpi.allreduce(x)
        assert np.all(out == P)
        choices.append(ringmpi.last_choice()["algorithm"])
    assert all(c in ringmpi.algorithms("allreduce") for c in choices)
    assert COMM.allgather(choices) == [choices] * P


@pytest.mark.skipif(P != 1, reason="spawns its own 2-rank job; run once")
def test_failing_rank_aborts_job_instead_of_hanging(tmp_path):
    """A test that fails on rank 1 only, while rank 0 waits in a collective: the job must end
    with a failure well inside the deadline, not hang."""
    (tmp_path / "conftest.py").write_text(open(os.path.join(os.path.dirname(__file__), "conftest.py")).read())
    (tmp_path / "test_one_rank_fails.py").write_text(
        "from mpi4py import MPI\n"
        "def test_x():\n"
        "    if MPI.COMM_WORLD.rank == 1:\n"
        "        assert False, 'rank 1 fails'\n"
        "    MPI.COMM_WORLD.barrier()\n")
    cmd = [sys.executable, "-m", "ringmpi.launch", "-n", "2", "--timeout", "120", "--",
           sys.executable, "-m", "mpi4py", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX", "PRTE", "OMPI_MCA"))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode not in (0, 124), proc.stdout + proc.stderr
    assert "rank 1 fails" in proc.stdout + proc.stderr


def test_one_transport_per_communicator():
    """comm=None and comm=COMM_WORLD share one transport (counters, profile, scratch)."""
    assert transport(None) is transport(COMM)
    assert transport(COMM) is transport(MPI.COMM_WORLD)


@pytest.mark.skipif(P == 1, reason="needs two ranks to disagree")
def test_check_mode_catches_mismatched_calls(env):
    """RINGMPI_CHECK=1: a rank with another length, dtype or forced algorithm makes every
    rank raise the same clear error, instead of a hang or a silently wrong tail."""
    env(CHECK="1")
    ok = ringmpi.allreduce(np.ones(8), algorithm="ring")
    assert np.all(ok == P)
    x = np.ones(8 + (R == P - 1))
    with pytest.raises(ringmpi.RingmpiUsageError, match=r"ranks disagree .*ranks \[0.*\]: allreduce ring 8 float64 SUM"):
        ringmpi.allreduce(x, algorithm="ring")
    with pytest.raises(ringmpi.RingmpiUsageError, match="ranks disagree"):
        ringmpi.allgather(np.ones(3 + (R == 0)), algorithm="ring")
    with pytest.raises(ringmpi.RingmpiUsageError, match="ranks disagree"):
        ringmpi.broadcast(np.ones(4), 0, algorithm="tree" if R == 0 else "ring")


@pytest.mark.skipif(P != 1, reason="spawns its own 2-rank jobs; run once")
@pytest.mark.parametrize("mode", ["warn", "abort"])
def test_stall_inspector(tmp_path, mode):
    """A rank that is late to a collective gets named on stderr; one that never comes makes
    the job abort after RINGMPI_STALL_ABORT seconds instead of hanging forever."""
    script = tmp_path / "late.py"
    script.write_text(
        "import time, numpy as np, ringmpi\n"
        "from mpi4py import MPI\n"
        "r = MPI.COMM_WORLD.rank\n"
        "ringmpi.allreduce(np.ones(1), algorithm='ring')  # both ranks in step once\n"
        "if r == 1:\n"
        f"    time.sleep({'4' if mode == 'warn' else '600'})\n"
        "out = ringmpi.allreduce(np.ones(10), algorithm='ring')\n"
        f"open(r'{tmp_path}/result%d' % r, 'w').write(str(out[0]))\n")  # one file per rank: launchers interleave output
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM", "PMIX", "PRTE", "OMPI_MCA"))}
    env.update(RINGMPI_STALL_WARN="1", RINGMPI_STALL_ABORT="" if mode == "warn" else "3")
    cmd = [sys.executable, "-m", "ringmpi.launch", "-n", "2", "--timeout", "120", "--",
           sys.executable, str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert "ringmpi: rank 0 of 2 has waited" in out and "allreduce/ring" in out, out
    if mode == "warn":
        results = [(tmp_path / f"result{q}").read_text() for q in range(2)]
        assert proc.returncode == 0 and results == ["2.0", "2.0"], (results, out)
    else:
        assert proc.returncode not in (0, 124) and "aborting the job" in out, out
