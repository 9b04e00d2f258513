"""All-to-all (MPI_Alltoall; the exchange of mixture-of-experts layers and of sequence
parallelism): rank r's send buffer is p blocks of n/p elements, block q goes to rank q, and
rank r's receive buffer gathers block r of every rank, in rank order.

Pairwise exchange, p-1 rounds (rank r, round k = 1..p-1; its own block is a local copy):

    send block (r+k) mod p to rank r+k,  receive rank (r-k)'s block into slot (r-k) mod p
    T_pairwise = (p-1)(alpha + n/p beta)          every rank sends (p-1)/p n

Bruck (small blocks: ceil(lg p) rounds instead of p-1, each moving about half the data):

    rotate   tmp[j] = send block (r+j) mod p                               (local)
    round k  send every tmp[j] whose index j has bit 2^k set to rank r+2^k,
             receive the same slots from rank r-2^k                        (packed, one message)
    unrotate recv block (r-j) mod p = tmp[j]                               (local)
    T_bruck = ceil(lg p) alpha + sum_k #{j < p : j has bit k} n/p beta    (~ lg p/2 n beta)

Naive (linear): every rank posts its p-1 sends and p-1 receives at once and waits:
    T_naive = alpha + (p-1)/p n beta   (one round in the model; a real network carries the
                                        p(p-1) messages at once only if it has the bisection)
"""
from __future__ import annotations

from ..cost import Cost
from . import lg, register


def _blocks(call) -> tuple[int, list[tuple[int, int]]]:
    b = call.counts[0] if call.counts else 0
    return b, [(q * b, (q + 1) * b) for q in range(len(call.counts))]


def _own_block(t, call):
    """Copy this rank's own block; returns (source: the send buffer, or a scratch copy of it
    when the call is in place, the receive buffer, the blocks' slices)."""
    _, blk = _blocks(call)
    src = call.send
    if call.inplace:
        src = t.empty(call.count, call.dtype)
        t.copy(call.send, src)
    own = slice(*blk[t.rank])
    t.copy(src[own], call.recv[own])
    return src, call.recv, blk


def _every_block_once(rounds: int):
    """Cost of sending each of the p-1 other blocks once, in `rounds` rounds (p-1 or 1)."""
    def cost(p, count, itemsize, **_):
        b, k = count // p * itemsize, rounds or p - 1
        return Cost(alphas=k, beta_bytes=(p - 1) * b, gamma_bytes=0, rounds=k, busiest_sent=(p - 1) * b,
                    avg_sent=(p - 1) * b)
    return cost


@register("alltoall", "pairwise", _every_block_once(0))
def pairwise(t, call):
    src, recv, blk = _own_block(t, call)
    p, r = t.size, t.rank
    for k in range(1, p):
        to, frm = (r + k) % p, (r - k) % p
        t.sendrecv(src[slice(*blk[to])], to, recv[slice(*blk[frm])], frm)


def _bruck_rounds(p: int) -> list[list[int]]:
    """Per round k, the slots j < p whose bit 2^k is set (they move by 2^k that round)."""
    return [[j for j in range(p) if j >> k & 1] for k in range(lg(p))]


def _bruck_cost(p, count, itemsize, **_):
    b = count // p * itemsize
    moved = sum(len(js) for js in _bruck_rounds(p)) * b
    L = lg(p)
    return Cost(alphas=L, beta_bytes=moved, gamma_bytes=0, rounds=L, busiest_sent=moved, avg_sent=moved)


@register("alltoall", "bruck", _bruck_cost)
def bruck(t, call):
    p, r = t.size, t.rank
    b, blk = _blocks(call)
    tmp = t.empty(call.count, call.dtype)
    for j in range(p):
        t.copy(call.send[slice(*blk[(r + j) % p])], tmp[slice(*blk[j])])
    out = t.empty(b * (p // 2 + 1), call.dtype)
    inn = t.empty(b * (p // 2 + 1), call.dtype)
    for k, slots in enumerate(_bruck_rounds(p)):
        for i, j in enumerate(slots):
            t.copy(tmp[slice(*blk[j])], out[i * b:(i + 1) * b])
        m = len(slots) * b
        t.sendrecv(out[:m], (r + (1 << k)) % p, inn[:m], (r - (1 << k)) % p)
        for i, j in enumerate(slots):
            t.copy(inn[i * b:(i + 1) * b], tmp[slice(*blk[j])])
    for j in range(p):
        t.copy(tmp[slice(*blk[j])], call.recv[slice(*blk[(r - j) % p])])


@register("alltoall", "naive", _every_block_once(1))
def naive(t, call):
    src, recv, blk = _own_block(t, call)
    others = [q for q in range(t.size) if q != t.rank]
    t.exchange([(src[slice(*blk[q])], q) for q in others], [(recv[slice(*blk[q])], q) for q in others])
