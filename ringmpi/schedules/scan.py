"""Scan (MPI_Scan): the inclusive prefix reduction, x0 op x1 op ... op xr on rank r.

Linear, the chain: rank r waits for rank r-1's prefix, folds its own vector in after it,
and passes the result on to rank r+1. It adds in rank order, so it gives the bits of the
rank-order fold ((x0 + x1) + x2) + ... (the deterministic mode), and its time grows with p:

    round k = 1 .. p-1: rank k-1 sends its prefix to rank k, which folds its own in
                                        T = (p-1)(alpha + n beta + n gamma)

Recursive doubling (Hillis and Steele's scan): in round k = 0 .. ceil(lg p)-1 rank r sends
its partial, the fold of ranks r-2^k+1 .. r, to rank r+2^k and folds the one from rank
r-2^k in before its own, so it then holds the fold of ranks r-2^(k+1)+1 .. r; after the
last round, its prefix. Rank 0 sends in every round, the last ranks only receive:

                                        T = ceil(lg p)(alpha + n beta + n gamma)

Every rank sends n bytes in the chain but the last; in recursive doubling rank r sends in
the rounds where r + 2^k < p, (p - 2^k) n bytes a round in all.
"""
from __future__ import annotations

from ..cost import Cost
from . import lg, register


def _linear_cost(p, count, itemsize, **_):
    n = count * itemsize
    return Cost(alphas=p - 1, beta_bytes=(p - 1) * n, gamma_bytes=(p - 1) * n, rounds=p - 1,
                busiest_sent=n, avg_sent=(p - 1) * n / p)


@register("scan", "linear", _linear_cost, ordered=True)
def scan_linear(t, call):
    p, r = t.size, t.rank
    if r == 0:
        if not call.inplace:
            t.copy(call.send, call.recv)
    else:
        prefix = t.empty(call.count, call.dtype)
        t.sendrecv(None, None, prefix, r - 1)
        t.combine(call.op, prefix, call.send, call.recv)
    if r + 1 < p:
        t.sendrecv(call.recv, r + 1, None, None)


def _rd_cost(p, count, itemsize, **_):
    n, L = count * itemsize, lg(p)
    return Cost(alphas=L, beta_bytes=L * n, gamma_bytes=L * n, rounds=L, busiest_sent=L * n,
                avg_sent=sum(p - (1 << k) for k in range(L)) * n / p)


@register("scan", "recursive_doubling", _rd_cost)
def scan_recursive_doubling(t, call):
    p, r = t.size, t.rank
    if not call.inplace:
        t.copy(call.send, call.recv)
    partial, lower = call.recv, t.empty(call.count, call.dtype)
    m = 1
    while m < p:
        dest, source = (r + m if r + m < p else None), (r - m if r >= m else None)
        if dest is not None or source is not None:
            t.sendrecv(partial if dest is not None else None, dest, lower if source is not None else None, source)
        if source is not None:
            t.combine(call.op, lower, partial, partial)
        m <<= 1
