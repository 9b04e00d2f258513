"""Reproducible reductions: every block folded in rank order by its owner, the bits of
((x0 + x1) + x2) + ... whatever p, the size, the hosts or the algorithm `auto` would pick.

Reduce-scatter by all-to-all (rank r owns block r; round k = 1..p-1 of the pairwise
exchange sends block (r+k) mod p to rank r+k and receives rank (r-k)'s copy of block r):
after the p-1 rounds the owner holds block r of every rank and folds them in rank order.
The all-reduce adds the ring all-gather; the reduce sends every owner's block to the root.

    reduce_scatter:  T = (p-1) alpha + (p-1)/p n beta + (2p-3)/p n gamma
    allreduce:       T = 2(p-1) alpha + 2(p-1)/p n beta + (2p-3)/p n gamma
    reduce:          T = p alpha + 2(p-1)/p n beta + (2p-3)/p n gamma

The alphas and betas are the ring's. The reductions are each rank's p-1 of n/p, but they
lie on the critical path p-2 more times than the ring's: rank 0 folds every block as it
arrives, so its send of round k leaves k-1 reductions late, and rank 1, which gets rank 0's
block in the last round, p-2 reductions late, then folds p-1 blocks. Folding everything
after the last round instead would put only p-1 on the path, but measured slower (every
block read back from memory, none while still in cache: `benchmarks/README.md`).

The bytes are the ring's: each rank sends every block but its own once, and receives its
block from every other rank once. What the fold needs beyond the ring is memory for the
copies of its block that arrive before their turn, and the fold must begin with rank 0's. Receiving from r+1 first, r+2, ..., the
blocks of ranks 0 ... r-1 come last and in order and are folded as they come; rank r keeps
only those of ranks r+1 ... p-1 (`fold_blocks`). The naive algorithm (`naive.py`: the
root folds in rank order too) is the latency-bound choice of the same guarantee.
"""
from __future__ import annotations

from ..cost import Cost
from . import cdiv, offsets, register
from .ring import allgather_phase, blocks_of, blocks_to_root

__all__ = ["fold_blocks"]


def fold_blocks(t, send, counts, op, out, inplace: bool = False) -> None:
    """Reduce-scatter of `send` (blocks `counts`) by all-to-all: rank r folds block r of
    every rank, in rank order, into `out` (`inplace`: out is block r of `send` itself).

    Round k = 1..p-1 receives from rank r+k and sends to rank r-k, so ranks r+1, ..., p-1
    arrive first (kept) and 0, 1, ..., r-1 last, in rank order: those are folded as they
    come (rank 0's lands in `out` itself); then this rank's own block, then the kept."""
    p, r = t.size, t.rank
    off = offsets(counts)
    w = counts[r]
    mine = send[off[r]:off[r + 1]]
    if inplace and r >= 1:   # `out` is about to take rank 0's block: this rank's own goes aside
        mine = t.empty(w, send.dtype)
        t.copy(send[off[r]:off[r + 1]], mine)
    kept = t.empty(w * (p - 1 - r) if r else 0, send.dtype)   # (rank 0 keeps none)
    landing = t.empty(w, send.dtype)
    for k in range(1, p):
        frm, to = (r + k) % p, (r - k) % p
        if 0 < r < frm:
            into = kept[(frm - r - 1) * w:(frm - r) * w]
        else:
            into = out if frm == 0 else landing
        t.sendrecv(send[off[to]:off[to + 1]], to, into, frm)
        if r == 0:   # (rank 0: every block comes in rank order)
            t.combine(op, mine if k == 1 else out, landing, out)
        elif 0 < frm < r:
            t.combine(op, out, landing, out)
    if r:
        t.combine(op, out, mine, out)
        for q in range(r + 1, p):
            t.combine(op, out, kept[(q - r - 1) * w:(q - r) * w], out)


def _rs_cost(p, count, itemsize, **_):
    b = cdiv(count, p) * itemsize
    return Cost(alphas=p - 1, beta_bytes=(p - 1) * b, gamma_bytes=(2 * p - 3) * b, rounds=p - 1,
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
    fold_blocks(t, call.send, call.counts, call.op, call.recv, call.inplace)


@register("allreduce", "ordered", _ar_cost, ordered=True)
def allreduce(t, call):
    p, r = t.size, t.rank
    counts, off = call.blocks(p)
    fold_blocks(t, call.send, counts, call.op, call.recv[off[r]:off[r + 1]], call.inplace)
    allgather_phase(t, call.recv, blocks_of(off), r)


@register("reduce", "ordered", _reduce_cost, ordered=True)
def reduce(t, call):
    """The ordered reduce-scatter, then every owner's block to the root."""
    p, r, root = t.size, t.rank, call.root
    counts, off = call.blocks(p)
    mine = call.recv[off[r]:off[r + 1]] if r == root else t.empty(counts[r], call.dtype)
    fold_blocks(t, call.send, counts, call.op, mine, call.inplace)
    blocks_to_root(t, call, off, mine, at_root=r == root)
