"""torch.distributed on ringmpi: a process group backend, its rendezvous from the MPI job,
and DDP's communication hook.

`init_process_group()` under mpirun (or `python -m ringmpi.launch`) needs no environment
variables: rank and size are the MPI job's, and rank 0's address and a free port (or
MASTER_ADDR/MASTER_PORT where set) reach the others over MPI, for the TCPStore that
torch keeps beside every process group.

Backend "ringmpi" (`Backend.register_backend`, torch's interface for backends written
outside it) is a `ProcessGroup` subclass in Python: `dist.all_reduce`, `broadcast`,
`all_gather(_into_tensor)`, `reduce_scatter(_tensor)`, `reduce`, `all_to_all(_single)`
(even splits) and `barrier` run ringmpi's collectives, and DDP, with no hook, all-reduces
its buckets through it: each bucket a ringmpi request, completed on ringmpi's progress
thread while backward goes on. A call made with `async_op=False` runs blocking on the
caller's thread (no hand-off to the progress thread). What ringmpi lacks (gather, scatter,
point-to-point, uneven all-to-all) raises, naming the call; a gloo group beside it
(`init_process_group(backend="gloo")` then `dist.new_group(backend="ringmpi")`, or the
reverse) serves those.

`allreduce_hook` is the other way in: gloo (or any backend) as DDP's process group, and
`ddp.register_comm_hook(HookState(), allreduce_hook)`, DDP's hook interface, to all-reduce
the gradient buckets with ringmpi.
"""
from __future__ import annotations

import gc
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..api import group
from .tensors import Outcome, TensorRequest, _Arrays, overlaps

__all__ = ["init_process_group", "destroy_process_group", "register", "ProcessGroupRingmpi", "HookState", "allreduce_hook"]

ReduceOp = dist.ReduceOp
#: torch's reduction ops as ringmpi names them (PREMUL_SUM has no ringmpi counterpart)
OPS = {ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min",
       ReduceOp.MAX: "max", ReduceOp.BAND: "band", ReduceOp.BOR: "bor", ReduceOp.BXOR: "bxor"}
#: the communicator `init_process_group` set the default group up on (None: COMM_WORLD)
_WORLD: list = [None]


def _rendezvous(t: Any) -> tuple[str, int]:
    """Rank 0's address and a port free there (MASTER_ADDR/MASTER_PORT where set), on every
    rank; a ValueError on every rank where rank 0's host name means a loopback address and
    the job spans several hosts (the others could not reach it: they would wait)."""
    where: Any = None
    if t.rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        port = os.environ.get("MASTER_PORT")
        if not port:
            with socket.socket() as s:     # (freed at once: the store binds it next, on this rank)
                s.bind(("", 0))
                port = s.getsockname()[1]
        where = (host, int(port))
        if host.startswith("127.") and len(set(t.nodes)) > 1:
            where = (f"ringmpi.torch.init_process_group: rank 0's host name {socket.gethostname()!r} is "
                     f"{host}, a loopback address, and the job spans {len(set(t.nodes))} hosts; set MASTER_ADDR "
                     "to an address of rank 0's host that the others reach",)
    where = t.bcast_obj(where, 0)
    if len(where) == 1:
        raise ValueError(f"{where[0]} (rank {t.rank})")
    return where


def init_process_group(backend: str = "ringmpi", *, comm: Any = None, algorithm: str = "auto",
                       timeout: timedelta = timedelta(minutes=10), **kwargs: Any) -> None:
    """`torch.distributed.init_process_group` from the MPI job: rank and world size those of
    `comm` (COMM_WORLD when None), the store's rendezvous over MPI. backend: "ringmpi" (this
    module's process group; `algorithm` is what its collectives ask ringmpi for), "gloo",
    or any backend torch knows, e.g. "cpu:gloo,cuda:ringmpi"."""
    t = group(comm)
    if "ringmpi" in backend:
        register(algorithm)
    _WORLD[0] = comm
    host, port = _rendezvous(t)
    store = dist.TCPStore(host, port, t.size, is_master=t.rank == 0, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=t.rank, world_size=t.size, timeout=timeout, **kwargs)


def destroy_process_group(group_: Any = None) -> None:
    """`dist.destroy_process_group`, then its objects freed on every rank before any rank
    goes on. A process group's C++ objects go when Python frees them, which for a DDP
    module (reference cycles) is whenever the garbage collector runs; gloo's teardown then
    waits for its peers, and a peer already waiting in an MPI call for this rank never
    comes: a hang, seen with two trainings in a row. Collected here, at the same point on
    every rank, and an MPI barrier after."""
    gc.collect()
    dist.destroy_process_group(group_)
    gc.collect()
    group(_WORLD[0]).barrier()


def register(algorithm: str = "auto") -> None:
    """Make backend "ringmpi" known to torch (for `init_process_group` and `new_group`)."""
    def create(options: Any, _backend_options: Any) -> "ProcessGroupRingmpi":
        t = group(_WORLD[0])
        ranks = list(options.global_ranks_in_group or range(t.size))
        comm = _WORLD[0] if ranks == list(range(t.size)) else t.subgroup(ranks)
        return ProcessGroupRingmpi(options.group_rank, options.group_size, comm, algorithm)
    dist.Backend.register_backend("ringmpi", create, extended_api=True, devices=["cpu", "cuda"])


class _Work(Outcome, dist.Work):
    """What the process group returns: its calls' requests, and the future DDP reads."""

    def __init__(self, requests: list[TensorRequest], future: Any) -> None:
        super().__init__()
        self.requests, self.future = requests, future

    def wait(self, timeout: Any = None) -> bool:
        for r in self.requests:       # (on the caller's thread, at a blocking call's speed)
            r.wait()
        self.future.wait()
        return True

    is_completed = Outcome.done


def _unserved(call: str) -> Callable[..., _Work]:
    """A process group call ringmpi has no collective for: a clear error naming what does."""
    def unserved(self: "ProcessGroupRingmpi", *args: Any) -> _Work:
        raise NotImplementedError(f"torch.distributed.{call} (ringmpi, rank {self.rank()}): ringmpi has no {call}; "
                                  "a gloo group beside this one serves it (dist.new_group(backend='gloo'))")
    unserved.__name__ = call
    return unserved


def _done(value: Any) -> _Work:   # (a call that completed at once)
    future = torch.futures.Future()
    future.set_result(value)
    return _Work([], future)


class ProcessGroupRingmpi(dist.ProcessGroup):
    """A torch process group whose collectives are ringmpi's, on communicator `comm`."""

    def __init__(self, rank: int, size: int, comm: Any, algorithm: str = "auto", overlap: bool | None = None) -> None:
        super().__init__(rank, size)
        self.comm, self.algorithm = comm, algorithm
        #: whether a call made with async_op=True runs as a request (`ringmpi.torch.overlaps`)
        self.overlap = overlaps(comm) if overlap is None else overlap

    def getBackendName(self) -> str:
        return "ringmpi"

    @property
    def name(self) -> str:   # (torch's own groups name themselves so)
        return "ringmpi"

    def __repr__(self) -> str:
        return f"ProcessGroupRingmpi(rank {self.rank()} of {self.size()}, algorithm {self.algorithm})"

    # -- the calls ----------------------------------------------------------------------
    def _run(self, name: str, given: dict, tensors: list, opts: Any, then: Any = None) -> _Work:
        """One ringmpi call on tensors: blocking when the caller waits at once, else a
        request; the work's value is `tensors` (after `then`, a copy out of the result)."""
        arrays = _Arrays(f"torch.distributed.{name} (ringmpi)")
        for k, v in list(given.items()):
            given[k] = arrays.of(v, k)
        def finish(out: Any) -> list:
            if then is not None:
                then(out)
            return tensors
        req = TensorRequest(name, self.comm, self.algorithm, given, arrays, finish,
                            overlap=self.overlap and getattr(opts, "asyncOp", True))
        return _Work([req], req.get_future())

    def _op(self, opts: Any, call: str) -> str:
        for op, name in OPS.items():
            if opts.reduceOp == op:
                return name
        raise ValueError(f"torch.distributed.{call} (ringmpi, rank {self.rank()}): op {opts.reduceOp} has no "
                         f"ringmpi counterpart; expected one of {', '.join(OPS.values())}")

    def _one(self, tensors: list, call: str) -> Any:
        if len(tensors) != 1:
            raise ValueError(f"torch.distributed.{call} (ringmpi, rank {self.rank()}): expected one tensor "
                             f"per process, got {len(tensors)}")
        return tensors[0]

    def allreduce(self, tensors: list, opts: Any = None) -> _Work:
        opts = opts or dist.AllreduceOptions()
        t = self._one(tensors, "all_reduce")
        return self._run("allreduce", dict(sendbuf=t, recvbuf=t, op=self._op(opts, "all_reduce")), tensors, opts)

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> _Work:
        works = [self.allreduce([t], opts) for t in tensors]
        for w in works:
            w.wait()
        return _done(tensors)

    def broadcast(self, tensors: list, opts: Any = None) -> _Work:
        opts = opts or dist.BroadcastOptions()
        t = self._one(tensors, "broadcast")
        return self._run("broadcast", dict(buf=t, root=opts.rootRank), tensors, opts)

    def reduce(self, tensors: list, opts: Any = None) -> _Work:
        opts = opts or dist.ReduceOptions()
        t = self._one(tensors, "reduce")
        return self._run("reduce", dict(sendbuf=t, recvbuf=t, root=opts.rootRank, op=self._op(opts, "reduce")),
                         tensors, opts)

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> _Work:
        return self._run("allgather", dict(sendbuf=input.reshape(-1), recvbuf=output.reshape(-1)), [output], opts)

    _allgather_base = all_gather_single

    def allgather(self, outputs: list, inputs: list, opts: Any = None) -> _Work:
        """all_gather into a list of tensors: into one buffer, then copied out."""
        t, outs = self._one(inputs, "all_gather"), self._one(outputs, "all_gather")
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype, device=t.device)
        return self._run("allgather", dict(sendbuf=t.reshape(-1), recvbuf=flat), outputs, opts,
                         self._copy_out(flat, outs))

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> _Work:
        opts = opts or dist.ReduceScatterOptions()
        op = self._op(opts, "reduce_scatter_tensor")
        return self._run("reduce_scatter", dict(sendbuf=input.reshape(-1), recvbuf=output.reshape(-1), op=op),
                         [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list, inputs: list, opts: Any = None) -> _Work:
        """reduce_scatter from a list of tensors: concatenated into one buffer first."""
        opts = opts or dist.ReduceScatterOptions()
        out, pieces = self._one(outputs, "reduce_scatter"), self._one(inputs, "reduce_scatter")
        send = torch.cat([p.reshape(-1) for p in pieces])
        return self._run("reduce_scatter", dict(sendbuf=send, recvbuf=out.reshape(-1),
                                                op=self._op(opts, "reduce_scatter")), outputs, opts)

    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: list, input_split_sizes: list,
                          opts: Any = None) -> _Work:
        p = self.size()
        for splits, what in ((output_split_sizes, "output"), (input_split_sizes, "input")):
            if splits and len(set(splits)) > 1:
                raise ValueError(f"torch.distributed.all_to_all_single (ringmpi, rank {self.rank()}): "
                                 f"{what}_split_sizes {list(splits)} are uneven; ringmpi's alltoall moves "
                                 f"{p} equal blocks (a gloo group serves uneven splits)")
        return self._run("alltoall", dict(sendbuf=input.reshape(-1), recvbuf=output.reshape(-1)), [output], opts)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> _Work:
        send = torch.cat([t.reshape(-1) for t in inputs])
        flat = torch.empty_like(send)
        return self._run("alltoall", dict(sendbuf=send, recvbuf=flat), outputs, opts, self._copy_out(flat, outputs))

    def _copy_out(self, flat: Any, outputs: list) -> Any:
        """What copies block q of `flat` into outputs[q] once the call is complete."""
        def copy(result: Any) -> None:
            for o, piece in zip(outputs, flat.view(self.size(), -1)):
                o.copy_(piece.view_as(o))
        return copy

    def barrier(self, opts: Any = None) -> _Work:
        group(self.comm).barrier()
        return _done([])

    gather, scatter, send, recv = (_unserved(call) for call in ("gather", "scatter", "send", "recv"))


# -- DDP's communication hook -------------------------------------------------------------

@dataclass
class HookState:
    """What `allreduce_hook` uses: the communicator (None: COMM_WORLD), the algorithm, and
    whether buckets run as requests beside backward (None: `ringmpi.torch.overlaps`)."""
    comm: Any = None
    algorithm: str = "auto"
    overlap: bool | None = None
    buckets: int = 0               # buckets all-reduced so far


def allreduce_hook(state: HookState | None, bucket):  # noqa: ANN201 (DDP refuses a hook whose bucket or
    # result is annotated with anything but dist.GradBucket and Future[Tensor]: here they would be strings)
    """DDP's default hook on ringmpi: the bucket's gradients averaged over the ranks (ringmpi's
    AVG: the sum, then one division by the rank count) in place, as a request; the future DDP
    waits for is completed on ringmpi's progress thread while backward goes on.

        ddp.register_comm_hook(ringmpi.torch.HookState(), ringmpi.torch.allreduce_hook)
    """
    state = state if state is not None else HookState()
    if state.overlap is None:
        state.overlap = overlaps(state.comm)
    buf = bucket.buffer()
    state.buckets += 1
    arrays = _Arrays("ringmpi.torch.allreduce_hook")
    a = arrays.of(buf, "bucket")
    req = TensorRequest("allreduce", state.comm, state.algorithm, dict(sendbuf=a, recvbuf=a, op="avg"), arrays,
                        overlap=state.overlap)
    return req.get_future()

