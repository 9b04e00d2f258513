"""Independent references for the tests: numpy folds and data generators."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ringmpi.ops import OPS, SUPPORTED_DTYPES, check_op_dtype, is_half

ALL_OPS = list(OPS)
DTYPES = [d.name for d in SUPPORTED_DTYPES]


def valid_ops(dtype) -> list[str]:
    return [op for op in ALL_OPS if check_op_dtype(op, np.dtype(dtype)) is None]


def make_data(rng: np.random.Generator, dtype, n: int, op: str, exact: bool = False) -> np.ndarray:
    """Random data suited to `op`: small integers, or floats whose reduction is well conditioned.

    exact=True gives integer-valued floats, so that a SUM/MAX/MIN is exact in any order.
    """
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        # SUM and PROD stay far from overflow (Open MPI saturates small integer sums where
        # numpy wraps; the wrap-around is tested on its own); the rest use a wide range.
        small = op in ("SUM", "PROD")
        lo = 0 if dt.kind == "u" or op in ("BAND", "BOR", "BXOR") else (-2 if op == "PROD" else -9 if small else -100)
        hi = min(np.iinfo(dt).max, 2 if op == "PROD" else 9 if small else 100)
        return rng.integers(lo, hi + 1, n).astype(dt)
    if op == "PROD":
        real = rng.choice([0.5, 1.0, 2.0], n) if exact else rng.uniform(0.5, 2.0, n)
    elif exact:
        real = rng.integers(-1000, 1001, n).astype(float)
    else:
        real = rng.standard_normal(n)
    if dt.kind == "c":
        imag = rng.integers(-1000, 1001, n).astype(float) if exact and op != "PROD" else \
            (np.zeros(n) if exact else rng.standard_normal(n))
        return (real + 1j * imag).astype(dt)
    return real.astype(dt)


def fold(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """Reduce `arrays` in rank order with numpy (exact for integers, wraps like C); AVG is
    the sum divided by the number of arrays."""
    acc = arrays[0].copy()
    for a in arrays[1:]:
        OPS[op](acc, a, out=acc)
    if op == "AVG":
        np.true_divide(acc, len(arrays), out=acc)
    return acc


def mpi_op(op: str):
    """MPI's op object for a ringmpi op name (AVG, which MPI lacks, stays a name)."""
    from mpi4py import MPI
    return getattr(MPI, op, op)


def tolerance(dtype, p: int) -> float:
    dt = np.dtype(dtype)
    return 0.0 if dt.kind in "iub" else 16 * p * float(ml_dtypes.finfo(dt).eps)


def exact_half(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """A 16-bit float reduction computed exactly (float64 holds any sum or product of a few
    16-bit floats without rounding; AVG's division rounds once there), rounded once to the
    16-bit dtype: what ringmpi's result may differ from by one unit in the last place."""
    return fold(op, [a.astype(np.float64) for a in arrays]).astype(arrays[0].dtype)


def assert_within_ulp(out: np.ndarray, exact: np.ndarray, what: str = "") -> None:
    """Every element of `out` within one unit in the last place of `exact` (the correctly
    rounded result), or equal to it where it is not finite."""
    dt = exact.dtype
    assert is_half(dt) and out.dtype == dt
    wide = exact.astype(np.float32)
    up = np.nextafter(wide.astype(dt), np.array(np.inf, dt)).astype(np.float32)
    down = np.nextafter(wide.astype(dt), np.array(-np.inf, dt)).astype(np.float32)
    got = out.astype(np.float32)
    finite = np.isfinite(wide)
    ok = ~finite & ((got == wide) | (np.isnan(got) & np.isnan(wide))) | finite & (got >= down) & (got <= up)
    assert ok.all(), f"{what}: {np.count_nonzero(~ok)} of {ok.size} elements beyond one ulp of the exact result"


def assert_close(out: np.ndarray, ref: np.ndarray, dtype, p: int, scale: np.ndarray | None = None, what=""):
    tol = tolerance(dtype, p)
    if tol == 0.0:
        assert np.array_equal(out, ref), f"{what}: {np.count_nonzero(out != ref)} elements differ"
        return
    s = np.abs(ref) if scale is None else scale
    err = np.abs(out.astype(complex) - ref.astype(complex))
    bad = err > tol * (s + 1.0)
    assert not bad.any(), f"{what}: {bad.sum()} elements off, worst {err.max():.3g}"
