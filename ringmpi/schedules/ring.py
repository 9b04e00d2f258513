"""Ring algorithms: ring reduce-scatter, ring all-gather, ring all-reduce, ring reduce, and
the segmented pipelined chain broadcast.

Ring all-reduce on p ranks (the lecture's index schedule). Rank r sends to r+1, receives
from r-1; the buffer is cut into p blocks (the first n % p one element longer):

    reduce-scatter, round i = 0..p-2:  send block (r-i) mod p, receive and reduce (r-i-1) mod p
    all-gather,     round i = 0..p-2:  send block (r-i+1) mod p, receive (r-i) mod p

After the reduce-scatter rank r owns the fully reduced block (r+1) mod p. Every round is one
MPI_Sendrecv of n/p bytes on every link at once:

    T_ring_allreduce = 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    bytes sent by every rank: 2(p-1)/p n   (bandwidth optimal; busiest = average)

Reduce-scatter and all-gather alone cost half of that each: (p-1) alpha + (p-1)/p n beta
(+ (p-1)/p n gamma for the reduction). Each block is reduced at exactly one place, in ring
order, then copied: every rank ends with the same bits.

Pipelined broadcast along the chain root -> root+1 -> ... with the buffer cut into S segments:
relative rank v receives segment s at step s+v-1 and forwards it at step s+v, so

    T_pipeline = (p - 2 + S)(alpha + n/S beta)       (S = 1: the plain chain, (p-1)(alpha + n beta))

S is the algorithm's tunable: S* = sqrt((p-2) n beta / alpha) minimises it (`tune`).

16-bit floats (float16, bfloat16). With float32 partial sums (`partials` 4, the default) the
reduce-scatter moves and reduces float32 blocks and the owner of each block rounds it once;
the all-gather moves the rounded 16-bit blocks:

    T = 2(p-1) alpha + (p-1)/p n4 beta + (p-1)/p n2 beta + (p-1)/p n4 gamma
                                    (n4, n2: the vector's bytes in float32 and in 16 bits)

so the wire carries 1.5x the 16-bit bytes (0.75x a float32 all-reduce's). With 16-bit hops
(`partials` 2) every round sends 16 bits and each reduction rounds: 0.5x a float32
all-reduce's bytes, a rounding per hop (`ringmpi sim accuracy` measures what it costs).
"""
from __future__ import annotations

from functools import lru_cache

from ..cost import Cost, best_segments
from ..ops import ACCUMULATOR
from . import block_counts, cdiv, offsets, register

__all__ = ["reduce_scatter_phase", "allgather_phase", "allreduce_part", "reduce_scatter_part", "blocks_of", "widths_of",
           "blocks_to_root", "segment_counts"]


@lru_cache(maxsize=256)
def blocks_of(off: tuple, part: tuple[int, int] | None = None) -> tuple[slice, ...]:
    """Block b of the partition `off` as a slice, or only its elements [lo, hi) (`part`,
    clipped to the block): the segmented ring runs the same rounds on one part of every
    block at a time, so every element is still reduced in its block's ring order. (One
    table per partition and part, shared by the ranks, as `block_counts`.)"""
    if part is None:
        return tuple(slice(off[b], off[b + 1]) for b in range(len(off) - 1))
    lo, hi = part
    return tuple(slice(min(off[b] + lo, off[b + 1]), min(off[b] + hi, off[b + 1])) for b in range(len(off) - 1))


@lru_cache(maxsize=256)
def widths_of(off: tuple, part: tuple[int, int] | None = None) -> frozenset[int]:
    """The distinct widths of `blocks_of(off, part)` (two for an even split): once per
    partition, not once per rank, whose p blocks made it p^2 work on a virtual cluster."""
    return frozenset(b.stop - b.start for b in blocks_of(off, part))


def reduce_scatter_phase(t, src, off: tuple, part: tuple[int, int] | None, op, out, shift: int = 0) -> int:
    """Ring reduce-scatter of the blocks `off` of `src`, whole or one `part` of each
    (`blocks_of`); returns the block this rank ends owning.

    Round i sends block (r-i+shift) and reduces block (r-i-1+shift) into block c of the
    array `out`, or into `out(i, c)` where a function chooses (scratch blocks); round 0
    reads `src` directly and every reduction writes `out = received op src[c]` (each
    received block is touched once, so there is no scratch copy of the input).
    """
    p, r = t.size, t.rank
    right, left = (r + 1) % p, (r - 1) % p
    blk, widths = blocks_of(off, part), widths_of(off, part)
    # where a received block lands before it is reduced (None over shared memory, which
    # reads it in the neighbour's memory and reduces it there, in one pass)
    tmp = t.landing(max(widths), src.dtype)
    lands = {} if tmp is None else {w: tmp[:w] for w in widths}   # its view for a block of each width
    out_for = out if callable(out) else None
    prev = src[blk[(r + shift) % p]]
    for i in range(p - 1):
        c = (r - i - 1 + shift) % p
        b = blk[c]
        send, prev = prev, out[b] if out_for is None else out_for(i, c)
        # receive block c from the left and reduce it with ours into prev (sent next round)
        t.sendrecv_reduce(send, right, lands.get(b.stop - b.start), left, op, src[b], prev)
    return (r + 1 + shift) % p


def allgather_phase(t, buf, blk: list[slice], own: int, pos: int | None = None, base: int = 0) -> None:
    """Ring all-gather in place: the rank at ring position `pos` holds block `own` of `buf`
    (`blk`: the blocks, `blocks_of`).

    Ring positions map to ranks as rank = (pos + base) mod p, so the same phase serves a
    ring rooted anywhere (scatter + all-gather broadcast).
    """
    p = t.size
    pos = t.rank if pos is None else pos
    right, left = (pos + 1 + base) % p, (pos - 1 + base) % p
    prev = buf[blk[own]]
    for i in range(p - 1):
        got = buf[blk[(own - i - 1) % p]]
        t.sendrecv(prev, right, got, left)   # what came this round goes on in the next
        prev = got


def _rounds_cost(p, count, itemsize, phases: int, reduce: bool) -> Cost:
    """`phases` ring phases of p-1 rounds, each round one block of ceil(n/p) on every link."""
    b = cdiv(count, p) * itemsize
    k = phases * (p - 1)
    return Cost(alphas=k, beta_bytes=k * b, gamma_bytes=(p - 1) * b if reduce else 0,
                rounds=k, busiest_sent=k * b, avg_sent=k * b)


def _allreduce_cost(p, count, itemsize, partials=0, **_):
    if partials <= itemsize:
        return _rounds_cost(p, count, itemsize, 2, True)
    rs, ag = _rounds_cost(p, count, partials, 1, True), _rounds_cost(p, count, itemsize, 1, False)
    return Cost(alphas=rs.alphas + ag.alphas, beta_bytes=rs.beta_bytes + ag.beta_bytes, gamma_bytes=rs.gamma_bytes,
                rounds=rs.rounds + ag.rounds, busiest_sent=rs.busiest_sent + ag.busiest_sent,
                avg_sent=rs.avg_sent + ag.avg_sent)


@register("allreduce", "ring", _allreduce_cost, mixed=True)
def allreduce(t, call):
    allreduce_part(t, call, offsets(block_counts(call.count, t.size)))


def allreduce_part(t, call, off, part: tuple[int, int] | None = None) -> None:
    """The ring all-reduce of the blocks `off` (or of their elements `part`). A 16-bit
    float with float32 partials (`partials` wider than its items): the reduce-scatter on a
    float32 copy, the owned block divided (AVG) and rounded there, the all-gather in 16 bits."""
    recv, blk = call.recv, blocks_of(off, part)
    if call.wide_partials:
        acc = t.empty(call.send.size, ACCUMULATOR)
        t.copy(call.send, acc)
        own = reduce_scatter_phase(t, acc, off, part, call.op, acc)
        if call.op == "AVG":
            t.scale(acc[blk[own]], t.size)
        t.copy(acc[blk[own]], recv[blk[own]])
    else:
        own = reduce_scatter_phase(t, call.send, off, part, call.op, recv)
    allgather_phase(t, recv, blk, own)


@register("reduce_scatter", "ring", lambda p, count, itemsize, **_: _rounds_cost(p, count, itemsize, 1, True))
def reduce_scatter(t, call):
    reduce_scatter_part(t, call)


def reduce_scatter_part(t, call, part: tuple[int, int] | None = None) -> None:
    """The ring reduce-scatter of the blocks `call.counts` (or of their elements `part`)."""
    p = t.size
    off = offsets(call.counts)
    blk = blocks_of(off, part)
    mine = call.recv[blocks_of((0, call.recv.size), part)[0]]
    # Two scratch blocks alternate as "just reduced" and "being reduced"; the last round
    # reduces straight into recv, so memory stays O(n/p) beyond the user's buffers.
    width = max(widths_of(off, part))
    work = [t.empty(width, call.dtype), t.empty(width, call.dtype)]

    def out_for(i, c):
        return mine if i == p - 2 else work[i % 2][:blk[c].stop - blk[c].start]
    own = reduce_scatter_phase(t, call.send, off, part, call.op, out_for, shift=-1)
    assert own == t.rank


@register("allgather", "ring", lambda p, count, itemsize, **_: _rounds_cost(p, count, itemsize, 1, False))
def allgather(t, call):
    off = offsets(call.counts)
    r = t.rank
    if not call.inplace:
        t.copy(call.send, call.recv[off[r]:off[r + 1]])
    allgather_phase(t, call.recv, blocks_of(off), r)


def _reduce_cost(p, count, itemsize, **_):
    b = cdiv(count, p) * itemsize
    rs = _rounds_cost(p, count, itemsize, 1, True)
    # then the p-1 reduced blocks converge on the root at once
    return Cost(alphas=rs.alphas + 1, beta_bytes=rs.beta_bytes + (p - 1) * b,
                gamma_bytes=rs.gamma_bytes, rounds=p, busiest_sent=rs.busiest_sent + b,
                avg_sent=rs.avg_sent + (p - 1) * b / p)


@register("reduce", "ring", _reduce_cost)
def reduce(t, call):
    """Ring reduce-scatter, then every rank sends its reduced block to the root."""
    p, r = t.size, t.rank
    counts, off = call.blocks(p)
    mine = t.empty(counts[r], call.dtype)
    reduce_scatter(t, call._replace(recv=mine, counts=tuple(counts), inplace=False))
    blocks_to_root(t, call, off, mine)


def blocks_to_root(t, call, off, mine, at_root: bool = False) -> None:
    """The second half of a reduce by reduce-scatter: every rank's reduced block `mine` (the
    blocks `off`) to the root's result, at once; the root's own copied there, unless it was
    reduced there already (`at_root`)."""
    p, r, root = t.size, t.rank, call.root
    if r == root:
        t.exchange([], [(call.recv[off[q]:off[q + 1]], q) for q in range(p) if q != root])
        if not at_root:
            t.copy(mine, call.recv[off[r]:off[r + 1]])
    else:
        t.exchange([(mine, root)], [])


def segment_counts(count: int, segments: int) -> tuple[int, ...]:
    return block_counts(count, max(1, min(segments, count)) if count else 1)


def _pipeline_cost(p, count, itemsize, segments=1, **_):
    segs = len(segment_counts(count, segments))
    seg = cdiv(count, segs) * itemsize
    steps = p - 2 + segs
    return Cost(alphas=steps, beta_bytes=steps * seg, gamma_bytes=0, rounds=steps,
                busiest_sent=count * itemsize, avg_sent=count * itemsize * (p - 1) / p)


#: no segment smaller than this, whatever the profile says (a tiny alpha would ask for one
#: segment per element)
MIN_SEGMENT_BYTES = 1024


def _pipeline_tune(p, count, itemsize, prof) -> dict:
    most = max(1, min(count, count * itemsize // MIN_SEGMENT_BYTES))
    if prof.alpha <= 0:
        return {"segments": most}
    return {"segments": best_segments(p, count * itemsize, prof.alpha, prof.beta, most)[0]}


@register("broadcast", "pipeline", _pipeline_cost, _pipeline_tune)
def broadcast(t, call):
    p, buf = t.size, call.recv
    v = (t.rank - call.root) % p
    right = (t.rank + 1) % p if v < p - 1 else None
    left = (t.rank - 1) % p if v > 0 else None
    off = offsets(segment_counts(buf.size, call.param("segments", 1)))
    nseg = len(off) - 1
    # step k: forward segment k-v (received last step), receive segment k-v+1
    for k in range(max(v - 1, 0), v + nseg):
        s_out, s_in = k - v, k - v + 1
        send = buf[off[s_out]:off[s_out + 1]] if right is not None and 0 <= s_out < nseg else None
        recv = buf[off[s_in]:off[s_in + 1]] if left is not None and 0 <= s_in < nseg else None
        if send is not None or recv is not None:
            t.sendrecv(send, right, recv, left)
