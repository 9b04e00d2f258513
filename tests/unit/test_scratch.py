"""The scratch pool: every call's takes are distinct memory of the asked size and dtype,
whatever the calls before asked (a view handed out again must be the one asked for), and
memory follows the recent calls (trim)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ringmpi.backend import ScratchPool

DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int8), np.dtype(np.complex128)]
calls = st.lists(st.lists(st.tuples(st.integers(0, 300), st.sampled_from(DTYPES)), max_size=4), max_size=40)


@settings(max_examples=150, deadline=None)
@given(calls)
def test_takes_are_distinct_and_as_asked(seq):
    pool = ScratchPool(window=4)
    for call in seq:
        pool.reset()
        views = [pool.take(n, dt) for n, dt in call]
        for v, (n, dt) in zip(views, call):
            assert v.shape == (n,) and v.dtype == dt
        for i, v in enumerate(views):      # one call's takes never share memory
            v[...] = i + 1
        for i, v in enumerate(views):
            assert (v == i + 1).all()
            assert not any(np.shares_memory(v, w) for w in views[i + 1:])


def test_same_take_again_is_the_same_view_until_a_trim():
    pool = ScratchPool(window=4)
    pool.reset()
    a = pool.take(10, np.float32)
    pool.reset()
    assert pool.take(10, np.float32) is a
    assert pool.take(10, np.float32) is not a             # (the next slot)
    pool.reset()
    b = pool.take(11, np.float32)                        # another size: another view
    assert b is not a and b.shape == (11,)
    pool.reset()                                         # the 4th call: a trim, views forgotten
    assert pool.take(11, np.float32) is not b


def test_trim_frees_unused_and_shrinks_oversized_slots():
    pool = ScratchPool(window=2)
    pool.reset()
    pool.take(1 << 20, np.uint8)
    pool.take(1 << 20, np.uint8)
    pool.reset()                                          # (the trim of the calls so far)
    for _ in range(4):                                    # calls that take one small slot
        pool.take(16, np.uint8)
        pool.reset()
    assert pool.nbytes <= 2 * 16
