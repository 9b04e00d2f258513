"""One test body over every (collective, algorithm) x dtype x op x count x in place x
backend (numpy, the fake device), run blocking, as requests (all counts in flight at once,
completed in reverse order or by polling `test()`), and persistent (bound once, started
three times), against the specs' own exact results (`expected`) on random per-rank data
that every summation order reduces exactly. Then what requests add: MPI's rules (order of
starts, any order of completion), mixing with blocking calls, errors, and the drop-in."""
from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import make_data, valid_ops
from mpi4py import MPI

import ringmpi
from ringmpi import comm as dropin
from ringmpi import requests, settings
from ringmpi.collectives import SPECS
from ringmpi.device import FakeDeviceArray
from ringmpi.errors import RingmpiUsageError

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
COUNTS = sorted({0, 1, max(P - 1, 0), P, 7 * P + 3})
HOST_ONLY = {"ring_shm", "pipeline_shm", "hierarchical", "hierarchical_oneway"}
BLOCKING_ONLY = {"hierarchical", "hierarchical_oneway"}
DTYPES = {True: ["int32", "float64"], False: ["int16", "complex64"]}   # reducing collectives or not
ROOT = P - 1


def cases():
    for name in SPECS:
        for alg in [*ringmpi.algorithms(name, COMM), "auto"]:
            for backend in ("numpy", "device"):
                if backend == "device" and alg in HOST_ONLY:
                    continue
                yield name, alg, backend


def calls(spec, dtype, op, rng):
    """(label, call, every rank's input) for every count, in place and out of place."""
    for n in COUNTS:
        per = n * P if spec.name in ("reduce_scatter", "alltoall") else n
        xs = [make_data(np.random.default_rng([int(rng.integers(1 << 30)), q]), dtype, per, op or "SUM", exact=True)
              for q in range(P)]
        xs = COMM.bcast(xs, 0)
        for inplace in ([False, True] if spec.has_out_of_place else [True]):
            yield f"n={n} inplace={inplace}", spec.make(R, P, xs[R], op=op, root=ROOT, inplace=inplace), xs


def arguments(spec, call, backend):
    """The public function's arguments for `call`, on device arrays for the device backend
    (the same object wherever the call passes one buffer twice: in place)."""
    args = spec.args(call)
    if backend == "numpy":
        return args
    made = {}
    for k, v in args.items():
        if isinstance(v, np.ndarray):
            made.setdefault(id(v), FakeDeviceArray.from_host(v))
            args[k] = made[id(v)]
    return args


def host(out):
    return None if out is None else out.get() if isinstance(out, FakeDeviceArray) else np.asarray(out)


@pytest.mark.parametrize("collective,algorithm,backend", list(cases()))
@pytest.mark.parametrize("mode", ["blocking", "requests", "persistent"])
def test_every_call(collective, algorithm, backend, mode, rng):
    spec = SPECS[collective]
    blocking = getattr(ringmpi, collective)
    start = getattr(ringmpi, "i" + collective)
    bind = getattr(ringmpi, collective + "_init")
    if mode != "blocking" and algorithm in BLOCKING_ONLY and P > 1:
        x = np.zeros(P, "int32")
        with pytest.raises(RingmpiUsageError, match="runs blocking calls only"):
            (start if mode == "requests" else bind)(x, algorithm=algorithm)
        return
    for dtype in DTYPES[spec.reduces]:
        for op in valid_ops(dtype) if spec.reduces else [None]:
            todo = list(calls(spec, dtype, op, rng))
            outs = {}
            if mode == "blocking":
                for what, call, _ in todo:
                    outs[what] = blocking(**arguments(spec, call, backend), algorithm=algorithm)
            elif mode == "requests":      # every count in flight at once; completed backwards, or polled
                reqs = [(what, start(**arguments(spec, call, backend), algorithm=algorithm))
                        for what, call, _ in todo]
                if rng.integers(2):
                    for what, q in reversed(reqs):
                        outs[what] = q.wait()
                else:
                    while not all(q.test() for _, q in reqs):
                        pass
                    outs.update((what, q.wait()) for what, q in reqs)
            else:   # (in place, each start reduces what the buffer holds: the input, restored)
                for what, call, _ in todo:
                    args = arguments(spec, call, backend)
                    send = args[spec.send_arg]
                    first = host(send).copy()
                    with bind(**args, algorithm=algorithm) as bound:
                        for _ in range(3):
                            (send._a if backend == "device" else send)[...] = first
                            outs[what] = bound.start().wait()
            for what, _, xs in todo:
                expected = spec.expected(xs, R, op=op, root=ROOT)
                got = host(outs[what])
                label = f"{collective}/{algorithm} {backend} {mode} {dtype} {op} {what}"
                if expected is None or (collective == "reduce" and R != ROOT):
                    assert got is None, label + ": a result off the root"
                    continue
                assert got is not None and got.reshape(-1).tobytes() == expected.tobytes(), \
                    f"{label}: {got} != {expected}"


def test_requests_overlap_with_blocking_calls_and_each_other(rng):
    """Requests on two communicators and blocking calls between them, started in the same
    order everywhere and completed in an order that differs by rank."""
    other = COMM.Dup()
    try:
        x = rng.standard_normal(1000)
        ref = np.empty_like(x)
        COMM.Allreduce(x, ref)
        a = ringmpi.iallreduce(x, algorithm="ring")
        b = ringmpi.iallreduce(x, comm=other, algorithm="recursive_doubling")
        c = ringmpi.allreduce(x, algorithm="tree")           # blocking, with two in flight
        d = ringmpi.ibroadcast(np.arange(5.0) * (R + 1), root=0, comm=other)
        first, second = (a, b) if R % 2 else (b, a)
        for out in (first.wait(), second.wait(), c):
            assert np.allclose(out, ref)
        assert np.array_equal(d.wait(), np.arange(5.0))
        assert ringmpi.waitall([]) == []
        reqs = [ringmpi.iallgather(np.array([R, q])) for q in range(4)]
        for q, out in enumerate(ringmpi.waitall(reqs[::-1])[::-1]):
            assert np.array_equal(out.reshape(P, 2), np.array([[r, q] for r in range(P)]))
        assert ringmpi.testall(reqs)
    finally:
        other.Free()


@pytest.mark.parametrize("progress, count, thread_was", [("thread", 1 << 16, "asleep"), ("thread", 1 << 16, "napping"),
                                                      ("thread", 64, "asleep"), ("thread", 64, "napping"),
                                                      ("calls", 1 << 16, None)])
def test_progress_while_the_caller_computes(progress, count, thread_was):
    """A request started, then numpy work that never calls ringmpi, then the wait: the result
    is MPI's, and with the progress thread the request completes while the caller computes,
    on every rank (the numpy work releases the GIL; no time bound but a generous one: four
    oversubscribed ranks over TCP are slow). Whatever the thread was doing at the start:
    asleep (a start wakes it), or napping after its last request (a large request wakes it,
    a small one is found at the nap's end: `requests.Engine._loop`)."""
    settings.reload({"RINGMPI_PROGRESS": progress})
    try:
        x = np.full(count, float(R + 1))
        if progress == "thread":
            ringmpi.iallreduce(x, algorithm="ring").wait()
            eng = requests.engine()
            threaded = eng.thread is not None    # (one rank: nothing went to the thread)
            deadline = time.monotonic() + 10
            while thread_was == "asleep" and threaded and not eng.deep and time.monotonic() < deadline:
                time.sleep(requests.LONG_NAP)
            assert eng.deep or not threaded or thread_was == "napping", \
                "the progress thread still awake 10 s after its last request"
        q = ringmpi.iallreduce(x, algorithm="ring")
        a = np.random.default_rng(R).standard_normal((300, 300))
        deadline = time.monotonic() + (60 if progress == "thread" else 0.2)
        while not q.done and time.monotonic() < deadline:
            a = np.tanh(a @ a.T / 300)
        done = q.done
        if progress == "calls":
            ringmpi.progress()
        assert np.array_equal(q.wait(), np.full(count, P * (P + 1) / 2))
        if progress == "thread" and P > 1 and ringmpi.api.group().wire:
            assert COMM.allreduce(done, op=MPI.LAND), "the progress thread did not complete the request meanwhile"
    finally:
        settings.reload({})


@pytest.mark.parametrize("between", ["blocking call", "test of another request"])
def test_a_request_moves_on_while_its_caller_blocks_outside_ringmpi(between, rng):
    """MPI's progress rule across ranks: rank 0 starts a request, makes a ringmpi call (a
    blocking collective, or a test of another request), then blocks in a plain mpi4py
    receive that rank 1 sends only once its own wait for the request returned. Rank 0's
    request must complete meanwhile, as MPI's own Iallreduce would (with a body begun by
    the caller's thread there, it stood still and the job hung). The ringmpi call comes
    right after the start (its plan made beforehand), before the progress thread's GRACE,
    and the request is too small to wake a napping thread."""
    if P < 2 or not ringmpi.api.group().wire:
        pytest.skip("needs two ranks on MPI")
    x = rng.standard_normal(1 << 14)
    ref = np.empty_like(x)
    COMM.Allreduce(x, ref)
    ringmpi.allreduce(np.ones(2))
    q = ringmpi.iallreduce(x, algorithm="ring")
    if between == "blocking call":
        ringmpi.allreduce(np.ones(2))
    else:
        other = ringmpi.iallreduce(np.ones(2), algorithm="ring")
        other.test()
        other.wait()
    token = np.zeros(1)
    if R == 0:
        time.sleep(0.05)                     # (computes: the request must not wait for it)
        COMM.Recv(token, source=1, tag=77)
        out = q.wait()
    else:
        out = q.wait()
        if R == 1:
            COMM.Send(np.ones(1), dest=0, tag=77)
    assert np.allclose(out, ref)
    if R == 0:
        assert token[0] == 1.0


SCHEDULE_ALGORITHMS = {"allreduce": ["ring", "recursive_doubling", "tree", "auto", "mpi"],
                       "allgather": ["ring", "recursive_doubling", "auto"],
                       "broadcast": ["pipeline", "tree", "auto"],
                       "alltoall": ["auto"], "reduce_scatter": ["ring", "auto"]}


@pytest.mark.parametrize("seed", range(6))
def test_random_schedules_of_starts_tests_waits_and_blocking_calls(seed):
    """Random programs: the same collectives started, and blocking calls made between them,
    in one order on every rank (MPI's rule), and each rank completing its requests in an
    order of its own, some by polling `test()` a random number of times first, some with
    `waitall`, some beside the next starts (the engine's ownership rules: a test takes only
    its request, a blocking call leaves the rest to the progress thread). Every result is
    MPI's own collective's on the same data (integer-valued floats: exact in any order)."""
    shared = np.random.default_rng([seed, 99])             # the program: the same on every rank
    mine = np.random.default_rng([seed, R])                # the order of completion: per rank
    x_of = lambda n: np.random.default_rng([seed, n, R]).integers(-9, 9, n).astype(np.float64)   # noqa: E731
    open_, checks = [], []

    def expect(name, x):
        if name == "allreduce":
            ref = np.empty_like(x)
            COMM.Allreduce(x, ref)
        elif name == "allgather":
            ref = np.empty(x.size * P)
            COMM.Allgather(x, ref)
        elif name == "broadcast":
            ref = COMM.bcast(x, root=ROOT)
        elif name == "alltoall":
            ref = np.empty_like(x)
            COMM.Alltoall(x, ref)
        else:
            ref = np.empty(x.size // P)
            COMM.Reduce_scatter_block(x, ref)
        return ref

    for step in range(int(shared.integers(6, 12))):
        name = str(shared.choice(list(SCHEDULE_ALGORITHMS)))
        alg = str(shared.choice(SCHEDULE_ALGORITHMS[name]))
        n = int(shared.choice([1, 7, 1000, 1 << 15])) * (P if name in ("alltoall", "reduce_scatter") else 1)
        x = x_of(n + step)[:n]
        ref = expect(name, x)
        args = (x,) if name != "broadcast" else (x.copy(),)
        kw = {"root": ROOT} if name == "broadcast" else {}
        if shared.random() < 0.3:                      # a blocking call between the starts
            checks.append((f"step {step} blocking {name}/{alg}", getattr(ringmpi, name)(*args, algorithm=alg, **kw), ref))
            continue
        open_.append((f"step {step} i{name}/{alg} n={n}", getattr(ringmpi, "i" + name)(*args, algorithm=alg, **kw), ref))
        if open_ and mine.random() < 0.4:              # this rank completes one now, in its own order
            what, q, ref_ = open_.pop(int(mine.integers(len(open_))))
            for _ in range(int(mine.integers(0, 4))):
                q.test()
            checks.append((what, q.wait(), ref_))
    mine.shuffle(open_)
    half = len(open_) // 2
    for what, out in zip([w for w, _, _ in open_[:half]], ringmpi.waitall([q for _, q, _ in open_[:half]])):
        checks.append((what, out, dict((w, r) for w, _, r in open_)[what]))
    for what, q, ref in open_[half:]:
        while not q.test():
            pass
        checks.append((what, q.wait(), ref))
    for what, out, ref in checks:
        assert np.array_equal(np.asarray(out).reshape(-1), np.asarray(ref).reshape(-1)), f"{what}: {out} != {ref}"


def test_errors_are_raised_at_the_start_and_never_disturb_the_next_call(rng):
    x = rng.standard_normal(10)
    with pytest.raises(RingmpiUsageError, match=r"ringmpi\.iallreduce \(rank \d+ of \d+\).*dtype"):
        ringmpi.iallreduce(x.astype(np.longdouble))
    with pytest.raises(RingmpiUsageError, match=r"ringmpi\.allreduce_init .*unknown algorithm"):
        ringmpi.allreduce_init(x, algorithm="nope")
    with pytest.raises(TypeError, match=r"ringmpi\.ibroadcast\(\) got an unexpected keyword"):
        ringmpi.ibroadcast(x, bogus=1)
    if P > 1:
        with pytest.raises(RingmpiUsageError, match="blocking calls only"):
            ringmpi.iallreduce(x, algorithm="hierarchical")
    ref = np.empty_like(x)
    COMM.Allreduce(x, ref)
    assert np.allclose(ringmpi.iallreduce(x).wait(), ref)


def test_a_rank_with_a_bad_buffer_stands_in_and_the_others_get_the_result(rng):
    """Without RINGMPI_CHECK, a read-only result buffer on one rank: that rank raises at the
    start, the others' request completes with the right sum (its stand-in took part)."""
    x = np.full(64, float(R + 1))
    out = np.empty(64)
    if R == 0:
        out.flags.writeable = False
    if R == 0:
        with pytest.raises(RingmpiUsageError, match="read-only"):
            ringmpi.iallreduce(x, out, algorithm="ring")
    else:
        assert np.array_equal(ringmpi.iallreduce(x, out, algorithm="ring").wait(), np.full(64, P * (P + 1) / 2))
    assert np.array_equal(ringmpi.allreduce(x, algorithm="ring"), np.full(64, P * (P + 1) / 2))


def test_a_test_never_blocks_after_a_start_that_ran_on_its_waiters_stack(monkeypatch):
    """A persistent request whose last call ran on its waiter's stack (a wait at once:
    blocking messages) starts again as any request: its next call's messages are posted, so
    a `test()` before the peers have started returns at once (it once waited in a blocking
    MPI_Sendrecv for the last rank, which starts a second later)."""
    monkeypatch.setattr(requests, "GRACE", 30.0)   # (the caller's test, not the progress thread, runs it)
    x, y = np.full(4096, float(R + 1)), np.empty(4096)
    bound = ringmpi.allreduce_init(x, y, algorithm="ring")
    bound.start().wait()
    COMM.Barrier()
    if R == P - 1:
        time.sleep(1.0)
    bound.start()
    t0 = time.monotonic()
    bound.test()
    took = time.monotonic() - t0
    assert np.array_equal(bound.wait(), np.full(4096, P * (P + 1) / 2))
    bound.free()
    assert R == P - 1 or P == 1 or took < 0.5, f"test() took {took:.2f} s"


@pytest.mark.parametrize("algorithm", ["mpi", "ring"])
def test_a_persistent_request_polled_by_test_then_waited(algorithm):
    """`test()` says True or False (never the result, whose truth an array refuses), and a
    wait after a test that found the call complete returns its result, AVG's division done
    once; MPI's own persistent call (where it serves) and ringmpi's."""
    x, y = np.full(4, float(R + 1)), np.empty(4)
    with ringmpi.allreduce_init(x, y, op="avg", algorithm=algorithm) as bound:
        for _ in range(3):
            bound.start()
            while True:
                done = bound.test()
                assert done is True or done is False
                if done:
                    break
            assert np.array_equal(bound.wait(), np.full(4, (P + 1) / 2))
            assert np.array_equal(bound.wait(), np.full(4, (P + 1) / 2))   # (a second wait: the same)


def test_persistent_rules():
    x = np.ones(8)
    bound = ringmpi.allreduce_init(x, np.empty(8))
    assert bound.wait() is None            # never started
    bound.start()
    with pytest.raises(ValueError, match="started again"):
        bound.start()
    assert np.array_equal(bound.wait(), np.full(8, float(P)))
    bound.free()
    with pytest.raises(ValueError, match="freed"):
        bound.start()


def test_drop_in_requests_mix_with_mpi4pys_in_waitall(rng):
    """ringmpi.Comm's Iallreduce returns an MPI request: MPI.Request.Waitall over it and
    mpi4py's own completes both (ringmpi's progress thread completes the generalized request)."""
    comm = ringmpi.Comm(COMM, allreduce="ring")
    x = rng.standard_normal(100)
    y, z = np.empty_like(x), np.empty_like(x)
    ours = comm.Iallreduce(x, y, op=MPI.SUM)
    theirs = COMM.Iallreduce(x, z, op=MPI.SUM)
    assert isinstance(ours, MPI.Request)
    MPI.Request.Waitall([ours, theirs])
    assert np.allclose(y, z)
    bound = comm.Allreduce_init(x, y)
    for _ in range(2):
        bound.Start()
        bound.Wait()
        assert np.allclose(y, z)
    bound.Free()
    buf = np.arange(6.0) if R == 0 else np.zeros(6)
    comm.Ibcast(buf, root=0).Wait()
    assert np.array_equal(buf, np.arange(6.0))
    for form in ("nonblocking", "persistent"):   # MPI's in place: this rank's block goes to the front
        full = np.arange(2.0 * P) + R
        want = sum(np.arange(2.0 * P) + q for q in range(P))[2 * R:2 * R + 2]
        if form == "nonblocking":
            comm.Ireduce_scatter_block(MPI.IN_PLACE, full, op=MPI.SUM).Wait()
        else:
            bound = comm.Reduce_scatter_block_init(MPI.IN_PLACE, full, op=MPI.SUM)
            bound.Start()
            bound.Wait()
            bound.Free()
        assert np.array_equal(full[:2], want), (form, full, want)



@pytest.mark.parametrize("algorithm", ["mpi", "ring"])
def test_drop_in_persistent_calls_complete_in_mpi_s_waits(algorithm, rng):
    """The drop-in's `Allreduce_init` and the like, served by MPI's own persistent
    collective (then what it returns is that MPI request) or by ringmpi's algorithm (each
    start a generalized request the object holds): MPI.Request.Waitall over them beside
    mpi4py's own persistent and nonblocking requests, and polling their Test, complete
    their calls. Before, a ringmpi request behind them was a null request to Waitall, which
    returned before the call was done. MPI.Prequest.Startall starts MPI's own and refuses
    ringmpi's (MPI has no persistent generalized request)."""
    x, b, part = rng.standard_normal(30000), np.zeros(7), rng.standard_normal(3)
    y, z, g, w = np.empty_like(x), np.empty_like(x), np.empty(3 * P), np.empty(3 * P)
    try:
        theirs = [COMM.Allreduce_init(x, z, op=MPI.SUM)]
    except NotImplementedError:   # (an MPI without persistent collectives, Open MPI 4: ringmpi's serve them all)
        theirs = []
    mpi4 = bool(theirs)
    mpi = algorithm == "mpi" and P > 1 and mpi4
    comm = ringmpi.Comm(COMM, allreduce=algorithm, broadcast="mpi" if mpi else "pipeline", allgather=algorithm)
    ours = [comm.Allreduce_init(x, y, op=MPI.SUM), comm.Bcast_init(b, root=ROOT), comm.Allgather_init(part, g)]
    assert all(isinstance(q, dropin._MPIPersistent if mpi else dropin._Persistent) for q in ours), ours
    if not mpi:
        with pytest.raises(MPI.Exception):
            MPI.Prequest.Startall(ours[:1])
    for i in range(4):
        x[:] = rng.integers(-1000, 1000, x.size)   # (exact sums in any order)
        part[:] = rng.standard_normal(3)
        if R == ROOT:
            b[:] = i + 1
        if not mpi4:
            COMM.Allreduce(x, z)
        if mpi and i % 2 == 0:
            MPI.Prequest.Startall([*ours, *theirs])
        else:
            for q in [*ours, *theirs]:
                q.Start()
        if i % 2 == 0:
            plain = COMM.Iallgather(part, w)
            MPI.Request.Waitall([plain, *reversed(ours), *theirs])
        else:
            COMM.Allgather(part, w)
            pending = [*ours, *theirs]
            while pending:
                pending = [q for q in pending if not q.Test()]
        assert np.array_equal(y, z) and np.all(b == i + 1) and np.array_equal(g, w), i
    for q in [*ours, *theirs]:
        q.Free()
        assert q == MPI.REQUEST_NULL


def test_drop_in_calls_on_the_same_arrays_reuse_their_request(rng):
    """The drop-in's nonblocking calls on the very same arrays start the kept request
    again (as `ringmpi.iallreduce` does): each call's generalized request is completed by
    its own call, in MPI.Request.Waitall as in its own Wait; in-place reduce-scatter moves
    each call's block; a change of op is a call of its own."""
    comm = ringmpi.Comm(COMM, allreduce="ring")
    x, y, z = np.empty(100), np.empty(100), np.empty(100)
    full = np.empty(2 * P)
    rings = []
    for i in range(4):
        x[:] = rng.integers(-9, 9, 100)
        y[:] = z[:] = np.nan
        ours = comm.Iallreduce(x, y, op=MPI.SUM if i % 2 else MPI.MAX)
        theirs = COMM.Iallreduce(x, z, op=MPI.SUM if i % 2 else MPI.MAX)
        rings.append((i % 2, ours._ring.source))
        if i < 2:
            MPI.Request.Waitall([ours, theirs])
        else:
            ours.Wait()
            theirs.Wait()
        assert np.array_equal(y, z), i
        full[:] = np.arange(2.0 * P) + R + i
        comm.Ireduce_scatter_block(MPI.IN_PLACE, full, op=MPI.SUM).Wait()
        assert np.array_equal(full[:2], sum(np.arange(2.0 * P) + q + i for q in range(P))[2 * R:2 * R + 2]), i
    assert rings[0][1] is rings[2][1] and rings[1][1] is rings[3][1] and rings[0][1] is not rings[1][1]

@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_calls_on_the_same_arrays_reuse_the_request_and_stay_correct(rng, algorithm):
    """A loop of requests on the very same arrays (kept and started again: `RequestMemo`;
    MPI's own posted again as it was: `api._Bound.relaunch`), with the data changing
    between calls; two in flight on the same send buffer (each with its own result: two
    calls in flight may not write one buffer); AVG's division after each; a result buffer
    made read-only; in place; a change of op; a broadcast."""
    x, y, z, v = np.empty(300), np.empty(300), np.empty(300), np.empty(300)
    bound = []
    for i in range(6):
        x[:] = rng.integers(-9, 9, 300)
        ref = np.empty(300)
        COMM.Allreduce(x, ref)
        q = ringmpi.iallreduce(x, y, algorithm=algorithm)
        q2 = ringmpi.iallreduce(x, z, algorithm=algorithm)
        bound.append(q.source)
        assert np.array_equal(q.wait(), ref) and np.array_equal(q2.wait(), ref)
        assert np.allclose(ringmpi.iallreduce(x, v, op="avg", algorithm=algorithm).wait(), ref / P, rtol=1e-15)
        w = x.copy()
        assert np.array_equal(ringmpi.iallreduce(w, w, op="max", algorithm=algorithm).wait(),
                              np.maximum.reduce(COMM.allgather(x)))
        b = np.arange(4.0) + i if R == 0 else np.zeros(4)
        assert np.array_equal(ringmpi.ibroadcast(b).wait(), np.arange(4.0) + i)
    assert len({id(b) for b in bound}) == 1, "the request on the same arrays was not started again"
    y.flags.writeable = False
    with pytest.raises(RingmpiUsageError, match="read-only"):
        ringmpi.iallreduce(x, y, algorithm=algorithm)
    y.flags.writeable = True
    assert np.array_equal(ringmpi.iallreduce(x, y, algorithm=algorithm).wait(), ref)


def test_the_kept_request_is_found_by_the_very_arguments(rng):
    """The memo finds a kept call by the identity of the arguments as passed: the buffers
    swapped, by keyword, another op from the same call site, and a new array that takes a
    dead one's id each get their own call, and the right result."""
    x, y = rng.integers(-9, 9, 64).astype(float), np.empty(64)
    every = np.array(COMM.allgather(x))
    for op in ("sum", "max", "min", "sum"):
        want = {"sum": every.sum(0), "max": every.max(0), "min": every.min(0)}[op]
        for _ in range(2):
            y[:] = np.nan
            assert np.array_equal(ringmpi.iallreduce(x, y, op=op).wait(), want), op
            y[:] = np.nan
            assert np.array_equal(ringmpi.iallreduce(sendbuf=x, recvbuf=y, op=op).wait(), want), op
    z = np.empty(64)
    ringmpi.iallreduce(x, z).wait()
    z[:] = x + R
    assert np.array_equal(ringmpi.iallreduce(z, x).wait(), sum(every[r] + r for r in range(P)))
    for i in range(4):   # a new array each time, often where the last one was
        a, b = np.full(64, float(i + R)), np.empty(64)
        assert np.array_equal(ringmpi.iallreduce(a, b).wait(), np.full(64, float(P * i + P * (P - 1) // 2)))
        del a, b


def test_requests_keep_no_user_array_alive():
    """Once waited for (or found complete by test()), a request, the one kept for the next
    call on the same arrays, the engine and its idle workers hold none of the caller's
    arrays."""
    import gc
    import weakref
    refs = []
    for alg in ("auto", "ring", "mpi"):
        x, y = np.ones(1000), np.empty(1000)
        for _ in range(3):
            ringmpi.iallreduce(x, y, algorithm=alg).wait()
        q = ringmpi.iallreduce(x, y, algorithm=alg)
        while not q.test():
            pass
        refs += [weakref.ref(x), weakref.ref(y)]
        del x, y, q
    gc.collect()
    assert not [r for r in refs if r() is not None], "a request kept a user array alive"
