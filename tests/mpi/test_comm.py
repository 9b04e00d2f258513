"""ringmpi.Comm, the mpi4py drop-in: every buffer collective it overrides gives what mpi4py's
own gives (plain MPI on the same handle) on random per-rank data, for every buffer spec
mpi4py accepts; what it cannot serve goes to mpi4py unchanged (same result, same
exception); communicators made from it are wrapped; the hot path stays correct.
(mpi4py's own collective test suite runs through it in `make test-mpi4py`.)"""
from __future__ import annotations

import array
import math
from contextlib import contextmanager

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi
from ringmpi import comm as dropin
from ringmpi import settings
from tests.helpers import make_data

WORLD = MPI.COMM_WORLD
P, R = WORLD.size, WORLD.rank
PLAIN = MPI.Intracomm(WORLD)   # mpi4py's own methods on the same handle: the reference


@pytest.fixture
def comm():
    return ringmpi.Comm(WORLD)


@contextmanager
def served(method: str, left_to_mpi4py: bool = False):
    """The calls inside went through ringmpi (or, with left_to_mpi4py, to mpi4py)."""
    before = dropin.PASSED[method]
    yield
    assert (dropin.PASSED[method] > before) == left_to_mpi4py, f"{method}: {dropin.stats().get(method)}"


# -- the object -----------------------------------------------------------------------

def test_is_an_mpi4py_intracommunicator_on_the_same_handle(comm):
    assert isinstance(comm, MPI.Intracomm) and comm == WORLD and comm.handle == WORLD.handle
    assert comm.Get_rank() == R and comm.Get_size() == P and comm.allreduce(1) == P
    assert "ringmpi.Comm" in repr(comm)


def test_derived_communicators_are_wrapped_with_the_same_choices():
    c = ringmpi.Comm(WORLD, allreduce="ring")
    made = {"Dup": c.Dup(), "Clone": c.Clone(), "Split": c.Split(0, R), "Create": c.Create(c.Get_group()),
            "Create_group": c.Create_group(c.Get_group()), "Split_type": c.Split_type(MPI.COMM_TYPE_SHARED),
            "Dup_with_info": c.Dup_with_info(MPI.INFO_NULL)}
    new, req = c.Idup()
    req.Wait()
    made["Idup"] = new
    for name, d in made.items():
        assert isinstance(d, ringmpi.Comm) and d._algorithms == {"allreduce": "ring"}, name
    x = np.arange(8.0) + R
    d = made["Dup"]
    d.Allreduce(MPI.IN_PLACE, x)
    assert ringmpi.last_choice(d)["algorithm"] == "ring"
    assert np.array_equal(x, np.arange(8.0) * P + P * (P - 1) / 2)
    for d in made.values():
        if d.Get_size() == P or d is made["Split_type"]:
            d.Free()
    odd = c.Split(MPI.UNDEFINED if R == 0 else 1, R)
    assert (odd == MPI.COMM_NULL) if R == 0 else isinstance(odd, ringmpi.Comm)
    if odd != MPI.COMM_NULL:
        odd.Free()


def test_unknown_names_are_refused():
    with pytest.raises(ringmpi.RingmpiUsageError, match="unknown collective 'allreduse'"):
        ringmpi.Comm(WORLD, allreduse="ring")
    with pytest.raises(ringmpi.RingmpiUsageError, match="unknown allreduce algorithm 'rign'.*ring"):
        ringmpi.Comm(WORLD, allreduce="rign")
    with pytest.raises(TypeError, match="intracommunicator"):
        ringmpi.Comm(object())


# -- every overridden call against mpi4py's own, buffer specs as mpi4py takes them ---------

DT = {np.dtype("float64"): MPI.DOUBLE, np.dtype("int32"): MPI.INT, np.dtype("complex64"): MPI.C_FLOAT_COMPLEX,
      np.dtype("uint8"): MPI.UNSIGNED_CHAR, np.dtype("bool"): MPI.C_BOOL, np.dtype("int64"): MPI.INT64_T}
OPS = {"SUM": MPI.SUM, "PROD": MPI.PROD, "MAX": MPI.MAX, "MIN": MPI.MIN, "LAND": MPI.LAND, "BXOR": MPI.BXOR}
CASES = [(dt, op) for dt in DT for op in OPS
         if not (op in ("MAX", "MIN") and dt.kind == "c") and not (op == "BXOR" and dt.kind not in "iu")
         and not (dt.kind == "b" and op not in ("LAND",)) and not (op == "LAND" and dt.kind in "fc")]


def specs(a: np.ndarray, n: int | None = None) -> list:
    """The ways mpi4py lets a program describe the first `n` entries of `a`."""
    t = DT[a.dtype]
    n = a.size if n is None else n
    return [a, [a, t], [a, n, t], [a, (n, 0), t], [a, n, 0, t]]


@pytest.mark.parametrize("dt,op", CASES, ids=lambda v: str(v))
def test_allreduce_every_spec(comm, rng, dt, op):
    x = make_data(rng, dt, 13, op, exact=True)
    ref = np.empty_like(x)
    PLAIN.Allreduce(x, ref, OPS[op])
    for i, spec in enumerate(specs(out := np.empty_like(x))):
        out[:] = 0
        keep = x.copy()
        with served("Allreduce"):
            comm.Allreduce(x if i % 2 else [x, DT[x.dtype]], spec, OPS[op])
        assert np.array_equal(out, ref) and np.array_equal(x, keep), (i, op)
    for sendspec in (MPI.IN_PLACE, None):
        y = x.copy()
        with served("Allreduce"):
            comm.Allreduce(sendspec, [y, DT[y.dtype]], op=OPS[op])
        assert np.array_equal(y, ref)


def test_reduce_and_bcast_every_root(comm, rng):
    x = make_data(rng, "float64", 10, "SUM", exact=True)
    for root in range(P):
        ref = np.empty_like(x)
        PLAIN.Reduce(x, ref, MPI.SUM, root)
        out = np.full_like(x, -1)
        with served("Reduce"):
            comm.Reduce([x, MPI.DOUBLE], [out, MPI.DOUBLE] if R == root else None, op=MPI.SUM, root=root)
        assert np.array_equal(out, ref) if R == root else np.all(out == -1)
        y = x.copy()
        with served("Reduce"):
            comm.Reduce(MPI.IN_PLACE if R == root else y, y, MPI.MAX, root)
        ref2 = x.copy()
        PLAIN.Reduce(MPI.IN_PLACE if R == root else ref2, ref2, MPI.MAX, root)
        if R == root:
            assert np.array_equal(y, ref2)
        b = (np.arange(7, dtype=np.int32) * (root + 1)) if R == root else np.zeros(7, np.int32)
        with served("Bcast"):
            comm.Bcast([b, MPI.INT], root=root)
        assert np.array_equal(b, np.arange(7, dtype=np.int32) * (root + 1))


def test_bcast_from_a_read_only_root_buffer(comm):
    b = np.arange(5.0) if R == 0 else np.zeros(5)
    if R == 0:
        b.flags.writeable = False
    with served("Bcast"):
        comm.Bcast(b, root=0)
    assert np.array_equal(b, np.arange(5.0))


def test_allgather_alltoall_and_v(comm, rng):
    x = make_data(rng, "int32", 3, "SUM")
    ref = np.empty(3 * P, np.int32)
    PLAIN.Allgather(x, ref)
    out = np.zeros((P, 3), np.int32)        # any contiguous shape
    with served("Allgather"):
        comm.Allgather([x, MPI.INT], [out, MPI.INT])
    assert np.array_equal(out.ravel(), ref)
    inplace = np.zeros(3 * P, np.int32)
    inplace[3 * R:3 * R + 3] = x
    with served("Allgather"):
        comm.Allgather(MPI.IN_PLACE, inplace)
    assert np.array_equal(inplace, ref)
    counts = [q + 1 for q in range(P)]
    displs = [sum(counts[:q]) for q in range(P)]
    mine = make_data(rng, "float64", R + 1, "SUM", exact=True)
    ref = np.empty(sum(counts))
    PLAIN.Allgatherv(mine, [ref, counts, displs, MPI.DOUBLE])
    for spec in ([counts, displs, MPI.DOUBLE], [(counts, displs), MPI.DOUBLE], [counts, MPI.DOUBLE], [counts],
                 [(counts, None), MPI.DOUBLE]):
        out = np.zeros(sum(counts))
        with served("Allgatherv"):
            comm.Allgatherv(mine, [out, *spec])
        assert np.array_equal(out, ref), spec
    a = make_data(rng, "complex64", 2 * P, "SUM", exact=True)
    ref = np.empty_like(a)
    PLAIN.Alltoall(a, ref)
    out = np.empty_like(a)
    with served("Alltoall"):
        comm.Alltoall(a, [out, 2, MPI.C_FLOAT_COMPLEX])
    assert np.array_equal(out, ref)
    with served("Alltoall"):
        comm.Alltoall(MPI.IN_PLACE, a)
    assert np.array_equal(a, ref)


def test_reduce_scatter_block_and_counts(comm, rng):
    x = make_data(rng, "float64", 4 * P, "SUM", exact=True)
    ref = np.empty(4)
    PLAIN.Reduce_scatter_block(x, ref, MPI.SUM)
    out = np.empty(4)
    with served("Reduce_scatter_block"):
        comm.Reduce_scatter_block([x, MPI.DOUBLE], out, op=MPI.SUM)
    assert np.array_equal(out, ref)
    buf = x.copy()   # in place: the whole buffer is the input, the result goes to its start
    with served("Reduce_scatter_block"):
        comm.Reduce_scatter_block(MPI.IN_PLACE, buf, MPI.SUM)
    assert np.array_equal(buf[:4], ref) and np.array_equal(buf[4:], x[4:])
    counts = [q % 3 + 1 for q in range(P)]
    x = make_data(rng, "int64", sum(counts), "BXOR")
    total = np.empty_like(x)
    PLAIN.Allreduce(x, total, MPI.BXOR)
    mine = total[sum(counts[:R]):sum(counts[:R + 1])]
    for rc in (counts, None):
        out = np.empty(counts[R], np.int64)
        with served("Reduce_scatter"):
            comm.Reduce_scatter(x, out, rc, MPI.BXOR)
        assert np.array_equal(out, mine), rc
    buf = x.copy()
    with served("Reduce_scatter"):
        comm.Reduce_scatter(None, buf, counts, MPI.BXOR)
    assert np.array_equal(buf[:counts[R]], mine) and np.array_equal(buf[counts[R]:], x[counts[R]:])


def test_other_memory_layouts_and_objects(comm):
    f = np.asfortranarray(np.arange(12.0).reshape(3, 4) + R)
    ref = np.empty_like(f)
    PLAIN.Allreduce(f, ref)
    out = np.empty_like(f)
    with served("Allreduce"):
        comm.Allreduce(f, out)
    assert np.array_equal(out, ref)
    a = array.array("i", [R + 1] * 5)
    b = array.array("i", [0] * 5)
    with served("Allreduce"):
        comm.Allreduce(a, b, MPI.PROD)
    assert list(b) == [math.factorial(P)] * 5
    raw = bytearray(np.full(3, R, np.float64).tobytes())
    out = bytearray(24)
    with served("Allreduce"):
        comm.Allreduce([raw, MPI.DOUBLE], [out, MPI.DOUBLE])
    assert np.frombuffer(out).tolist() == [P * (P - 1) / 2] * 3
    q = np.array([1, 2], dtype="q")       # int64 as 'q' and 'l': one MPI type for ringmpi
    ql = np.zeros(2, dtype="l")
    comm.Allreduce(q, ql)
    assert ql.tolist() == [P, 2 * P]


# -- what it cannot serve goes to mpi4py, unchanged ----------------------------------------

def test_unserved_calls_go_to_mpi4py(comm):
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    b = np.arange(6.0) if R == 0 else np.zeros(6)
    with served("Bcast", left_to_mpi4py=True):
        comm.Bcast([b, 3, pair], root=0)
    assert np.array_equal(b, np.arange(6.0))
    pair.Free()
    x = np.arange(6.0) + R
    out, ref = np.empty(6), np.empty(6)
    PLAIN.Allreduce(x, ref, MPI.SUM)
    user = MPI.Op.Create(lambda a, b, t: np.add(np.frombuffer(a, np.float64), np.frombuffer(b, np.float64),
                                                out=np.frombuffer(b, np.float64)), commute=True)
    with served("Allreduce", left_to_mpi4py=True):
        comm.Allreduce(x, out, user)
    assert np.array_equal(out, ref)
    user.Free()
    ld = np.ones(3, np.longdouble)
    with served("Allreduce", left_to_mpi4py=True):
        comm.Allreduce(MPI.IN_PLACE, ld)
    assert np.all(ld == P)
    with served("Bcast", left_to_mpi4py=True):
        comm.Bcast(np.zeros(0), root=0)


@pytest.mark.parametrize("case", ["noncontiguous", "readonly", "count", "types", "root"])
def test_bad_calls_raise_what_mpi4py_raises(comm, case):
    x = np.ones(8)
    calls = {
        "noncontiguous": lambda c: c.Allreduce(x[::2], np.empty(4)),
        "readonly": lambda c: c.Allreduce(x, np.frombuffer(bytes(64))),
        "count": lambda c: c.Allreduce(x, np.empty(7)),
        "types": lambda c: c.Allreduce([x, MPI.DOUBLE], [np.empty(8, np.int64), MPI.INT64_T]),
        "root": lambda c: c.Bcast(x, root=P),
    }
    errors = []
    for c in (PLAIN, comm):
        try:
            calls[case](c)
            errors.append(None)
        except Exception as e:  # noqa: BLE001  (the point: the same class and message)
            errors.append((type(e), str(e)))
    assert errors[0] is not None and errors[0] == errors[1], errors


# -- the hot path ----------------------------------------------------------------------------

def test_repeated_calls_stay_correct(comm, rng):
    a, b = np.empty(16), np.empty(16)
    other = np.empty(16)
    for i in range(12):
        x = make_data(rng, "float64", 16, "SUM", exact=True)
        a[:] = x
        ref = np.empty(16)
        PLAIN.Allreduce(x, ref)
        dst = b if i % 3 else other                      # two receive buffers, alternating
        comm.Allreduce(a, dst, op=MPI.SUM)
        assert np.array_equal(dst, ref), i
        inplace = x.copy() if i % 4 == 0 else a
        inplace[:] = x
        comm.Allreduce(MPI.IN_PLACE, inplace, MPI.SUM)
        assert np.array_equal(inplace, ref), i
        if i == 6:
            settings.reload()                            # every plan dropped: the hot path notices
    mx = np.empty(16)
    PLAIN.Allreduce(a, mx, MPI.MAX)
    comm.Allreduce(a, b, MPI.MAX)                        # same arrays, another op
    assert np.array_equal(b, mx)


@pytest.mark.parametrize("alg", ["ring", "recursive_doubling"])
def test_a_matrix_all_reduced_again_is_found_by_its_array(rng, alg):
    """A C-contiguous matrix (a weight's gradient, all-reduced every step) served by
    ringmpi's algorithm: its blocking calls come to go straight to the plan kept for that
    very array (`Comm._hot`; the memo behind it backs off up to 64 calls after arrays that
    died, as earlier tests' did) and its nonblocking calls start the request kept for it
    (the same persistent request each time, once the first call's set-up is done), as a
    flat array's do; the results are mpi4py's own, and one in Fortran order is still
    paired element by element in memory order. The receive buffer is a view of a larger
    buffer, as a gradient in a flat gradient buffer is."""
    c = ringmpi.Comm(WORLD, allreduce=alg)
    send, recv = np.empty((6, 5)), np.empty(40)[5:35].reshape(6, 5)
    ref = np.empty((6, 5))

    def fresh() -> None:
        send[...] = make_data(rng, "float64", 30, "SUM", exact=True).reshape(6, 5)
        PLAIN.Allreduce(send, ref)
    for i in range(80):
        fresh()
        c.Allreduce(send, recv)
        assert np.array_equal(recv, ref), i
    assert id(recv) in (c._hot or {})
    sources = []
    for i in range(8):
        fresh()
        req = c.Iallreduce(send, recv)
        sources.append(req._ring.source)
        req.Wait()
        assert np.array_equal(recv, ref), i
    assert all(s is sources[-1] for s in sources[2:]), sources
    f = np.asfortranarray(send + R)
    out, ref = np.empty_like(f), np.empty_like(f)
    PLAIN.Allreduce(f, ref)
    for _ in range(2):
        c.Allreduce(f, out)
        assert np.array_equal(out, ref) and out.flags.f_contiguous


@pytest.mark.parametrize("alg", ["mpi", "ring"])
def test_matrices_of_every_collective_repeated(rng, alg):
    """Bare arrays of several dimensions, passed to ringmpi's functions as they are
    (`comm._whole`), in every collective the drop-in parses, repeated on the same arrays,
    with MPI's own and with ringmpi's algorithms: mpi4py's own results."""
    c = ringmpi.Comm(WORLD, allgather=alg, broadcast="pipeline" if alg == "ring" else alg,
                     alltoall="pairwise" if alg == "ring" else alg, allreduce=alg)
    b = np.empty((3, 4))
    x, gathered = np.empty((2, 3), np.int32), np.empty((P, 2, 3), np.int32)
    a, swapped = np.empty((P, 4), np.float32), np.empty((P, 4), np.float32)
    inplace = np.empty((P, 3))
    for i in range(4):
        root = i % P
        b[...] = make_data(rng, "float64", 12, "SUM", exact=True).reshape(3, 4) if R == root else 0
        ref = b.copy()
        PLAIN.Bcast(ref, root=root)
        c.Bcast(b, root=root)
        assert np.array_equal(b, ref), i
        x[...] = make_data(rng, "int32", 6, "SUM").reshape(2, 3)
        ref = np.empty_like(gathered)
        PLAIN.Allgather(x, ref)
        c.Allgather(x, gathered)
        assert np.array_equal(gathered, ref), i
        a[...] = make_data(rng, "float32", 4 * P, "SUM", exact=True).reshape(P, 4)
        ref = np.empty_like(a)
        PLAIN.Alltoall(a, ref)
        c.Alltoall(a, swapped)
        assert np.array_equal(swapped, ref), i
        inplace[R] = make_data(rng, "float64", 3, "SUM", exact=True)
        ref = inplace.copy()
        PLAIN.Allgather(MPI.IN_PLACE, ref)
        c.Allgather(MPI.IN_PLACE, inplace)
        assert np.array_equal(inplace, ref), i


def test_repeated_calls_on_bytes_like_buffers(comm):
    """mpi4py's demo style, repeated: [buf, count, type] lists over mmap and bytearray
    buffers, IN_PLACE, with MPI's own chosen (the forms kept, the parsing skipped) and with
    ringmpi's ring: the same bytes as mpi4py's own, a new buffer object every few calls, and
    MPI.BYTE summed (which MPI refuses and ringmpi serves as unsigned bytes) still summed."""
    import mmap
    for alg in ("mpi", "ring"):
        c = ringmpi.Comm(WORLD, allgather=alg, broadcast="pipeline" if alg == "ring" else alg,
                         alltoall="pairwise" if alg == "ring" else alg, allreduce=alg)
        buf = mmap.mmap(-1, 64 * P)
        for i in range(40):
            n = 1 + i % 3
            if i % 7 == 6:
                buf = mmap.mmap(-1, 64 * P)     # a new buffer object of the same form
            mine = bytes([(R * 16 + i + k) % 256 for k in range(n)])
            buf[R * n:(R + 1) * n] = mine
            c.Allgather(MPI.IN_PLACE, [buf, n, MPI.BYTE])
            assert buf[:n * P] == b"".join(bytes([(q * 16 + i + k) % 256 for k in range(n)]) for q in range(P)), (alg, i)
            b = bytearray(b"%02d" % i * 4) if R == i % P else bytearray(8)
            c.Bcast([b, 8, MPI.BYTE], root=i % P)
            assert bytes(b) == b"%02d" % i * 4, (alg, i)
            send = bytearray(bytes([R * P + q for q in range(P)]))
            recv = bytearray(P)
            c.Alltoall([send, 1, MPI.BYTE], [recv, 1, MPI.BYTE])
            assert list(recv) == [q * P + R for q in range(P)], (alg, i)
            acc = bytearray([R + 1, 1 << (R % 8)])
            c.Allreduce(MPI.IN_PLACE, [acc, 2, MPI.BYTE], op=MPI.BOR)
            assert acc[1] == np.bitwise_or.reduce([1 << (q % 8) for q in range(P)]), (alg, i)
            ints = np.full(3, R + i, np.int32)
            out = bytearray(12)
            c.Allreduce([bytearray(ints.tobytes()), 3, MPI.INT], [out, 3, MPI.INT], op=MPI.SUM)
            assert np.frombuffer(out, np.int32).tolist() == [sum(q + i for q in range(P))] * 3, (alg, i)
        s = bytearray([1, 2])
        c.Allreduce(MPI.IN_PLACE, [s, 2, MPI.BYTE], op=MPI.SUM)
        assert list(s) == [P % 256, 2 * P % 256]
        kept = set(c._kept or {})
        assert kept == ({"Allgather", "Bcast", "Alltoall", "Allreduce"} if alg == "mpi" else set()), kept


def test_kept_forms_end_with_the_plans_and_at_a_refusal():
    """A kept form (`_Kept`: MPI's own called on the user's specifications as they are) is
    retired when the plans are forgotten: the next call takes the full path and keeps the
    form again. A call of the form that mpi4py refuses (a read-only memoryview to receive
    into) takes the full path, which raises mpi4py's own error, and the form stays kept for
    the next buffer. Every call is counted once in `stats`, and every result is mpi4py's
    own."""
    import mmap
    c = ringmpi.Comm(WORLD, broadcast="mpi", allreduce="mpi")
    before = dropin.stats()
    calls = {"Bcast": 0, "Allreduce": 0}
    buf = mmap.mmap(-1, 64)
    view = memoryview(buf)

    def both(i: int) -> None:
        buf[:8] = bytes((i + k) % 256 for k in range(8)) if R == i % P else bytes(8)
        c.Bcast([buf, 8, MPI.BYTE], root=i % P)
        assert buf[:8] == bytes((i + k) % 256 for k in range(8)), i
        view[:4] = bytes([1 << ((R + i) % 8)] * 4)
        c.Allreduce(MPI.IN_PLACE, [view, 4, MPI.BYTE], op=MPI.BOR)
        assert view[:4] == bytes([np.bitwise_or.reduce([1 << ((q + i) % 8) for q in range(P)])] * 4), i
        calls["Bcast"] += 1
        calls["Allreduce"] += 1

    for i in range(3):
        both(i)
    assert set(c._kept) == {"Bcast", "Allreduce"}, c._kept
    kept = c._kept["Allreduce"]
    assert kept.calls >= 1
    arr = np.arange(4, dtype=np.int32)                 # and a bare array's form
    d = ringmpi.Comm(WORLD, broadcast="mpi")
    for _ in range(3):
        d.Bcast(arr, root=0)
    kept_array = d._kept["Bcast"]
    ringmpi.api.forget_plans()
    assert c._kept == {} and d._kept == {}, c._kept    # retired: nothing fits them any more
    both(3)
    d.Bcast(arr, root=0)
    calls["Bcast"] += 4
    assert set(c._kept) == {"Bcast", "Allreduce"} and c._kept["Allreduce"] is not kept and kept.calls == 0
    assert d._kept["Bcast"] is not kept_array and kept_array.calls == 0 and arr.tolist() == [0, 1, 2, 3]
    frozen = memoryview(bytes(64))                     # the kept form, but read-only
    with pytest.raises(Exception) as got:
        PLAIN.Allreduce(MPI.IN_PLACE, [frozen, 4, MPI.BYTE], op=MPI.BOR)
    with pytest.raises(got.type):
        c.Allreduce(MPI.IN_PLACE, [frozen, 4, MPI.BYTE], op=MPI.BOR)
    calls["Allreduce"] += 1
    kept = c._kept["Allreduce"]
    served = kept.calls
    for i in range(4, 7):
        both(i)
    assert c._kept["Allreduce"] is kept and kept.calls == served + 3
    after = dropin.stats()
    for method, n in calls.items():
        assert after[method][0] - before.get(method, (0, 0))[0] == n, (method, after, before)


def test_repeated_nonblocking_calls_pass_to_mpi_as_they_are(rng):
    """The drop-in's nonblocking calls with MPI's own chosen: after the first call of a
    buffer form, the next begin MPI's own request on the caller's specifications as they
    are (`_MPIRequest`, an MPI request), in numpy and in mpi4py's demo style. Completed
    by their own Wait in reverse order, by polling Test, and by MPI.Request.Waitall beside
    a plain mpi4py request; every result is mpi4py's own, and the plans forgotten retire
    the forms."""
    import mmap
    c = ringmpi.Comm(WORLD, allreduce="mpi", broadcast="mpi", allgather="mpi", alltoall="mpi")
    buf = mmap.mmap(-1, 8)
    for i in range(9):
        if i == 6:
            ringmpi.api.forget_plans()
            assert not {"Iallreduce", "Ibcast", "Iallgather", "Ialltoall"} & set(c._kept), c._kept
        x = rng.integers(0, 100, 4).astype(np.int32)
        got, want = np.empty_like(x), np.empty_like(x)
        if i == 4:                                     # a kept form, a read-only result: mpi4py's error
            got.flags.writeable = False
            with pytest.raises(Exception) as plain_error:
                PLAIN.Iallreduce(x, got, op=MPI.SUM)
            with pytest.raises(plain_error.type):
                c.Iallreduce(x, got, op=MPI.SUM)
            got.flags.writeable = True
        whole = np.zeros(2 * P, np.int32)
        whole[2 * R:2 * R + 2] = x[:2]
        ref = np.empty_like(whole)
        PLAIN.Allgather(x[:2], ref)
        buf[:] = bytes(range(i, i + 8)) if R == 0 else bytes(8)
        send, recv = np.arange(P, dtype=np.int64) + 10 * R, np.empty(P, np.int64)
        reqs = [c.Iallreduce(x, got, op=MPI.SUM), c.Ibcast([buf, 8, MPI.BYTE], root=0),
                c.Iallgather(MPI.IN_PLACE, whole), c.Ialltoall(send, recv)]
        plain = PLAIN.Iallreduce(x, want, op=MPI.SUM)
        if i % 3 == 0:
            MPI.Request.Waitall([plain, *reversed(reqs)])
        elif i % 3 == 1:
            for r in reversed(reqs):
                assert r.Wait() is True
            plain.Wait()
        else:
            pending = [*reqs, plain]
            while pending:
                pending = [r for r in pending if not r.Test()]
        assert np.array_equal(got, want) and buf[:] == bytes(range(i, i + 8)), i
        assert np.array_equal(whole, ref) and recv.tolist() == [10 * q + R for q in range(P)], i
        if i % 6 and P > 1:   # (a form is kept at its first call, and after the plans are forgotten;
            # one rank's calls are local copies, not MPI's)
            assert all(isinstance(r, dropin._MPIRequest) for r in reqs), [type(r) for r in reqs]
        else:
            assert not any(isinstance(r, dropin._MPIRequest) for r in reqs), [type(r) for r in reqs]


def test_the_drop_in_s_requests_run_mpi_s_own_where_blocking_calls_measured_it_fastest(rng):
    """Where online tuning measured MPI's own all-reduce fastest, but not REQUEST_MARGIN times
    faster than ringmpi's best: ringmpi.iallreduce runs ringmpi's where a request can hide
    anything (`overlaps`: it advances while its caller computes), and MPI's own elsewhere, as
    MPI's own request (`requests.MPIRequest`); the drop-in's Iallreduce runs MPI's own either way
    (its caller asked for it; the first call a generalized request of MPI's own, the next
    ones MPI's own request as it is), and every result is mpi4py's."""
    if P == 1:
        pytest.skip("one rank: every collective is a local copy")
    from ringmpi import auto
    from ringmpi.collectives import SPECS
    comm = WORLD.Dup()
    try:
        c = ringmpi.Comm(comm)
        t = ringmpi.api.group(c)
        auto.profile_of(t)   # (read at the first call, which begins afresh: before the seed)
        x = rng.integers(-1000, 1000, 4096).astype(np.float32)   # (exact sums in any order)
        call, _ = SPECS["allreduce"].prepare(ringmpi.api.Edge("allreduce", t), x, np.empty_like(x), op="sum")
        key = auto._bucket(t, call)
        seed = {"winner": "mpi", "tuned": {"mpi": 10e-6, "recursive_doubling": 15e-6}}
        t.tuners.put(key, auto.Tuner(key, ["mpi", "recursive_doubling"], seed=seed))
        want = np.empty_like(x)
        PLAIN.Allreduce(x, want)
        for hides, algorithm in ((True, "recursive_doubling"), (False, "mpi")):
            t.hides = hides
            ours = ringmpi.iallreduce(x, np.empty_like(x), comm=c)
            assert ours.label == f"allreduce/{algorithm}", (hides, ours.label)
            assert isinstance(ours, ringmpi.requests.MPIRequest) == (not hides), (hides, ours)
            assert np.array_equal(ours.wait(), want)
        t.hides = True
        for i in range(3):
            got = np.empty_like(x)
            req = c.Iallreduce(x, got)
            if i == 0:
                assert isinstance(req, dropin._Request) and req._ring.label == "allreduce/mpi", req
            else:
                assert isinstance(req, dropin._MPIRequest), type(req)
            req.Wait()
            assert np.array_equal(got, want), i
    finally:
        ringmpi.api.group(comm).hides = None
        ringmpi.api.forget_plans()
        comm.Free()


def test_a_kept_form_of_an_array_and_a_tuple():
    """An array sent, a `(buf, count, type)` tuple received, MPI's own chosen: the form is
    kept, and its later calls are compared as such (an array beside a tuple has no
    overlap to look for)."""
    import mmap
    c = ringmpi.Comm(WORLD, alltoall="mpi")
    send = np.arange(P, dtype=np.uint8) + 10 * R
    for i in range(4):
        out = mmap.mmap(-1, P)
        c.Alltoall(send, (out, 1, MPI.BYTE))
        assert list(out[:]) == [10 * q + R for q in range(P)], i
    assert "Alltoall" in c._kept and c._kept["Alltoall"].calls >= 2


def test_nothing_kept_where_every_call_is_compared():
    """Under RINGMPI_CHECK every call is compared across ranks first: no buffer form is
    passed to MPI as it is (`_Kept`), so a call that differs from another rank's is caught
    at its tenth repeat as at its first."""
    import mmap
    settings.reload({"RINGMPI_CHECK": "1"})
    try:
        c = ringmpi.Comm(WORLD, broadcast="mpi", allreduce="mpi")
        buf = mmap.mmap(-1, 8)
        for _ in range(10):
            c.Bcast([buf, 8, MPI.BYTE], root=0)
            c.Allreduce(MPI.IN_PLACE, [buf, 8, MPI.BYTE], op=MPI.BOR)
        assert c._kept == {}, c._kept
        if P > 1:
            with pytest.raises(ringmpi.RingmpiUsageError, match="ranks disagree"):
                c.Bcast([buf, 8, MPI.BYTE], root=R % 2)   # the ranks disagree on the root
    finally:
        settings.reload()


def test_repeated_calls_on_bare_arrays_with_mpi_chosen(comm, rng):
    """Bare numpy arrays, MPI's own chosen: after the first call of a form (dtype and size)
    the next go to mpi4py as they are (`_Kept`), for new arrays of that form too; another
    dtype of the same size, a strided array (mpi4py refuses it: the full path says so), two
    views of one array and a 16-bit float take the full path. Every result is mpi4py's own
    on the same data. An Allreduce of floats by MAX (ringmpi's propagates NaN) or of bools
    (MPI_C_BOOL takes the logical ops only) is never passed as it is."""
    c = ringmpi.Comm(WORLD, allgather="mpi", broadcast="mpi", alltoall="mpi", allreduce="mpi")
    hits = dict.fromkeys(("Bcast", "Allgather", "Alltoall", "Allreduce"), 0)   # calls passed as they are
    buf = np.empty(0)

    def note_hits() -> None:
        for m, k in (c._kept or {}).items():
            if m in hits:
                hits[m] = max(hits[m], k.calls)

    for i in range(24):
        dt = ("int32", "float32", "uint8", "float16")[i % 4] if i >= 8 else "int32"
        x = make_data(rng, dt, 6 * P, "SUM", exact=True)
        if i % 3 == 0 or buf.dtype != x.dtype:             # a new array of the same form, or of another
            buf = x.copy()
        buf[...] = x
        want = x.copy()
        root = i % P if i >= 8 else 0
        PLAIN.Bcast(want if dt != "float16" else want.view(np.uint16), root=root)
        c.Bcast(buf, root=root)
        assert np.array_equal(buf.view(np.uint8), want.view(np.uint8)), (i, dt)
        whole = np.empty(6 * P * P, x.dtype)
        whole[R * 6 * P:(R + 1) * 6 * P] = x
        ref = np.empty_like(whole)
        PLAIN.Allgather(x.view(np.uint8), ref.view(np.uint8))
        c.Allgather(MPI.IN_PLACE, whole)
        assert np.array_equal(whole.view(np.uint8), ref.view(np.uint8)), (i, dt)
        both = np.empty(12 * P, x.dtype)                    # send and receive views of one array, apart
        send, recv = both[:6 * P], both[6 * P:]
        send[...] = x
        ref = np.empty(6 * P, x.dtype)
        PLAIN.Alltoall(x.view(np.uint8), ref.view(np.uint8))
        c.Alltoall(send, recv)
        assert np.array_equal(recv.view(np.uint8), ref.view(np.uint8)), (i, dt)
        note_hits()   # (before the strided call retires Alltoall's form)
        strided = np.zeros(12 * P, x.dtype)[::2]            # not contiguous, the form's dtype and size:
        try:                                                # what the full path does (mpi4py refuses it)
            PLAIN.Alltoall(x, np.zeros(12 * P, x.dtype)[::2])
        except Exception as err:   # noqa: BLE001
            with pytest.raises(type(err)):
                c.Alltoall(x, strided)
        else:
            c.Alltoall(x, strided)
            assert np.array_equal(np.ascontiguousarray(strided).view(np.uint8), ref.view(np.uint8)), (i, dt)
        if dt != "float16":
            acc = x.copy()
            ref = np.empty_like(x)
            PLAIN.Allreduce(x, ref, op=MPI.SUM)
            c.Allreduce(MPI.IN_PLACE, acc, op=MPI.SUM)
            assert np.array_equal(acc, ref), (i, dt)
        note_hits()
    assert all(hits.values()), hits
    for x, op, want in ((np.array([np.nan if R == 0 else 1.0, 2.0]), MPI.MAX, [np.nan, 2.0]),
                        (np.array([R == 0, False]), MPI.LOR, [True, False])):
        fresh = ringmpi.Comm(WORLD, allreduce="mpi")
        for _ in range(3):
            acc = x.copy()
            fresh.Allreduce(MPI.IN_PLACE, acc, op=op)
            assert np.array_equal(acc, want, equal_nan=True) and "Allreduce" not in fresh._kept, (acc, op)


def test_run_installs_the_wrapper():
    import pickle

    from ringmpi import run
    world, self_ = MPI.COMM_WORLD, MPI.COMM_SELF
    try:
        run.install()
        run.install()
        assert isinstance(MPI.COMM_WORLD, ringmpi.Comm) and MPI.COMM_WORLD == world
        assert isinstance(MPI.COMM_SELF, ringmpi.Comm) and MPI.COMM_SELF.Get_size() == 1
        x = np.ones(4)
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)
        assert np.all(x == P)
        assert pickle.loads(pickle.dumps(MPI.COMM_WORLD)) is MPI.COMM_WORLD
        plain = pickle.loads(pickle.dumps(MPI.Intracomm(MPI.COMM_WORLD)))
        assert plain == world and plain is not MPI.COMM_WORLD
        mine = pickle.loads(pickle.dumps(ringmpi.Comm(world, allreduce="ring")))
        assert isinstance(mine, ringmpi.Comm) and mine._algorithms == {"allreduce": "ring"}
        dup = MPI.COMM_WORLD.Dup()
        with pytest.raises(ValueError):
            pickle.dumps(dup)
        dup.Free()
    finally:
        run.uninstall()
    assert MPI.COMM_WORLD is world and MPI.COMM_SELF is self_
