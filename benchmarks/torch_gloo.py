"""ringmpi against gloo on torch tensors, side by side in one run: collectives, then DDP steps.

    python -m ringmpi.launch -n 2 -- .venv-torch/bin/python benchmarks/torch_gloo.py [--max 64M] [--rounds 5]

Collectives (float32, in place where the call is): for each size and call, every round
times a loop of gloo's `torch.distributed` call, the same call on the "ringmpi" backend
(`dist.new_group(backend="ringmpi")`), `ringmpi.torch`'s call (algorithm auto) and, for
all-reduce, MPI_Allreduce through plain mpi4py on the tensor's memory, in a shuffled order
(the same on every rank); a loop's time per call is the slowest rank's. Printed per size:
medians, and the median over rounds of each one's time / gloo's.

DDP (`--ddp`, on by default): an MLP (`--sizes`, default the issue's 512-2048-1024-10),
`--batch` samples per rank, one thread per rank, SGD; steps of DistributedDataParallel on
gloo (its default all-reduce), on gloo with `ringmpi.torch.allreduce_hook`, and on the
ringmpi backend, in interleaved blocks; and the step's computation alone (the same model
without DDP) and the gradients' all-reduce alone (by gloo and by ringmpi, every bucket of
DDP's size, one after the other), for the share of communication each hides:
(compute + comm - step) / comm. Every call and step runs `--warmup` times first: auto
tunes online during its first calls of a size, and a training loop's steady state is after.
On two namespace hosts: `PY=$PWD/.venv-torch/bin/python RATE=1gbit RUN_CMD="$PWD/.venv-torch/bin/python
benchmarks/torch_gloo.py --no-collectives --batch 1024" bash benchmarks/multihost.sh 2`.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

import ringmpi.torch as rt
from ringmpi.units import human_bytes, parse_size


def timed(fn, reps: int, comm) -> float:
    for _ in range(min(reps, 5)):
        fn()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX)


def compare(title: str, calls: dict, rounds: int, reps: int, comm, order: random.Random, warm: int = 0) -> tuple:
    """Each call `warm` times first (auto's online tuning explores for its first calls of a
    size: the steady state of a training loop is after it), then `rounds` shuffled rounds."""
    for fn in calls.values():
        for _ in range(warm):
            fn()
    runs: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        names = list(calls)
        order.shuffle(names)
        for k in names:
            runs[k].append(timed(calls[k], reps, comm))
    ratios = {k: statistics.median(a / b for a, b in zip(runs[k], runs["gloo"])) for k in calls}
    medians = {k: statistics.median(v) for k, v in runs.items()}
    if comm.rank == 0:
        cells = "  ".join(f"{k} {medians[k] * 1e6:9.1f} us ({ratios[k]:.3f}x)" for k in runs)
        print(f"{title:22s} {cells}", flush=True)
    return ratios, medians


def collectives(ns, comm, ring_pg, order) -> None:
    p, r = comm.Get_size(), comm.Get_rank()
    top = parse_size(ns.max)
    sizes = []
    n = 8
    while n <= top:
        sizes.append(n)
        n *= 8 if n < 65536 else 4
    summary: dict[str, list[tuple[int, float]]] = {}
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        reps = max(3, min(ns.calls, ns.calls * 65536 // max(nbytes, 65536)))
        x = torch.rand(count)
        out = torch.empty(count * p)
        piece = torch.empty(max(count // p, 1))
        big = torch.rand(piece.numel() * p)
        xa = x.numpy()
        sets = {
            "all_reduce": {
                "gloo": lambda: dist.all_reduce(x),
                "ringmpi backend": lambda: dist.all_reduce(x, group=ring_pg),
                "ringmpi.torch": lambda: rt.allreduce(x, x),
                "MPI_Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, xa),
            },
            "broadcast": {
                "gloo": lambda: dist.broadcast(x, 0),
                "ringmpi backend": lambda: dist.broadcast(x, 0, group=ring_pg),
                "ringmpi.torch": lambda: rt.broadcast(x, 0),
            },
            "all_gather": {
                "gloo": lambda: dist.all_gather_into_tensor(out, x),
                "ringmpi backend": lambda: dist.all_gather_into_tensor(out, x, group=ring_pg),
                "ringmpi.torch": lambda: rt.allgather(x, out),
            },
            "reduce_scatter": {
                "gloo": lambda: dist.reduce_scatter_tensor(piece, big),
                "ringmpi backend": lambda: dist.reduce_scatter_tensor(piece, big, group=ring_pg),
                "ringmpi.torch": lambda: rt.reduce_scatter(big, piece),
            },
        }
        for name, calls in sets.items():
            ratios, _ = compare(f"{name} {human_bytes(nbytes)}", calls, ns.rounds, reps, comm, order,
                                max(reps, ns.warmup))
            summary.setdefault(name, []).append((nbytes, ratios["ringmpi.torch"]))
    if r == 0:
        print("# ringmpi.torch / gloo, median over rounds:", flush=True)
        for name, pairs in summary.items():
            small = [v for n, v in pairs if n < 65536]
            large = [v for n, v in pairs if n >= 1 << 20]
            print(f"#   {name:15s} below 64 KiB: max {max(small):.4f}x (1/{1 / max(small):.0f});"
                  + (f" from 1 MiB: max {max(large):.3f}x (1/{1 / max(large):.1f})" if large else ""), flush=True)


def mlp(sizes: list[int], seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def ddp_steps(ns, comm, ring_pg, order) -> None:
    sizes = [int(s) for s in ns.sizes.split(",")]
    r = comm.Get_rank()
    gen = torch.Generator().manual_seed(100 + r)
    xs = torch.randn(ns.batch, sizes[0], generator=gen)
    ys = torch.randint(0, sizes[-1], (ns.batch,), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()

    def stepper(model: torch.nn.Module):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xs), ys).backward()
            opt.step()
        return step

    alone = mlp(sizes, 0)
    cap = ns.bucket_cap_mb
    gloo = torch.nn.parallel.DistributedDataParallel(mlp(sizes, 0), bucket_cap_mb=cap)
    hooked = torch.nn.parallel.DistributedDataParallel(mlp(sizes, 0), bucket_cap_mb=cap)
    hooked.register_comm_hook(rt.HookState(), rt.allreduce_hook)
    ring = torch.nn.parallel.DistributedDataParallel(mlp(sizes, 0), process_group=ring_pg, bucket_cap_mb=cap)
    grads = [p.detach().clone().reshape(-1) for p in alone.parameters()]
    # the all-reduce alone: DDP's buckets (the cap; 1 MB first), one flat buffer per bucket,
    # one after the other, by each library
    buckets, cur, size = [], [], 0
    for g in reversed(grads):
        if cur and size + g.nbytes > (1e6 if not buckets else cap * 2 ** 20):
            buckets.append(torch.cat(cur))
            cur, size = [], 0
        cur.append(g)
        size += g.nbytes
    buckets.append(torch.cat(cur))

    def ringmpi_alone() -> None:
        for b in buckets:
            rt.allreduce(b, b, op="avg")

    def gloo_alone() -> None:
        for b in buckets:
            dist.all_reduce(b)
    calls = {"gloo": stepper(gloo), "gloo + ringmpi hook": stepper(hooked), "ringmpi backend": stepper(ring),
             "compute alone": stepper(alone), "gloo all-reduce alone": gloo_alone,
             "ringmpi all-reduce alone": ringmpi_alone}
    nparams = sum(p.numel() for p in alone.parameters())
    if r == 0:
        print(f"# DDP steps: MLP {ns.sizes} ({nparams / 1e6:.2f} M parameters, {nparams * 4 / 1e6:.1f} MB of "
              f"gradients, buckets of {cap:g} MB: {len(buckets)}), batch {ns.batch} per rank, "
              f"{torch.get_num_threads()} thread(s), {ns.warmup} steps of warm-up", flush=True)
    ratios, med = compare("DDP step", calls, ns.rounds, ns.steps, comm, order, ns.warmup)
    if r == 0:
        c = med["compute alone"]
        for k, alone_k in (("gloo", "gloo all-reduce alone"), ("gloo + ringmpi hook", "ringmpi all-reduce alone"),
                           ("ringmpi backend", "ringmpi all-reduce alone")):
            m = med[alone_k]
            print(f"# {k:20s} {med[k] * 1e3:8.2f} ms per step, {ratios[k]:.3f}x gloo's, hidden "
                  f"{(c + m - med[k]) / m * 100:.0f}% of its all-reduce alone ({m * 1e3:.2f} ms)", flush=True)
        print(f"# computation alone {c * 1e3:.2f} ms; overlap (ringmpi.torch.overlaps) "
              f"{'on' if rt.overlaps() else 'off'} here", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", default="64M", help="largest message of the collectives")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200, help="calls per timed loop (fewer for large messages)")
    ap.add_argument("--steps", type=int, default=10, help="DDP steps per timed block")
    ap.add_argument("--sizes", default="512,2048,1024,10")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket cap")
    ap.add_argument("--warmup", type=int, default=40, help="calls (steps) of each kind before the timed rounds")
    ap.add_argument("--no-collectives", dest="collectives", action="store_false")
    ap.add_argument("--no-ddp", dest="ddp", action="store_false")
    ns = ap.parse_args()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rt.init_process_group("gloo")
    rt.distributed.register()
    ring_pg = dist.new_group(backend="ringmpi")
    order = random.Random(3)
    if comm.rank == 0:
        print(f"# ringmpi.torch against gloo, {comm.size} ranks, torch {torch.__version__}, "
              f"{MPI.Get_library_version().splitlines()[0]}", flush=True)
    if ns.collectives:
        collectives(ns, comm, ring_pg, order)
    if ns.ddp:
        ddp_steps(ns, comm, ring_pg, order)
    rt.destroy_process_group()


if __name__ == "__main__":
    main()
