"""Overlapped training and communication hooks, side by side in one launch.

    sudo RATE=1gbit RUN_CMD="$PWD/.venv/bin/python benchmarks/hooks.py" bash benchmarks/multihost.sh 2
    python -m ringmpi.launch -n 2 -- .venv/bin/python benchmarks/hooks.py --steps 20   # one host

For every hook (`ringmpi.dp.hooks`): computation per step, communication per step timed
alone, the step overlapped and blocking (interleaved medians, `dp.train.time_overlap`),
the share hidden, the speedup over one process, and the loss after --steps of overlapped
training next to plain float32 all-reduce's: the last step's, and the mean of the last
tenth of the steps (one step's loss on a noisy task swings by 10% from step to step, and
two trainings whose gradients differ in their last bits soon take different swings). The issue's model by default: MLP
512-2048-1024-10, float32 (3.2 M parameters, 12.6 MB of gradients), global batch 2048.

The data, by default: clusters that overlap (`--separation 0.1`), and a fresh sample at
every step (steps x batch of them, each seen once), so the loss after --steps is what the
model has learned of the task, as in training on more data than one pass covers. On a set
that is seen again and again the loss measures how much of the set is memorised instead:
this model learns the default clusters to a loss below 1e-5, and with `--samples 32768
--label-noise 0.2 --separation 1.5` (the earlier default) float32 training memorises random
labels that a rank-4 PowerSGD cannot follow (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from ringmpi.api import group
from ringmpi.dp.ddp import DataParallel
from ringmpi.dp.hooks import HOOKS, PowerSGD, named
from ringmpi.settings import reload
from ringmpi.dp.train import local_batch, make_optimizer, make_task, params_digest, time_overlap, train_dp, train_single


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="512,2048,1024,10")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=0, help="data set size (default: steps x batch, each sample "
                    "seen once)")
    ap.add_argument("--separation", type=float, default=0.1, help="distance of the class clusters (1.5: separable)")
    ap.add_argument("--label-noise", type=float, default=0.0, help="share of labels drawn at random")
    ap.add_argument("--steps", type=int, default=200, help="training steps per hook (loss after them)")
    ap.add_argument("--rounds", type=int, default=5, help="timed steps per mode (medians)")
    ap.add_argument("--hooks", default=",".join(HOOKS) + ",fp16/16,bf16/16",
                    help="hooks; NAME/16: with 16-bit hops (RINGMPI_PARTIALS=16, half of float32's bytes)")
    ap.add_argument("--algorithm", default="ring")
    ap.add_argument("--bucket-cap", default="auto", help="MB, or auto (DataParallel.tune_buckets)")
    o = ap.parse_args()
    t = group()
    seed, lr, momentum = 0, 0.1, 0.9
    o.samples = o.samples or o.steps * o.batch
    task = make_task("mlp", np.float32, seed, tuple(int(s) for s in o.sizes.split(",")), o.samples,
                     label_noise=o.label_noise, separation=o.separation)
    t1 = None
    if t.rank == 0:   # one process on the global batch: the speedup's numerator
        train_single(task, 1, o.batch, lr=lr, momentum=momentum, seed=seed)
        a = time.perf_counter()
        train_single(task, 3, o.batch, lr=lr, momentum=momentum, seed=seed)
        t1 = (time.perf_counter() - a) / 3
    t1 = t.bcast_obj(t1, 0)
    caps: dict[str, float] = {}
    rows = {}
    for name in o.hooks.split(","):
        hook, _, bits = name.partition("/")
        reload({**os.environ, "RINGMPI_PARTIALS": bits or os.environ.get("RINGMPI_PARTIALS", "32")})
        def replica(overlap, hook=hook, timed=True, cap=None):
            fn, state = named(hook)
            if timed and isinstance(state, PowerSGD):
                state.start = 0      # (timed as it compresses, not in the steps it sends whole)
            return DataParallel(task.make_model(), None, algorithm=o.algorithm, overlap=overlap,
                                bucket_cap_mb=cap or caps[name], comm_hook=fn, hook_state=state)
        if o.bucket_cap == "auto":   # each hook's own cap: what it does to a bucket weighs in
            plan = replica(True, cap=25.0).tune_buckets(task.take(task.data, local_batch(task, 0, o.batch, seed,
                                                                                         t.size, t.rank)))
            caps[name] = plan.cap_mb
            if t.rank == 0:
                print(f"# {name}: {plan.describe()}", flush=True)
        else:
            caps[name] = float(o.bucket_cap)
        med = time_overlap(task, o.batch, seed, replica, lambda: make_optimizer("sgd", lr, momentum), o.rounds)
        ddp = replica(None, timed=False)
        ddp, _, losses = train_dp(task, o.steps, o.batch, ddp=ddp, lr=lr, momentum=momentum, seed=seed)
        same = len(set(t.allgather_obj(params_digest(ddp.params)))) == 1
        tail = losses[-max(1, len(losses) // 10):]
        rows[name] = dict(med, loss=losses[-1], mean=float(np.mean(tail)), same=same, overlap=ddp.overlap)
    if t.rank == 0:
        base = rows.get("allreduce")
        print(f"# {t.size} ranks on {len(set(t.nodes))} hosts, MLP {o.sizes} float32, {o.samples} samples "
              f"(separation {o.separation:g}, {o.label_noise:.0%} of the labels random), global batch {o.batch}, "
              f"all-reduce {o.algorithm}; one process: {t1 * 1e3:.1f} ms a step; medians of "
              f"{o.rounds}")
        print(f"{'hook':<10} {'buckets':>8} {'compute':>9} {'comm':>9} {'overlap':>9} {'blocking':>9} {'hidden':>7}"
              f" {'speedup':>8} {'comm/f32':>9} {'loss@' + str(o.steps):>11} {'vs f32':>8} {'mean last':>10} {'vs f32':>8}  replicas")
        for name, r in rows.items():
            ratio = r["communication"] / base["communication"] if base else float("nan")
            dloss = (r["loss"] - base["loss"]) / base["loss"] if base and base["loss"] else float("nan")
            dmean = (r["mean"] - base["mean"]) / base["mean"] if base and base["mean"] else float("nan")
            print(f"{name:<10} {caps[name]:>6g}MB {r['compute'] * 1e3:>7.1f}ms {r['communication'] * 1e3:>7.1f}ms "
                  f"{r['overlapped'] * 1e3:>7.1f}ms {r['blocking'] * 1e3:>7.1f}ms {r['hidden']:>7.0%} "
                  f"{t1 / r['overlapped']:>7.2f}x {ratio:>9.3f} {r['loss']:>11.3e} {dloss:>+8.2%} {r['mean']:>10.3e} "
                  f"{dmean:>+8.2%}  "
                  f"{'identical' if r['same'] else 'DIFFER'}{'' if r['overlap'] else ' (trained blocking)'}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
