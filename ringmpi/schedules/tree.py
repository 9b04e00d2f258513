"""Binomial trees: reduce, broadcast, and all-reduce = reduce to rank 0 + broadcast from it.

Relative rank v = (rank - root) mod p. Broadcast, ceil(lg p) rounds: in the round of bit
m (from the highest down) every v < m that has the data sends it to v + m. Reduce is the
mirror image: in the round of bit m, v with bit m set sends its partial result to v - m,
which reduces it (children in increasing m, so the order is fixed).

    T_tree_broadcast = ceil(lg p)(alpha + n beta)
    T_tree_reduce    = ceil(lg p)(alpha + n beta + n gamma)
    T_tree_allreduce = 2 ceil(lg p)(alpha + n beta) + ceil(lg p) n gamma
    busiest rank sends ceil(lg p) n; the average 2(p-1)/p n (all-reduce)

Few rounds, but the whole buffer crosses every edge: latency-friendly, bandwidth-poor.
"""
from __future__ import annotations

from . import register


def _lg(p: int) -> int:
    return (p - 1).bit_length()


def _cost(p, count, itemsize, reduce_part, bcast_part):
    from ..cost import Cost
    n, L = count * itemsize, _lg(p)
    k = reduce_part + bcast_part
    return Cost(alphas=k * L, beta_bytes=k * L * n, gamma_bytes=L * n if reduce_part else 0,
                rounds=k * L, busiest_sent=(L * n if bcast_part else n) if p > 1 else 0,
                avg_sent=k * (p - 1) * n / p)


def binomial_reduce(t, sendbuf, acc, op, root) -> bool:
    """Reduce into `acc` on the root; True where `acc` holds data (interior nodes and root)."""
    p = t.size
    v = (t.rank - root) % p
    tmp = None
    holding = False
    m = 1
    while m < p:
        if v & m:
            t.sendrecv(acc if holding else sendbuf, (t.rank - m) % p, None, None)
            return holding
        if v + m < p:
            if tmp is None:
                tmp = t.empty(sendbuf.size, sendbuf.dtype)
            t.sendrecv(None, None, tmp, (t.rank + m) % p)
            t.combine(op, tmp, acc if holding else sendbuf, acc)
            holding = True
        m <<= 1
    if not holding and acc is not sendbuf:  # p == 1
        acc[...] = sendbuf
    return True


def binomial_broadcast(t, buf, root) -> None:
    p = t.size
    v = (t.rank - root) % p
    m = 1
    while m < p:
        if v & m:
            t.sendrecv(None, None, buf, (t.rank - m) % p)
            break
        m <<= 1
    m >>= 1
    while m > 0:
        if v + m < p:
            t.sendrecv(buf, (t.rank + m) % p, None, None)
        m >>= 1


@register("broadcast", "tree", lambda p, count, itemsize, **_: _cost(p, count, itemsize, 0, 1))
def broadcast(t, buf, root, segments):
    binomial_broadcast(t, buf, root)


@register("reduce", "tree", lambda p, count, itemsize, **_: _cost(p, count, itemsize, 1, 0))
def reduce(t, sendbuf, recvbuf, op, root):
    acc = recvbuf if t.rank == root else t.empty(sendbuf.size, sendbuf.dtype)
    binomial_reduce(t, sendbuf, acc, op, root)


@register("allreduce", "tree", lambda p, count, itemsize, **_: _cost(p, count, itemsize, 1, 1))
def allreduce(t, sendbuf, recvbuf, op):
    binomial_reduce(t, sendbuf, recvbuf, op, 0)
    binomial_broadcast(t, recvbuf, 0)
