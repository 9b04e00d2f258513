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

from . import block_counts, offsets, register
from .ring import allgather_phase


def _lg(p: int) -> int:
    return (p - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fold(p: int):
    """(p', q): the power-of-two part and the number of folded pairs."""
    pp = 1 << (p.bit_length() - 1)
    return pp, p - pp


def _fold_in(t, src, acc, op):
    """Fold step; returns (new rank among p', real-rank map) or (None, map) for idle ranks."""
    p, r = t.size, t.rank
    pp, q = _fold(p)

    def real(v: int) -> int:
        return 2 * v + 1 if v < q else v + q
    if r < 2 * q:
        if r % 2 == 0:
            t.sendrecv(src, r + 1, None, None)
            return None, real
        tmp = t.empty(src.size, src.dtype)
        t.sendrecv(None, None, tmp, r - 1)
        t.combine(op, tmp, src, acc)
        return r // 2, real
    return r - q, real


def _fold_out(t, buf):
    r = t.rank
    _, q = _fold(t.size)
    if r < 2 * q:
        if r % 2 == 0:
            t.sendrecv(None, None, buf, r + 1)
        else:
            t.sendrecv(buf, r - 1, None, None)


def _fold_cost(p, n, reduce=True):
    """Extra (alphas, beta bytes, gamma bytes) of the fold when p is no power of two."""
    pp, q = _fold(p)
    return (2, 2 * n, n if reduce else 0) if q else (0, 0, 0)


def _rd_cost(p, count, itemsize, **_):
    from ..cost import Cost
    n = count * itemsize
    pp, q = _fold(p)
    L = _lg(pp)
    fa, fb, fg = _fold_cost(p, n)
    return Cost(alphas=L + fa, beta_bytes=L * n + fb, gamma_bytes=L * n + fg, rounds=L + fa,
                busiest_sent=L * n + (n if q else 0),
                avg_sent=(pp * L * n + 2 * q * n) / p)


def _folded(t, sendbuf, recvbuf, op, body) -> None:
    """p = 1: copy. Otherwise fold to p' = 2^k ranks, run body(v, real, p', src) on them
    (src: this rank's input, already folded), and send the result back to the folded ranks."""
    if t.size == 1:
        if recvbuf is not sendbuf:
            recvbuf[...] = sendbuf
        return
    v, real = _fold_in(t, sendbuf, recvbuf, op)
    if v is not None:
        pp, q = _fold(t.size)
        body(v, real, pp, recvbuf if t.rank < 2 * q else sendbuf)
    _fold_out(t, recvbuf)


@register("allreduce", "recursive_doubling", _rd_cost)
def allreduce_recursive_doubling(t, sendbuf, recvbuf, op):
    def body(v, real, pp, src):
        tmp = t.empty(sendbuf.size, sendbuf.dtype)
        m = 1
        while m < pp:
            t.sendrecv(src, real(v ^ m), tmp, real(v ^ m))
            # both partners compute lower-rank-data op higher-rank-data: complex multiply
            # with FMA is not bitwise commutative, and every rank must end with the same bits
            t.combine(op, *((src, tmp) if v < v ^ m else (tmp, src)), recvbuf)
            src = recvbuf
            m <<= 1
    _folded(t, sendbuf, recvbuf, op, body)


def _rab_cost(p, count, itemsize, **_):
    from ..cost import Cost
    n = count * itemsize
    pp, q = _fold(p)
    L = _lg(pp)
    b = _cdiv(count, pp) * itemsize
    fa, fb, fg = _fold_cost(p, n)
    sent = 2 * (pp - 1) * b
    return Cost(alphas=2 * L + fa, beta_bytes=2 * (pp - 1) * b + fb,
                gamma_bytes=(pp - 1) * b + fg, rounds=2 * L + fa,
                busiest_sent=sent + (n if q else 0), avg_sent=(pp * sent + 2 * q * n) / p)


@register("allreduce", "rabenseifner", _rab_cost)
def allreduce_rabenseifner(t, sendbuf, recvbuf, op):
    def body(v, real, pp, src):
        off = offsets(block_counts(sendbuf.size, pp))
        tmp = t.empty(max(off[pp // 2], off[-1] - off[pp // 2]), sendbuf.dtype)
        lo, hi = 0, pp
        m = pp >> 1
        while m:  # recursive halving: keep the half that holds block v
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if v & m else ((lo, mid), (mid, hi))
            k0, k1 = off[keep[0]], off[keep[1]]
            got = tmp[:k1 - k0]
            t.sendrecv(src[off[give[0]]:off[give[1]]], real(v ^ m), got, real(v ^ m))
            t.combine(op, got, src[k0:k1], recvbuf[k0:k1])
            src = recvbuf
            lo, hi = keep
            m >>= 1
        m = 1
        while m < pp:  # recursive doubling all-gather of the reduced blocks
            base = v & ~(m - 1)
            other = base ^ m
            t.sendrecv(recvbuf[off[base]:off[base + m]], real(v ^ m),
                       recvbuf[off[other]:off[other + m]], real(v ^ m))
            m <<= 1
    _folded(t, sendbuf, recvbuf, op, body)


def _ag_cost(p, count, itemsize, **_):
    from ..cost import Cost
    b = _cdiv(count, p) * itemsize
    L = _lg(p)
    return Cost(alphas=L, beta_bytes=(p - 1) * b, gamma_bytes=0, rounds=L,
                busiest_sent=(p - 1) * b, avg_sent=(p - 1) * b)


@register("allgather", "recursive_doubling", _ag_cost)
def allgather_recursive_doubling(t, sendbuf, recvbuf, counts):
    p, r = t.size, t.rank
    off = offsets(counts)
    mine = recvbuf[off[r]:off[r + 1]]
    if p & (p - 1) == 0:
        if sendbuf is not mine:
            mine[...] = sendbuf
        m = 1
        while m < p:
            base = r & ~(m - 1)
            other = base ^ m
            t.sendrecv(recvbuf[off[base]:off[base + m]], r ^ m,
                       recvbuf[off[other]:off[other + m]], r ^ m)
            m <<= 1
        return
    # Bruck: position j of the rotated buffer holds block (r + j) mod p.
    rot_counts = [counts[(r + j) % p] for j in range(p)]
    roff = offsets(rot_counts)
    rot = t.empty(roff[-1], recvbuf.dtype)
    rot[:roff[1]] = sendbuf
    k = 1
    while k < p:
        m = min(k, p - k)
        t.sendrecv(rot[:roff[m]], (r - k) % p, rot[roff[k]:roff[k + m]], (r + k) % p)
        k <<= 1
    # unrotate: rotated positions [0, p-r) are blocks r..p-1, the rest blocks 0..r-1
    split = roff[p - r]
    recvbuf[off[r]:] = rot[:split]
    recvbuf[:off[r]] = rot[split:]


def _sag_cost(p, count, itemsize, **_):
    from ..cost import Cost
    b = _cdiv(count, p) * itemsize
    L = _lg(p)
    if p == 1:
        return Cost(0, 0, 0, 0, 0, 0)
    # binomial scatter: the root sends (p-1) blocks down its subtrees (critical path);
    # then the ring all-gather sends p-1 blocks from every rank.
    scattered = sum(min(v + (v & -v), p) - v for v in range(1, p))  # blocks moved by the scatter
    return Cost(alphas=L + p - 1, beta_bytes=2 * (p - 1) * b, gamma_bytes=0, rounds=L + p - 1,
                busiest_sent=2 * (p - 1) * b, avg_sent=(p - 1) * b + scattered * b / p)


@register("broadcast", "scatter_allgather", _sag_cost)
def broadcast_scatter_allgather(t, buf, root, segments):
    p = t.size
    if p == 1:
        return
    off = offsets(block_counts(buf.size, p))
    v = (t.rank - root) % p
    m = 1
    while m < p:  # binomial scatter: relative rank v receives blocks [v, v + lowbit(v))
        if v & m:
            t.sendrecv(None, None, buf[off[v]:off[min(v + m, p)]], (t.rank - m) % p)
            break
        m <<= 1
    m >>= 1
    while m > 0:
        if v + m < p:
            t.sendrecv(buf[off[v + m]:off[min(v + 2 * m, p)]], (t.rank + m) % p, None, None)
        m >>= 1
    allgather_phase(t, buf, off, own=v, pos=v, base=root)
