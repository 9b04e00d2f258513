"""A virtual cluster: p ranks in one process running the very same schedule code as MPI.

Each virtual rank is a greenlet with a transport (`VirtualRank`) that implements
`ringmpi.transport.Transport`, as `ringmpi.mpicomm.MPITransport` does. A `sendrecv` or `exchange` posts its messages and yields;
the scheduler matches them FIFO per (source, destination) channel, as MPI does, copies the
data, and resumes the rank when all its messages are matched. Nothing waits on a network:
a schedule that would deadlock under MPI raises `SimDeadlock` naming the stuck ranks.

Clock (alpha-beta-gamma): an operation starts when its rank and all of its peers have
posted (a rendezvous) and lasts alpha + beta * V, V the largest volume any of them moves in
that operation (a root posting p-1 receives at once moves (p-1) n through its link);
reducing n bytes adds n gamma to the rank's clock. Under this clock the simulated time of
every schedule equals its registered cost formula (tests/unit/test_sim.py).

Data can be numpy arrays (bytes counted exactly) or symbolic: object arrays of `Sym`, whose
sums print as in the lecture (a1+b1+c1+d1).
"""
from __future__ import annotations

import gc
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np
from greenlet import greenlet

from .backend import NUMPY, PHANTOM, Phantom, phantom
from .cost import LECTURE, Profile
from .schedules import get
from .specs import spec as collective_spec
from .transport import Counters, ReceiveThenReduce, split_nodes

__all__ = ["Sym", "VirtualCluster", "VirtualRank", "Network", "SimDeadlock", "symbolic", "phantoms", "run_collective"]


class SimDeadlock(RuntimeError):
    pass


class Sym:
    """A symbolic value: a sum of named terms, printed sorted ('a2+c2+d2')."""
    __slots__ = ("terms",)

    def __init__(self, *terms: str) -> None:
        self.terms = tuple(sorted(terms))

    def __add__(self, other: "Sym") -> "Sym":
        return Sym(*self.terms, *other.terms)

    __radd__ = __add__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(self.terms)

    def __repr__(self) -> str:
        return "+".join(self.terms)


def symbolic(names: str, p: int, blocks: int) -> list[np.ndarray]:
    """Rank r holds names[r] + block index: symbolic('abcd', 4, 4)[1] = [b0, b1, b2, b3]."""
    out = []
    for r in range(p):
        a = np.empty(blocks, dtype=object)
        for j in range(blocks):
            a[j] = Sym(f"{names[r]}{j}")
        out.append(a)
    return out


class _Op:
    """The exchange a virtual rank has in flight (one per rank: its transport blocks), reused
    for each of the rank's exchanges.

    What it posted: `posted` (its rank's clock), `latency` and `transfer` (its share of the
    op's time: alpha, and its bytes times beta, both scaled by the network's slow ranks and
    links) and `depth` (the critical-path rounds before it). The op ends at the latest
    posting among it and its peers plus the largest latency and transfer among them: each
    match folds the peer's posted values into `start`, `slowest`, `largest` and `deepest`
    (`VirtualCluster._pair`), so completing reads four fields and keeps no list of peers."""
    __slots__ = ("rank", "posted", "latency", "transfer", "depth", "start", "slowest", "largest", "deepest",
                 "pending")

    def __init__(self, rank: "VirtualRank") -> None:
        self.rank = rank
        self.pending = 0          # message ends not yet matched (0: nothing in flight)

    def finish(self) -> None:
        """The op is complete: its rank's clock is its end, its rounds one more than the
        deepest of it and its peers (`VirtualRank.sendrecv` and `VirtualCluster._pair`
        inline this: a call there cost more per message, side by side: benchmarks/README.md,
        "Figures behind constants in the code")."""
        rank = self.rank
        rank.clock = self.start + self.slowest + self.largest
        rank.rounds = self.deepest + 1

    def post(self, clock: float, latency: float, transfer: float, depth: int, ends: int) -> None:
        self.posted = self.start = clock
        self.latency = self.slowest = latency
        self.transfer = self.largest = transfer
        self.depth = self.deepest = depth
        self.pending = ends


@dataclass(frozen=True)
class Network:
    """What makes a cluster less uniform than alpha-beta-gamma, each a factor >= 1 on the
    time of what it touches.

    slow_ranks: {rank: f}: a straggler; every message it sends or receives takes f times
        the latency and bandwidth term (its NIC and host are f times slower), and so do its
        reductions (gamma).
    slow_links: {(src, dst): f}: one direction of one link f times slower (bandwidth term).
    overhead: seconds of per-message CPU overhead (LogP's o) added for every message an
        operation posts: an exchange of k messages costs k * overhead more.
    """
    slow_ranks: Mapping[int, float] = field(default_factory=dict)
    slow_links: Mapping[tuple[int, int], float] = field(default_factory=dict)
    overhead: float = 0.0

    @property
    def uniform(self) -> bool:
        return not self.slow_ranks and not self.slow_links and not self.overhead

    def check(self, p: int) -> None:
        for r, f in self.slow_ranks.items():
            if not (0 <= r < p) or not f >= 1:
                raise ValueError(f"slow rank {r} x{f}: expected a rank below {p} and a factor >= 1")
        for (a, b), f in self.slow_links.items():
            if not (0 <= a < p and 0 <= b < p) or not f >= 1:
                raise ValueError(f"slow link {a}->{b} x{f}: expected ranks below {p} and a factor >= 1")
        if not self.overhead >= 0:
            raise ValueError(f"per-message overhead must be >= 0, got {self.overhead}")

    def rank_factor(self, r: int) -> float:
        return self.slow_ranks.get(r, 1.0)

    def link_factor(self, src: int, dst: int) -> float:
        return self.slow_links.get((src, dst), 1.0) * max(self.slow_ranks.get(src, 1.0), self.slow_ranks.get(dst, 1.0))


UNIFORM = Network()


class VirtualRank(ReceiveThenReduce):
    """The transport of one virtual rank (implements `ringmpi.transport.Transport`)."""
    on_device = False
    nonblocking = False

    def __init__(self, cluster: "VirtualCluster", rank: int) -> None:
        self.cluster = cluster
        self.rank = rank
        self.size = cluster.size
        self.backend = cluster.backend
        self.counters = Counters()
        self.clock = 0.0
        self.rounds = 0   # critical-path rounds: 1 + the deepest of this op's and its peers'
        self.bytes_received = 0
        self.row = rank * self.size      # the channel of a message to rank d: row + d
        self.watch = None
        self.snapshots: list = []        # (clock, copy of watch)
        self._gamma = cluster.profile.gamma * cluster.network.rank_factor(rank)   # seconds per byte reduced
        self.op = _Op(self)              # the exchange in flight
        self.stack = cluster._stacks[rank // BUCKET]   # where it waits to run once ready
        self.let: Any = None             # the greenlet the rank runs in (`VirtualCluster.run`)
        # the cluster's, copied here for sendrecv's inlined path: one lookup less each
        # (measured in `benchmarks/README.md`, "Ranks run in windows")
        self.alpha, self.beta, self.per_node = cluster.alpha, cluster.beta, cluster.per_node
        self.ends = cluster._ends
        self.data = cluster.data

    # -- data movement --------------------------------------------------------------------
    def sendrecv(self, sendbuf, dest, recvbuf, source) -> None:
        if not self.fast or dest is None or sendbuf is None or source is None or recvbuf is None:
            self._post([] if dest is None or sendbuf is None else [(sendbuf, dest)],
                       [] if source is None or recvbuf is None else [(recvbuf, source)])
            return
        # the common two-sided case on a uniform network, `_post` and `_match` inlined: the
        # simulator's hot path (a rank waits in a sendrecv once a round of every schedule)
        out, inn = sendbuf.nbytes, recvbuf.nbytes
        op = self.op
        op.posted = op.start = self.clock
        cl = self.cluster
        if self.per_node:   # two kinds of link: each message at its own link's alpha and beta
            a_out, b_out = cl.link(self.rank, dest)
            a_in, b_in = cl.link(source, self.rank)
            op.latency = op.slowest = a_out if a_out > a_in else a_in
            op.transfer = op.largest = max(out * b_out, inn * b_in)
        else:
            op.latency = op.slowest = self.alpha
            op.transfer = op.largest = (out if out > inn else inn) * self.beta
        op.depth = op.deepest = self.rounds
        op.pending = 2
        c = self.counters
        c.calls += 1
        c.messages += 1
        c.bytes_sent += out
        self.bytes_received += inn
        ends = self.ends
        k = self.row + dest
        e = ends.pop(k, None)
        if e is None:
            ends[k] = (0, op, sendbuf)
        elif e.__class__ is tuple and e[0]:
            cl._pair(k, op, e[1], sendbuf, e[2])
        else:
            cl._queue(k, e, 0, op, sendbuf)
        k = source * self.size + self.rank
        e = ends.pop(k, None)
        if e is None:
            ends[k] = (1, op, recvbuf)
        elif e.__class__ is tuple and not e[0]:
            cl._pair(k, op, e[1], e[2], recvbuf)
        else:
            cl._queue(k, e, 1, op, recvbuf)
        if op.pending:   # (`VirtualCluster._park`, inlined)
            ready = cl._here
            (ready.pop() if ready else (ready.pop() if (ready := cl._next) else cl._main)).switch()
        else:   # (`_Op.finish`, inlined)
            self.clock = op.start + op.slowest + op.largest
            self.rounds = op.deepest + 1

    @property
    def watch(self) -> Any:
        """A buffer to snapshot before each op (symbolic tables), or None."""
        return self._watch

    @watch.setter
    def watch(self, buf: Any) -> None:
        self._watch = buf
        self.fast = buf is None and self.cluster.fast   # sendrecv's inlined path applies

    def sendrecv_reduce(self, sendbuf, dest, landing, source, op, mine, out) -> None:
        self.sendrecv(sendbuf, dest, landing, source)
        if self.data:
            self.combine(op, landing, mine, out)
        else:   # phantoms: nothing to reduce, the bytes counted and timed (as `combine`)
            n = out.nbytes
            self.counters.bytes_reduced += n
            self.clock += n * self._gamma

    def exchange(self, sends, recvs) -> None:
        self._post(list(sends), list(recvs))

    def _post(self, sends, recvs) -> None:
        self.counters.calls += 1
        if self.watch is not None:
            self.snapshots.append((self.clock, self.watch.copy()))
        if not sends and not recvs:
            return
        cl = self.cluster
        nb = cl.nbytes
        out = [nb(b) for b, _ in sends]
        inn = [nb(b) for b, _ in recvs]
        prof, net, me = cl.profile, cl.network, self.rank
        if net.uniform and not cl.per_node:
            latency, transfer = prof.alpha, max(sum(out), sum(inn)) * prof.beta
        else:
            link, rf = cl.link, net.rank_factor
            peers = [d for _, d in sends] + [s for _, s in recvs]
            latency = max(link(me, q)[0] * max(rf(me), rf(q)) for q in peers) + net.overhead * len(peers)
            transfer = max(sum(n * link(me, d)[1] * net.link_factor(me, d) for n, (_, d) in zip(out, sends)),
                           sum(n * link(s, me)[1] * net.link_factor(s, me) for n, (_, s) in zip(inn, recvs)))
        op = self.op
        op.post(self.clock, latency, transfer, self.rounds, len(out) + len(inn))
        c = self.counters
        c.messages += len(out)
        c.bytes_sent += sum(out)
        self.bytes_received += sum(inn)
        size = self.size
        for buf, dest in sends:
            cl._match(me * size + dest, 0, op, buf)
        for buf, src in recvs:
            cl._match(src * size + me, 1, op, buf)
        if op.pending:   # not already completed by the matches above
            cl._park()
        else:
            op.finish()

    # -- local work ---------------------------------------------------------------------
    def empty(self, n: int, dtype: Any) -> np.ndarray:
        return self.backend.empty(n, dtype)

    def copy(self, src, dst) -> None:
        self.counters.bytes_copied += self.cluster.nbytes(dst)
        self.backend.copy(src, dst)

    def combine(self, op: str, a, b, out) -> None:
        if not self.cluster.data:   # phantoms: nothing to reduce, the bytes counted and timed
            nbytes = out.nbytes
        elif out.dtype.kind == "O":
            if op not in ("SUM", "AVG"):
                raise ValueError("symbolic data supports SUM only")
            out[...] = a + b
            nbytes = out.size * self.cluster.sym_itemsize
        else:
            self.backend.combine(op, a, b, out)
            nbytes = out.nbytes
        self.counters.bytes_reduced += nbytes
        self.clock += nbytes * self._gamma

    def scale(self, buf, divisor: int) -> None:
        if buf.dtype.kind != "O":
            self.backend.scale(buf, divisor)

    @property
    def nodes(self) -> list[int]:
        return self.cluster.nodes

    def shared(self) -> "VirtualRank":
        """Shared memory within one virtual host: the same transport (its links are the
        node's; see `VirtualCluster`)."""
        if len(set(self.cluster.nodes)) != 1:
            raise ValueError(f"shared memory needs every rank on one host; these {self.size} ranks are on "
                             f"{len(set(self.cluster.nodes))}")
        return self

    def reserve(self, nbytes: int) -> None:
        pass

    def in_shared(self, buf) -> bool:
        return True

    def reads_across(self, nbytes: int) -> bool:
        """No cross-memory reads here (every buffer is shared): the schedules run in parts."""
        return False

    def split_nodes(self) -> tuple[Any, Any]:
        """(the ranks of my node, the ranks with my place on every node, or None when my
        place is beyond the smallest node's size) as sub-groups."""
        return split_nodes(self, self.cluster.nodes)

    def mpi(self, call) -> None:
        """The MPI library's own collective is opaque: the simulator runs the algorithm the
        collective's spec names as its stand-in (`Collective.simulated_mpi`): its body,
        as MPI's own collective is the body of "mpi" (the division of AVG and a 16-bit
        float's widening are `Algorithm.run`'s, once, around it)."""
        spec = call.collective
        get(spec.name, spec.simulated_mpi).body(self, call)

    @property
    def reduced_bytes(self) -> int:
        return self.counters.bytes_reduced


#: Ranks per bucket of the ready set. A parked rank hands over to a ready rank of the
#: window, two neighbouring buckets; `run` moves the window when both are empty, and every
#: sweep over the cluster starts one bucket further than the one before (1-2, 3-4, ...,
#: then 2-3, 4-5, ...). Rank r of a ring can be at most d rounds ahead of rank r+d: run
#: alone, a window rises to a pyramid of BUCKET rounds in its middle, and the next sweep's
#: windows, centred on the valleys between pyramids, raise them as far. So a sweep moves
#: every rank about BUCKET rounds while 2 BUCKET ranks' state (their greenlets' stacks,
#: frames and views) stays in cache; a sweep of the whole cluster for every round missed
#: the caches on every rank once p passed a thousand or two (the skewed tiles of stencil
#: codes, found by the ready set itself: `benchmarks/README.md` has the figures).
BUCKET = 64


class VirtualCluster:
    """p virtual ranks; `run(fn)` calls fn(transport) on each and returns their results.

    data=False: timing without data. The buffers are phantoms (`ringmpi.backend.phantom`):
    the same schedule code runs and every message, byte and round is counted, the clock
    advances, but nothing is copied or reduced, so 1024 ranks x 64 MB need no 64 GB.
    `network` adds stragglers, slow links and per-message overhead (`Network`)."""

    def __init__(self, size: int, profile: Profile = LECTURE, sym_itemsize: int = 1, *, data: bool = True,
                 network: Network = UNIFORM, per_node: int = 0) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one rank, got {size}")
        if per_node < 0:
            raise ValueError(f"ranks per node must be >= 0, got {per_node}")
        network.check(size)
        self.size = size
        self.profile = profile
        self.network = network
        self.data = data
        self.backend = NUMPY if data else PHANTOM
        self.per_node = per_node
        # the host of every rank (named by its lowest rank): nodes of per_node consecutive
        # ranks (the last one may be smaller); 0: one node and one link class
        self.nodes = [r - r % per_node for r in range(size)] if per_node else [0] * size
        self.fast = network.uniform   # sendrecv's inlined path applies
        self.sym_itemsize = sym_itemsize
        self._stacks: list[list] = [[] for _ in range(-(-size // BUCKET))]   # the ready ranks' greenlets
        self._here = self._next = self._stacks[0]   # the window (`_park`)
        self.sweeps = 0   # sweeps of the window over the cluster in the last run
        self.alpha, self.beta = profile.alpha, profile.beta   # (sendrecv's inlined path)
        self._ends: dict = {}
        self.ranks = [VirtualRank(self, r) for r in range(size)]
        self._main: greenlet | None = None

    def nbytes(self, buf) -> int:
        return buf.nbytes if buf.dtype.kind != "O" else buf.size * self.sym_itemsize

    def link(self, a: int, b: int) -> tuple[float, float]:
        """(alpha, beta) of the link between ranks a and b: the node's own links (the
        profile's alpha_local, beta_local) inside a node of a multi-node cluster, the
        network's otherwise."""
        prof = self.profile
        if self.per_node and self.nodes[a] == self.nodes[b]:
            return prof.alpha_l, prof.beta_l
        return prof.alpha, prof.beta

    # -- matching: FIFO per (source, destination) channel, as MPI's non-overtaking rule ---
    # `_ends[chan]`: the message ends of one channel not yet matched, all sends or all
    # receives: one (side, op, buf) (side 0 a send, 1 a receive), or a deque of them when
    # several wait. A matched channel leaves the table, so it holds what is in flight, not
    # every channel a run ever used (p^2 of them for an all-to-all pattern).
    def _match(self, chan: int, side: int, op: _Op, buf: Any) -> None:
        """Post one message end of the running rank's `op`: it waits, or meets the oldest
        end of the other side (`VirtualRank.sendrecv` inlines this)."""
        ends = self._ends
        e = ends.pop(chan, None)
        if e is None:
            ends[chan] = (side, op, buf)
        elif e.__class__ is tuple and e[0] != side:
            self._pair(chan, op, e[1], buf, e[2]) if side == 0 else self._pair(chan, op, e[1], e[2], buf)
        else:
            self._queue(chan, e, side, op, buf)

    def _queue(self, chan: int, e: Any, side: int, op: _Op, buf: Any) -> None:
        """The channel's ends `e` (popped) are a queue, or of the posting side: queue the new
        end behind them, or pair it with the oldest."""
        ends = self._ends
        if e.__class__ is tuple:
            ends[chan] = deque((e, (side, op, buf)))
        elif e[0][0] == side:
            e.append((side, op, buf))
            ends[chan] = e
        else:
            _, other, obuf = e.popleft()
            ends[chan] = e[0] if len(e) == 1 else e
            self._pair(chan, op, other, buf, obuf) if side == 0 else self._pair(chan, op, other, obuf, buf)

    def _pair(self, chan: int, op: _Op, other: _Op, sbuf: Any, rbuf: Any) -> None:
        """A send meets its receive on channel `chan`: the running rank's `op` and the waiting `other` (a
        parked rank's, or `op` itself for a message to oneself). The data moves, each op
        folds the other's posted values, and `other`, once complete, makes its rank ready."""
        if sbuf.size != rbuf.size:
            src, dst = divmod(chan, self.size)
            raise SimDeadlock(f"rank {src} sent {sbuf.size} elements to rank {dst}, "
                              f"which posted a receive of {rbuf.size} (MPI would truncate or hang)")
        if self.data:
            np.copyto(rbuf, sbuf)
        # each op folds the other's posted values (written out both ways: a method called
        # twice costs more per message, the simulator's hot path; benchmarks/README.md)
        if other.posted > op.start:
            op.start = other.posted
        if other.latency > op.slowest:
            op.slowest = other.latency
        if other.transfer > op.largest:
            op.largest = other.transfer
        if other.depth > op.deepest:
            op.deepest = other.depth
        if op.posted > other.start:
            other.start = op.posted
        if op.latency > other.slowest:
            other.slowest = op.latency
        if op.transfer > other.largest:
            other.largest = op.transfer
        if op.depth > other.deepest:
            other.deepest = op.depth
        op.pending -= 1
        other.pending -= 1
        if not other.pending and other is not op:   # (`_Op.finish`, inlined: once per message)
            rank = other.rank
            rank.clock = other.start + other.slowest + other.largest
            rank.rounds = other.deepest + 1
            rank.stack.append(rank.let)

    def _park(self) -> None:
        """Suspend the running rank until its op completes, switching straight to a ready
        rank of the window (one switch per exchange, not two through a scheduler), or to the
        main greenlet when the window has none (`run` moves it). (`VirtualRank.sendrecv`
        inlines this.)"""
        let = self._ready_one()
        (self._main if let is None else let).switch()

    def _ready_one(self) -> Any:
        """The greenlet of a ready rank of the window, taken from its bucket, or None. Within
        a bucket the rank made ready last goes first (a stack, not a queue): its state is
        still in cache, and in a ring it can often post its next exchange and complete it
        at once, with no switch at all."""
        here = self._here
        if here:
            return here.pop()
        return self._next.pop() if self._next else None

    def _window(self, b: int) -> bool:
        """Buckets b and b+1 (cyclically) are where parked ranks look for the next to run;
        whether any of their ranks is ready."""
        stacks = self._stacks
        self._here, self._next = stacks[b % len(stacks)], stacks[(b + 1) % len(stacks)]
        return bool(self._here or self._next)

    def _check_stuck(self) -> None:
        """Raise SimDeadlock naming every rank still waiting when no rank can go on."""
        stuck = [rk for rk in self.ranks if rk.op.pending]
        if stuck:
            raise SimDeadlock("no progress possible; blocked: " + ", ".join(
                f"rank {rk.rank} (op posted at t={rk.op.posted:.3g})" for rk in stuck))

    # -- running ------------------------------------------------------------------------
    def run(self, fn: Callable[[VirtualRank], Any]) -> list:
        """fn(rank) on every rank, each a greenlet started in rank order; their results.
        The simulated times do not depend on the order the ranks run in: every exchange's
        end time is a function of what it and its peers posted, and a channel pairs its
        k-th send with its k-th receive whoever comes first."""
        # (about 60 lines, one function: the ranks' bodies, their start in rank order and
        # the sweeps share this run's results, errors and windows)
        results: list = [None] * self.size
        errors: list = []
        self._main = greenlet.getcurrent()

        def body(r: int):
            try:
                results[r] = fn(self.ranks[r])
            except BaseException as e:  # surface the first failure with its rank
                errors.append((r, e))
            finally:
                rk = self.ranks[r]
                if rk.watch is not None:
                    rk.snapshots.append((rk.clock, rk.watch.copy()))
                # a finished greenlet returns to its parent: the window's next ready rank,
                # as a parked one hands over (the main greenlet would move the window on)
                if not errors and (let := self._ready_one()) is not None:
                    greenlet.getcurrent().parent = let
        for rk in self.ranks:
            rk.let = greenlet(lambda r=rk.rank: body(r))
        # the engine makes no reference cycle per message (a rank and its one reused op are
        # the only cycle, p of them): the cyclic collector would only rescan the millions of
        # live buffers of a large run
        collecting = gc.isenabled()
        gc.disable()
        stacks = self._stacks
        try:
            def go(let) -> None:
                let.switch()
                if errors:
                    rank, err = errors[0]
                    if isinstance(err, SimDeadlock):
                        raise err
                    raise RuntimeError(f"virtual rank {rank} failed: {err!r}") from err
            # the ranks start from here, in rank order (a greenlet started from another
            # rank's would nest in its stack), each with the window on its bucket and the one
            # below, where the ranks it completes wait
            for rk in self.ranks:
                self._window(max(rk.rank // BUCKET - 1, 0))
                go(rk.let)
            # then sweeps of windows, each window run until none of its ranks can go on
            parity, self.sweeps = 0, 0
            while any(stacks):
                self.sweeps += 1
                for b in range(parity, len(stacks) + parity, 2):
                    if self._window(b):
                        go(self._ready_one())
                parity ^= len(stacks) > 1
        finally:
            for st in stacks:
                st.clear()
            for rk in self.ranks:
                rk.let = None     # (a finished greenlet; a failed run's suspended ones unwind here)
            if collecting:
                gc.enable()
        self._check_stuck()
        return results

    @property
    def time(self) -> float:
        return max(r.clock for r in self.ranks)

    def traffic(self) -> dict:
        sent = [r.counters.bytes_sent for r in self.ranks]
        return {"busiest_sent": max(sent), "avg_sent": sum(sent) / self.size,
                "rounds": max(r.rounds for r in self.ranks),
                "busiest_moved": max(s + r.bytes_received for s, r in zip(sent, self.ranks)),
                "messages": sum(r.counters.messages for r in self.ranks), "sent": sent}


def phantoms(p: int, count: int, dtype: Any = np.uint8) -> list[Phantom]:
    """p phantom inputs of `count` elements (for `run_collective` without data)."""
    return [phantom(count, dtype) for _ in range(p)]


def _plain(buf: Any) -> Any:
    """A phantom as a plain ndarray (stride 0 still: no memory). The schedules slice it
    once or twice a message, and numpy slices a subclass at about twice a plain array's
    cost; the engine never copies its contents (`PhantomBackend`), so nothing else changes."""
    return buf if buf is None else buf.view(np.ndarray)


def run_collective(collective: str, algorithm: str, inputs: list[np.ndarray], *, op: str | None = "SUM",
                   root: int = 0, params: dict | None = None, profile: Profile = LECTURE,
                   inplace: bool = False, watch: bool = False, sym_itemsize: int = 1,
                   network: Network = UNIFORM, per_node: int = 0):
    """Run one registered algorithm on a virtual cluster of len(inputs) ranks, rank r's
    input being inputs[r] (its contribution, as in `Collective.make`); returns (cluster,
    per-rank outputs). The algorithm's tunables are `params`, else its `tune` under `profile`.
    Phantom inputs (`phantoms`) run without data: timing and traffic only. `per_node` makes
    a cluster of nodes of that many ranks, with the profile's local links inside a node."""
    spec = collective_spec(collective)
    alg = get(collective, algorithm)
    p = len(inputs)
    data = not all(isinstance(x, Phantom) for x in inputs)
    if per_node:
        profile = replace(profile, per_node=per_node)
    cl = VirtualCluster(p, profile, sym_itemsize, data=data, network=network, per_node=per_node)

    def fn(t: VirtualRank):
        call = spec.make(t.rank, p, inputs[t.rank], op=op if spec.reduces else None, root=root, inplace=inplace)
        itemsize = cl.nbytes(call.send[:1]) if call.count else 1
        tuned = {**dict(call.params), **alg.tuned(p, call.count, itemsize, profile), **(params or {})}
        plain = {} if data else dict(send=_plain(call.send), recv=_plain(call.recv))   # (`_plain`)
        call = call._replace(params=tuple(sorted(tuned.items())), **plain)
        if watch:
            t.watch = spec.shown(call)
        alg.run(t, call)
        return spec.output(call)
    return cl, cl.run(fn)
