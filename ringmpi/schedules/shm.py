"""The ring and the pipeline over the host's shared memory (`ringmpi.shm`): the lecture's
schedules from ring.py, unchanged, on the shared-memory transport.

    ring_shm  (allreduce, reduce_scatter, allgather)   pipeline_shm  (broadcast)

Rounds and bytes are ring.py's (same round table, same formulas), on the node's links:

    T_ring_shm_allreduce = 2(p-1) alpha_l + 2(p-1)/p n beta_l + (p-1)/p n gamma

alpha_l and beta_l those of the host's memory rather than a network: a "message" is the
receiver reading the block in the sender's shared segment (one copy, not MPI's two through
its queue), and the reduce-scatter reduces the neighbour's block straight into its output
(`sendrecv_reduce`, one pass). The blocks a round sends must lie in shared memory: the work
buffer (the result while it is being built) is in the arena, so only the first round's
block of the input is copied there, and the result is copied out once at the end; with
arrays from `ringmpi.shared_empty`, or where the transport reads ordinary arrays across
(cross-memory attach, `ringmpi.cma`), nothing is staged at all. Every block is reduced in
the same order as over MPI: the same bits.

Only for ranks that share one host (`unavailable` otherwise: auto leaves them out).
"""
from __future__ import annotations

from dataclasses import replace

from . import cdiv, offsets, register
from . import ring as _ring

SLACK = 8 * 64   # alignment of the arena's pieces


def _one_host(t) -> str | None:
    if getattr(t, "on_device", False):
        return "device buffers do not go through the host's shared memory"
    hosts = len(set(t.nodes))
    return None if hosts == 1 else f"shared memory needs every rank on one host; these ranks are on {hosts}"


def _work(s, buf, count, dtype):
    """`buf` itself when peers can read it (in a shared segment, or across with cross-memory
    attach), else a buffer of the arena."""
    if buf is not None and (s.in_shared(buf) or s.cross_memory and buf.flags.c_contiguous):
        return buf
    return s.empty(count, dtype)


def _allreduce_cost(p, count, itemsize, **_):
    return _ring._rounds_cost(p, count, itemsize, 2, True).local()


def _pipeline_cost(p, count, itemsize, segments=1, **_):
    return _ring._pipeline_cost(p, count, itemsize, segments).local()


def _pipeline_tune(p, count, itemsize, prof) -> dict:
    """The pipeline's segment count under the node's own alpha and beta."""
    return _ring._pipeline_tune(p, count, itemsize, replace(prof, alpha=prof.alpha_l, beta=prof.beta_l))


@register("allreduce", "ring_shm", _allreduce_cost, unavailable=_one_host)
def allreduce(t, call):
    """ring.py's all-reduce into the user's buffer: the reduce-scatter reduces straight
    into it; a block published from memory peers cannot map is staged in the arena (none
    with `shared_empty` arrays)."""
    s, p = t.shared(), t.size
    block = cdiv(call.count, p) * call.itemsize
    s.reserve(2 * p * (block + 64) + SLACK)   # the ring's landing block and every block it publishes
    _ring.allreduce(s, call)


def _rounds_cost(reduces: bool):
    """ring.py's p-1 rounds of one block, on the node's links (reduce-scatter or all-gather)."""
    return lambda p, count, itemsize, **_: _ring._rounds_cost(p, count, itemsize, 1, reduces).local()


@register("reduce_scatter", "ring_shm", _rounds_cost(True), unavailable=_one_host)
def reduce_scatter(t, call):
    s = t.shared()
    # ring.py's landing block and two work blocks, and the first block it sends, staged
    s.reserve(4 * (max(call.counts) * call.itemsize + 64) + SLACK)
    _ring.reduce_scatter(s, call)


@register("allgather", "ring_shm", _rounds_cost(False), unavailable=_one_host)
def allgather(t, call):
    s, r = t.shared(), t.rank
    off = offsets(call.counts)
    s.reserve(call.count * call.itemsize + SLACK)
    work = _work(s, call.recv, call.count, call.dtype)
    mine = call.send if not call.inplace else call.recv[off[r]:off[r + 1]]
    if work is not call.recv or not call.inplace:
        s.copy(mine, work[off[r]:off[r + 1]])
    _ring.allgather_phase(s, work, off, r)
    if work is not call.recv:
        s.copy(work, call.recv)


@register("broadcast", "pipeline_shm", _pipeline_cost, _pipeline_tune, unavailable=_one_host)
def broadcast(t, call):
    s, buf = t.shared(), call.recv
    s.reserve(buf.size * buf.itemsize + SLACK)
    work = _work(s, buf, buf.size, buf.dtype)
    if work is not buf and t.rank == call.root:
        s.copy(buf, work)
    _ring.broadcast(s, call._replace(send=work, recv=work))
    if work is not buf and t.rank != call.root:
        s.copy(work, buf)

