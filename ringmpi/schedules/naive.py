"""Root-centric ("naive") algorithms: everything goes through one rank.

The root posts all of its p-1 receives (or sends) at once, so the fan-in and fan-out each
cost one latency and (p-1) messages' worth of bandwidth on the root's link:

    T_naive_allreduce = 2(alpha + (p-1) n beta) + (p-1) n gamma     (the lecture's formula)
    T_naive_reduce    = alpha + (p-1) n beta + (p-1) n gamma
    T_naive_broadcast = alpha + (p-1) n beta
    reduce_scatter = reduce to rank 0 + scatter; allgather = gather to rank 0 + broadcast.

Two rounds only, so it wins for tiny messages; the root's traffic grows as (p-1) n, which
is the parameter server's bottleneck. The root reduces in rank order, ((x0 + x1) + x2) + ...,
whichever rank it is: the bits of the deterministic mode at any p (`ordered`).
"""
from __future__ import annotations

from ..cost import Cost
from . import cdiv, offsets, register

__all__ = ["fan_in_reduce", "fan_out"]


def fan_in_reduce(t, sendbuf, acc, op, root) -> None:
    """Every rank sends its vector to the root, which reduces them in rank order into acc."""
    p, r, n = t.size, t.rank, sendbuf.size
    if r != root:
        t.exchange([(sendbuf, root)], [])
        return
    others = [q for q in range(p) if q != root]
    scratch = t.empty(n * len(others), sendbuf.dtype)
    parts = {q: scratch[i * n:(i + 1) * n] for i, q in enumerate(others)}
    t.exchange([], [(parts[q], q) for q in others])
    # In rank order. An in-place root (acc is sendbuf) past rank 0 would overwrite its own
    # vector before its turn: it folds from a copy.
    if root and acc is sendbuf:
        parts[root] = t.empty(n, sendbuf.dtype)
        t.copy(sendbuf, parts[root])
    else:
        parts[root] = sendbuf
    t.combine(op, parts[0], parts[1], acc)
    for q in range(2, p):
        t.combine(op, acc, parts[q], acc)


def fan_out(t, buf, root) -> None:
    if t.rank == root:
        t.exchange([(buf, q) for q in range(t.size) if q != root], [])
    else:
        t.exchange([], [(buf, root)])


def _cost(p, fan_in: float, fan_out_bytes: float, reduced: float) -> Cost:
    """Fan-in of `fan_in` bytes from every leaf, then fan-out of `fan_out_bytes` to every leaf."""
    a = int(bool(fan_in)) + int(bool(fan_out_bytes))
    sent_root = (p - 1) * fan_out_bytes
    return Cost(alphas=a, beta_bytes=(p - 1) * (fan_in + fan_out_bytes), gamma_bytes=reduced, rounds=a,
                busiest_sent=max(sent_root, fan_in), avg_sent=(sent_root + (p - 1) * fan_in) / p)


@register("allreduce", "naive", lambda p, count, itemsize, **_: _cost(p, count * itemsize, count * itemsize,
                                                                      (p - 1) * count * itemsize), ordered=True)
def allreduce(t, call):
    fan_in_reduce(t, call.send, call.recv, call.op, 0)
    fan_out(t, call.recv, 0)


@register("reduce", "naive", lambda p, count, itemsize, **_: _cost(p, count * itemsize, 0, (p - 1) * count * itemsize),
          ordered=True)
def reduce(t, call):
    fan_in_reduce(t, call.send, call.recv, call.op, call.root)


@register("broadcast", "naive", lambda p, count, itemsize, **_: _cost(p, 0, count * itemsize, 0))
def broadcast(t, call):
    fan_out(t, call.recv, call.root)


# reduce-scatter: the root's fan-out sends one block (not the vector) to every leaf
@register("reduce_scatter", "naive", lambda p, count, itemsize, **_: _cost(
    p, count * itemsize, cdiv(count, p) * itemsize, (p - 1) * count * itemsize), ordered=True)
def reduce_scatter(t, call):
    p, r = t.size, t.rank
    off = offsets(call.counts)
    full = t.empty(call.count, call.dtype) if r == 0 else None
    fan_in_reduce(t, call.send, full, call.op, 0)
    if r == 0:
        t.exchange([(full[off[q]:off[q + 1]], q) for q in range(1, p)], [])
        t.copy(full[off[0]:off[1]], call.recv)
    else:
        t.exchange([], [(call.recv, 0)])


# all-gather: one block in from every leaf, the whole vector out to every leaf
@register("allgather", "naive", lambda p, count, itemsize, **_: _cost(
    p, cdiv(count, p) * itemsize, count * itemsize, 0))
def allgather(t, call):
    r = t.rank
    off = offsets(call.counts)
    mine = call.recv[off[r]:off[r + 1]]
    if not call.inplace:
        t.copy(call.send, mine)
    if r == 0:
        t.exchange([], [(call.recv[off[q]:off[q + 1]], q) for q in range(1, t.size)])
    else:
        t.exchange([(mine, 0)], [])
    fan_out(t, call.recv, 0)
