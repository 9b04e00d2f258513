"""Data parallelism on ringmpi: partition the data, average the gradients, take a step.

`partition_indices` splits a data set without communication; `DataParallel` broadcasts the
parameters from rank 0, buckets the gradients (reverse parameter order, a byte cap as in
PyTorch DDP) into one ringmpi all-reduce each, weights by the global sample or token count
(SUM then divide), supports `no_sync()` gradient accumulation and parameters without a
gradient; `ParameterServer` is the synchronous alternative (pull = broadcast, push = reduce).
"""
from .ddp import DataParallel, partition_indices
from .models import MLP, CharRNN
from .optim import SGD, Adam

__all__ = ["DataParallel", "partition_indices", "MLP", "CharRNN", "SGD", "Adam"]
