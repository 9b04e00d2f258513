"""Root-centric ("naive") algorithms: everything goes through one rank.

The root posts all of its p-1 receives (or sends) at once, so the fan-in and fan-out each
cost one latency and (p-1) messages' worth of bandwidth on the root's link:

    T_naive_allreduce = 2(alpha + (p-1) n beta) + (p-1) n gamma     (the lecture's formula)
    T_naive_reduce    = alpha + (p-1) n beta + (p-1) n gamma
    T_naive_broadcast = alpha + (p-1) n beta
    reduce_scatter = reduce to rank 0 + scatter; allgather = gather to rank 0 + broadcast.

Two rounds only, so it wins for tiny messages; the root's traffic grows as (p-1) n, which
is the parameter server's bottleneck. The root reduces in rank order, one fixed order.
"""
from __future__ import annotations

from . import offsets, register


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fan_in_reduce(t, sendbuf, acc, op, root) -> None:
    """Every rank sends its vector to the root, which reduces them in rank order into acc."""
    p, r, n = t.size, t.rank, sendbuf.size
    if r != root:
        t.exchange([(sendbuf, root)], [])
        return
    others = [q for q in range(p) if q != root]
    if not others:
        if acc is not sendbuf:
            acc[...] = sendbuf
        return
    scratch = t.empty(n * len(others), sendbuf.dtype)
    parts = {q: scratch[i * n:(i + 1) * n] for i, q in enumerate(others)}
    t.exchange([], [(parts[q], q) for q in others])
    # root's own vector first, then the others in rank order; reading sendbuf only in the
    # first combine keeps an in-place root correct.
    t.combine(op, sendbuf, parts[others[0]], acc)
    for q in others[1:]:
        t.combine(op, acc, parts[q], acc)


def fan_out(t, buf, root) -> None:
    p, r = t.size, t.rank
    if p == 1:
        return
    if r == root:
        t.exchange([(buf, q) for q in range(p) if q != root], [])
    else:
        t.exchange([], [(buf, root)])


def _cost(p, count, itemsize, fan_in, fan_out_bytes, reduce=True):
    from ..cost import Cost
    n = count * itemsize
    if p == 1:
        return Cost(0, 0, 0, 0, 0, 0)
    a = int(bool(fan_in)) + int(bool(fan_out_bytes))
    beta = (p - 1) * (fan_in + fan_out_bytes)
    sent_root = (p - 1) * fan_out_bytes
    sent_leaf = fan_in
    return Cost(alphas=a, beta_bytes=beta, gamma_bytes=(p - 1) * n if reduce else 0, rounds=a,
                busiest_sent=max(sent_root, sent_leaf),
                avg_sent=(sent_root + (p - 1) * sent_leaf) / p)


@register("allreduce", "naive",
          lambda p, count, itemsize, **_: _cost(p, count, itemsize, count * itemsize, count * itemsize))
def allreduce(t, sendbuf, recvbuf, op):
    fan_in_reduce(t, sendbuf, recvbuf, op, 0)
    fan_out(t, recvbuf, 0)


@register("reduce", "naive",
          lambda p, count, itemsize, **_: _cost(p, count, itemsize, count * itemsize, 0))
def reduce(t, sendbuf, recvbuf, op, root):
    fan_in_reduce(t, sendbuf, recvbuf, op, root)


@register("broadcast", "naive",
          lambda p, count, itemsize, **_: _cost(p, count, itemsize, 0, count * itemsize, False))
def broadcast(t, buf, root, segments):
    fan_out(t, buf, root)


def _rs_cost(p, count, itemsize, **_):
    from ..cost import Cost
    n, b = count * itemsize, _cdiv(count, p) * itemsize
    if p == 1:
        return Cost(0, 0, 0, 0, 0, 0)
    return Cost(alphas=2, beta_bytes=(p - 1) * n + (p - 1) * b, gamma_bytes=(p - 1) * n, rounds=2,
                busiest_sent=max(n, (p - 1) * b), avg_sent=((p - 1) * n + (p - 1) * b) / p)


@register("reduce_scatter", "naive", _rs_cost)
def reduce_scatter(t, sendbuf, recvbuf, op, counts):
    p, r = t.size, t.rank
    off = offsets(counts)
    full = t.empty(sendbuf.size, sendbuf.dtype) if r == 0 else None
    fan_in_reduce(t, sendbuf, full, op, 0)
    if r == 0:
        t.exchange([(full[off[q]:off[q + 1]], q) for q in range(1, p)], [])
        recvbuf[...] = full[off[0]:off[1]]
    elif p > 1:
        t.exchange([], [(recvbuf, 0)])


def _ag_cost(p, count, itemsize, **_):
    from ..cost import Cost
    n, b = count * itemsize, _cdiv(count, p) * itemsize
    if p == 1:
        return Cost(0, 0, 0, 0, 0, 0)
    return Cost(alphas=2, beta_bytes=(p - 1) * b + (p - 1) * n, gamma_bytes=0, rounds=2,
                busiest_sent=(p - 1) * n, avg_sent=((p - 1) * b + (p - 1) * n) / p)


@register("allgather", "naive", _ag_cost)
def allgather(t, sendbuf, recvbuf, counts):
    p, r = t.size, t.rank
    off = offsets(counts)
    mine = recvbuf[off[r]:off[r + 1]]
    if sendbuf is not mine:
        mine[...] = sendbuf
    if p == 1:
        return
    if r == 0:
        t.exchange([], [(recvbuf[off[q]:off[q + 1]], q) for q in range(1, p)])
    else:
        t.exchange([(mine, 0)], [])
    fan_out(t, recvbuf, 0)
