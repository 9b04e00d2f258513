"""`ringmpi train`: data-parallel training on ringmpi under mpirun (loss per step, replica
check, comparison with single-process and MPI_Allreduce training, measured vs modelled
speedup), and the asynchronous-SGD staleness table (no MPI).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..api import algorithms, fault_tolerant, group, shrink
from ..auto import profile_of
from ..dp.arrays import DEVICES, to_host
from ..dp.ps import async_sgd_study
from ..errors import RankFailure, RingmpiUsageError
from ..dp.checkpoint import Snapshot, Writer, newest
from ..dp.ddp import DataParallel, restore, state_arrays
from ..dp.hooks import HOOKS, named
from ..dp.train import local_batch, make_optimizer, make_task, max_diff, params_digest, time_overlap, train_dp, train_single
from ..model import dp_step
from . import args

__all__ = ["add_parser"]


def _staleness() -> int:
    rows = async_sgd_study()
    print("# asynchronous SGD, 8 workers, 400 gradient computations; final loss "
          f"(initial {rows[0]['initial_loss']:.3f}; DIVERGED = worse than twice the initial)")
    taus = sorted({r["tau"] for r in rows})
    print(f"{'lr':>6} " + " ".join(f"{'tau=' + str(t):>10}" for t in taus))
    for lr in dict.fromkeys(r["lr"] for r in rows):
        cells = ["DIVERGED" if r["diverged"] else f"{r['final_loss']:.4f}" for r in rows if r["lr"] == lr]
        print(f"{lr:>6g} " + " ".join(f"{c:>10}" for c in cells))
    return 0


class _Progress:
    """A line per step on rank 0 (and a progress bar where stderr is a terminal)."""

    def __init__(self, ns, t, start: int = 0) -> None:
        self.lead = t.rank == 0 and not ns.quiet
        self.bar = None
        if self.lead and sys.stderr.isatty():
            from rich.progress import Progress
            self.bar = Progress(transient=True)
            self.bar.start()
            self.bar.add_task("training", total=ns.steps, completed=start)

    def rebind(self, ns, t) -> None:
        """After a shrink: the survivors' new rank 0 prints."""
        self.lead = t.rank == 0 and not ns.quiet

    def __call__(self, s: int, loss: float) -> None:
        if self.lead:
            print(f"step {s:>5}  loss {loss:.6f}", flush=True)
            if self.bar:
                self.bar.advance(self.bar.task_ids[0])

    def stop(self) -> None:
        if self.bar:
            self.bar.stop()


#: the options a checkpoint must agree with to be resumed (the algorithm may change: it
#: changes the summation order, so the bits, not the training)
CONFIG = ("model", "sizes", "samples", "batch", "dtype", "device", "optimizer", "lr", "momentum", "seed")


class _Checkpoints:
    """--checkpoint DIR --checkpoint-every N: resume from the newest complete checkpoint
    (rank 0 reads it and sends it to every rank), and write one every N steps and at the
    end (rank 0, on a thread: the step pays for a copy of the state)."""

    def __init__(self, ns, ddp, opt, samples: int) -> None:
        self.ns, self.opt, self.samples = ns, opt, samples
        self.config = {k: getattr(ns, k) for k in CONFIG}
        self.writer: Writer | None = None
        self.copy_seconds = 0.0      # the steps' time spent copying the state for the writer
        self.wait_seconds = 0.0      # ... and waiting for the write before (not done in time)
        self.rebind(ddp)

    @property
    def t(self):
        return self.ddp.t

    def rebind(self, ddp) -> None:
        """The replica to save (a new one after a shrink, whose rank 0 may be new: it writes)."""
        self.ddp = ddp
        if ddp.t.rank == 0 and self.writer is None:
            self.writer = Writer(self.ns.checkpoint, keep=self.ns.checkpoint_keep)

    def resume(self) -> int:
        found = newest(self.ns.checkpoint) if self.t.rank == 0 else None
        data = self.t.bcast_obj(found[1] if found else None, 0)
        if data is None:
            return 0
        snap = Snapshot.decode(data)
        differ = [k for k in CONFIG if snap.meta.get("config", {}).get(k) != _jsonable(self.config[k])]
        if differ:
            k = differ[0]
            raise RingmpiUsageError(
                f"ringmpi train (rank {self.t.rank}): --checkpoint {self.ns.checkpoint} holds step {snap.step} of "
                f"a run with --{k.replace('_', '-')} {snap.meta['config'].get(k)}, this run has "
                f"{_jsonable(self.config[k])}: resume with the same options or use another directory")
        step = restore(self.ddp, self.opt, snap)
        if self.t.rank == 0 and not self.ns.quiet:
            print(f"# resumed from {found[0]} at step {step} (attempt {os.environ.get('RINGMPI_RESTART', '0')})",
                  flush=True)
        return step

    def after(self, s: int) -> None:
        """After step `s` (0-based): write the state at step s + 1 if it is due."""
        done = s + 1
        if self.writer is not None and (done % self.ns.checkpoint_every == 0 or done == self.ns.steps):
            a = time.perf_counter()
            self.writer.wait()
            b = time.perf_counter()
            self.wait_seconds += b - a
            epoch, index = divmod(done, max(self.samples // self.ns.batch, 1))   # as global_batch
            self.writer.save(done, state_arrays(self.ddp, self.opt),
                             {"config": {k: _jsonable(v) for k, v in self.config.items()},
                              "data": {"epoch": epoch, "batch_in_epoch": index}, "ranks": self.t.size})
            self.copy_seconds += time.perf_counter() - b

    def close(self) -> None:
        if self.writer is not None:
            self.writer.wait()
            if self.writer.written and not self.ns.quiet:
                n = len(self.writer.written)
                print(f"# checkpoints: {n} written into {self.ns.checkpoint}; on the steps, per checkpoint: "
                      f"{self.copy_seconds / n * 1e3:.2f} ms copying the state, {self.wait_seconds / n * 1e3:.2f} ms "
                      "waiting for the write before it (the write overlaps the steps)", flush=True)


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v


#: all-reduce algorithms that wait on shared memory, where a dead rank is never noticed (no
#: MPI call sees it): a run that means to outlive a rank uses the others (auto may pick these)
_WAIT_ON_SHARED_MEMORY = ("auto", "ring_shm", "hierarchical", "hierarchical_oneway")


class _Steps:
    """How far this rank's training got: `done` steps complete (their update applied), and
    when the first of them ended (`first`, perf_counter; 0: none yet)."""

    def __init__(self, done: int) -> None:
        self.done = done
        self.first = 0.0


def _go_on(ns, ddp, opt, steps: _Steps, show: _Progress):
    """--on-failure shrink: the survivors' communicator (ULFM's shrink), the state of the
    survivor that got furthest (a rank dies mid-step: the survivors that had every block of
    the step's last all-reduce applied its update, the others not), a new replica on the
    survivors, which re-partitions each global batch over p - 1 ranks (the same samples per
    step: the training goes on unchanged, only the summation order differs)."""
    began = time.perf_counter()
    old = ddp.t
    comm = shrink(ddp.comm)
    t = group(comm)
    survivors = t.allgather_obj((old.rank, steps.done))     # (rank before, steps done)
    reached = [done for _, done in survivors]
    root = reached.index(max(reached))
    snap = Snapshot(max(reached), {k: to_host(v) for k, v in state_arrays(ddp, opt).items()}) if t.rank == root else None
    data = t.bcast_obj(snap.encode() if snap else None, root)
    fresh = _replica(ns, ddp.model, comm, ns.overlap)
    steps.done = restore(fresh, opt, Snapshot.decode(data))
    show.rebind(ns, t)
    if t.rank == 0 and not ns.quiet:
        lost = sorted(set(range(old.size)) - {r for r, _ in survivors})
        print(f"# rank{'s' * (len(lost) > 1)} {', '.join(map(str, lost))} of {old.size} lost in step "
              f"{min(reached)}: going on with {t.size} ranks at step {steps.done} (the state of rank {root} of "
              f"the survivors), {time.perf_counter() - began:.2f} s after the error", flush=True)
    return fresh


def _bucket_cap(text: str) -> float | str:
    if text == "auto":
        return text
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a size in MB > 0 or auto, got {text}")
    return value


def _replica(ns, model, comm, overlap: bool | None, cap: float | None = None) -> DataParallel:
    hook, state = named(ns.hook)
    cap = cap if cap is not None else 25.0 if ns.bucket_cap == "auto" else ns.bucket_cap
    return DataParallel(model, comm, algorithm=ns.algorithm, overlap=overlap, bucket_cap_mb=cap, comm_hook=hook,
                        hook_state=state)


def _train(ns, task, kw):
    """Train with a progress line per step on rank 0 (from the newest checkpoint with
    --checkpoint; on the survivors after a lost rank with --on-failure shrink); returns
    (ddp, seconds, steps run)."""
    ddp = _replica(ns, task.make_model(), None, ns.overlap)
    if ns.bucket_cap == "auto" and ddp.overlap:   # (blocking, the fewest buckets cost the least: DDP's 25 MB)
        plan = ddp.tune_buckets(task.take(task.data, local_batch(task, 0, ns.batch, ns.seed, ddp.t.size, ddp.t.rank)))
        if ddp.t.rank == 0 and not ns.quiet:
            print(f"# {plan.describe()}", flush=True)
    opt = make_optimizer(ns.optimizer, ns.lr, ns.momentum)
    saver = _Checkpoints(ns, ddp, opt, task.size) if ns.checkpoint else None
    start = saver.resume() if saver else 0
    steps = _Steps(start)
    show = _Progress(ns, ddp.t, start)

    def on_step(s: int, loss: float) -> None:
        steps.done = s + 1
        steps.first = steps.first or time.perf_counter()
        show(s, loss)
        if saver:
            saver.after(s)

    ddp.t.barrier()
    t0 = time.perf_counter()
    try:
        while True:
            try:
                train_dp(task, ns.steps - steps.done, ns.batch, algorithm=ns.algorithm, start=steps.done, ddp=ddp,
                         opt=opt, on_step=on_step, **kw)
                ddp.t.barrier()
                break
            except RankFailure:
                if ns.on_failure != "shrink":
                    raise
                ddp = _go_on(ns, ddp, opt, steps, show)
                if saver:
                    saver.rebind(ddp)
    finally:
        show.stop()
    elapsed = time.perf_counter() - t0
    if saver:
        saver.close()
    return ddp, _Timing(elapsed, steps.first - t0 if steps.first else elapsed), ns.steps - start


@dataclass(frozen=True)
class _Timing:
    """The training loop's seconds (`elapsed`), and of them its first step's (`first`: the
    first calls of every bucket set their requests, pools and greenlets up)."""
    elapsed: float
    first: float

    def steady(self, steps: int) -> float:
        """Seconds a step after the first, as T1 is timed after a step to warm up."""
        return (self.elapsed - self.first) / (steps - 1) if steps > 1 else self.elapsed


def _compare(ns, t, task, kw, ddp) -> None:
    """Distances to single-process whole-batch training and to MPI_Allreduce averaging."""
    ref = train_single(task, ns.steps, ns.batch, **kw)[0].params if t.rank == 0 else None
    mpi_ddp, _, _ = train_dp(task, ns.steps, ns.batch, algorithm="mpi", **kw)
    if t.rank == 0:
        print(f"# max |param - single-process whole-batch| = {max_diff(ddp.params, ref):.3g}")
        print(f"# max |param - MPI_Allreduce-averaged run|  = {max_diff(ddp.params, mpi_ddp.params):.3g}")


def _speedup(ns, t, task, kw, ddp, timing: "_Timing", ran: int) -> None:
    """Measured speedup next to the model's T1/p + T_comm. T1: a whole training step (batch
    gathering, forward, backward, update) on the global batch in one process, timed on
    rank 0 while the others wait, after one step to warm up; the measured step likewise:
    the loop's steps after its first."""
    t1 = None
    if t.rank == 0:
        train_single(task, 1, ns.batch, **kw)  # warm-up
        a = time.perf_counter()
        train_single(task, 3, ns.batch, **kw)
        t1 = (time.perf_counter() - a) / 3
    t1 = t.bcast_obj(t1, 0)
    grad_bytes = sum(v.nbytes for v in ddp.params.values())
    prof = profile_of(t)
    model = dp_step(t1, t.size, grad_bytes, prof) if t.size > 1 else None
    if t.rank == 0:
        step = timing.steady(ran)
        print(f"# speedup: T1 = {t1 * 1e3:.2f} ms per global batch on one process; measured step "
              f"{step * 1e3:.2f} ms (the first, setting up, {timing.first * 1e3:.0f} ms) -> {t1 / step:.2f}x; "
              f"model T1/p + T_comm = "
              f"{(model.step if model else t1) * 1e3:.2f} ms -> {(model.speedup if model else 1):.2f}x "
              f"(gradients {grad_bytes / 1e6:.2f} MB, profile '{prof.name}')")


def _overlap_report(ns, t, task, kw, trained: bool, cap: float) -> None:
    """What overlap hides (`time_overlap`), on fresh replicas of the model (buckets of `cap` MB)."""
    med = time_overlap(task, ns.batch, kw["seed"], lambda o: _replica(ns, task.make_model(), None, o, cap),
                       lambda: make_optimizer(ns.optimizer, ns.lr, ns.momentum))
    if t.rank == 0:
        print(f"# overlap: computation {med['compute'] * 1e3:.1f} ms, communication {med['communication'] * 1e3:.1f} "
              f"ms alone; step {med['overlapped'] * 1e3:.1f} ms overlapped, {med['blocking'] * 1e3:.1f} ms blocking: "
              f"hidden {med['hidden']:.0%} (hook {ns.hook}, {cap:g} MB buckets; this run trained "
              f"{'overlapped' if trained else 'blocking'})",
              flush=True)


def _run(ns) -> int:
    if ns.staleness:
        return _staleness()
    if ns.framework == "torch":
        return _run_torch(ns)
    t = group()
    dtype = np.dtype(ns.dtype)
    try:
        task = make_task(ns.model, dtype, ns.seed, tuple(ns.sizes), ns.samples, ns.device)
        task.make_model()   # cupy present (device cuda)? before any rank trains
    except ImportError as e:
        raise RingmpiUsageError(f"--device {ns.device}: {e}") from None
    kw = dict(optimizer=ns.optimizer, lr=ns.lr, momentum=ns.momentum, seed=ns.seed)
    if ns.on_failure == "shrink":
        if not fault_tolerant():
            raise RingmpiUsageError(f"ringmpi train (rank {t.rank}): --on-failure shrink needs ULFM on; launch "
                                    "with python -m ringmpi.launch --fault-tolerant (Open MPI 5)")
        if ns.algorithm in _WAIT_ON_SHARED_MEMORY:
            raise RingmpiUsageError(f"ringmpi train (rank {t.rank}): --on-failure shrink needs an all-reduce that "
                                    f"waits in MPI, not {ns.algorithm} (one of {', '.join(_WAIT_ON_SHARED_MEMORY)}, "
                                    "which wait on shared memory or may): use ring, tree, rabenseifner, ...")
    if t.rank == 0 and not ns.quiet:
        print(f"# ringmpi train: {ns.model}, {t.size} ranks, global batch {ns.batch}, {ns.steps} steps, "
              f"{dtype.name} on {ns.device}, all-reduce algorithm {ns.algorithm}")
    ddp, timing, ran = _train(ns, task, kw)
    elapsed = timing.elapsed
    t = ddp.t   # the survivors' after a shrink
    digests = t.allgather_obj(params_digest(ddp.params))
    same = len(set(digests)) == 1
    if t.rank == 0:
        print(f"# replicas bitwise identical on all {t.size} ranks: {'yes' if same else 'NO'}")
        if ran:
            print(f"# {elapsed / ran * 1e3:.2f} ms per step, {ns.batch * ran / elapsed:.1f} samples/s "
                  f"({'buckets all-reduced during backward' if ddp.overlap else 'all-reduced after backward'})")
    if ns.compare:
        _compare(ns, t, task, kw, ddp)
    if ns.speedup and ran:
        _speedup(ns, t, task, kw, ddp, timing, ran)
        if t.size > 1:
            _overlap_report(ns, t, task, kw, ddp.overlap, ddp.bucket_cap_mb)
    if t.rank == 0:   # the last line: runs (an interrupted one and its resumption) compare by it
        print(f"params sha256 {digests[0]}", flush=True)
    return 0 if same else 1


def _run_torch(ns) -> int:
    """HW5 on torch (`ringmpi.torch.trainer`): an MLP on the host, SGD or Adam."""
    for flag, value, default in (("--model", ns.model, "mlp"), ("--device", ns.device, "cpu"),
                                 ("--checkpoint", ns.checkpoint, ""), ("--on-failure", ns.on_failure, "abort")):
        if value != default:
            raise RingmpiUsageError(f"--framework torch: {flag} {value} is not offered (only {default})")
    if ns.speedup:
        raise RingmpiUsageError("--framework torch: --speedup is not offered (benchmarks/torch_gloo.py times DDP)")
    try:
        from ..torch.trainer import run
    except ImportError as e:
        raise RingmpiUsageError(f"--framework torch: {e}") from None
    t = group()
    if t.rank == 0 and not ns.quiet:
        print(f"# ringmpi train --framework torch: mlp {ns.sizes}, {t.size} ranks, global batch {ns.batch}, "
              f"{ns.steps} steps, {ns.dtype}, HW5's average_gradients on ringmpi ({ns.algorithm})")
    show = _Progress(ns, t)
    try:
        return run(ns, t, show)
    finally:
        show.stop()


def add_parser(sub, name: str = "train", text: str = "") -> None:
    a = sub.add_parser(name, help=text, description=__doc__.split("\n\n")[0],
                       epilog="example: python -m ringmpi.launch -n 4 -- .venv/bin/ringmpi train --steps 20 --compare",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a.add_argument("--framework", choices=["numpy", "torch"], default="numpy",
                   help="numpy (ringmpi's own models) or torch (HW5's functions on torch modules, ringmpi.torch)")
    a.add_argument("--model", choices=["mlp", "rnn"], default="mlp", help="an MLP classifier or a character RNN")
    a.add_argument("--sizes", type=args.int_list, default="16,32,32,4", help="MLP layer sizes")
    a.add_argument("--samples", type=args.positive(int), default=512, help="data set size")
    a.add_argument("--steps", type=args.positive(int), default=20, help="training steps")
    a.add_argument("--batch", type=args.positive(int), default=64, help="global batch (split over the ranks)")
    a.add_argument("--dtype", choices=["float32", "float64"], default="float64", help="parameter type")
    a.add_argument("--device", choices=list(DEVICES), default="cpu",
                   help="where parameters and gradients live (cuda: cupy arrays, all-reduced on the GPU)")
    a.add_argument("--algorithm", choices=algorithms("allreduce") + ["auto"], default="ring",
                   help="all-reduce algorithm for the gradients")
    a.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="optimizer")
    a.add_argument("--lr", type=args.positive(float), default=0.1, help="learning rate")
    a.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    a.add_argument("--seed", type=int, default=0, help="seed of data, initial parameters and shuffling")
    a.add_argument("--compare", action="store_true", help="also run single-process and MPI_Allreduce training")
    a.add_argument("--speedup", action="store_true",
                   help="measured speedup next to the model's prediction, and what overlap hides")
    a.add_argument("--hook", choices=list(HOOKS), default="allreduce",
                   help="how each gradient bucket is all-reduced: as it is, cast to fp16 or bf16 for the wire, or "
                        "PowerSGD's rank-4 factors with error feedback (ringmpi.dp.hooks)")
    a.add_argument("--quiet", action="store_true", help="no per-step lines")
    a.add_argument("--bucket-cap", type=_bucket_cap, default="auto", metavar="MB|auto",
                   help="gradient bucket size in MB, or auto (default): when overlapped, predicted from the "
                        "backward's measured timeline and the all-reduce's measured cost, then the caps timed as "
                        "steps (reported); blocking, DDP's 25")
    a.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="all-reduce each gradient bucket as a request during backward, as it is ready (default: "
                        "where that can hide anything: ranks on several hosts, or a core to spare per rank)")
    a.add_argument("--staleness", action="store_true", help="the asynchronous SGD staleness table (no MPI)")
    a.add_argument("--checkpoint", metavar="DIR", default="",
                   help="resume from the newest complete checkpoint in DIR and write checkpoints there "
                        "(atomically, with a digest; rank 0 writes, on a thread)")
    a.add_argument("--checkpoint-every", type=args.positive(int), default=10, metavar="N",
                   help="steps between checkpoints (and one at the end)")
    a.add_argument("--checkpoint-keep", type=args.positive(int), default=2, metavar="K",
                   help="checkpoints kept in DIR (the newest K)")
    a.add_argument("--on-failure", choices=["abort", "shrink"], default="abort",
                   help="a lost rank: end the job (restart it with ringmpi.launch --restarts), or go on with "
                        "the survivors (needs ringmpi.launch --fault-tolerant: Open MPI 5's ULFM)")
    a.set_defaults(func=_run)
