"""Real GPU buffers (cupy), under mpirun on a machine with an NVIDIA GPU
(`benchmarks/gpu_check.sh`); every test skips cleanly without cupy or a device. The
stand-in device array covers the same paths on every `make test` (tests/mpi/test_device.py).
References: MPI's own collective on host copies, numpy's reduction of the same operands."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi
from ringmpi import settings

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except cp.cuda.runtime.CUDARuntimeError as e:   # no driver
    pytest.skip(f"no CUDA device ({e})", allow_module_level=True)

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
HOST_ONLY = {"ring_shm", "pipeline_shm", "hierarchical", "hierarchical_oneway"}
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


@pytest.fixture(params=["default", "small-chunks"])
def chunks(request):
    settings.reload({"RINGMPI_STAGE_CHUNK": "64K"} if request.param == "small-chunks" else {})
    yield request.param
    settings.reload({})


def algs(collective: str) -> list[str]:
    return [a for a in ringmpi.algorithms(collective) if a not in HOST_ONLY] + ["auto"]


@pytest.mark.parametrize("count", [0, 1, 7 * P + 3, (1 << 20) + 5])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_allreduce_on_gpu_matches_mpi_on_the_host(chunks, count, dtype):
    rng = np.random.default_rng([R, count])
    x = (rng.standard_normal(count) * 10).astype(dtype)
    ref = np.empty_like(x)
    COMM.Allreduce(x, ref)
    for a in algs("allreduce"):
        d = cp.asarray(x)
        out = ringmpi.allreduce(d, algorithm=a)
        assert isinstance(out, cp.ndarray) and out.dtype == x.dtype
        host = cp.asnumpy(out)
        if dtype.startswith("int"):
            assert np.array_equal(host, ref), a
        else:
            assert np.allclose(host, ref, rtol=1e-4 if dtype == "float32" else 1e-12, atol=1e-3), a
        assert cp.asnumpy(d).tobytes() == x.tobytes(), f"{a}: send buffer written"
        first = COMM.bcast(host.tobytes() if R == 0 else None, 0)
        assert host.tobytes() == first, f"{a}: not bitwise identical across ranks"
        inplace = cp.asarray(x)
        assert ringmpi.allreduce(inplace, inplace, algorithm=a) is inplace
        got = cp.asnumpy(inplace)
        if a in ("auto", "mpi") and not dtype.startswith("int"):   # MPI's own may sum in another order in place
            assert np.allclose(got, ref, rtol=1e-4 if dtype == "float32" else 1e-12, atol=1e-3), f"{a} in place"
        else:
            assert got.tobytes() == host.tobytes(), f"{a}: in place differs from out of place"


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"])
def test_every_collective_on_gpu_equals_the_host_call(collective):
    n = 1000 * P + (0 if collective == "alltoall" else 3)
    x = np.random.default_rng([R, 5]).integers(-100, 100, n).astype(np.int64)
    run = {"reduce_scatter": lambda b, a: ringmpi.reduce_scatter(b, algorithm=a),
           "allgather": lambda b, a: ringmpi.allgather(b, algorithm=a),
           "broadcast": lambda b, a: ringmpi.broadcast(b, root=P - 1, algorithm=a),
           "reduce": lambda b, a: ringmpi.reduce(b, root=0, algorithm=a),
           "alltoall": lambda b, a: ringmpi.alltoall(b, algorithm=a)}[collective]
    for a in algs(collective):
        expect = run(x.copy(), "mpi")
        got = run(cp.asarray(x), a)
        if expect is None:
            assert got is None
        else:
            assert np.array_equal(cp.asnumpy(got), expect), f"{collective}/{a}"


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int32", "uint8"])
def test_device_reduction_equals_numpy_bitwise(op, dtype):
    from ringmpi.device import cupy_backend
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(100_003) * 50).astype(dtype)
    b = (rng.standard_normal(100_003) * 50).astype(dtype)
    if dtype.startswith("float"):
        a[::97] = np.nan
    out = cp.empty(a.size, dtype)
    cupy_backend().combine(op.upper(), cp.asarray(a), cp.asarray(b), out)
    ref = np.empty_like(a)
    {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op](a, b, out=ref)
    got = cp.asnumpy(out)
    if dtype.startswith("float"):   # a NaN where numpy has one (its payload is the device's own)
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(got), nan) and nan.any()
        got, ref = got[~nan], ref[~nan]
    assert got.tobytes() == ref.tobytes()


def test_nan_propagates_on_gpu_max():
    x = np.arange(8, dtype=np.float64) + R
    if R == 0:
        x[3] = np.nan
    for a in algs("allreduce"):
        out = cp.asnumpy(ringmpi.allreduce(cp.asarray(x), op="max", algorithm=a))
        assert np.isnan(out[3]) and out[0] == P - 1, a


def test_forcing_cuda_aware_on_an_mpi_that_says_no_is_an_error_not_a_segfault():
    from ringmpi import mpicomm
    if mpicomm.cuda_support().aware:
        pytest.skip("this MPI reads device memory")
    settings.reload({"RINGMPI_CUDA_AWARE": "1"})
    try:
        with pytest.raises(ringmpi.RingmpiUsageError, match="cannot read device memory"):
            ringmpi.allreduce(cp.ones(10), algorithm="ring")
    finally:
        settings.reload({})
    assert float(ringmpi.allreduce(cp.ones(10), algorithm="ring")[0]) == P


@pytest.mark.parametrize("model", ["mlp", "rnn"])
def test_data_parallel_training_on_gpu(model):
    """cupy parameters and gradients: replicas bitwise identical, within 1e-12 of
    single-process whole-batch training on the same device (float64)."""
    from ringmpi.dp.train import make_task, max_diff, params_digest, train_dp, train_single
    task = make_task(model, np.float64, seed=1, device="cuda")
    ddp, _, _ = train_dp(task, 10, 32, algorithm="ring", seed=1)
    assert isinstance(ddp.params[next(iter(ddp.params))], cp.ndarray)
    digests = COMM.allgather(params_digest(ddp.params))
    assert len(set(digests)) == 1, "replicas differ"
    ref = train_single(task, 10, 32, seed=1)[0].params
    assert max_diff(ddp.params, ref) <= 1e-12


# -- requests, 16-bit floats and overlapped training on device buffers ----------------------

@pytest.mark.parametrize("count", [1, 7 * P + 3, (1 << 18) + 5])
def test_requests_on_gpu_equal_the_blocking_call(count):
    """Several device requests in flight, completed in reverse; a persistent request started
    three times on the same device arrays: every result the blocking call's bits."""
    rng = np.random.default_rng([R, count, 9])
    xs = [cp.asarray(rng.standard_normal(count)) for _ in range(3)]
    blocking = [cp.asnumpy(ringmpi.allreduce(x, algorithm="ring")) for x in xs]
    reqs = [ringmpi.iallreduce(x, algorithm="ring") for x in xs]
    for req, ref in zip(reversed(reqs), reversed(blocking)):
        out = req.wait()
        assert isinstance(out, cp.ndarray) and cp.asnumpy(out).tobytes() == ref.tobytes()
    y = cp.empty_like(xs[0])
    with ringmpi.allreduce_init(xs[0], y, algorithm="ring") as pr:
        for _ in range(3):
            pr.start()
            pr.wait()
            assert cp.asnumpy(y).tobytes() == blocking[0].tobytes()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_allreduce_on_gpu(dtype):
    """A 16-bit device all-reduce gives the host's result for the same algorithm within a
    16-bit rounding, the same bits on every rank; a dtype the device cannot hold is refused
    in one line naming it."""
    from ringmpi.ops import BFLOAT16
    dt = BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.random.default_rng([R, 16]).standard_normal(10_003).astype(dt)
    host = ringmpi.allreduce(x, algorithm="ring").astype(np.float32)
    try:
        d = cp.asarray(x) if dtype == "float16" else cp.asarray(x.view(np.uint16)).view(dt)
    except (TypeError, ValueError) as err:   # cupy has no bfloat16: nothing to pass
        pytest.skip(f"cupy cannot hold {dtype}: {err}")
    out = cp.asnumpy(ringmpi.allreduce(d, algorithm="ring")).astype(np.float32)
    assert np.allclose(out, host, rtol=2 ** -7 if dtype == "bfloat16" else 2 ** -10, atol=1e-2)
    assert COMM.bcast(out.tobytes() if R == 0 else None, 0) == out.tobytes()


def test_overlapped_training_on_gpu_gives_the_bits_of_blocking_training():
    from ringmpi.dp.ddp import DataParallel
    from ringmpi.dp.train import make_task, params_digest, train_dp
    task = make_task("mlp", np.float64, seed=4, device="cuda")
    digests = {}
    for overlap in (True, False):
        ddp = DataParallel(task.make_model(), COMM, algorithm="ring", overlap=overlap, bucket_cap_mb=0.0005,
                           first_bucket_mb=0.0001)
        ddp, _, losses = train_dp(task, 8, 48, ddp=ddp, seed=4)
        digests[overlap] = (params_digest(ddp.params), losses)
    assert digests[True] == digests[False]
    assert len(set(COMM.allgather(digests[True][0]))) == 1
