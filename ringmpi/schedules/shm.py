"""The ring and the pipeline over the host's shared memory (`ringmpi.shm`): the lecture's
schedules from ring.py, unchanged, on the shared-memory transport.

    ring_shm  (allreduce, reduce_scatter, allgather)   pipeline_shm  (broadcast)

A "message" is the receiver reading the block in the sender's memory (one copy, not MPI's
two through its queue), and the reduce-scatter reduces the neighbour's block straight into
its output (`sendrecv_reduce`, one pass). A block of an array peers cannot map (a user's
ordinary numpy array) is staged in the sender's shared arena first, or, from `shm.CMA_MIN` up
where the kernel lets ranks read each other's memory, read across (`ringmpi.cma`); arrays
from `ringmpi.shared_empty` are sent as they are.

The ring runs on one part of every block at a time, PART bytes of each (NCCL's ring works
in slices too): round i of part k sends elements [k PART, (k+1) PART) of the block round i
sends whole. A part's blocks stay in cache from the sender's staging copy (or the reduction
that wrote them) to the receiver's read; whole blocks of megabytes go out to memory in
between. Each element stays in its block and is reduced in that block's ring order: the
same bits as the ring over MPI. Where the transport reads ordinary arrays across (blocks
from CMA_MIN, every rank allowed), whole blocks cost less (one read per block, nothing
staged to keep in cache): every rank then runs whole blocks, whatever its arrays are.
With S = ceil(ceil(n/p) / PART) parts, on the node's links:

    T_ring_shm_allreduce = 2(p-1) S alpha_l + 2(p-1)/p n beta_l + (p-1)/p n gamma

(reduce-scatter and all-gather: half the rounds and bytes; the formula and the simulator
count parts; a transport reading across runs whole blocks, S = 1). Parts keep a block's
copy and reduction in cache: staged or shared, they took half the time of whole blocks,
and parts of 1 MiB lose that (benchmarks/README.md, "Figures behind constants in the
code"). Where blocks of ordinary arrays are read across (from `shm.CMA_MIN`, see there)
whole blocks do as well or better.

Only for ranks that share one host (`unavailable` otherwise: auto leaves them out). Each
body registers the arena it reserves (`arena`): a request reserves it when it starts, on the
caller's thread, since growing the arena is collective (`Algorithm.scratch`).
"""
from __future__ import annotations

from dataclasses import replace

from . import block_counts, cdiv, offsets, register
from . import ring as _ring

SLACK = 8 * 64      # alignment of the arena's pieces
PART = 512 << 10    # bytes of every block per part (see above)


def _step(itemsize: int) -> int:
    return max(1, PART // itemsize)


def _parts(s, width: int, itemsize: int) -> list[tuple[int, int] | None]:
    """The parts [lo, hi) of every block (`width` elements at most) the ring runs one after
    the other: whole blocks (None) where the transport reads ordinary arrays' blocks across
    or one part holds them, else PART bytes (the same on every rank, whatever memory each
    rank's buffers are in)."""
    step = _step(itemsize)
    if width <= step or s.reads_across(width * itemsize):
        return [None]
    return [(lo, lo + step) for lo in range(0, width, step)]


def _block_bytes(width: int, itemsize: int) -> int:
    """The largest block of a part that may be staged: PART bytes, or the whole block where
    it is smaller (whole blocks read across stage at most a short block of uneven counts;
    one the arena cannot hold is read across too)."""
    return min(width, _step(itemsize)) * itemsize


def _in_parts(c, p: int, count: int, itemsize: int):
    """A ring cost `c` run in parts: the same bytes in S times the rounds."""
    k = max(1, cdiv(cdiv(count, p), _step(itemsize)))
    return replace(c, alphas=c.alphas * k, rounds=c.rounds * k).local()


def _one_host(t) -> str | None:
    if t.on_device:
        return "device buffers do not go through the host's shared memory"
    hosts = len(set(t.nodes))
    return None if hosts == 1 else f"shared memory needs every rank on one host; these ranks are on {hosts}"


def _work(s, buf, count, dtype):
    """`buf` itself when peers can read it (in a shared segment, or across with cross-memory
    attach), else a buffer of the arena."""
    if buf is not None and (s.in_shared(buf) or s.cross_memory and buf.flags.c_contiguous):
        return buf
    return s.empty(count, dtype)


def _allreduce_cost(p, count, itemsize, **_):
    return _in_parts(_ring._rounds_cost(p, count, itemsize, 2, True), p, count, itemsize)


def _pipeline_cost(p, count, itemsize, segments=1, **_):
    return _ring._pipeline_cost(p, count, itemsize, segments).local()


def _pipeline_tune(p, count, itemsize, prof) -> dict:
    """The pipeline's segment count under the node's own alpha and beta."""
    return _ring._pipeline_tune(p, count, itemsize, replace(prof, alpha=prof.alpha_l, beta=prof.beta_l))


# -- the arena each body reserves (the arena from its start at every part: every block of
# the previous part has been read), registered beside it for requests (`Algorithm.scratch`)
def _allreduce_arena(p, call, itemsize):
    """Every block a part publishes, staged."""
    return 2 * p * (_block_bytes(cdiv(call.count, p), itemsize) + 64) + SLACK


def _reduce_scatter_arena(p, call, itemsize):
    """ring.py's two work blocks and every block it publishes, staged."""
    return (p + 2) * (_block_bytes(max(call.counts), itemsize) + 64) + SLACK


def _allgather_arena(p, call, itemsize):
    """Every block it publishes, staged."""
    return p * (_block_bytes(max(call.counts), itemsize) + 64) + SLACK


def _broadcast_arena(p, call, itemsize):
    """The whole buffer, or every segment this rank sends staged (64-byte aligned)."""
    segments = len(_ring.segment_counts(call.count, call.param("segments", 1)))
    return call.count * itemsize + 64 * segments + SLACK


@register("allreduce", "ring_shm", _allreduce_cost, unavailable=_one_host, arena=_allreduce_arena)
def allreduce(t, call):
    """ring.py's all-reduce into the user's buffer, part after part."""
    s, p = t.shared(), t.size
    width = cdiv(call.count, p)
    off = offsets(block_counts(call.count, p))
    arena = _allreduce_arena(p, call, call.itemsize)
    for part in _parts(s, width, call.itemsize):
        s.reserve(arena)
        _ring.allreduce_part(s, call, off, part)


def _rounds_cost(reduces: bool):
    """ring.py's p-1 rounds of one block, in parts, on the node's links (reduce-scatter or
    all-gather)."""
    return lambda p, count, itemsize, **_: _in_parts(_ring._rounds_cost(p, count, itemsize, 1, reduces), p,
                                                     count, itemsize)


@register("reduce_scatter", "ring_shm", _rounds_cost(True), unavailable=_one_host, arena=_reduce_scatter_arena)
def reduce_scatter(t, call):
    s, width = t.shared(), max(call.counts)
    arena = _reduce_scatter_arena(t.size, call, call.itemsize)
    for part in _parts(s, width, call.itemsize):
        s.reserve(arena)
        _ring.reduce_scatter_part(s, call, part)


@register("allgather", "ring_shm", _rounds_cost(False), unavailable=_one_host, arena=_allgather_arena)
def allgather(t, call):
    s, r = t.shared(), t.rank
    off = offsets(call.counts)
    if not call.inplace:
        s.copy(call.send, call.recv[off[r]:off[r + 1]])
    arena = _allgather_arena(t.size, call, call.itemsize)
    for part in _parts(s, max(call.counts), call.itemsize):
        s.reserve(arena)
        _ring.allgather_phase(s, call.recv, _ring.blocks_of(off, part), r)


@register("broadcast", "pipeline_shm", _pipeline_cost, _pipeline_tune, unavailable=_one_host,
          arena=_broadcast_arena)
def broadcast(t, call):
    s, buf = t.shared(), call.recv
    s.reserve(_broadcast_arena(t.size, call, buf.itemsize))
    work = _work(s, buf, buf.size, buf.dtype)
    if work is not buf and t.rank == call.root:
        s.copy(buf, work)
    _ring.broadcast(s, call._replace(send=work, recv=work))
    if work is not buf and t.rank != call.root:
        s.copy(work, buf)

