"""16-bit floats and the deterministic mode on real ranks.

Deterministic: for floating-point SUM and AVG, `auto` and every algorithm that accepts the
mode give the bits of the rank-order fold ((x0 + x1) + x2) + ... (in float32 for 16-bit
inputs, rounded once), at every size, in place or not, whether asked per call or by
RINGMPI_DETERMINISTIC; an algorithm that cannot keep it refuses on every rank. 16-bit hops
(RINGMPI_PARTIALS=16): the same bits on every rank, within the rounding of p-1 hops."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_close, fold, make_data
from mpi4py import MPI

import ringmpi
from ringmpi import settings
from ringmpi.ops import ACCUMULATOR, is_half
from ringmpi.schedules import block_counts, get, offsets

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
#: up to 160 KiB of float32: auto's choice (and the tuner's candidates) change along them
COUNTS = sorted({0, 1, max(P - 1, 0), P, 7 * P + 3, 1000, 40_000})
DTYPES = ["float32", "float64", "complex64", "float16", "bfloat16"]


def ordered_fold(op: str, xs: list[np.ndarray]) -> np.ndarray:
    """The rank-order fold in the dtype, or in float32 for a 16-bit float (rounded once)."""
    if is_half(xs[0].dtype):
        return fold(op, [x.astype(ACCUMULATOR) for x in xs]).astype(xs[0].dtype)
    return fold(op, xs)


def result(collective: str, x: np.ndarray, op: str, algorithm: str, inplace: bool, deterministic, root: int = 0):
    """This rank's part of the result (allreduce: all; reduce_scatter: block R; reduce: the
    root's, None elsewhere), and the part of the fold it must equal."""
    y = x.copy()
    if collective == "allreduce":
        out = ringmpi.allreduce(y, y if inplace else None, op=op, algorithm=algorithm, deterministic=deterministic)
        return out, slice(None)
    if collective == "reduce_scatter":
        out = ringmpi.reduce_scatter(y, y if inplace else None, op=op, algorithm=algorithm, deterministic=deterministic)
        off = offsets(block_counts(x.size, P))
        return out, slice(off[R], off[R + 1])
    out = ringmpi.reduce(y, y if inplace else None, root=root, op=op, algorithm=algorithm, deterministic=deterministic)
    return out, slice(None)


def accepts(collective: str, algorithm: str) -> bool:
    return algorithm == "auto" or P <= 2 or get(collective, algorithm).ordered


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "reduce"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_bits_are_the_rank_order_fold(collective, dtype, rng):
    algorithms = ["auto"] + ringmpi.algorithms(collective, COMM)
    for op in ("SUM", "AVG"):
        for n in COUNTS:
            x = make_data(rng, dtype, n, op)
            want = ordered_fold(op, COMM.allgather(x))
            root = n % P
            for algorithm in algorithms:
                for inplace in (False, True):
                    what = f"{collective}/{algorithm} {dtype} {op} n={n} {'in place' if inplace else ''}"
                    if not accepts(collective, algorithm):
                        with pytest.raises(ringmpi.RingmpiUsageError,
                                           match=rf"rank {R} of {P}\).*{algorithm}.*deterministic"):
                            result(collective, x, op, algorithm, inplace, True, root)
                        continue
                    out, part = result(collective, x, op, algorithm, inplace, True, root)
                    if collective == "reduce" and R != root:
                        assert out is None
                        continue
                    assert out.dtype == x.dtype and out.tobytes() == want[part].tobytes(), what


def test_the_environment_variable_sets_the_mode_and_the_argument_wins(monkeypatch, rng):
    x = make_data(rng, "float32", 40_000, "SUM")
    want = ordered_fold("SUM", COMM.allgather(x))
    monkeypatch.setenv("RINGMPI_DETERMINISTIC", "1")
    settings.reload()
    try:
        for _ in range(12):   # through the tuner's first calls and the plans after them
            assert ringmpi.allreduce(x).tobytes() == want.tobytes()
        assert ringmpi.iallreduce(x).wait().tobytes() == want.tobytes()
        if P > 2:
            with pytest.raises(ringmpi.RingmpiUsageError, match="deterministic"):
                ringmpi.allreduce(x, algorithm="ring")
            assert ringmpi.allreduce(x, algorithm="ring", deterministic=False).shape == x.shape
            monkeypatch.setenv("RINGMPI_ALGO", "allreduce=ring")
            settings.reload()
            with pytest.raises(ringmpi.RingmpiUsageError, match="deterministic"):
                ringmpi.allreduce(x)
    finally:
        monkeypatch.delenv("RINGMPI_DETERMINISTIC")
        monkeypatch.delenv("RINGMPI_ALGO", raising=False)
        settings.reload()
    with pytest.raises(ringmpi.RingmpiUsageError, match=rf"rank {R}.*deterministic must be True, False or None"):
        ringmpi.allreduce(x, deterministic="yes")


def test_integers_ignore_the_mode(rng):
    """Integer sums are exact in any order: every algorithm serves them, deterministic or not."""
    x = make_data(rng, "int64", 7 * P + 3, "SUM")
    want = fold("SUM", COMM.allgather(x))
    for algorithm in ringmpi.algorithms("allreduce", COMM):
        assert np.array_equal(ringmpi.allreduce(x, algorithm=algorithm, deterministic=True), want), algorithm


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_hops(monkeypatch, dtype, rng):
    """RINGMPI_PARTIALS=16: each hop rounds to 16 bits; still the same bits on every rank,
    and within the rounding of the p-1 hops of the exact sum."""
    monkeypatch.setenv("RINGMPI_PARTIALS", "16")
    settings.reload()
    try:
        for algorithm in ringmpi.algorithms("allreduce", COMM):
            for n in (7 * P + 3, 5000):
                x = make_data(rng, dtype, n, "SUM")
                xs = COMM.allgather(x)
                out = ringmpi.allreduce(x, algorithm=algorithm)
                assert COMM.allgather(out.tobytes()) == [out.tobytes()] * P, algorithm
                exact = fold("SUM", [a.astype(np.float64) for a in xs])
                scale = np.sum(np.abs(np.stack([a.astype(np.float64) for a in xs])), axis=0)
                assert_close(out.astype(np.float64), exact, dtype, P, scale, f"{algorithm} {dtype} 16-bit hops")
    finally:
        monkeypatch.delenv("RINGMPI_PARTIALS")
        settings.reload()


def test_bfloat16_is_ml_dtypes_bfloat16(rng):
    x = rng.standard_normal(10).astype(ml_dtypes.bfloat16)
    out = ringmpi.allreduce(x, op="max")
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(out.astype(np.float32), np.max([a.astype(np.float32) for a in COMM.allgather(x)], axis=0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_requests_and_repeated_calls(dtype, rng):
    """A 16-bit all-reduce as a request (MPI's own included: widened around its nonblocking
    collective), as a persistent request, and repeated on the same arrays (the kept plans):
    the blocking call's bits every time."""
    x = make_data(rng, dtype, 5000, "SUM")
    for algorithm in ["mpi", "ring", "ordered", "rabenseifner"]:
        want = ringmpi.allreduce(x, algorithm=algorithm)
        y = np.empty_like(x)
        for _ in range(4):
            assert ringmpi.allreduce(x, y, algorithm=algorithm).tobytes() == want.tobytes(), algorithm
            assert ringmpi.iallreduce(x, y, algorithm=algorithm).wait().tobytes() == want.tobytes(), algorithm
        with ringmpi.allreduce_init(x, y, algorithm=algorithm) as bound:
            for _ in range(3):
                assert bound.start().wait().tobytes() == want.tobytes(), algorithm
