"""The shared-memory transport (ringmpi.shm) and its algorithms (ring_shm, pipeline_shm):
the same bits as the ring over MPI and MPI's own result on random per-rank data, the send
buffer never written, zero copies with shared arrays, the arena grown across calls, nothing
left in /dev/shm, a freed communicator releasing its segments."""
from __future__ import annotations

import glob
import time

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi
from ringmpi.api import group
from tests.helpers import make_data

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
ONE_HOST = len(set(group().nodes)) == 1
pytestmark = [pytest.mark.skipif(P == 1, reason="one rank has no peers"),
              pytest.mark.skipif(not ONE_HOST, reason="shared memory needs every rank on one host")]


@pytest.mark.parametrize("n", [0, 1, P - 1, 1000, 65537, 1 << 20])
@pytest.mark.parametrize("dtype,op", [("float32", "SUM"), ("float64", "PROD"), ("int32", "MAX"), ("complex64", "SUM")])
def test_allreduce_over_shared_memory_is_the_ring_bit_for_bit(rng, n, dtype, op):
    x = make_data(rng, dtype, n, op)
    keep = x.copy()
    ring = ringmpi.allreduce(x, algorithm="ring", op=op)
    shm = ringmpi.allreduce(x, algorithm="ring_shm", op=op)
    assert np.array_equal(x, keep)
    assert shm.tobytes() == ring.tobytes()
    ref = np.empty_like(x)
    COMM.Allreduce(x, ref, op=getattr(MPI, op))
    assert np.allclose(shm, ref, rtol=1e-5, atol=1e-5)   # another summation order
    y = x.copy()
    ringmpi.allreduce(y, y, algorithm="ring_shm", op=op)          # in place
    assert y.tobytes() == ring.tobytes()


def test_reduce_scatter_allgather_broadcast_over_shared_memory(rng):
    counts = [(q * 7) % 5 + 1 for q in range(P)]
    x = make_data(rng, "float64", sum(counts), "SUM", exact=True)
    total = np.empty_like(x)
    COMM.Allreduce(x, total)
    mine = total[sum(counts[:R]):sum(counts[:R + 1])]
    assert np.array_equal(ringmpi.reduce_scatter(x, algorithm="ring_shm", counts=counts), mine)
    even = make_data(rng, "float32", 12 * P, "SUM", exact=True)
    ref = np.empty_like(even)
    COMM.Allreduce(even, ref)
    buf = even.copy()
    got = ringmpi.reduce_scatter(buf, buf, algorithm="ring_shm")   # in place: block r of the buffer
    assert np.array_equal(got, np.split(ref, P)[R])
    part = make_data(rng, "int64", 3 + R, "SUM")
    every = COMM.allgather(part)
    assert np.array_equal(ringmpi.allgather(part, algorithm="ring_shm", counts=[3 + q for q in range(P)]),
                          np.concatenate(every))
    inplace = np.zeros(4 * P, np.int64)
    inplace[4 * R:4 * R + 4] = R + 1
    ringmpi.allgather(inplace[4 * R:4 * R + 4].copy(), inplace, algorithm="ring_shm")
    assert np.array_equal(inplace, np.repeat(np.arange(1, P + 1), 4))
    for root in range(P):
        for segments in (1, 3):
            b = np.arange(1001.0) * (root + 1) if R == root else np.zeros(1001)
            ringmpi.broadcast(b, root, algorithm="pipeline_shm", segments=segments)
            assert np.array_equal(b, np.arange(1001.0) * (root + 1))


def test_shared_arrays_are_sent_and_filled_without_a_copy(rng):
    n = 1 << 18
    a = ringmpi.shared_empty(n, np.float32)
    out = ringmpi.shared_empty((n // 4, 4), np.float32)
    assert a.shape == (n,) and out.shape == (n // 4, 4)
    a[:] = make_data(rng, "float32", n, "SUM")
    ref = ringmpi.allreduce(a, algorithm="ring")
    s = group().shared()
    before = s.counters.bytes_copied
    ringmpi.allreduce(a, out, algorithm="ring_shm")
    assert s.counters.bytes_copied == before          # nothing staged, nothing copied out
    assert out.ravel().tobytes() == ref.tobytes()
    plain = a.copy()
    ringmpi.allreduce(plain, algorithm="ring_shm")
    if not s.cross_memory:
        assert s.counters.bytes_copied > before       # a numpy array is staged (read across otherwise)


def test_the_ring_in_parts_gives_the_rings_bits(rng, monkeypatch):
    """schedules.shm runs the ring on one part of every block at a time; parts of any size
    (here 40 and 64 bytes: many parts, a short last one, blocks one element apart) leave
    every element in its block's ring order: the ring's bits, for all-reduce (in place
    too) and reduce-scatter with uneven counts, and MPI's values for all-gather."""
    from ringmpi.schedules import shm as schedule
    for part in (40, 64):
        monkeypatch.setattr(schedule, "PART", part)
        for n in (1, 7 * P + 3, 1000):
            x = make_data(rng, "float32", n, "SUM")
            ring = ringmpi.allreduce(x, algorithm="ring")
            assert ringmpi.allreduce(x, algorithm="ring_shm").tobytes() == ring.tobytes(), (part, n)
            y = x.copy()
            ringmpi.allreduce(y, y, algorithm="ring_shm")
            assert y.tobytes() == ring.tobytes(), (part, n)
            counts = [(q * 5 + n) % 7 + 1 for q in range(P)]
            z = make_data(rng, "float64", sum(counts), "SUM")
            assert ringmpi.reduce_scatter(z, algorithm="ring_shm", counts=counts).tobytes() == \
                ringmpi.reduce_scatter(z, algorithm="ring", counts=counts).tobytes(), (part, n)
            mine = make_data(rng, "int32", counts[R], "SUM")
            assert np.array_equal(ringmpi.allgather(mine, algorithm="ring_shm", counts=counts),
                                  np.concatenate(COMM.allgather(mine))), (part, n)


def test_ranks_mixing_shared_and_ordinary_arrays_run_the_same_parts(rng, monkeypatch):
    """A call runs in the same parts on every rank whatever memory each rank's arrays are
    in (here rank 0's are shared, the others' ordinary), with blocks below and above the
    size from which ordinary arrays are read across: the ring's bits, and no rank waiting
    for a part that another never sends."""
    from ringmpi import shm
    monkeypatch.setattr(shm, "CMA_MIN", 1 << 16)
    for n in (1000, 3 * (1 << 16) // 4 * P + 5):   # float32 blocks below, then above CMA_MIN
        x = make_data(rng, "float32", n, "SUM")
        ring = ringmpi.allreduce(x, algorithm="ring")
        shared = ringmpi.shared_empty(n, np.float32)   # collective
        shared[:] = x
        mine = shared if R == 0 else x
        assert ringmpi.allreduce(mine, algorithm="ring_shm").tobytes() == ring.tobytes(), n
        out = ringmpi.shared_empty(n, np.float32)   # collective
        got = ringmpi.allreduce(x, out if R == 0 else np.empty_like(x), algorithm="ring_shm")
        assert got.tobytes() == ring.tobytes(), n


def test_a_block_the_arena_cannot_hold_is_read_across(rng, monkeypatch):
    """Whole blocks (the widest read across) with uneven counts: a short block is staged,
    and one between the part size and CMA_MIN that the arena cannot hold is read across
    instead of failing; the ring's bits."""
    from ringmpi.schedules import shm as schedule
    dup = COMM.Dup()
    try:
        s = group(dup).shared()
        if not s.cross_memory:
            pytest.skip("no cross-memory reads here")
        monkeypatch.setattr(schedule, "PART", 4096)
        counts = [(5 << 20) // 8, (2 << 20) // 8 + 3] + [7 + q for q in range(P - 2)]
        x = make_data(rng, "float64", sum(counts), "SUM")
        want = ringmpi.reduce_scatter(x, algorithm="ring", counts=counts, comm=dup)
        got = ringmpi.reduce_scatter(x, algorithm="ring_shm", counts=counts, comm=dup)
        assert got.tobytes() == want.tobytes() and s._arena < (2 << 20)
    finally:
        dup.Free()


@pytest.mark.parametrize("cma", ["1", "0"])
def test_ordinary_arrays_read_across_or_staged_give_the_same_bits(rng, cma):
    """RINGMPI_SHM_CMA=1 (default): blocks of ordinary arrays from CMA_MIN up are read from
    the peer's private memory (into the result, or in place into a kept buffer), nothing
    staged; below it, in parts through the arena (several parts and a remainder here);
    =0: staged through the arena. Either way the ring's bits, MPI's values, the send buffer
    untouched, for all-reduce (in place too), reduce-scatter, all-gather and broadcast."""
    import os

    from ringmpi import shm
    from ringmpi.settings import reload
    reload({**os.environ, "RINGMPI_SHM_CMA": cma})
    dup = COMM.Dup()
    try:
        s = group(dup).shared()
        if cma == "0":
            assert not s.cross_memory
        for n in (100, (3 << 20) // 4 * P + 7, shm.CMA_MIN // 4 * P + 5):
            for dtype, op in (("float32", "SUM"), ("float64", "MAX"), ("int64", "BXOR")):
                x = make_data(rng, dtype, n, op)
                keep = x.copy()
                ring = ringmpi.allreduce(x, algorithm="ring", op=op, comm=dup)
                before = s.counters.bytes_copied
                got = ringmpi.allreduce(x, algorithm="ring_shm", op=op, comm=dup)
                staged = s.counters.bytes_copied - before
                assert got.tobytes() == ring.tobytes() and np.array_equal(x, keep, equal_nan=True)
                if s.cross_memory and n * x.itemsize // P >= shm.CMA_MIN:
                    assert staged == 0, staged
                y = x.copy()
                ringmpi.allreduce(y, y, algorithm="ring_shm", op=op, comm=dup)
                assert y.tobytes() == ring.tobytes()
            x = make_data(rng, "float64", n * P, "SUM", exact=True)
            total = np.empty_like(x)
            COMM.Allreduce(x, total)
            assert np.array_equal(ringmpi.reduce_scatter(x, algorithm="ring_shm", comm=dup), np.split(total, P)[R])
            part = make_data(rng, "float32", n, "SUM")
            assert np.array_equal(ringmpi.allgather(part, algorithm="ring_shm", comm=dup),
                                  np.concatenate(COMM.allgather(part)))
            b = part.copy() if R == 1 % P else np.zeros_like(part)
            ringmpi.broadcast(b, 1 % P, algorithm="pipeline_shm", comm=dup)
            assert np.array_equal(b, COMM.bcast(part if R == 1 % P else None, 1 % P))
    finally:
        dup.Free()
        reload()


def test_the_arena_grows_to_a_part_and_nothing_is_left_in_dev_shm(rng):
    """The arena grows from its first 1 MiB to what one part of the ring stages (every
    block it publishes), not to the buffer's size."""
    from ringmpi.schedules import shm as schedule
    dup = COMM.Dup()
    for n in (10, 1 << 16, 1 << 21, 100):
        x = make_data(rng, "float64", n, "SUM", exact=True)
        ref = np.empty_like(x)
        COMM.Allreduce(x, ref)
        assert np.array_equal(ringmpi.allreduce(x, algorithm="ring_shm", comm=dup), ref)
    arena = group(dup).shared()._arena
    dup.Free()
    assert 2 * P * schedule.PART <= arena < (1 << 21) * 8, arena
    COMM.Barrier()
    assert not glob.glob("/dev/shm/ringmpi-*"), glob.glob("/dev/shm/ringmpi-*")


def test_requests_take_the_transport_in_start_order(rng):
    """ring_shm and pipeline_shm as requests: several in flight, a blocking ring_shm call
    between them (it waits until the queue is empty), a start whose broadcast needs a larger
    arena (grown at the start, once the calls before it are done), completed in an order
    that differs by rank; then one completed by the progress thread while the caller
    computes. Integer-valued data: every order of summation gives MPI's own result."""
    from ringmpi import requests, settings
    xs = [rng.integers(-50, 50, n).astype(np.float64) for n in (10, 1000, 70_000, 7)]
    refs = [np.empty_like(x) for x in xs]
    for x, ref in zip(xs, refs):
        COMM.Allreduce(x, ref)
    big = rng.integers(-50, 50, 3 << 17).astype(np.float64)      # (3 MiB: parts, several rounds each)
    big_ref = np.empty_like(big)
    COMM.Allreduce(big, big_ref)
    grow = group().shared_memory().arena // 8 + 1000        # (the same on every rank)
    b = np.arange(grow, dtype=np.float64) * (R == 0)
    reqs = [ringmpi.iallreduce(xs[0], algorithm="ring_shm"), ringmpi.iallreduce(xs[1], algorithm="ring_shm")]
    between = ringmpi.allreduce(xs[3], algorithm="ring_shm")
    reqs += [ringmpi.ibroadcast(b, 0, algorithm="pipeline_shm"), ringmpi.iallreduce(xs[2], algorithm="ring_shm"),
             ringmpi.iallreduce(xs[0], algorithm="ring")]
    outs = ringmpi.waitall(reqs[::-1] if R % 2 else reqs)
    outs = outs[::-1] if R % 2 else outs
    assert group().shared_memory().arena >= grow * 8
    assert np.array_equal(between, refs[3])
    for got, ref in zip([outs[0], outs[1], outs[3], outs[4]], [refs[0], refs[1], refs[2], refs[0]]):
        assert np.array_equal(got, ref)
    assert np.array_equal(outs[2], np.arange(grow, dtype=np.float64))
    assert not group().shared_memory().queue
    settings.reload({"RINGMPI_PROGRESS": "thread"})
    try:
        q = ringmpi.iallreduce(xs[2], algorithm="ring_shm")
        a = np.random.default_rng(R).standard_normal((300, 300))
        deadline = time.monotonic() + 60
        while not q.done and time.monotonic() < deadline:
            a = np.tanh(a @ a.T / 300)
        done = q.done
        assert np.array_equal(q.wait(), refs[2])
        if group().wire:
            assert COMM.allreduce(done, op=MPI.LAND), "the progress thread did not complete the request meanwhile"
        # a request begun on this thread (test()) that the progress thread's next one waits
        # behind: waiting for the second keeps the first moving
        time.sleep(0.02 * (R % 2))
        first = ringmpi.iallreduce(big, algorithm="ring_shm")
        first.test()
        second = ringmpi.iallreduce(xs[2], algorithm="ring_shm")
        time.sleep(0.05)
        assert np.array_equal(second.wait(), refs[2])
        assert np.array_equal(first.wait(), big_ref)
    finally:
        settings.reload({})
    assert not requests.ACTIVE


def test_a_freed_communicator_releases_its_segments():
    for _ in range(3):
        dup = COMM.Dup()
        x = np.full(1000, R + 1.0)
        assert np.all(ringmpi.allreduce(x, comm=dup, algorithm="ring_shm") == P * (P + 1) / 2)
        s = group(dup).shared()
        dup.Free()
        assert s.segments == [] and all(not segs for segs in s.peers)


def test_auto_may_choose_it_and_errors_are_clear():
    assert "ring_shm" in ringmpi.algorithms("allreduce") and "pipeline_shm" in ringmpi.algorithms("broadcast")
    with pytest.raises(ringmpi.RingmpiUsageError, match="shared_empty.*shape must hold non-negative"):
        ringmpi.shared_empty((-1,))


def test_segments_of_dead_shared_arrays_are_unmapped_everywhere():
    s = group().shared()
    for i in range(6):
        a = ringmpi.shared_empty(1 << 16, np.float64)
        a[:] = R + i
        assert np.all(ringmpi.allreduce(a, algorithm="ring_shm") == sum(range(P)) + P * i)
        del a
    live = [seg for seg in s.segments if seg is not None]
    assert len(live) <= 2, len(live)      # the arena and the last array: the others were collected
    assert all(sum(x is not None for x in segs) <= 2 for segs in s.peers)


def test_bench_with_registered_buffers(tmp_path):
    from ringmpi.tools.cli import main
    out = tmp_path / "rows.json" if R == 0 else None
    rc = main(["bench", "-R", "1", "-C", "allreduce,broadcast", "-A", "ring_shm,pipeline_shm,ring", "-b", "1K",
               "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "--rounds", "1", "--no-progress", "--quiet",
               *(["-J", str(out)] if out else [])])
    assert COMM.allgather(rc) == [0] * P
    if R == 0:
        import json
        rows = json.loads(out.read_text())["rows"]
        assert {r["algorithm"] for r in rows} >= {"ring_shm", "pipeline_shm", "mpi"}
        assert all(r["wrong"] == 0 for r in rows)
