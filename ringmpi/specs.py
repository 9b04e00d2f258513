"""A collective, whatever carries it: one spec each (the nccl-tests plug-in idea).

    nccl_count / size       the benchmark's count column and bytes (per rank or whole vector)
    busbw_factor(p)         nccl-tests' bus bandwidth factor
    make(rank, p, x, ...)   a harness call (simulator, benchmark, demo) from this rank's input x
    expected(xs, rank, ..)  the exact result on `rank` from every rank's input (numpy)
    output / shown          what a harness call returns / what the simulator's tables print
    simulated_mpi           the algorithm the simulator runs for MPI's own (opaque) collective
    prepare(edge, ...)      the public call's validation: the user's arguments into a `Call`
    args(call) / again      a harness call's public arguments / a call on the very same arrays

A spec names MPI's functions for the collective (`mpi_methods`, which the drop-in serves)
but knows nothing of how MPI is called or of the call path: the MPI transport says how
MPI's own runs a call (`ringmpi.mpicomm`: `mpi`, `mpi_plan`), the API runs the rest, and
the simulator, the model's tools and the benchmark's harness stand on the specs below both.
Adding a collective is its spec here and its schedule module in `ringmpi/schedules/`: its
public, nonblocking and persistent calls follow from the spec (`ringmpi.collectives`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .backend import Phantom, phantom
from .call import Call, block_counts, offsets
from .ops import ACCUMULATOR, OPS, ROUNDING, is_half, kind
from .settings import settings

__all__ = ["Collective", "SPECS", "spec", "arithmetic", "fold", "blank", "flat_view", "returned", "add"]


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


def flat_view(buf: np.ndarray, canonical: np.dtype) -> np.ndarray:
    """A checked host array as ringmpi sends it: flat, a plain ndarray (subclasses such as
    np.matrix viewed as one), in its canonical dtype."""
    if type(buf) is np.ndarray and buf.ndim == 1 and buf.dtype.char == canonical.char:
        return buf   # (already one: a view of it would cost a nonblocking call's restart a third)
    flat = buf.reshape(-1) if type(buf) is np.ndarray else buf.view(np.ndarray).reshape(-1)
    return flat if buf.dtype.char == canonical.char else flat.view(canonical)


def _deterministic(e: Any, value: Any) -> bool | None:
    if value is not None and not isinstance(value, (bool, np.bool_)):
        e.fail(f"deterministic must be True, False or None (RINGMPI_DETERMINISTIC), got {value!r}")
    return None if value is None else bool(value)


def returned(recvbuf: Any, flat: np.ndarray, shape: tuple) -> Any:
    """What a public call returns: the user's result buffer, else the new one shaped."""
    return recvbuf if recvbuf is not None else flat.reshape(shape)


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
    send_arg, recv_arg = "sendbuf", "recvbuf"   # the public function's buffer arguments
    #: MPI's functions of this collective, which the drop-in (`ringmpi.Comm`) serves
    mpi_methods: tuple[str, ...] = ()

    def busbw_factor(self, p: int) -> float:
        return 1.0

    def divisor(self, p: int, rank: int) -> int:
        """What an AVG result is divided by on `rank`, once, after its SUM: the rank count."""
        return p

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

    def prepare(self, e: Any, **args: Any) -> tuple[Call, Any]:
        """The public call's arguments checked on this rank (`e`: the API's `Edge`, whose
        `fail` raises the one-line error): the `Call`, and what the public call returns.
        Its parameters (names, kinds, defaults) are the public call's, and the class's
        docstring is its documentation (`ringmpi.collectives` writes the call from both)."""
        raise NotImplementedError

    def args(self, call: Call) -> dict:
        """The public function's arguments (but comm and algorithm) for a harness call."""
        raise NotImplementedError

    def again(self, call: Call, dtype: np.dtype, canonical: np.dtype, sendbuf: Any, recvbuf: Any) -> Call | None:
        """`prepare`'s Call (`call`, its buffers stripped) for the very arrays (the same
        objects, so the same memory, shape and strides) it last accepted, or None to
        prepare afresh: for collectives whose buffers are the user's arrays, flat."""
        return None

    def with_buffers(self, args: dict, sendbuf: Any, recvbuf: Any) -> dict:
        """The public function's arguments `args` with these buffers."""
        out = {**args, self.send_arg: sendbuf}
        if self.recv_arg:
            out[self.recv_arg] = recvbuf
        return out

    def __repr__(self) -> str:
        return f"<collective {self.name}>"


class Allreduce(Collective):
    """Reduce `sendbuf` over all ranks; every rank gets the same result, bit for bit.

    Parameters:
        sendbuf: this rank's contribution (any shape, C-contiguous, a dtype MPI has, or
            float16 / bfloat16 (ml_dtypes): their SUM, AVG and PROD accumulate in float32
            and round once; RINGMPI_PARTIALS=16 sends 16-bit partial sums instead).
        recvbuf: where the result goes (same size and dtype); None allocates a new array
            shaped like `sendbuf`; `recvbuf is sendbuf` works in place (MPI_IN_PLACE).
        op: "sum", "prod", "max", "min", "land", "lor", "lxor", "band", "bor", "bxor",
            "avg" (the sum divided by the rank count, floating types only: NCCL's ncclAvg), or
            MPI's predefined op (MPI.SUM, ...). MAX and MIN propagate NaN.
        comm: an mpi4py intracommunicator (COMM_WORLD when None).
        algorithm: "ring", "naive", "tree", "recursive_doubling", "rabenseifner", "ordered",
            "mpi" (the library's own) or "auto" (the lowest predicted time; RINGMPI_ALGO forces one).
        deterministic: True: a floating-point SUM, AVG or PROD gives the bits of the rank-order
            fold ((x0 + x1) + x2) + ... whatever the algorithm, size or hosts (`auto` picks
            among "ordered" and "naive"; another algorithm is refused beyond 2 ranks);
            None: RINGMPI_DETERMINISTIC decides.

    Returns the result array (`recvbuf` when given).
    Raises RingmpiUsageError naming the call and the rank when an argument is wrong, before
    any message is sent.

    Example (mpirun -n 4):
        >>> s = ringmpi.allreduce(np.arange(3.0), algorithm="ring")   # [0, 4, 8] on every rank
    """
    name, reduces, busbw, simulated_mpi, taught = "allreduce", True, "2(n-1)/n", "rabenseifner", "ring"
    mpi_methods = ("Allreduce",)

    def busbw_factor(self, p):
        return 2 * (p - 1) / p

    def make(self, rank, p, x, *, op=None, root=0, inplace=False):
        send = x.copy()
        return Call(self, send, send if inplace else blank(x.size, x), x.size, op, inplace=inplace,
                    params=arithmetic(x.dtype, op))

    def expected(self, xs, rank, op=None, root=0):
        return fold(op, xs)

    def prepare(self, e, sendbuf, recvbuf=None, *, op="sum", deterministic=None):
        inplace = recvbuf is not None and recvbuf is sendbuf
        send = e.array("sendbuf", sendbuf, writable=inplace)
        opn = e.op(op, send.dtype)
        recv = send if inplace else e.recv(recvbuf, send, send.size)
        return Call(self, send, recv, send.size, opn, inplace=inplace,
                    params=arithmetic(send.dtype, opn, _deterministic(e, deterministic))), \
            returned(recvbuf, recv, sendbuf.shape)

    def again(self, call, dtype, canonical, sendbuf, recvbuf):
        # all that can change about the same array objects: their writability, a dtype set in place
        if sendbuf.dtype is not dtype or recvbuf.dtype is not dtype or not recvbuf.flags.writeable:
            return None
        send = flat_view(sendbuf, canonical)
        recv = send if call.inplace else flat_view(recvbuf, canonical)
        return call.on(send, recv)

    def args(self, call):
        return dict(sendbuf=call.send, recvbuf=call.recv, op=call.op)


class ReduceScatter(Collective):
    """Reduce over all ranks and leave block r of the result on rank r.

    Blocks follow `counts` (one non-negative integer per rank, adding up to len(sendbuf));
    the default splits evenly, the first len % p blocks one element longer. In place
    (`recvbuf is sendbuf`) the result is written into block r of the buffer and that block
    (a view) is returned. Algorithms: "ring", "naive", "ordered", "mpi", "auto". Other
    parameters and errors as in `allreduce`.

    Example (mpirun -n 2):
        >>> ringmpi.reduce_scatter(np.ones(4))      # [2., 2.] on both ranks
    """
    name, reduces, per_rank, busbw, simulated_mpi, taught = \
        "reduce_scatter", True, True, "(n-1)/n", "ring", "ring"
    mpi_methods = ("Reduce_scatter", "Reduce_scatter_block")

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

    def prepare(self, e, sendbuf, recvbuf=None, *, op="sum", counts=None, deterministic=None):
        inplace = recvbuf is not None and recvbuf is sendbuf
        send = e.array("sendbuf", sendbuf, writable=inplace)
        opn = e.op(op, send.dtype)
        c = tuple(block_counts(send.size, e.t.size)) if counts is None else e.counts(counts, send.size)
        r = e.t.rank
        params = arithmetic(send.dtype, opn, _deterministic(e, deterministic))
        if inplace:
            off = offsets(c)
            recv = send[off[r]:off[r + 1]]
            return Call(self, send, recv, send.size, opn, counts=c, inplace=True, params=params), recv
        recv = e.recv(recvbuf, send, c[r])
        return Call(self, send, recv, send.size, opn, counts=c, params=params), returned(recvbuf, recv, (c[r],))

    def args(self, call):
        return dict(sendbuf=call.send, recvbuf=call.send if call.inplace else call.recv, op=call.op, counts=None)


class Allgather(Collective):
    """Concatenate every rank's `sendbuf` in rank order, on every rank.

    `counts` gives per-rank block sizes (default: every rank sends len(sendbuf)). In place
    (`recvbuf is sendbuf`) the buffer holds the whole result and block r is this rank's
    input. Algorithms: "ring", "naive", "recursive_doubling" (Bruck when p is not a power
    of two), "mpi", "auto".

    Example (mpirun -n 2):
        >>> ringmpi.allgather(np.array([rank]))     # [0, 1] on both ranks
    """
    name, per_rank, busbw, simulated_mpi, taught = "allgather", True, "(n-1)/n", "recursive_doubling", "ring"
    mpi_methods = ("Allgather", "Allgatherv")

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

    def prepare(self, e, sendbuf, recvbuf=None, *, counts=None):
        p, r = e.t.size, e.t.rank
        inplace = recvbuf is not None and recvbuf is sendbuf
        buf = e.array("sendbuf", sendbuf, writable=inplace)
        if counts is not None:
            c = e.counts(counts)
        elif inplace:
            if buf.size % p:
                e.fail(f"in-place buffer has {buf.size} elements, expected a multiple of {p} "
                       "(pass counts= for uneven blocks)")
            c = (buf.size // p,) * p
        else:
            c = (buf.size,) * p
        off = offsets(c)
        if inplace:
            if buf.size != off[-1]:
                e.fail(f"in-place buffer has {buf.size} elements, expected sum(counts) = {off[-1]}")
            return Call(self, buf[off[r]:off[r + 1]], buf, off[-1], counts=c, inplace=True), recvbuf
        if buf.size != c[r]:
            e.fail(f"sendbuf has {buf.size} elements, expected counts[{r}] = {c[r]}")
        recv = e.recv(recvbuf, buf, off[-1])
        return Call(self, buf, recv, off[-1], counts=c), returned(recvbuf, recv, (off[-1],))

    def args(self, call):
        return dict(sendbuf=call.recv if call.inplace else call.send, recvbuf=call.recv, counts=None)


class Broadcast(Collective):
    """Copy the root's `buf` into `buf` on every rank (in place, like MPI_Bcast); returns `buf`.

    Algorithms: "pipeline" (the segmented chain: `segments` pieces, default the S that
    minimises (p-2+S)(alpha + n/(S B)) under the active profile), "tree", "naive",
    "scatter_allgather", "mpi", "auto".

    Example:
        >>> ringmpi.broadcast(weights, root=0, algorithm="pipeline", segments=16)
    """
    name, rooted, simulated_mpi, taught, has_out_of_place = "broadcast", True, "tree", "pipeline", False
    mpi_methods = ("Bcast",)
    send_arg, recv_arg = "buf", None

    def make(self, rank, p, x, *, op=None, root=0, inplace=True):
        buf = x.copy() if rank == root else blank(x.size, x)
        return Call(self, buf, buf, x.size, None, root, inplace=True)

    def expected(self, xs, rank, op=None, root=0):
        return xs[root]

    def prepare(self, e, buf, root=0, *, segments=None):
        flat = e.array("buf", buf, writable=True)
        root = e.root(root)
        params = () if segments is None else (("segments", e.integer("segments", segments, 1)),)
        return Call(self, flat, flat, flat.size, None, root, inplace=True, params=params), buf

    def args(self, call):
        return dict(buf=call.recv, root=call.root, segments=call.param("segments"))


class Reduce(Collective):
    """Reduce over all ranks onto `root`; returns the result there and None elsewhere.

    `recvbuf` matters on the root only (`recvbuf is sendbuf`: in place). Algorithms:
    "ring" (reduce-scatter, then the blocks to the root), "tree", "naive", "ordered", "mpi",
    "auto". `deterministic` as in `allreduce`.
    """
    name, reduces, rooted, simulated_mpi, taught = "reduce", True, True, "tree", "ring"
    mpi_methods = ("Reduce",)

    def make(self, rank, p, x, *, op=None, root=0, inplace=False):
        send = x.copy()
        recv = (send if inplace else blank(x.size, x)) if rank == root else None
        return Call(self, send, recv, x.size, op, root, inplace=inplace and rank == root, params=arithmetic(x.dtype, op))

    def expected(self, xs, rank, op=None, root=0):
        return fold(op, xs) if rank == root else None

    def prepare(self, e, sendbuf, recvbuf=None, root=0, *, op="sum", deterministic=None):
        root = e.root(root)
        at_root = e.t.rank == root
        inplace = at_root and recvbuf is not None and recvbuf is sendbuf
        send = e.array("sendbuf", sendbuf, writable=inplace)
        opn = e.op(op, send.dtype)
        params = arithmetic(send.dtype, opn, _deterministic(e, deterministic))
        if not at_root:
            return Call(self, send, None, send.size, opn, root, params=params), None
        recv = send if inplace else e.recv(recvbuf, send, send.size)
        return Call(self, send, recv, send.size, opn, root, inplace=inplace, params=params), \
            returned(recvbuf, recv, sendbuf.shape)

    def args(self, call):
        return dict(sendbuf=call.send, recvbuf=call.recv, root=call.root, op=call.op)


class Alltoall(Collective):
    """Block q of this rank's `sendbuf` goes to rank q; block q of the result came from rank q.

    `sendbuf` holds p equal blocks (its size a multiple of p; e.g. shape (p, ...)). In place:
    `recvbuf is sendbuf`. Algorithms: "pairwise" (p-1 rounds), "bruck" (ceil(lg p) rounds,
    for small blocks), "naive" (everything posted at once), "mpi", "auto".

    Example (mpirun -n 2):
        >>> ringmpi.alltoall(np.array([10 * rank, 10 * rank + 1]))   # rank 0: [0, 10]; rank 1: [1, 11]
    """
    name, busbw, simulated_mpi, taught = "alltoall", "(n-1)/n", "pairwise", "pairwise"
    mpi_methods = ("Alltoall",)

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

    def prepare(self, e, sendbuf, recvbuf=None):
        p = e.t.size
        inplace = recvbuf is not None and recvbuf is sendbuf
        send = e.array("sendbuf", sendbuf, writable=inplace)
        if send.size % p:
            e.fail(f"sendbuf has {send.size} elements, expected a multiple of {p} (one block per rank)")
        recv = send if inplace else e.recv(recvbuf, send, send.size)
        call = Call(self, send, recv, send.size, counts=(send.size // p,) * p, inplace=inplace)
        return call, returned(recvbuf, recv, sendbuf.shape)

    def args(self, call):
        return dict(sendbuf=call.send, recvbuf=call.recv)


class Scan(Allreduce):
    """The inclusive prefix reduction (MPI_Scan): rank r gets x0 op x1 op ... op xr of the
    ranks' `sendbuf`s; "avg" divides rank r's sum by r + 1.

    Algorithms: "linear" (the chain, p-1 hops: rank order, the deterministic mode's),
    "recursive_doubling" (Hillis and Steele, ceil(lg p) rounds), "mpi", "auto". Arguments,
    results and errors as in `allreduce`.

    Example (mpirun -n 3):
        >>> ringmpi.scan(np.array([rank + 1.0]))     # rank 0: [1.]; rank 1: [3.]; rank 2: [6.]
    """
    name, busbw, simulated_mpi, taught = "scan", "1", "recursive_doubling", "linear"
    mpi_methods = ("Scan",)

    def busbw_factor(self, p):
        return 1.0

    def divisor(self, p, rank):
        return rank + 1

    def expected(self, xs, rank, op=None, root=0):
        return fold(op, xs[:rank + 1])


SPECS: dict[str, Collective] = {s.name: s for s in (Allreduce(), ReduceScatter(), Allgather(), Broadcast(), Reduce(),
                                                     Alltoall(), Scan())}


def add(spec: Collective) -> Collective:
    """A collective from outside the package (a plug-in), by its spec: it joins `SPECS`, and
    `ringmpi.<name>`, `ringmpi.i<name>` and `ringmpi.<name>_init` serve it once its
    algorithms are registered (`ringmpi.schedules.register`)."""
    if not spec.name or spec.name in SPECS:
        raise ValueError(f"a new collective needs a name of its own, got {spec.name!r}")
    SPECS[spec.name] = spec
    return spec


def spec(name: str) -> Collective:
    """The spec of collective `name` (ValueError naming the valid ones otherwise)."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; expected one of {', '.join(SPECS)}") from None
