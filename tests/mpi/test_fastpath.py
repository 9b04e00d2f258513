"""The fast path: a call repeated with the same shape is served by a kept plan (MPI's own
called straight, or the algorithm after a lighter validation), and must give what the full
path gives: MPI's own result on fresh random data every time, the same bits on every rank,
the same clear errors for bad buffers, the send buffer untouched. And online tuning: every
rank explores the same candidates and settles on the same winner."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi
from ringmpi.api import group
from ringmpi.api import PLANS
from ringmpi.collectives import SPECS

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank


def reference(collective: str, x: np.ndarray, root: int = 0) -> np.ndarray | None:
    """This rank's result from every rank's `x`, by numpy (the spec's `expected`), whatever
    algorithm ringmpi ran."""
    spec = SPECS[collective]
    return spec.expected(COMM.allgather(x), R, "SUM" if spec.reduces else None, root)


def call(collective, x, out, alg, root=0):
    """The public call on send buffer `x` and result buffer `out` (None: a new one)."""
    spec = SPECS[collective]
    args = {spec.send_arg: x, **({"root": root} if spec.rooted else {})}
    if spec.recv_arg:
        args[spec.recv_arg] = out
    return getattr(ringmpi, collective)(**args, algorithm=alg)


COLLECTIVES = list(SPECS)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_repeated_calls_match_mpi(collective, rng):
    """Five calls per (algorithm, placement) with fresh data: the first builds the plan,
    the others use it. The buffers are the spec's harness call (`make`); "new" passes no
    result buffer."""
    spec = SPECS[collective]
    n, root, op = 6 * P, 1 % P, "SUM" if spec.reduces else None
    for alg in ringmpi.algorithms(collective, COMM) + ["auto"]:
        for place in ("new", "given", "inplace") if spec.has_out_of_place else ("inplace",):
            for _ in range(5):
                x = rng.integers(-50, 50, n).astype(np.float64)
                want = reference(collective, x, root)
                c = spec.make(R, P, x, op=op, root=root, inplace=place == "inplace")
                args = spec.args(c)
                if place == "new" and spec.recv_arg:
                    args[spec.recv_arg] = None
                keep = c.send.copy()
                got = getattr(ringmpi, collective)(**args, algorithm=alg)
                what = f"{collective}/{alg} {place}"
                if place == "given":
                    assert got is None or got is args[spec.recv_arg], what
                if place != "new":
                    got = spec.output(c)   # (in place: the caller's buffer, or its block)
                if want is None:
                    assert got is None, what
                else:
                    assert np.array_equal(got, want), what
                if place != "inplace":
                    assert np.array_equal(c.send, keep), what + ": sendbuf modified"


def test_plans_are_kept_and_used():
    x = np.ones(10)
    ringmpi.allreduce(x, algorithm="mpi")
    before = len(PLANS)
    t = group()
    seq = t.seq
    for _ in range(10):
        ringmpi.allreduce(x, algorithm="mpi")
    assert len(PLANS) == before and t.seq == seq + 10  # the plan served them, one sequence number each
    assert ringmpi.last_choice()["algorithm"] == "mpi"


@pytest.mark.parametrize("alg", ["mpi", "ring", "auto"])
def test_bad_buffers_on_the_fast_path_get_the_full_error(alg):
    """A plan exists for this shape; buffers the key cannot tell apart still get the
    full path's errors: read-only result, overlap, non-contiguous of the same shape."""
    x = np.arange(8.0)
    y = np.empty(8)
    for _ in range(3):
        ringmpi.allreduce(x, y, algorithm=alg)
    ro = np.empty(8)
    ro.flags.writeable = False
    big = np.arange(16.0)
    for bad, needle in ((ro, "read-only"), (big[4:12], "overlaps"), (np.empty(16)[::2], "C-contiguous")):
        src = big[:8] if needle == "overlaps" else x
        with pytest.raises(ringmpi.RingmpiUsageError, match=needle):
            ringmpi.allreduce(src, bad, algorithm=alg)
    assert np.array_equal(ringmpi.allreduce(x, y, algorithm=alg), x * P)  # and the next call is fine
    # a new result (small: the plan copies the input and reduces in place): a strided input
    # is refused by every call, the first through the plan cache, the next through the memo
    for _ in range(3):
        ringmpi.allreduce(x, algorithm=alg)
    strided = np.arange(16.0)[::2]
    for _ in range(3):
        with pytest.raises(ringmpi.RingmpiUsageError, match="C-contiguous"):
            ringmpi.allreduce(strided, algorithm=alg)
    assert np.array_equal(ringmpi.allreduce(x, algorithm=alg), x * P)


@pytest.mark.parametrize("alg", ["ring", "ring_shm"])
def test_the_same_arrays_again_are_checked_for_what_can_change(alg, rng):
    """A plan remembers the last arrays it validated (weakly) and skips, for the very same
    objects, what cannot have changed about them; what can is checked on every call: new
    contents give new sums (in place too), a result made read-only is refused on every
    rank, and the call after that is served again."""
    if alg not in ringmpi.algorithms("allreduce", COMM):
        pytest.skip(f"{alg} cannot run here")
    x, y = np.empty(1000), np.empty(1000)
    for _ in range(3):
        x[:] = rng.integers(-50, 50, 1000)
        assert np.array_equal(ringmpi.allreduce(x, y, algorithm=alg), reference("allreduce", x))
    z = x.copy()
    for _ in range(2):
        z[:] = x
        ringmpi.allreduce(z, z, algorithm=alg)
        assert np.array_equal(z, reference("allreduce", x))
    y.flags.writeable = False
    for _ in range(2):
        with pytest.raises(ringmpi.RingmpiUsageError, match="read-only"):
            ringmpi.allreduce(x, y, algorithm=alg)
    y.flags.writeable = True
    assert np.array_equal(ringmpi.allreduce(x, y, algorithm=alg), reference("allreduce", x))


def test_online_tuning_agrees_on_every_rank(rng):
    """auto explores on the first calls of each size bucket; every rank runs the same
    candidate at the same call and settles on the same winner, results exact throughout."""
    t = group()
    for n in (1, 100, 3000, 70_000):
        x = rng.integers(-50, 50, n).astype(np.float32)
        want = reference("allreduce", x)
        picks = []
        for _ in range(100):   # (exploration: about 3 calls a candidate, 5 more for the close ones)
            assert np.array_equal(ringmpi.allreduce(x), want)
            picks.append(ringmpi.last_choice()["algorithm"])
        assert COMM.allgather(picks) == [picks] * P
        tuners = [tu for k, tu in t.tuners.items()
                  if k[:3] == ("allreduce", "float32", "SUM") and k[3] == (n * 4).bit_length()]
        assert len(tuners) == 1
        tuner = tuners[0]
        for _ in range(200):   # a slow spell can send the bucket back to exploring: it settles again
            if tuner.winner is not None:
                break
            assert np.array_equal(ringmpi.allreduce(x), want)
        assert tuner.winner in ringmpi.algorithms("allreduce")
        # (the pick of a call is the winner when it starts: the monitored call that ends the
        # loop above may switch the winner after it ran, so the next call is the one to check)
        winner = tuner.winner
        assert np.array_equal(ringmpi.allreduce(x), want)
        assert ringmpi.last_choice()["algorithm"] == winner
        assert COMM.allgather(winner) == [winner] * P


@pytest.mark.parametrize("alg", ["mpi", "ring", "auto"])
def test_plans_keep_no_user_array_alive(alg):
    """The plan cache keeps shapes, not buffers: arrays a program drops are freed."""
    import gc
    import weakref
    x, y = np.ones(1000), np.empty(1000)
    for _ in range(4):
        ringmpi.allreduce(x, y, algorithm=alg)
        ringmpi.broadcast(x, 0, algorithm=alg if alg != "ring" else "pipeline")
    refs = [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    assert [r() for r in refs] == [None, None]


@pytest.mark.parametrize("alg", ["mpi", "auto"])
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_the_same_arrays_with_a_dtype_or_shape_set_in_place(collective, alg, rng):
    """Every public call remembers its last arrays by identity (a training loop's step goes
    straight to the plan); `x.dtype = ...` and `x.shape = ...` keep the object, so the
    memo must not serve it as it was: the next call reduces, and shapes, what the arrays
    are now."""
    from ringmpi.api import CACHE
    n = 4 * P
    x = rng.integers(1, 1 << 20, n).astype(np.float32)
    root = 1 % P
    recv = SPECS[collective].make(R, P, x, root=root).recv   # (the harness call's result buffer: its size;
    out = np.empty(x.size if recv is None else recv.size, np.float32)   # reduce's off the root is ignored)
    buf = x.copy()

    def same_arrays():
        if collective == "broadcast":
            buf[:] = x
            return call(collective, buf, None, alg, root)
        return call(collective, x, out, alg, root)
    # past auto's exploration and the memo's pause after other tests' arrays died (up to 64
    # calls, from a state those tests left): every rank calls until every rank's memo holds
    # these arrays' plan
    for calls in range(1, 301):
        got, want = same_arrays(), reference(collective, x, root)
        assert (got is None and want is None) or np.array_equal(got, want)
        if calls >= 70 and COMM.allreduce(CACHE.memo(collective).plan is not None, op=MPI.LAND):
            break
    assert CACHE.memo(collective).plan is not None, f"the memo holds no plan after {calls} calls"
    for a in (x, out, buf):
        a.dtype = np.int32                          # the same objects, the same bytes
    got, want = same_arrays(), reference(collective, x, root)
    assert (got is None and want is None) or (got.dtype == np.int32 and np.array_equal(got, want))
    if collective in ("allreduce", "alltoall"):      # a new result is shaped like the send buffer
        for _ in range(70):
            call(collective, x, None, alg, root)
        x.shape = (P, 4)
        got = call(collective, x, None, alg, root)
        assert got.shape == (P, 4) and np.array_equal(got.ravel(), reference(collective, x.ravel(), root))


def test_the_memo_follows_the_arrays_a_loop_passes(monkeypatch):
    """The memo remembers the arrays of a call its plan served; a loop that passes a new
    result array every call stops paying for remembering them (~200 ns a call), and a loop
    with kept arrays is then remembered again and served."""
    import ringmpi.collectives as C
    from ringmpi.api import CACHE
    kept, real = [], C._remember    # (a count: keeping the arrays would keep them alive)
    monkeypatch.setattr(C, "_remember", lambda m, plan, s, r, *a: (kept.append(None), real(m, plan, s, r, *a)))
    m = CACHE.memo("alltoall")
    x = np.arange(4.0 * P)
    want = reference("alltoall", x)
    for _ in range(40):
        y = np.empty_like(x)
        assert np.array_equal(ringmpi.alltoall(x, y, algorithm="mpi"), want)
        del y                                    # the next one may take its id
    assert len(kept) <= 7, f"remembered {len(kept)} of 40 new arrays"
    y = np.empty_like(x)
    for _ in range(70):                          # the pause (at most 64 calls) ends
        assert np.array_equal(ringmpi.alltoall(x, y, algorithm="mpi"), want)
    assert m.plan is not None and m.recv() is y   # kept arrays: remembered
    seq, n = group().seq, len(kept)
    for _ in range(3):
        assert np.array_equal(ringmpi.alltoall(x, y, algorithm="mpi"), want)
    assert group().seq == seq + 3 and len(kept) == n   # served by the memo



@pytest.mark.parametrize("alg", ["auto", "ring", "mpi"])
def test_arguments_the_caller_may_change_in_place_are_read_every_call(alg):
    """Counts given as a list, changed in place between calls on the very same arrays, are
    read afresh (no plan is kept for them), and MPI's own op objects (unhashable) are kept
    by identity: the calls with MPI.SUM and MPI.MAX on the same arrays never mix."""
    x = np.arange(4.0 * P) + R
    counts = [4] * P
    out = np.empty(4)
    full = sum(COMM.allgather(x))
    for _ in range(3):
        ringmpi.reduce_scatter(x, out, counts=counts, algorithm=alg)
        assert np.array_equal(out, full[4 * R:4 * R + 4]), (alg, out)
    counts[:] = [4 * P] + [0] * (P - 1)   # (in place: the same list object)
    mine = np.empty(counts[R])
    got = ringmpi.reduce_scatter(x, mine, counts=counts, algorithm=alg)
    assert np.array_equal(got, full if R == 0 else full[:0]), (alg, got)
    y = np.empty_like(x)
    for op, fold in ((MPI.SUM, sum), (MPI.MAX, lambda xs: np.maximum.reduce(xs)), (MPI.SUM, sum)):
        for _ in range(3):
            ringmpi.allreduce(x, y, op=op, algorithm=alg)
            assert np.array_equal(y, fold(COMM.allgather(x))), (alg, op)
