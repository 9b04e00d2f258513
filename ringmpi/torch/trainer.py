"""`ringmpi train --framework torch`: the lecture's comparison on a torch MLP trained with
HW5's functions (`ringmpi.torch.hw5`): replicas bitwise identical, and the distance to
single-process whole-batch training (and, with --compare, to torch's own
DistributedDataParallel on gloo).

The model is the numpy trainer's MLP (tanh hidden layers, the same initial values) as
`torch.nn.Linear` layers. Each rank's loss is its samples' summed cross-entropy times
p / (global batch), so that HW5's average (SUM over ranks, then / p) is the gradient of the
global batch's mean loss even where the shards are uneven (64 samples over 3 ranks): the
mean of per-rank means would weight a sample of a smaller shard more (the lecture's pitfall).
"""
from __future__ import annotations

import copy
import hashlib
import time
from typing import Any

import numpy as np
import torch

from .. import collectives
from ..dp.train import global_batch, local_batch, make_task
from .hw5 import train_step

__all__ = ["torch_mlp", "run"]


def torch_mlp(params: dict, sizes: list[int]) -> torch.nn.Sequential:
    """The numpy MLP (`ringmpi.dp.models.MLP`: x @ W + b, tanh between) as torch layers."""
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w, bias = params[f"W{i}"], params[f"b{i}"]
        lin = torch.nn.Linear(a, b, dtype=torch.from_numpy(w).dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
            lin.bias.copy_(torch.from_numpy(bias))
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def _optimizer(name: str, model: torch.nn.Module, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    return torch.optim.Adam(model.parameters(), lr=lr)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _batch(task: Any, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = task.take(task.data, idx)
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.asarray(y, dtype=np.int64))


def _train(task: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, ns: Any, t: Any, show: Any) -> None:
    for s in range(ns.steps):
        idx = local_batch(task, s, ns.batch, ns.seed, t.size, t.rank)
        x, y = _batch(task, idx)
        scale = t.size / len(global_batch(task, s, ns.batch, ns.seed))

        def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(out, target, reduction="sum") * scale
        loss = train_step(model, opt, loss_fn, x, y, algorithm=ns.algorithm)
        total = collectives.allreduce(np.array([loss]), algorithm=ns.algorithm)[0] / t.size
        show(s, total)


def _single(task: Any, model: torch.nn.Module, ns: Any) -> None:
    """The reference: one process, the whole global batch each step, the batch's mean loss."""
    opt = _optimizer(ns.optimizer, model, ns.lr, ns.momentum)
    for s in range(ns.steps):
        x, y = _batch(task, global_batch(task, s, ns.batch, ns.seed))
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _gloo_ddp(task: Any, model: torch.nn.Module, ns: Any, t: Any) -> None:
    """torch's own DistributedDataParallel on gloo (rendezvous from the MPI job), the same
    shards and weighting: an independent reference for ringmpi's HW5 averaging."""
    from .distributed import destroy_process_group, init_process_group
    init_process_group("gloo")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = _optimizer(ns.optimizer, ddp, ns.lr, ns.momentum)
    for s in range(ns.steps):
        x, y = _batch(task, local_batch(task, s, ns.batch, ns.seed, t.size, t.rank))
        scale = t.size / len(global_batch(task, s, ns.batch, ns.seed))
        opt.zero_grad(set_to_none=True)
        (torch.nn.functional.cross_entropy(ddp(x), y, reduction="sum") * scale).backward()
        opt.step()
    del ddp, opt
    destroy_process_group()


def run(ns: Any, t: Any, show: Any) -> int:
    """Train, then report; returns the exit status (1 when replicas differ)."""
    dtype = np.dtype(ns.dtype)
    task = make_task("mlp", dtype, ns.seed, tuple(ns.sizes), ns.samples)
    start = torch_mlp(task.make_model().params, list(ns.sizes))
    model = copy.deepcopy(start)
    opt = _optimizer(ns.optimizer, model, ns.lr, ns.momentum)   # (its first use imports much of torch: untimed)
    t.barrier()
    t0 = time.perf_counter()
    _train(task, model, opt, ns, t, show)
    t.barrier()
    elapsed = time.perf_counter() - t0
    same = len(set(t.allgather_obj(digest(model)))) == 1
    if t.rank == 0:
        single = copy.deepcopy(start)
        _single(task, single, ns)
        print(f"# replicas bitwise identical on all {t.size} ranks: {'yes' if same else 'NO'}")
        print(f"# {elapsed / ns.steps * 1e3:.2f} ms per step, {ns.batch * ns.steps / elapsed:.1f} samples/s")
        print(f"# max |param - single-process whole-batch| = {max_diff(model, single):.3g} ({dtype.name})")
    if ns.compare:
        reference = copy.deepcopy(start)
        _gloo_ddp(task, reference, ns, t)
        if t.rank == 0:
            print(f"# max |param - torch DDP on gloo|           = {max_diff(model, reference):.3g}")
    return 0 if same else 1
