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

from ..cost import Cost
from . import binomial, lg, register

__all__ = ["binomial_reduce", "binomial_broadcast"]


def _cost(p, count, itemsize, reduce_part, bcast_part):
    n, L = count * itemsize, lg(p)
    k = reduce_part + bcast_part
    return Cost(alphas=k * L, beta_bytes=k * L * n, gamma_bytes=L * n if reduce_part else 0,
                rounds=k * L, busiest_sent=L * n if bcast_part else n,
                avg_sent=k * (p - 1) * n / p)


def binomial_reduce(t, sendbuf, acc, op, root) -> None:
    """Reduce every rank's `sendbuf` into `acc` on the root (`acc` is scratch elsewhere)."""
    p = t.size
    v = (t.rank - root) % p
    parent, children = binomial(v, p)
    src = sendbuf
    if children:
        tmp = t.empty(sendbuf.size, sendbuf.dtype)
        for m in reversed(children):
            t.sendrecv(None, None, tmp, (t.rank + m) % p)
            t.combine(op, tmp, src, acc)
            src = acc
    if parent is not None:
        t.sendrecv(src, (t.rank - parent) % p, None, None)


def binomial_broadcast(t, buf, root) -> None:
    p = t.size
    v = (t.rank - root) % p
    parent, children = binomial(v, p)
    if parent is not None:
        t.sendrecv(None, None, buf, (t.rank - parent) % p)
    for m in children:
        t.sendrecv(buf, (t.rank + m) % p, None, None)


@register("broadcast", "tree", lambda p, count, itemsize, **_: _cost(p, count, itemsize, 0, 1))
def broadcast(t, call):
    binomial_broadcast(t, call.recv, call.root)


@register("reduce", "tree", lambda p, count, itemsize, **_: _cost(p, count, itemsize, 1, 0))
def reduce(t, call):
    acc = call.recv if t.rank == call.root else t.empty(call.count, call.dtype)
    binomial_reduce(t, call.send, acc, call.op, call.root)


@register("allreduce", "tree", lambda p, count, itemsize, **_: _cost(p, count, itemsize, 1, 1))
def allreduce(t, call):
    binomial_reduce(t, call.send, call.recv, call.op, 0)
    binomial_broadcast(t, call.recv, 0)
