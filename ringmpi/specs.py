"""What is true of a collective whatever carries it: one spec each (the nccl-tests plug-in idea).

    nccl_count / size       the benchmark's count column and bytes (per rank or whole vector)
    busbw_factor(p)         nccl-tests' bus bandwidth factor
    make(rank, p, x, ...)   a harness call (simulator, benchmark, demo) from this rank's input x
    expected(xs, rank, ..)  the exact result on `rank` from every rank's input (numpy)
    output / shown          what a harness call returns / what the simulator's tables print
    simulated_mpi        the algorithm the simulator runs for MPI's own (opaque) collective

The spec knows nothing of MPI, of the user's arguments or of the call path, so the
simulator, the model's tools and the benchmark's harness stand on it below the API. What
the API adds to a spec to serve the public call (validating the user's arguments into a
`Call`, MPI's own collective, the fast path's plans) is the subclass of the same name in
`ringmpi.collectives`; a call the API prepares carries that subclass as its `collective`.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .backend import Phantom, phantom
from .call import Call, block_counts, offsets
from .ops import ACCUMULATOR, OPS, ROUNDING, is_half, kind
from .settings import settings

__all__ = ["Collective", "SPECS", "spec", "arithmetic", "fold", "blank"]


def fold(op: str, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The reduction in rank order; AVG the sum divided by the rank count, once."""
    acc = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        OPS[op](acc, a, out=acc)
    if op == "AVG":
        acc /= len(arrays)
    return acc


def arithmetic(dtype: np.dtype, op: str | None, deterministic: bool | None = None) -> tuple:
    """The call parameters that concern the arithmetic (`ringmpi.schedules`): `deterministic`
    for a floating-point SUM, AVG or PROD in the deterministic mode (the call's argument, else
    RINGMPI_DETERMINISTIC), and a 16-bit float's `partials`, the bytes of its partial sums
    (RINGMPI_PARTIALS; float32 always in the deterministic mode, whose fold is in float32)."""
    if op not in ROUNDING:
        return ()
    st = settings()
    keep = st.deterministic if deterministic is None else deterministic
    out = (("deterministic", True),) if keep and kind(dtype) in "fc" else ()
    if is_half(dtype):
        out += (("partials", ACCUMULATOR.itemsize if keep or st.partials == 32 else dtype.itemsize),)
    return out


def blank(n: int, like: np.ndarray) -> np.ndarray:
    """A buffer of n elements like `like` whose old contents must not matter (zeros; None
    for symbolic data; a phantom for data-free simulation)."""
    if isinstance(like, Phantom):
        return phantom(n, like.dtype)
    return np.full(n, None, dtype=object) if like.dtype.kind == "O" else np.zeros(n, like.dtype)


class Collective:
    """What is true of a collective whatever the algorithm and whatever carries it
    (override per collective)."""
    name = ""
    reduces = False          # combines data with an op
    rooted = False           # has a root argument
    per_rank = False         # nccl-tests: the count column is per rank (size = count x nranks)
    busbw = "1"              # nccl-tests' bus bandwidth factor, as printed
    simulated_mpi = ""    # the algorithm the simulator runs for "mpi" (the library's choice is opaque)
    taught = ""              # the algorithm the lecture's tables show
    has_out_of_place = True

    def busbw_factor(self, p: int) -> float:
        return 1.0

    def nccl_count(self, nbytes: int, itemsize: int, p: int) -> int:
        return nbytes // itemsize // (p if self.per_rank else 1)

    def size(self, count: int, itemsize: int, p: int) -> int:
        """Bytes of the whole vector for `count` in the count column (algbw = size / time)."""
        return count * itemsize * (p if self.per_rank else 1)

    def input_count(self, count: int, p: int) -> int:
        """Elements of each rank's input for `count` in the count column."""
        return count

    def make(self, rank: int, p: int, x: np.ndarray, *, op: str | None = None, root: int = 0,
             inplace: bool = False) -> Call:
        raise NotImplementedError

    def expected(self, xs: Sequence[np.ndarray], rank: int, op: str | None = None, root: int = 0) -> np.ndarray | None:
        raise NotImplementedError

    def output(self, call: Call) -> Any:
        return call.recv

    def shown(self, call: Call) -> Any:
        """The buffer the simulator's symbolic tables print after every round."""
        return call.recv if call.recv is not None else call.send

    def __repr__(self) -> str:
        return f"<collective {self.name}>"


class Allreduce(Collective):
    name, reduces, busbw, simulated_mpi, taught = "allreduce", True, "2(n-1)/n", "rabenseifner", "ring"

    def busbw_factor(self, p):
        return 2 * (p - 1) / p

    def make(self, rank, p, x, *, op=None, root=0, inplace=False):
        send = x.copy()
        return Call(self, send, send if inplace else blank(x.size, x), x.size, op, inplace=inplace,
                    params=arithmetic(x.dtype, op))

    def expected(self, xs, rank, op=None, root=0):
        return fold(op, xs)


class ReduceScatter(Collective):
    name, reduces, per_rank, busbw, simulated_mpi, taught = \
        "reduce_scatter", True, True, "(n-1)/n", "ring", "ring"

    def busbw_factor(self, p):
        return (p - 1) / p

    def input_count(self, count, p):
        return count * p

    def make(self, rank, p, x, *, op=None, root=0, inplace=False):
        c = tuple(block_counts(x.size, p))
        off = offsets(c)
        send = x.copy()
        recv = send[off[rank]:off[rank + 1]] if inplace else blank(c[rank], x)
        return Call(self, send, recv, x.size, op, counts=c, inplace=inplace, params=arithmetic(x.dtype, op))

    def expected(self, xs, rank, op=None, root=0):
        off = offsets(block_counts(xs[0].size, len(xs)))
        return fold(op, xs)[off[rank]:off[rank + 1]]

    def shown(self, call):
        return call.send if call.inplace else call.recv


class Allgather(Collective):
    name, per_rank, busbw, simulated_mpi, taught = "allgather", True, "(n-1)/n", "recursive_doubling", "ring"

    def busbw_factor(self, p):
        return (p - 1) / p

    def make(self, rank, p, x, *, op=None, root=0, inplace=False):
        n = x.size
        recv = blank(n * p, x)
        if inplace:
            if not isinstance(x, Phantom):
                recv[rank * n:(rank + 1) * n] = x
            return Call(self, recv[rank * n:(rank + 1) * n], recv, n * p, counts=(n,) * p, inplace=True)
        return Call(self, x.copy(), recv, n * p, counts=(n,) * p)

    def expected(self, xs, rank, op=None, root=0):
        return np.concatenate(xs)


class Broadcast(Collective):
    name, rooted, simulated_mpi, taught, has_out_of_place = "broadcast", True, "tree", "pipeline", False

    def make(self, rank, p, x, *, op=None, root=0, inplace=True):
        buf = x.copy() if rank == root else blank(x.size, x)
        return Call(self, buf, buf, x.size, None, root, inplace=True)

    def expected(self, xs, rank, op=None, root=0):
        return xs[root]


class Reduce(Collective):
    name, reduces, rooted, simulated_mpi, taught = "reduce", True, True, "tree", "ring"

    def make(self, rank, p, x, *, op=None, root=0, inplace=False):
        send = x.copy()
        recv = (send if inplace else blank(x.size, x)) if rank == root else None
        return Call(self, send, recv, x.size, op, root, inplace=inplace and rank == root, params=arithmetic(x.dtype, op))

    def expected(self, xs, rank, op=None, root=0):
        return fold(op, xs) if rank == root else None


class Alltoall(Collective):
    name, busbw, simulated_mpi, taught = "alltoall", "(n-1)/n", "pairwise", "pairwise"

    def busbw_factor(self, p):
        return (p - 1) / p

    def nccl_count(self, nbytes, itemsize, p):
        return nbytes // itemsize // p * p  # whole blocks: one per rank

    def make(self, rank, p, x, *, op=None, root=0, inplace=False):
        send = x.copy()
        recv = send if inplace else blank(x.size, x)
        return Call(self, send, recv, x.size, counts=(x.size // p,) * p, inplace=inplace)

    def expected(self, xs, rank, op=None, root=0):
        b = xs[0].size // len(xs)
        return np.concatenate([x[rank * b:(rank + 1) * b] for x in xs])


SPECS: dict[str, Collective] = {s.name: s for s in (Allreduce(), ReduceScatter(), Allgather(), Broadcast(), Reduce(),
                                                     Alltoall())}


def spec(name: str) -> Collective:
    """The spec of collective `name` (ValueError naming the valid ones otherwise)."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; expected one of {', '.join(SPECS)}") from None
