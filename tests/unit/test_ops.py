"""ops.convert: numpy's own bits for float <-> float16, on every kind of value (numpy's
conversion is the reference; ours only avoids its slow path below float16's normal range)."""
from __future__ import annotations

import numpy as np
import pytest

from ringmpi.ops import convert


def numpy_half(a: np.ndarray) -> np.ndarray:
    out = np.empty(a.size, np.float16)
    with np.errstate(all="ignore"):
        np.copyto(out, a, casting="unsafe")
    return out


def every_half_and_its_neighbours() -> np.ndarray:
    """Every finite float16 as float32, the midpoints between neighbours (ties) and the
    float32 values either side of each midpoint."""
    f = np.sort(np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32))
    f = f[np.isfinite(f)]
    mids = ((f[:-1].astype(np.float64) + f[1:]) / 2).astype(np.float32)
    return np.concatenate([f, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e-5, 1e-7, 1e-9, 1e5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_narrowing_to_float16_gives_numpys_bits(scale, dtype):
    a = (np.random.default_rng(int(-np.log10(scale) + 20)).standard_normal(200_003) * scale).astype(dtype)
    a[::997], a[5::991], a[7::50], a[9::77] = np.nan, -np.inf, 0.0, -0.0
    out = np.empty(a.size, np.float16)
    with np.errstate(over="ignore"):
        convert(a, out)
    assert out.view(np.uint16).tobytes() == numpy_half(a).view(np.uint16).tobytes()


def test_ties_and_subnormals_round_as_numpy_does():
    a = every_half_and_its_neighbours()
    out = np.empty(a.size, np.float16)
    convert(a, out)
    assert out.view(np.uint16).tobytes() == numpy_half(a).view(np.uint16).tobytes()


def test_widening_every_float16_gives_numpys_float32():
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    out = np.empty(h.size, np.float32)
    convert(h, out)
    assert out.view(np.uint32).tobytes() == h.astype(np.float32).view(np.uint32).tobytes()
    strided = np.empty(h.size // 2, np.float32)
    convert(h[::2], strided)                      # (not contiguous: numpy's own conversion)
    assert np.array_equal(strided, h[::2].astype(np.float32), equal_nan=True)
