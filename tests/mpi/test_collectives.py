"""Every algorithm of every collective against MPI's own collective and an exact numpy fold,
with random per-rank data: every dtype and valid op, counts 0, 1, p-1, p, 7p+3, every root,
in place and out of place, send buffer untouched, identical bits on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import DTYPES, assert_close, assert_within_ulp, exact_half, fold, make_data, mpi_op, valid_ops
from mpi4py import MPI

import ringmpi
from ringmpi.ops import ROUNDING, is_half, wire
from ringmpi.schedules import block_counts, offsets

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
COUNTS = sorted({0, 1, max(P - 1, 0), P, 7 * P + 3})


def gather_all(x: np.ndarray) -> list[np.ndarray]:
    return COMM.allgather(x)


def same_everywhere(x: np.ndarray, what: str) -> None:
    ref = COMM.bcast(x.tobytes() if R == 0 else None, 0)
    assert x.tobytes() == ref, f"{what}: result differs from rank 0's (not bitwise identical)"


def reference(op: str, x: np.ndarray):
    """(exact numpy fold in rank order, MPI library's Allreduce, sum of |x| for tolerances).
    A 16-bit float: its exact result rounded once (MPI has no 16-bit float to reduce)."""
    xs = gather_all(x)
    exact = fold(op, xs)
    mpi_out, scale = exact, None
    if is_half(x.dtype):
        return (exact_half(op, xs), None, None) if op in ROUNDING else (exact, exact, None)
    if x.dtype.kind in "fc":
        mpi_out = np.empty_like(x)
        COMM.Allreduce(x, mpi_out, op=getattr(MPI, "SUM" if op == "AVG" else op))
        if op == "AVG":
            mpi_out /= P
        scale = np.sum(np.abs(np.stack(xs)), axis=0)
    return exact, mpi_out, scale


def check_reduction(out, exact, mpi_out, scale, dtype, what):
    """Floats: within p-scaled rounding of MPI's own result; 16-bit floats: within one ulp of
    the exact result; integers: the exact fold."""
    if mpi_out is None:
        assert_within_ulp(out, exact, what)
    elif np.dtype(dtype).kind in "fc":
        assert_close(out, mpi_out, dtype, P, scale, what + " vs MPI")
    else:
        assert np.array_equal(out, exact), f"{what}: differs from the exact fold"


def sl(a, blk):
    return None if a is None else a[blk]


def algos(collective):
    return ringmpi.algorithms(collective, COMM)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", algos("allreduce"))
def test_allreduce(algorithm, dtype, rng):
    for op in valid_ops(dtype):
        for n in COUNTS:
            x = make_data(rng, dtype, n, op)
            keep = x.copy()
            exact, mpi_out, scale = reference(op, x)
            what = f"allreduce/{algorithm} {dtype} {op} n={n}"
            out = ringmpi.allreduce(x, op=mpi_op(op), algorithm=algorithm)
            assert np.array_equal(x, keep), what + ": sendbuf modified"
            check_reduction(out, exact, mpi_out, scale, dtype, what)
            same_everywhere(out, what)
            y = x.copy()
            res = ringmpi.allreduce(y, y, op=op, algorithm=algorithm)
            assert res is y
            assert y.tobytes() == out.tobytes() or x.dtype.kind in "fc" and algorithm == "mpi", \
                what + ": in place differs from out of place"
            same_everywhere(y, what + " in place")


@pytest.mark.parametrize("dtype", ["int32", "float64", "complex64", "uint8", "bool"])
@pytest.mark.parametrize("algorithm", algos("allreduce"))
def test_allreduce_exact_floats(algorithm, dtype, rng):
    """Integer-valued floats make SUM exact in any order: then every algorithm must be exact."""
    for op in valid_ops(dtype):
        x = make_data(rng, dtype, 5 * P + 1, op, exact=True)
        exact = fold(op, gather_all(x))
        out = ringmpi.allreduce(x, op=op, algorithm=algorithm)
        assert np.array_equal(out, exact), f"{algorithm} {dtype} {op}"


@pytest.mark.parametrize("dtype", ["int64", "float32", "complex128", "bool", "float16", "bfloat16"])
@pytest.mark.parametrize("algorithm", algos("reduce_scatter"))
def test_reduce_scatter(algorithm, dtype, rng):
    for op in valid_ops(dtype):
        for n in COUNTS:
            x = make_data(rng, dtype, n, op)
            keep = x.copy()
            exact, mpi_out, scale = reference(op, x)
            off = offsets(block_counts(n, P))
            blk = slice(off[R], off[R + 1])
            what = f"reduce_scatter/{algorithm} {dtype} {op} n={n}"
            out = ringmpi.reduce_scatter(x, op=op, algorithm=algorithm)
            assert out.shape == (off[R + 1] - off[R],)
            assert np.array_equal(x, keep), what + ": sendbuf modified"
            check_reduction(out, exact[blk], sl(mpi_out, blk), sl(scale, blk), dtype, what)
            y = x.copy()
            view = ringmpi.reduce_scatter(y, y, op=op, algorithm=algorithm)
            assert np.shares_memory(view, y) or view.size == 0
            assert np.array_equal(y[blk], view)
            check_reduction(view, exact[blk], sl(mpi_out, blk), sl(scale, blk), dtype, what + " in place")


@pytest.mark.parametrize("algorithm", algos("reduce_scatter"))
def test_reduce_scatter_uneven_counts(algorithm, rng):
    counts = [(3 * q + 1) % 5 for q in range(P)]  # includes zeros for P >= 5
    counts[-1] += 2
    n = sum(counts)
    x = make_data(rng, "float64", n, "SUM", exact=True)
    exact = fold("SUM", gather_all(x))
    off = offsets(counts)
    out = ringmpi.reduce_scatter(x, op=MPI.SUM, algorithm=algorithm, counts=counts)
    assert np.array_equal(out, exact[off[R]:off[R + 1]])


@pytest.mark.parametrize("dtype", ["int16", "float64", "complex64", "bool", "bfloat16"])
@pytest.mark.parametrize("algorithm", algos("allgather"))
def test_allgather(algorithm, dtype, rng):
    for n in sorted({0, 1, 3, P + 2}):
        x = make_data(rng, dtype, n, "SUM" if dtype != "bool" else "LAND")
        keep = x.copy()
        ref = np.concatenate(gather_all(x))
        out = ringmpi.allgather(x, algorithm=algorithm)
        assert np.array_equal(x, keep)
        assert np.array_equal(out, ref), f"allgather/{algorithm} {dtype} n={n}"
        buf = np.zeros(n * P, dtype=x.dtype)
        buf[R * n:(R + 1) * n] = x
        ringmpi.allgather(buf, buf, algorithm=algorithm)
        assert np.array_equal(buf, ref), "in place"


@pytest.mark.parametrize("algorithm", algos("allgather"))
def test_allgather_uneven(algorithm, rng):
    counts = [(q * 7 + 2) % 4 for q in range(P)]
    x = rng.standard_normal(counts[R])
    ref = np.concatenate(gather_all(x))
    out = ringmpi.allgather(x, algorithm=algorithm, counts=counts)
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("dtype", ["uint64", "float32", "complex128", "bool", "bfloat16"])
@pytest.mark.parametrize("algorithm", algos("broadcast"))
def test_broadcast(algorithm, dtype, rng):
    for n in COUNTS + [1000]:
        for root in range(P):
            x = make_data(rng, dtype, n, "SUM" if dtype != "bool" else "LOR")
            ref = COMM.bcast(x, root)
            for segments in (None, 1, 3, n + 5):
                y = x.copy()
                out = ringmpi.broadcast(y, root, algorithm=algorithm, segments=segments)
                assert out is y
                assert np.array_equal(y, ref), f"broadcast/{algorithm} n={n} root={root} S={segments}"


@pytest.mark.parametrize("dtype", ["int8", "float64", "complex64", "bfloat16"])
@pytest.mark.parametrize("algorithm", algos("reduce"))
def test_reduce(algorithm, dtype, rng):
    for op in valid_ops(dtype):
        for n in COUNTS:
            x = make_data(rng, dtype, n, op)
            keep = x.copy()
            exact, mpi_out, scale = reference(op, x)
            for root in range(P):
                what = f"reduce/{algorithm} {dtype} {op} n={n} root={root}"
                out = ringmpi.reduce(x, root=root, op=op, algorithm=algorithm)
                assert np.array_equal(x, keep), what + ": sendbuf modified"
                if R == root:
                    check_reduction(out, exact, mpi_out, scale, dtype, what)
                else:
                    assert out is None
                y = x.copy()
                ringmpi.reduce(y, y, root=root, op=op, algorithm=algorithm)
                if R == root:
                    check_reduction(y, exact, mpi_out, scale, dtype, what + " in place")
                else:
                    assert np.array_equal(y, x), what + ": non-root buffer modified"


@pytest.mark.parametrize("dtype", ["int32", "float64", "complex64", "uint8", "bool", "float16"])
@pytest.mark.parametrize("algorithm", algos("alltoall"))
def test_alltoall(algorithm, dtype, rng):
    """Against MPI_Alltoall: blocks of 0, 1, 2, p+1 and 7 elements, out of place, in place,
    and shaped (p, b) buffers whose row q goes to rank q."""
    for b in sorted({0, 1, 2, P + 1, 7}):
        x = make_data(rng, dtype, b * P, "SUM" if dtype != "bool" else "LOR")
        keep = x.copy()
        ref = np.empty_like(x)
        COMM.Alltoall(wire(x), wire(ref))   # (a 16-bit float as 16-bit words: Open MPI 4 has no float16)
        what = f"alltoall/{algorithm} {dtype} b={b}"
        out = ringmpi.alltoall(x, algorithm=algorithm)
        assert np.array_equal(x, keep), what + ": sendbuf modified"
        assert np.array_equal(out, ref), what
        y = x.copy()
        assert ringmpi.alltoall(y, y, algorithm=algorithm) is y
        assert np.array_equal(y, ref), what + " in place"
        rows = x.reshape(P, b)
        got = ringmpi.alltoall(rows, algorithm=algorithm)
        assert got.shape == (P, b) and np.array_equal(got.reshape(-1), ref), what + " shaped (p, b)"


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"])
def test_large_count(collective, rng):
    """1,000,003 float64 elements through every algorithm (not divisible by any p > 1)."""
    n = 1_000_003
    x = make_data(rng, "float64", n, "SUM", exact=True)
    exact = fold("SUM", gather_all(x)) if collective != "allgather" else None
    for alg in algos(collective):
        if collective == "allreduce":
            assert np.array_equal(ringmpi.allreduce(x, algorithm=alg), exact), alg
        elif collective == "reduce_scatter":
            off = offsets(block_counts(n, P))
            assert np.array_equal(ringmpi.reduce_scatter(x, algorithm=alg), exact[off[R]:off[R + 1]]), alg
        elif collective == "reduce":
            out = ringmpi.reduce(x, root=P - 1, algorithm=alg)
            assert R != P - 1 or np.array_equal(out, exact), alg
        elif collective == "broadcast":
            y = x.copy()
            ringmpi.broadcast(y, root=P // 2, algorithm=alg)
            assert np.array_equal(y, COMM.bcast(x, P // 2)), alg
        elif collective == "alltoall":
            z = x[:n // P * P]
            ref = np.empty_like(z)
            COMM.Alltoall(z, ref)
            assert np.array_equal(ringmpi.alltoall(z, algorithm=alg), ref), alg
        else:
            part = x[:1000 + R]
            counts = [1000 + q for q in range(P)]
            assert np.array_equal(ringmpi.allgather(part, algorithm=alg, counts=counts),
                                  np.concatenate(gather_all(part))), alg


def test_multidimensional_buffers(rng):
    x = rng.standard_normal((3, 5, 2))
    out = ringmpi.allreduce(x, algorithm="ring")
    assert out.shape == x.shape
    ref = np.empty_like(x)
    COMM.Allreduce(x, ref)
    assert np.allclose(out, ref, rtol=1e-12, atol=1e-12)
    y = np.empty_like(x)
    assert ringmpi.allreduce(x, y, algorithm="tree") is y


def test_platform_integer_aliases():
    """np.longlong, np.intc, np.uintp ... are accepted like the sized types they alias."""
    for t in (np.longlong, np.intc, np.uintp, np.ulonglong, np.double, np.single):
        x = np.arange(5, dtype=t)
        assert np.array_equal(ringmpi.allreduce(x, algorithm="ring"), x * P)


def test_equal_dtypes_mpi4py_names_differently_mix():
    """'l' and 'q' (both int64 on LP64) are one MPI datatype for ringmpi: mixed in one call
    and across ranks (even ranks 'l', odd 'q'), through the fast path's MPI plan
    and ringmpi's own, repeated so that the plans serve them."""
    mine, other = ("l", "q") if R % 2 == 0 else ("q", "l")
    x = np.arange(6, dtype=mine) + R
    expect = np.arange(6) * P + P * (P - 1) // 2
    for alg in ("mpi", "auto", "ring"):
        for _ in range(3):
            y = np.empty(6, dtype=other)
            assert ringmpi.allreduce(x, y, algorithm=alg) is y and np.array_equal(y, expect), alg
            assert np.array_equal(ringmpi.allreduce(x, algorithm=alg), expect), alg
            assert np.array_equal(ringmpi.allgather(x, algorithm=alg).reshape(P, 6) - np.arange(P)[:, None],
                                  np.tile(np.arange(6), (P, 1))), alg


def test_int_sum_wraps_like_numpy():
    """Overflowing integer sums wrap (two's complement), as numpy does, on every algorithm."""
    x = np.full(P + 1, 100, dtype=np.int8)
    expect = fold("SUM", [x] * P)
    for alg in algos("allreduce"):
        if alg != "mpi":
            assert np.array_equal(ringmpi.allreduce(x, algorithm=alg), expect), alg


def test_shift(rng):
    x = rng.standard_normal(10) + R
    for offset in (1, -1, 2, P + 1):
        out = ringmpi.shift(x, offset=offset)
        assert np.array_equal(out, gather_all(x)[(R - offset) % P])


def test_subcommunicators(rng):
    """Any intracommunicator works: halves of COMM_WORLD run independently."""
    sub = COMM.Split(R % 2, R)
    try:
        x = make_data(rng, "int64", 2 * sub.size + 1, "SUM")
        for alg in ringmpi.algorithms("allreduce", sub):   # what runs on the half (its hosts, its sizes)
            ref = np.empty_like(x)
            sub.Allreduce(x, ref)
            assert np.array_equal(ringmpi.allreduce(x, comm=sub, algorithm=alg), ref)
        y = x.copy()
        ringmpi.broadcast(y, root=sub.size - 1, comm=sub, algorithm="pipeline", segments=2)
        assert np.array_equal(y, sub.bcast(x, sub.size - 1))
    finally:
        sub.Free()


def test_messages_split_above_max_count(rng):
    """Counts above the MPI int limit are sent in pieces: force a tiny limit to exercise it."""
    from ringmpi.mpicomm import transport
    t = transport(COMM)
    saved = t.max_count
    t.max_count = 5
    try:
        x = make_data(rng, "float64", 13 * P + 4, "SUM", exact=True)
        exact = fold("SUM", gather_all(x))
        for alg in algos("allreduce"):
            assert np.array_equal(ringmpi.allreduce(x, algorithm=alg), exact), alg
        y = x.copy()
        ringmpi.broadcast(y, 0, algorithm="naive")
        assert np.array_equal(y, COMM.bcast(x, 0))
    finally:
        t.max_count = saved


def test_ring_allreduce_sends_exactly_the_schedule():
    """Each rank sends 2(p-1) messages of n/p elements: 2(p-1)/p n bytes in all."""
    from ringmpi.mpicomm import transport
    t = transport(COMM)
    n = 64 * P
    x = np.ones(n, dtype=np.float32)
    before = t.counters.snapshot()
    ringmpi.allreduce(x, algorithm="ring")
    d = t.counters.since(before)
    assert d.bytes_sent == 2 * (P - 1) * (n // P) * 4
    assert d.messages == 2 * (P - 1)
