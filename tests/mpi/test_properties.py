"""Property-based cases in lockstep: every rank draws the same examples (derandomized
hypothesis), the data differ per rank, and MPI's own collective is the reference."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import ringmpi
from ringmpi.schedules import block_counts, offsets

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
LOCKSTEP = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def data(seed: int, n: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([seed, R])
    return rng.integers(-50, 50, n).astype(dtype)  # exact in every dtype and order


@LOCKSTEP
@given(collective=st.sampled_from(["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"]),
       n=st.integers(0, 3 * P + 40), dtype=st.sampled_from(["int32", "int64", "float32", "float64"]),
       root=st.integers(0, 63), seed=st.integers(0, 2**31), segments=st.integers(1, 9),
       algorithm_index=st.integers(0, 10))
def test_any_collective_matches_mpi(collective, n, dtype, root, seed, segments, algorithm_index):
    algs = ringmpi.algorithms(collective, COMM)
    alg = algs[algorithm_index % len(algs)]
    root %= P
    x = data(seed, n, dtype)
    if collective == "allreduce":
        ref = np.empty_like(x)
        COMM.Allreduce(x, ref)
        assert np.array_equal(ringmpi.allreduce(x, algorithm=alg), ref)
    elif collective == "reduce_scatter":
        ref = np.empty_like(x)
        COMM.Allreduce(x, ref)
        off = offsets(block_counts(n, P))
        assert np.array_equal(ringmpi.reduce_scatter(x, algorithm=alg), ref[off[R]:off[R + 1]])
    elif collective == "allgather":
        part = x[:max(n - R, 0)]  # uneven blocks, some possibly empty
        counts = COMM.allgather(part.size)
        ref = np.concatenate(COMM.allgather(part))
        assert np.array_equal(ringmpi.allgather(part, algorithm=alg, counts=counts), ref)
    elif collective == "alltoall":
        z = x[:n // P * P]
        ref = np.empty_like(z)
        COMM.Alltoall(z, ref)
        assert np.array_equal(ringmpi.alltoall(z, algorithm=alg), ref)
    elif collective == "broadcast":
        y = x.copy()
        ringmpi.broadcast(y, root, algorithm=alg, segments=segments)
        assert np.array_equal(y, COMM.bcast(x, root))
    else:
        ref = np.empty_like(x)
        COMM.Reduce(x, ref, root=root)
        out = ringmpi.reduce(x, root=root, algorithm=alg)
        assert (out is None) if R != root else np.array_equal(out, ref)
