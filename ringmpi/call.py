"""The record of one collective call, and the block layout every schedule shares.

A `Call` is what the API edge (or a harness: the simulator, the benchmark) hands an
algorithm body after validation: flat 1-D buffers and the call's arguments. Bodies read
it and never see user-facing arguments (shapes, `None` receive buffers, MPI objects).

    collective  the collective's spec (`ringmpi.specs.Collective`; the API's subclass
                in `ringmpi.collectives` for a call it prepared)
    send, recv  flat buffers; `recv is None` where a rank gets no result (reduce off-root)
    count       the n of the cost formula: elements of the whole vector (all-gather: of the
                result; all-to-all: of one rank's send buffer)
    op          reduction op name ("SUM", ...) or None
    root        root rank (0 where the collective has none)
    counts      block sizes, one per rank (reduce-scatter, all-gather, all-to-all) or ()
    inplace     the result overwrites the input (MPI_IN_PLACE semantics of the collective)
    params      algorithm tunables, e.g. (("segments", 16),): filled by the algorithm's
                `tune` hook unless the caller gave them; and the arithmetic's (`partials`,
                `deterministic`: `ringmpi.schedules`)
"""
from __future__ import annotations

from functools import lru_cache
from itertools import accumulate
from typing import Any, NamedTuple

__all__ = ["Call", "block_counts", "offsets", "cdiv", "lg"]

_tuple_new = tuple.__new__


class Call(NamedTuple):
    collective: Any
    send: Any
    recv: Any
    count: int
    op: str | None = None
    root: int = 0
    counts: tuple = ()
    inplace: bool = False
    params: tuple = ()

    def param(self, name: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        return default

    def on(self, send: Any, recv: Any) -> "Call":
        """This call with other buffers: `_replace(send=send, recv=recv)` at a third of its
        cost (a call on the same arrays again makes one: `Collective.again`)."""
        return _tuple_new(Call, (self[0], send, recv, *self[3:]))

    def blocks(self, p: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The even split of the call's `count` elements over p ranks (`block_counts`) and
        its offsets: block i is [off[i], off[i+1])."""
        counts = block_counts(self.count, p)
        return counts, offsets(counts)

    @property
    def wide_partials(self) -> bool:
        """A 16-bit float whose partial sums are kept wider than its items (`partials`, the
        bytes of a partial sum, set by `collectives.arithmetic`: 4, float32)."""
        return self.param("partials", 0) > self.itemsize

    @property
    def dtype(self) -> Any:
        return self.send.dtype if self.send is not None else self.recv.dtype

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


@lru_cache(maxsize=256)
def block_counts(count: int, p: int) -> tuple[int, ...]:
    """Even split of `count` elements into p blocks: the first count % p hold one more.
    One table per (count, p), shared: the p ranks of a virtual cluster all ask for it, and
    p private copies of p entries are p^2 (16,384 ranks: 268 M)."""
    q, r = divmod(count, p)
    return tuple(q + (i < r) for i in range(p))


def offsets(counts: list[int] | tuple) -> tuple[int, ...]:
    """Prefix sums, length len(counts)+1: block i is [off[i], off[i+1]) (one shared table
    per partition, as `block_counts`)."""
    return _offsets(tuple(counts))


@lru_cache(maxsize=256)
def _offsets(counts: tuple) -> tuple[int, ...]:
    return tuple(accumulate(counts, initial=0))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative integers: the largest block of an even split."""
    return -(-a // b)


def lg(p: int) -> int:
    """ceil(log2 p): rounds of a binomial tree or of recursive doubling over p ranks."""
    return (p - 1).bit_length()
