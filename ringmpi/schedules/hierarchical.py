"""Hierarchical all-reduce: reduce inside each node, all-reduce across the nodes on 1/k of
the data, gather inside each node (Horovod's hierarchical all-reduce, ChainerMN's
two-dimensional communicator, NCCL's split of intra- and inter-node rings).

N nodes of k ranks, n bytes, the ranks of a node numbered 0..k-1 by their place:

    1. node ring reduce-scatter: place j ends with slice j of the node's sum
           (k-1) alpha_l + (k-1)/k n beta_l + (k-1)/k n gamma
    2. k cross-node rings at once, ring j joining place j of every node: ring all-reduce
       of slice j                2(N-1) alpha + 2(N-1)/N n/k beta + (N-1)/N n/k gamma
    3. node ring all-gather of the slices
           (k-1) alpha_l + (k-1)/k n beta_l

alpha_l, beta_l are the node's own links (shared memory), alpha, beta the network's. Each
host puts 2(N-1)/N n bytes on its link each way (k rings of n/k), where a flat ring over
all p = Nk ranks puts 2(p-1)/p n through the one ring edge that leaves the host, one rank
wide: with 2 nodes of 2, 1.5n against n. Nodes of different sizes: the slices follow the
smallest node (k = its rank count); the other places own an empty slice and sit out the
cross-node rings. Every rank ends with the same bits (each slice is reduced once, then
copied). Inside a node, the rings run on shared memory when the transport has it.

hierarchical_oneway (two nodes, an even number of places): step 2 sends each slice whole to
the node that reduces it (node j % 2 for place j) and the result back, so that no connection
carries data both ways at once (`_two_nodes`). With a link per rank it costs

    2 alpha + 2 n/k beta + n/k gamma        (the 2-rank ring: 2 alpha + n/k beta + n/2k gamma)

but where the k places share the host's one link it moves the same n/2 each way per round
as the ring, and over TCP it avoids the half rate of a connection used both ways at once.
"""
from __future__ import annotations

from ..cost import Cost
from . import block_counts, cdiv, offsets, register
from . import ring as _ring


def _cost(p, count, itemsize, per_node=0, **_):
    k = per_node if 0 < per_node < p else p
    nodes = cdiv(p, k)
    bl = cdiv(count, k) * itemsize                 # a node ring's block: one slice
    bx = cdiv(cdiv(count, k), nodes) * itemsize    # a cross ring's block
    local, cross = 2 * (k - 1), 2 * (nodes - 1)
    sent = local * bl + cross * bx
    return Cost(alphas=cross, beta_bytes=cross * bx, gamma_bytes=(k - 1) * bl + (nodes - 1) * bx,
                rounds=local + cross, busiest_sent=sent, avg_sent=sent,
                local_alphas=local, local_beta_bytes=local * bl)


def _tune(p, count, itemsize, prof) -> dict:
    return {"per_node": prof.per_node}


def _smallest_node(nodes) -> int:
    """The rank count of the smallest node (`nodes`: every rank's node)."""
    return min(nodes.count(h) for h in set(nodes))


def _several_hosts(t) -> str | None:
    if t.on_device:
        return "not on device buffers yet (its node rings run on the host's shared memory)"
    if t.nonblocking:
        return "runs blocking calls only (its node rings wait on shared-memory flags by spinning)"
    return None if len(set(t.nodes)) > 1 else "needs ranks on more than one host (on one, ring_shm is the same)"


@register("allreduce", "hierarchical", _cost, _tune, unavailable=_several_hosts)
def allreduce(t, call):
    _allreduce(t, call, one_way=False)


def _one_way_cost(p, count, itemsize, per_node=0, **_):
    """Two nodes, k even: step 2 moves the whole slice to its reducer and the result back
    (2 rounds of n/k, one reduction of n/k); other layouts are `hierarchical`'s."""
    k = per_node if 0 < per_node < p else p
    if cdiv(p, k) != 2 or k % 2:
        return _cost(p, count, itemsize, per_node=per_node)
    bl = cdiv(count, k) * itemsize
    local = 2 * (k - 1)
    sent = local * bl + bl
    return Cost(alphas=2, beta_bytes=2 * bl, gamma_bytes=k * bl, rounds=local + 2, busiest_sent=sent,
                avg_sent=sent, local_alphas=local, local_beta_bytes=local * bl)


def _two_hosts_even(t) -> str | None:
    why = _several_hosts(t)
    if why:
        return why
    nodes = t.nodes
    if len(set(nodes)) != 2 or _smallest_node(nodes) % 2:
        return "differs from hierarchical only on two hosts with an even number of ranks each"
    return None


@register("allreduce", "hierarchical_oneway", _one_way_cost, _tune, unavailable=_two_hosts_even)
def allreduce_one_way(t, call):
    """`hierarchical` whose step 2 on two hosts sends each slice one way to its reducer and
    the result back (`_two_nodes`): for TCP links, where a connection used both ways at
    once runs at half the rate; auto's online tuning measures which of the two wins."""
    _allreduce(t, call, one_way=True)


def _allreduce(t, call, one_way: bool) -> None:
    local, cross = t.split_nodes()
    nodes = t.nodes
    smallest = _smallest_node(nodes)
    counts = block_counts(call.count, smallest) + (0,) * (local.size - smallest)
    off = offsets(counts)
    j = local.rank
    node = local.shared() if len(set(local.nodes)) == 1 else local
    # the node's reduce-scatter (ring.py: a landing and two work blocks, the first send
    # staged) and its all-gather's blocks, staged as they leave the user's buffer
    node.reserve((local.size + 3) * (max(counts) * call.itemsize + 64) + 512)
    recv = call.recv
    # 1. my slice of the node's sum, straight into its place in the result
    mine = recv[off[j]:off[j + 1]]
    if node.size == 1:
        node.copy(call.send, mine)
    else:
        _ring.reduce_scatter(node, call._replace(recv=mine, counts=tuple(counts), inplace=False))
    # 2. the slice across the nodes, in place
    if one_way and cross is not None and cross.size == 2 and smallest % 2 == 0 and counts[j]:
        _two_nodes(cross, call, mine, j)
    elif cross is not None and cross.size > 1 and counts[j]:
        _ring.allreduce(cross, call._replace(send=mine, recv=mine, count=counts[j], inplace=True))
    # 3. every slice to every rank of the node
    _ring.allgather_phase(node, recv, _ring.blocks_of(off), j)


def _two_nodes(cross, call, mine, j) -> None:
    """Step 2 for two nodes with an even number of places: the slice goes whole to the node
    that reduces it (node j % 2), and the result comes back. Even places send one way while
    odd places send the other, so each host link carries n/2 each way in each of the two
    rounds, as the 2-rank rings would (a rank sends twice the ring's bytes, in one round
    instead of two: `_one_way_cost`), but no connection carries data both ways at once.
    Full-duplex traffic on one TCP connection behind a deep transmit queue runs at half
    the link rate (measured: benchmarks/README.md, "Figures behind constants in the
    code"), since each direction's acknowledgements wait behind the other's data; a 2-rank ring exchanges with one peer
    both ways in every round."""
    peer = 1 - cross.rank
    if cross.rank == j % 2:
        landing = cross.empty(mine.size, mine.dtype)
        cross.sendrecv(None, None, landing, peer)
        cross.combine(call.op, landing, mine, mine)     # received op mine, as the ring reduces
        cross.sendrecv(mine, peer, None, None)
    else:
        cross.sendrecv(mine, peer, None, None)
        cross.sendrecv(None, None, mine, peer)
