"""Recursive doubling and halving: all-reduce, Rabenseifner's all-reduce, all-gather
(recursive doubling; Bruck's rotation when p is not a power of two), and van de Geijn's
scatter + ring all-gather broadcast.

Non-powers of two (all-reduce): with p' = 2^floor(lg p) and q = p - p', ranks 2i and 2i+1
(i < q) first fold: the even one sends its vector to the odd one, which stands for both in
the power-of-two part and sends the result back at the end (2 extra rounds).

Recursive doubling all-reduce, lg p' rounds: in round k exchange the whole vector with
partner v xor 2^k and reduce.          T = lg p (alpha + n beta + n gamma)
Rabenseifner: recursive halving reduce-scatter (round k: keep half the current range, send
the other half to partner v xor p'/2^(k+1), reduce) then recursive doubling all-gather.
                                        T = 2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma
Recursive doubling all-gather (p a power of two): round k swaps the 2^k blocks gathered so
far with partner v xor 2^k.  Bruck (any p): round k sends the first min(2^k, p-2^k) blocks of
a rotated buffer to v - 2^k and receives as many from v + 2^k; a final rotation.
                                        T = ceil(lg p) alpha + (p-1)/p n beta
Scatter + all-gather broadcast: binomial scatter of p blocks, then ring all-gather.
                                        T = (ceil(lg p) + p - 1) alpha + 2(p-1)/p n beta
"""
from __future__ import annotations

from ..cost import Cost
from . import binomial, block_counts, cdiv, lg, offsets, register
from .ring import allgather_phase, blocks_of


def _fold(p: int) -> tuple[int, int]:
    """(p', q): the power-of-two part and the number of folded pairs."""
    pp = 1 << (p.bit_length() - 1)
    return pp, p - pp


def _fold_extra(p: int, n: int) -> tuple[int, int, int, int]:
    """What the fold adds when p is no power of two: (alphas, beta bytes, gamma bytes,
    bytes sent by the busiest rank)."""
    return (2, 2 * n, n, n) if _fold(p)[1] else (0, 0, 0, 0)


def _folded(t, call, body) -> None:
    """Fold to p' = 2^k ranks, run body(v, real, p', src) on them (v: rank among p',
    real(v): its real rank, src: this rank's input, already folded into call.recv where a
    pair folded), and send the result back to the folded-away ranks."""
    p, r = t.size, t.rank
    pp, q = _fold(p)

    def real(v: int) -> int:
        return 2 * v + 1 if v < q else v + q
    src = call.send
    if r < 2 * q:
        if r % 2 == 0:  # hands its vector to r+1 and waits for the result
            t.sendrecv(call.send, r + 1, None, None)
            t.sendrecv(None, None, call.recv, r + 1)
            return
        tmp = t.empty(call.count, call.dtype)
        t.sendrecv(None, None, tmp, r - 1)
        t.combine(call.op, tmp, call.send, call.recv)
        src = call.recv
    body(r // 2 if r < 2 * q else r - q, real, pp, src)
    if r < 2 * q:
        t.sendrecv(call.recv, r - 1, None, None)


def _rd_cost(p, count, itemsize, **_):
    n = count * itemsize
    pp, q = _fold(p)
    L = lg(pp)
    fa, fb, fg, fs = _fold_extra(p, n)
    return Cost(alphas=L + fa, beta_bytes=L * n + fb, gamma_bytes=L * n + fg, rounds=L + fa,
                busiest_sent=L * n + fs, avg_sent=(pp * L * n + 2 * q * n) / p)


@register("allreduce", "recursive_doubling", _rd_cost)
def allreduce_recursive_doubling(t, call):
    def body(v, real, pp, src):
        tmp = t.empty(call.count, call.dtype)
        m = 1
        while m < pp:
            t.sendrecv(src, real(v ^ m), tmp, real(v ^ m))
            # both partners compute lower-rank-data op higher-rank-data: complex multiply
            # with FMA is not bitwise commutative, and every rank must end with the same bits
            t.combine(call.op, *((src, tmp) if v < v ^ m else (tmp, src)), call.recv)
            src = call.recv
            m <<= 1
    _folded(t, call, body)


def _rab_cost(p, count, itemsize, **_):
    pp, q = _fold(p)
    L = lg(pp)
    b = cdiv(count, pp) * itemsize
    fa, fb, fg, fs = _fold_extra(p, count * itemsize)
    sent = 2 * (pp - 1) * b
    return Cost(alphas=2 * L + fa, beta_bytes=sent + fb, gamma_bytes=(pp - 1) * b + fg, rounds=2 * L + fa,
                busiest_sent=sent + fs, avg_sent=(pp * sent + 2 * q * count * itemsize) / p)


@register("allreduce", "rabenseifner", _rab_cost)
def allreduce_rabenseifner(t, call):
    recv = call.recv

    def body(v, real, pp, src):
        off = offsets(block_counts(call.count, pp))
        tmp = t.empty(max(off[pp // 2], off[-1] - off[pp // 2]), call.dtype)
        lo, hi = 0, pp
        m = pp >> 1
        while m:  # recursive halving: keep the half that holds block v
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if v & m else ((lo, mid), (mid, hi))
            k0, k1 = off[keep[0]], off[keep[1]]
            got = tmp[:k1 - k0]
            t.sendrecv(src[off[give[0]]:off[give[1]]], real(v ^ m), got, real(v ^ m))
            t.combine(call.op, got, src[k0:k1], recv[k0:k1])
            src = recv
            lo, hi = keep
            m >>= 1
        m = 1
        while m < pp:  # recursive doubling all-gather of the reduced blocks
            base = v & ~(m - 1)
            other = base ^ m
            t.sendrecv(recv[off[base]:off[base + m]], real(v ^ m), recv[off[other]:off[other + m]], real(v ^ m))
            m <<= 1
    _folded(t, call, body)


def _ag_cost(p, count, itemsize, **_):
    b = cdiv(count, p) * itemsize
    L = lg(p)
    return Cost(alphas=L, beta_bytes=(p - 1) * b, gamma_bytes=0, rounds=L,
                busiest_sent=(p - 1) * b, avg_sent=(p - 1) * b)


@register("allgather", "recursive_doubling", _ag_cost)
def allgather_recursive_doubling(t, call):
    p, r = t.size, t.rank
    counts, recv = call.counts, call.recv
    off = offsets(counts)
    if p & (p - 1) == 0:
        if not call.inplace:
            t.copy(call.send, recv[off[r]:off[r + 1]])
        m = 1
        while m < p:
            base = r & ~(m - 1)
            other = base ^ m
            t.sendrecv(recv[off[base]:off[base + m]], r ^ m, recv[off[other]:off[other + m]], r ^ m)
            m <<= 1
        return
    # Bruck: position j of the rotated buffer holds block (r + j) mod p.
    roff = offsets([counts[(r + j) % p] for j in range(p)])
    rot = t.empty(roff[-1], call.dtype)
    t.copy(call.send, rot[:roff[1]])
    k = 1
    while k < p:
        m = min(k, p - k)
        t.sendrecv(rot[:roff[m]], (r - k) % p, rot[roff[k]:roff[k + m]], (r + k) % p)
        k <<= 1
    # unrotate: rotated positions [0, p-r) are blocks r..p-1, the rest blocks 0..r-1
    split = roff[p - r]
    t.copy(rot[:split], recv[off[r]:])
    t.copy(rot[split:], recv[:off[r]])


def _sag_cost(p, count, itemsize, **_):
    b = cdiv(count, p) * itemsize
    L = lg(p)
    # binomial scatter: the root sends (p-1) blocks down its subtrees (critical path);
    # then the ring all-gather sends p-1 blocks from every rank.
    scattered = sum(min(v + (v & -v), p) - v for v in range(1, p))  # blocks moved by the scatter
    return Cost(alphas=L + p - 1, beta_bytes=2 * (p - 1) * b, gamma_bytes=0, rounds=L + p - 1,
                busiest_sent=2 * (p - 1) * b, avg_sent=(p - 1) * b + scattered * b / p)


@register("broadcast", "scatter_allgather", _sag_cost)
def broadcast_scatter_allgather(t, call):
    p, buf = t.size, call.recv
    off = offsets(block_counts(call.count, p))
    v = (t.rank - call.root) % p
    parent, children = binomial(v, p)
    if parent is not None:  # relative rank v receives blocks [v, v + lowbit(v))
        t.sendrecv(None, None, buf[off[v]:off[min(v + parent, p)]], (t.rank - parent) % p)
    for m in children:
        t.sendrecv(buf[off[v + m]:off[min(v + 2 * m, p)]], (t.rank + m) % p, None, None)
    allgather_phase(t, buf, blocks_of(off), own=v, pos=v, base=call.root)
