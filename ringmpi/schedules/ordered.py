"""Reproducible reductions: every block folded in rank order by its owner, the bits of
((x0 + x1) + x2) + ... whatever p, the size, the hosts or the algorithm `auto` would pick.

Reduce-scatter by all-to-all (rank r owns block r; round k = 1..p-1 of the pairwise
exchange sends block (r+k) mod p to rank r+k and receives rank (r-k)'s copy of block r):
after the p-1 rounds the owner holds block r of every rank and folds them in rank order.
The all-reduce adds the ring all-gather; the reduce sends every owner's block to the root.

    reduce_scatter:  T = (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma
    allreduce:       T = 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma   (the ring's cost)
    reduce:          T = p alpha + 2(p-1)/p n beta + (p-1)/p n gamma

The bytes are the ring's: each rank sends every block but its own once, and receives its
block from every other rank once. What the fold needs beyond the ring is memory, the p
copies of one block (n elements in all), since block r arrives from rank r-1 first and from
rank 0 last, and the fold must begin with rank 0's. The naive algorithm (`naive.py`: the
root folds in rank order too) is the latency-bound choice of the same guarantee.
"""
from __future__ import annotations

from ..cost import Cost
from . import block_counts, cdiv, offsets, register
from .ring import allgather_phase, blocks_of

__all__ = ["fold_blocks"]


def fold_blocks(t, send, counts, op, out) -> None:
    """Reduce-scatter of `send` (blocks `counts`) by all-to-all: rank r folds block r of
    every rank, in rank order, into `out` (which may be block r of `send` itself)."""
    p, r = t.size, t.rank
    off = offsets(counts)
    w = counts[r]
    parts = t.empty(w * p, send.dtype)
    slot = [parts[q * w:(q + 1) * w] for q in range(p)]
    t.copy(send[off[r]:off[r + 1]], slot[r])   # (an in-place call writes `out` over it)
    for k in range(1, p):
        to, frm = (r + k) % p, (r - k) % p
        t.sendrecv(send[off[to]:off[to + 1]], to, slot[frm], frm)
    t.combine(op, slot[0], slot[1], out)
    for q in range(2, p):
        t.combine(op, out, slot[q], out)


def _rs_cost(p, count, itemsize, **_):
    b = cdiv(count, p) * itemsize
    return Cost(alphas=p - 1, beta_bytes=(p - 1) * b, gamma_bytes=(p - 1) * b, rounds=p - 1,
                busiest_sent=(p - 1) * b, avg_sent=(p - 1) * b)


def _ar_cost(p, count, itemsize, **_):
    rs, b = _rs_cost(p, count, itemsize), cdiv(count, p) * itemsize
    return Cost(alphas=2 * (p - 1), beta_bytes=2 * (p - 1) * b, gamma_bytes=rs.gamma_bytes, rounds=2 * (p - 1),
                busiest_sent=2 * (p - 1) * b, avg_sent=2 * (p - 1) * b)


def _reduce_cost(p, count, itemsize, **_):
    rs, b = _rs_cost(p, count, itemsize), cdiv(count, p) * itemsize
    return Cost(alphas=p, beta_bytes=2 * (p - 1) * b, gamma_bytes=rs.gamma_bytes, rounds=p,
                busiest_sent=p * b, avg_sent=rs.avg_sent + (p - 1) * b / p)


@register("reduce_scatter", "ordered", _rs_cost, ordered=True)
def reduce_scatter(t, call):
    fold_blocks(t, call.send, call.counts, call.op, call.recv)


@register("allreduce", "ordered", _ar_cost, ordered=True)
def allreduce(t, call):
    p, r = t.size, t.rank
    counts = block_counts(call.count, p)
    off = offsets(counts)
    fold_blocks(t, call.send, counts, call.op, call.recv[off[r]:off[r + 1]])
    allgather_phase(t, call.recv, blocks_of(off), r)


@register("reduce", "ordered", _reduce_cost, ordered=True)
def reduce(t, call):
    """The ordered reduce-scatter, then every owner's block to the root."""
    p, r, root = t.size, t.rank, call.root
    counts = block_counts(call.count, p)
    off = offsets(counts)
    mine = call.recv[off[r]:off[r + 1]] if r == root else t.empty(counts[r], call.dtype)
    fold_blocks(t, call.send, counts, call.op, mine)
    if r == root:
        t.exchange([], [(call.recv[off[q]:off[q + 1]], q) for q in range(p) if q != root])
    else:
        t.exchange([(mine, root)], [])
