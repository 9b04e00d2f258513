"""ringmpi's collectives on torch tensors, a `torch.distributed` backend, DDP hooks, HW5.

    import ringmpi.torch as rt
    rt.allreduce(t, t)                                  # in place, every rank gets the sum
    req = rt.iallreduce(g, g, op="avg"); ...; req.wait()
    rt.init_process_group()                             # backend "ringmpi", under mpirun
    model = torch.nn.parallel.DistributedDataParallel(model)

A CPU tensor is handed to ringmpi as the numpy array that shares its memory
(`Tensor.numpy()`: no copy), and results come back as tensors on that memory: the very
tensor given as the result buffer, or a view of it. A CUDA tensor goes to ringmpi's device
path as the cupy array on its memory (`__cuda_array_interface__`, cupy needed), reduced on
the device. bfloat16 tensors travel as ml_dtypes' bfloat16 arrays (float16 as numpy's):
which collectives accept them is ringmpi's rule for those dtypes, not this module's.

Arguments, algorithms and errors are those of `ringmpi.allreduce` and its siblings; the
nonblocking forms return a `TensorRequest` (`wait()`, `test()`, `get_future()`), which a
ringmpi request completes on ringmpi's progress thread, so that a `torch.futures.Future`
(what DDP's communication hooks return, what `Work.get_future()` gives) completes while
the caller computes, with no call into ringmpi.
"""
from __future__ import annotations

from . import tensors
from .tensors import *  # noqa: F401,F403  (the collectives on tensors, blocking and nonblocking: tensors.__all__)
from .distributed import HookState, allreduce_hook, destroy_process_group, init_process_group
from .hw5 import average_gradients, partition_indices, train_step
from . import distributed

__all__ = [*tensors.__all__, "distributed", "init_process_group", "destroy_process_group", "allreduce_hook", "HookState",
           "partition_indices", "average_gradients", "train_step"]
