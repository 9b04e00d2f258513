"""Device buffers without a GPU: `FakeDeviceArray` (host memory seen only through
`__cuda_array_interface__`, no buffer protocol) through every collective and algorithm,
staged through the host in chunks (the default with the PyPI wheels, which are not
CUDA-aware) and straight to MPI (RINGMPI_CUDA_AWARE=1, which the stand-in allows because
its memory is the host's). References: the same call on numpy arrays, which the other test
files check against MPI's own collective (bitwise: the device backend reduces with the same
operations), and MPI's own all-reduce directly."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi
from ringmpi import mpicomm, settings
from ringmpi.api import group
from ringmpi.device import FakeDeviceArray, OpaqueFakeDeviceArray, chunk_bytes, cai_span
from ringmpi.errors import RingmpiUsageError

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
HOST_ONLY = {"ring_shm", "pipeline_shm", "hierarchical", "hierarchical_oneway"}


@pytest.fixture(params=["staged", "staged-small-chunks", "aware"])
def mode(request):
    env = {"staged": {}, "staged-small-chunks": {"RINGMPI_STAGE_CHUNK": "96"},
           "aware": {"RINGMPI_CUDA_AWARE": "1"}}[request.param]
    settings.reload(env)
    yield request.param
    settings.reload({})


def dev(x: np.ndarray) -> FakeDeviceArray:
    return FakeDeviceArray.from_host(x)


def staged_bytes() -> int:
    g = group(None).devices.get("fake-device")
    return g.staged_bytes if g is not None else 0


def algs(collective: str) -> list[str]:
    return [a for a in ringmpi.algorithms(collective) if a not in HOST_ONLY] + ["auto"]


def data(n: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, R])
    return (rng.standard_normal(n) * 100).astype(dtype) if np.dtype(dtype).kind == "f" else \
        rng.integers(-1000, 1000, n).astype(dtype)


CASES = {
    "allreduce": lambda x, algorithm, inplace: ringmpi.allreduce(x, x if inplace else None, algorithm=algorithm),
    "reduce_scatter": lambda x, algorithm, inplace: ringmpi.reduce_scatter(x, x if inplace else None,
                                                                           algorithm=algorithm),
    "allgather": lambda x, algorithm, inplace: ringmpi.allgather(x, algorithm=algorithm),
    "broadcast": lambda x, algorithm, inplace: ringmpi.broadcast(x, root=P - 1, algorithm=algorithm),
    "reduce": lambda x, algorithm, inplace: ringmpi.reduce(x, root=P // 2, algorithm=algorithm),
    "alltoall": lambda x, algorithm, inplace: ringmpi.alltoall(x, algorithm=algorithm),
}


@pytest.mark.parametrize("collective", list(CASES))
@pytest.mark.parametrize("count", [0, 1, 7 * P + 3, 1000 * P + 1])
def test_every_algorithm_on_device_buffers_equals_the_host_call(mode, collective, count):
    if collective == "alltoall":
        count -= count % P
    run = CASES[collective]
    for dtype in ("float64", "int32"):
        for inplace in ((False, True) if collective in ("allreduce", "reduce_scatter") else (False,)):
            for i, algorithm in enumerate(algs(collective)):
                x = data(count, dtype, i)
                d = dev(x)
                before = staged_bytes()
                got = run(d, algorithm, inplace)
                ran = ringmpi.last_choice()["algorithm"]       # auto's choice, on the host too
                expect = run(x.copy(), ran, inplace)
                what = f"{collective}/{algorithm} {mode} {dtype} n={count} inplace={inplace}"
                if expect is None:                 # reduce on a non-root rank
                    assert got is None, what
                else:
                    assert isinstance(got, FakeDeviceArray), f"{what}: returned {type(got)}"
                    if ran == "mpi" and dtype == "float64":   # MPI may pick another internal order
                        assert np.allclose(got.get(), expect, rtol=1e-12, atol=1e-9), f"{what}: differs from the host"
                    else:
                        assert got.get().tobytes() == np.asarray(expect).tobytes(), f"{what}: differs from the host"
                if not inplace and collective != "broadcast":
                    assert d.get().tobytes() == x.tobytes(), f"{what}: the send buffer was written"
                moved = staged_bytes() - before
                if mode == "aware":
                    assert moved == 0, f"{what}: staged although MPI reads the buffers"
                elif P > 1 and count:
                    assert moved > 0, f"{what}: nothing went through the host staging buffers"


def test_allreduce_on_device_matches_mpi_allreduce(mode):
    x = data(12345, "float64", 7)
    ref = np.empty_like(x)
    COMM.Allreduce(x, ref)
    out = ringmpi.allreduce(dev(x), algorithm="ring")
    assert np.allclose(out.get(), ref, rtol=1e-12, atol=1e-9)
    ref = COMM.bcast(out.get() if R == 0 else None, 0)
    assert out.get().tobytes() == ref.tobytes(), "not bitwise identical across ranks"


def test_uneven_blocks_in_default_chunks_are_cut_alike_by_sender_and_receiver():
    """Blocks an element apart, each staged in several chunks of the default size: every
    message is cut by its own size, the same on both ends (a chunk taken from both buffers
    of an exchange failed with MPI_ERR_TRUNCATE at 4 ranks on the H200: 262149 float64)."""
    for extra in (1, 3, 5, 7, 9, 11, 13, 17):   # (where a chunk size from both buffers parted ways: ~1 in 6)
        x = data((1 << 16) * P + extra, "float64", extra)
        for algorithm in ("ring", "rabenseifner"):
            want = ringmpi.allreduce(x, algorithm=algorithm).tobytes()
            what = f"{algorithm}, {x.size} float64"
            assert ringmpi.allreduce(dev(x), algorithm=algorithm).get().tobytes() == want, what
            assert ringmpi.iallreduce(dev(x), algorithm=algorithm).wait().get().tobytes() == want, f"{what} request"


def test_nan_propagates_through_staged_mpi_max():
    x = np.arange(8, dtype=np.float64) + R
    if R == 0:
        x[3] = np.nan
    out = ringmpi.allreduce(dev(x), op="max", algorithm="mpi").get()
    assert np.isnan(out[3]) and out[0] == P - 1


def test_recvbuf_on_device_in_place_views_and_counts():
    """A given device recvbuf is filled (and returned); uneven reduce-scatter counts."""
    x = data(5 * P + 2, "float64", 3)
    out = dev(np.zeros(x.size))
    assert ringmpi.allreduce(dev(x), out, algorithm="ring") is out
    counts = [5] * (P - 1) + [x.size - 5 * (P - 1)]
    got = ringmpi.reduce_scatter(dev(x), counts=counts, algorithm="ring").get()
    expect = ringmpi.reduce_scatter(x.copy(), counts=counts, algorithm="ring")
    assert got.tobytes() == expect.tobytes()


def test_mixed_host_and_device_buffers_are_refused_on_every_rank():
    x = np.ones(8)
    with pytest.raises(RingmpiUsageError, match=rf"ringmpi.allreduce \(rank {R} of {P}\): recvbuf is in host memory, "
                                                r"expected device memory"):
        ringmpi.allreduce(dev(x), np.empty(8))
    with pytest.raises(RingmpiUsageError, match="recvbuf is in device memory, expected host memory"):
        ringmpi.allreduce(x, dev(x))
    d = dev(np.ones(8))
    with pytest.raises(RingmpiUsageError, match="overlaps sendbuf"):
        ringmpi.allreduce(d[:4], d[2:6])
    with pytest.raises(RingmpiUsageError, match="read-only"):
        ringmpi.allreduce(d.set_readonly(), d)
    assert ringmpi.allreduce(dev(x), algorithm="ring").get()[0] == P   # a failed call disturbs nothing


def test_forcing_the_aware_path_on_memory_mpi_cannot_read_is_refused():
    """RINGMPI_CUDA_AWARE=1 with an MPI that says it cannot read device memory: a one-line
    error on every rank before any message (a real GPU buffer would be a segfault); without
    the override the same buffer is staged."""
    x = OpaqueFakeDeviceArray.from_host(np.full(10, R + 1.0))
    try:
        settings.reload({"RINGMPI_CUDA_AWARE": "1"})
        if not mpicomm.cuda_support().aware:
            with pytest.raises(RingmpiUsageError, match=rf"ringmpi.allreduce \(rank {R} of {P}\): "
                                                        r"RINGMPI_CUDA_AWARE=1, but this MPI library cannot read"):
                ringmpi.allreduce(x, algorithm="ring")
    finally:
        settings.reload({})
    out = ringmpi.allreduce(x, algorithm="ring")
    assert type(out) is OpaqueFakeDeviceArray and out.get()[0] == P * (P + 1) / 2


def test_the_wheels_say_they_cannot_read_device_memory_and_how_it_was_decided():
    s = mpicomm.cuda_support()
    assert s.aware is False, s
    assert "MPIX_Query_cuda_support() = 0" in s.how or "mpi_memory_alloc_kinds" in s.how, s
    settings.reload({"RINGMPI_CUDA_AWARE": "0"})
    try:
        assert mpicomm.cuda_support().how.startswith("RINGMPI_CUDA_AWARE=0")
    finally:
        settings.reload({})


def test_scratch_and_staging_buffers_are_kept_between_calls():
    x = dev(data(4096 * P, "float32", 1))
    ringmpi.allreduce(x, algorithm="ring")
    g = group(None).devices["fake-device"]
    hosts = [id(h) for h in g._slots]
    for _ in range(3):
        ringmpi.allreduce(x, algorithm="ring")
    assert [id(h) for h in g._slots] == hosts, "staging buffers reallocated for calls of the same size"
    assert cai_span(x)[1] - cai_span(x)[0] == x.nbytes


def test_chunk_formula_is_the_pipeline_optimum():
    """chunk_bytes minimises T(K) = (K + 2)(alpha + n/K beta) within its clamps."""
    alpha, beta = 5e-6, 1 / 25e9
    for n in (1 << 20, 16 << 20, 256 << 20):
        c = chunk_bytes(n, alpha, beta)
        t = lambda k: (k + 2) * (alpha + n / k * beta)     # noqa: E731
        best = min(t(k) for k in range(1, 4096))
        assert t(max(1, round(n / c))) <= 1.02 * best or c in (64 << 10, 16 << 20), (n, c)


def test_raw_sendrecv_splits_above_the_count_limit():
    """The CUDA-aware path hands MPI addresses (MPI_BYTE); above the C-int limit (here a
    transport whose limit is 7) a message goes in pieces that land in order."""
    t = mpicomm.MPITransport(COMM, max_count=7)
    try:
        t.begin("raw")
        send = np.arange(40, dtype=np.uint8) + R
        recv = np.zeros(40, np.uint8)
        t.sendrecv_bytes((send.ctypes.data, send.nbytes), (R + 1) % P, (recv.ctypes.data, recv.nbytes), (R - 1) % P)
        assert np.array_equal(recv, np.arange(40, dtype=np.uint8) + (R - 1) % P)
        assert t.counters.messages == 6   # 40 bytes in pieces of at most 7
        t.end()
    finally:
        t.release()


def test_auto_tunes_device_calls_apart_from_host_calls_and_keeps_plans():
    """auto on device buffers learns online like on the host, in its own tuners (keyed by
    the memory: host timings do not carry over), and repeated calls get a kept plan."""
    from ringmpi.api import PLANS
    x = data(50_000, "float32", 9)
    ref = ringmpi.allreduce(x.copy(), algorithm="mpi")
    g = group(None)
    d = dev(x)
    kept = False   # (seen after a call: a forget at the very last one, from whatever cause, leaves none)
    for _ in range(120):
        out = ringmpi.allreduce(d)
        kept = kept or any(FakeDeviceArray in k for k in PLANS if isinstance(k, tuple))
    assert np.allclose(out.get(), ref, rtol=1e-5, atol=1e-3)
    tuners = g.devices["fake-device"].tuners
    assert tuners and all(k[1].startswith("fake-device:") for k in tuners.keys())
    assert any(tu.winner is not None for tu in tuners.values()), "device tuning never settled"
    assert not any(str(k[1]).startswith("fake-device") for k in g.tuners.keys())
    assert kept, "no kept plan for device calls"
    assert COMM.allgather(ringmpi.last_choice()["algorithm"]) == [ringmpi.last_choice()["algorithm"]] * P
