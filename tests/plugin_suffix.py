"""A collective from outside the package, by its spec and its schedule alone (what a
plug-in writes): the suffix scan, rank r gets x_r op x_{r+1} op ... op x_{p-1} (no MPI
function has it, so MPI's own cannot run it). `installed()` adds it for a test and takes
it away after."""
from __future__ import annotations

import contextlib
from typing import Iterator

from ringmpi import collectives, schedules, specs
from ringmpi.api import forget_plans
from ringmpi.cost import Cost

NAME = "suffix_scan"


class SuffixScan(specs.Allreduce):
    """The suffix scan: rank r gets x_r op ... op x_{p-1}. Arguments as `allreduce`'s."""
    name, busbw, simulated_mpi, taught = NAME, "1", "linear", "linear"
    mpi_methods = ()

    def busbw_factor(self, p):
        return 1.0

    def divisor(self, p, rank):
        return p - rank

    def expected(self, xs, rank, op=None, root=0):
        return specs.fold(op, xs[rank:])


def _cost(p, count, itemsize, **_):
    n = count * itemsize
    return Cost(alphas=p - 1, beta_bytes=(p - 1) * n, gamma_bytes=(p - 1) * n, rounds=p - 1,
                busiest_sent=n, avg_sent=(p - 1) * n / p)


def suffix_linear(t, call):
    """The chain from the top: rank r waits for rank r+1's suffix and folds its own in front."""
    p, r = t.size, t.rank
    if r == p - 1:
        if not call.inplace:
            t.copy(call.send, call.recv)
    else:
        suffix = t.empty(call.count, call.dtype)
        t.sendrecv(None, None, suffix, r + 1)
        t.combine(call.op, call.send, suffix, call.recv)
    if r > 0:
        t.sendrecv(call.recv, r - 1, None, None)


@contextlib.contextmanager
def installed() -> Iterator[SuffixScan]:
    """The plug-in added (`specs.add`, `schedules.register`) for the block, then removed:
    its spec, its algorithm, its calls and the plans kept for it."""
    schedules.collectives()   # (the package's own algorithms registered first)
    spec = specs.add(SuffixScan())
    schedules.register(NAME, "linear", _cost, ordered=True)(suffix_linear)
    try:
        yield spec
    finally:
        del specs.SPECS[NAME]
        for algorithm in ("linear", schedules.MPI_ALGORITHM):
            schedules._REGISTRY.pop((NAME, algorithm), None)
        for name in (NAME, f"i{NAME}", f"{NAME}_init"):
            vars(collectives).pop(name, None)
            if name in collectives.__all__:
                collectives.__all__.remove(name)
        forget_plans()
