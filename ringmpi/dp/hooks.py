"""Communication hooks: how `DataParallel` all-reduces a bucket of gradients (DDP's
`register_comm_hook`). One small signature:

    hook(state, bucket: GradBucket) -> future      # future.wait() -> the bucket summed

`bucket.buffer` holds this rank's gradient sums, packed; the future's `wait()` returns an
array of its size holding them summed over the ranks (the buffer itself may be reused), and
`DataParallel` then divides by the global sample count. A hook starts its communication as
requests (`ringmpi.iallreduce`), so with overlap it runs while backward goes on.

- `allreduce_hook`: the default, a SUM of the buffer as it is.
- `fp16_hook`, `bf16_hook`: the buffer cast for the wire (fp16: pre-divided by the rank
  count, as DDP does, so a sum over ranks cannot overflow float16), all-reduced with float32
  accumulation (`ringmpi.ops`: 16-bit payloads, float32 partial sums by default,
  RINGMPI_PARTIALS=16 for 16-bit hops: half of float32's bytes), cast back.
- `powersgd_hook` (Vogels, Karimireddy and Jaggi, NeurIPS 2019): each matrix gradient M
  (plus its error feedback) is sent as two rank-r factors: P = M Q all-reduced and
  orthonormalised, then Q = M^T P all-reduced; the sum is approximated by P Q^T. Each rank
  keeps what its own projection missed, M - P P^T M, and adds it to the next step's
  gradient (error feedback); Q starts from the last step's (warm start), the same seeded
  random matrix on every rank at first. Vectors (biases) travel uncompressed with P. Each
  bucket is all-reduced whole for its first `PowerSGD.start` steps (torch's
  `start_powerSGD_iter`): compressed from the first step, training diverged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import ml_dtypes
import numpy as np

from .. import collectives as api
from ..api import group
from ..ops import convert
from .arrays import views_of

__all__ = ["GradBucket", "Then", "allreduce_hook", "fp16_hook", "bf16_hook", "PowerSGD", "powersgd_hook", "HOOKS", "named"]


@dataclass(eq=False)
class GradBucket:
    """What a hook gets: the bucket's position (`index`, the same on every rank), this
    rank's packed gradient sums (`buffer`), its parameters' names and shapes in the
    buffer's order ("W0", or "W0[0:256]" for rows of a parameter cut into pieces: a hook
    with `whole_parameters = True` gets none cut), and where and how to communicate."""
    index: int
    buffer: Any
    names: list[str]
    shapes: list[tuple[int, ...]]
    comm: Any = None
    algorithm: str = "auto"

    def iallreduce(self, x: Any) -> Any:
        """x summed over the ranks, in place, as a request."""
        return api.iallreduce(x, x, comm=self.comm, algorithm=self.algorithm)


class Then:
    """A future: `wait()` waits for `request` and returns `fn` of its result."""
    __slots__ = ("request", "fn")

    def __init__(self, request: Any, fn: Callable[[Any], Any]) -> None:
        self.request, self.fn = request, fn

    def wait(self) -> Any:
        return self.fn(self.request.wait())


def allreduce_hook(state: Any, bucket: GradBucket) -> Any:
    """The default: the buffer summed as it is."""
    return bucket.iallreduce(bucket.buffer)


def _cast_hook(dtype: Any, predivide: bool) -> Callable[[Any, GradBucket], Any]:
    """The buffer cast to `dtype` for the wire and back. `predivide`: scaled by 1/ranks
    first (and by ranks after), so that a sum over the ranks cannot overflow float16's
    range; bfloat16 has float32's exponents and skips both passes over the buffer (as
    torch's bf16 hook does). The scaling is done in the buffer's own dtype, and only then
    converted (`ops.convert`): numpy's float16 arithmetic is emulated element by element,
    and its conversion flags every value below float16's normal range one at a time
    (benchmarks/README.md); the product is the same float32 product either way before it
    is rounded."""
    def hook(state: dict, bucket: GradBucket) -> Any:
        p = group(bucket.comm).size if predivide else 1
        low = state.get(bucket.index)
        if low is None or low.size != bucket.buffer.size:
            low = state[bucket.index] = np.empty(bucket.buffer.size, dtype)   # kept: one per bucket
        if p > 1:
            np.multiply(bucket.buffer, 1.0 / p, out=bucket.buffer)   # (the buffer is the result's anyway)
        convert(bucket.buffer, low)

        def back(summed: Any) -> Any:
            convert(summed, bucket.buffer)
            if p > 1:
                bucket.buffer *= p
            return bucket.buffer
        return Then(bucket.iallreduce(low), back)
    return hook


fp16_hook = _cast_hook(np.float16, predivide=True)
fp16_hook.__doc__ = "The bucket in float16 on the wire, reduced with float32 accumulation."
bf16_hook = _cast_hook(ml_dtypes.bfloat16, predivide=False)
bf16_hook.__doc__ = "The bucket in bfloat16 on the wire, reduced with float32 accumulation."


@dataclass(eq=False)
class PowerSGD:
    """PowerSGD's state: the rank r of the factors, each matrix's warm-started Q and error
    feedback (by parameter name), the seed of the first Q (the same on every rank), and
    `start`: how many steps each bucket is all-reduced whole before it is compressed (torch's
    `start_powerSGD_iter`): compressed from the first step, error feedback fed the early,
    large and fast-turning gradients back step after step, and the issue's MLP on noisy
    labels diverged; whole for its first 20 steps it trained (benchmarks/README.md)."""
    rank: int = 4
    seed: int = 0
    start: int = 20
    q: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict[str, np.ndarray] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)   # bucket index -> calls so far


def _orthonormalise(p: np.ndarray) -> np.ndarray:
    """Orthonormal columns spanning p's (Gram-Schmidt as QR; the same bits on every rank,
    which all hold the same summed p)."""
    q, r = np.linalg.qr(p)
    q[:, np.diag(r) < 0] *= -1   # a sign convention: unique (in place: q stays in p's dtype, and so
    return q                     # do the products with it; a float64 P made each a float64 copy of M)


BLOCK = 1 << 19   # bytes of rows of M worked on at a time (see `powersgd_hook`)


def _rows(m: np.ndarray) -> list[slice]:
    """M's rows in blocks of about BLOCK bytes."""
    step = max(1, BLOCK // max(1, m.shape[1] * m.itemsize))
    return [slice(lo, lo + step) for lo in range(0, m.shape[0], step)]


def _laid_out(shapes: list[tuple[int, ...]], dtype: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """A new flat array for one all-reduce, and its views with these shapes."""
    flat = np.empty(sum(int(np.prod(s)) for s in shapes), dtype)
    return flat, views_of(flat, shapes)


def powersgd_hook(state: PowerSGD, bucket: GradBucket) -> Any:
    """Rank-r factors of every matrix instead of the matrix (see the module docstring).
    Each matrix is worked on in its place in the bucket's buffer, which the result
    overwrites anyway, a block of rows at a time where a block is read twice: the error fed
    back into a block, then that block's rows of P = M Q; later (`_Compressing.rebuild`)
    each block's error M - P Q^T written, then the block rebuilt from the summed Q, while
    the block is in cache (a third less memory traffic than whole-matrix passes). P and Q
    are computed into the arrays that travel."""
    done = state.steps[bucket.index] = state.steps.get(bucket.index, 0) + 1
    if done <= state.start:
        return bucket.iallreduce(bucket.buffer)
    views = dict(zip(bucket.names, views_of(bucket.buffer, bucket.shapes)))
    mats = {k: v for k, v in views.items() if v.ndim == 2 and state.rank < min(v.shape)}
    job = _Compressing(state, bucket, mats, {k: v for k, v in views.items() if k not in mats})
    first, slots = _laid_out(job.first_shapes(), bucket.buffer.dtype)
    for (k, m), p in zip(mats.items(), slots):   # m: M, with last step's error fed back
        q, err = job.q0(k), state.error.get(k)
        for rows in _rows(m):
            if err is not None:
                m[rows] += err[rows]
            np.matmul(m[rows], q, out=p[rows])
    for v, slot in zip(job.vecs.values(), slots[len(mats):]):
        slot[...] = v
    return Then(bucket.iallreduce(first), job.rebuild)


# rank-r factors of each matrix: a matrix cut into pieces of rows would be compressed piece
# by piece (another approximation, more factors, more calls): `DataParallel` cuts none
powersgd_hook.whole_parameters = True  # type: ignore[attr-defined]


@dataclass(eq=False)
class _Compressing:
    """One bucket between its two all-reduces: its matrices (compressed) and vectors (sent
    as they are), views of the bucket's buffer."""
    state: PowerSGD
    bucket: GradBucket
    mats: dict[str, np.ndarray]
    vecs: dict[str, np.ndarray]

    def first_shapes(self) -> list[tuple[int, ...]]:
        """What the first all-reduce carries: every matrix's P, then the vectors."""
        return [(m.shape[0], self.state.rank) for m in self.mats.values()] + [v.shape for v in self.vecs.values()]

    def q0(self, name: str) -> np.ndarray:
        """The matrix's Q: last step's summed Q (warm start), or the same seeded random
        matrix on every rank."""
        q, m = self.state.q.get(name), self.mats[name]
        if q is None:
            rng = np.random.default_rng([self.state.seed, sum(map(ord, name))])
            q = self.state.q[name] = rng.standard_normal((m.shape[1], self.state.rank)).astype(m.dtype)
        return q

    def rebuild(self, summed: np.ndarray) -> np.ndarray:
        """P summed -> orthonormalised; the vectors summed; Q = M^T P all-reduced; each
        matrix's error kept and the matrix rebuilt as P Q^T, a block of rows at a time."""
        got = views_of(summed, self.first_shapes())
        ps = [_orthonormalise(p) for p in got[:len(self.mats)]]
        for v, s in zip(self.vecs.values(), got[len(self.mats):]):
            v[...] = s
        flat, qs = _laid_out([(m.shape[1], self.state.rank) for m in self.mats.values()], self.bucket.buffer.dtype)
        for m, p, q in zip(self.mats.values(), ps, qs):
            np.matmul(m.T, p, out=q)
        # this rank's Q^T, for its error (the sum overwrites flat); the Q^Ts of the products
        # P Q^T contiguous: BLAS took twice as long on a transposed view's rows
        mine = [np.ascontiguousarray(q.T) for q in qs]
        summed_q = self.bucket.iallreduce(flat).wait()
        if summed_q is not flat:
            flat[...] = summed_q
        for (k, m), p, q, own in zip(self.mats.items(), ps, qs, mine):
            qt = np.ascontiguousarray(q.T)
            err = self.state.error.get(k)
            if err is None or err.shape != m.shape:
                err = self.state.error[k] = np.empty_like(m)
            for rows in _rows(m):   # what this rank's projection misses, M - P (M^T P)^T: fed back next step
                np.matmul(p[rows], own, out=err[rows])
                np.subtract(m[rows], err[rows], out=err[rows])
                np.matmul(p[rows], qt, out=m[rows])
            self.state.q[k] = q.copy()   # warm start
        return self.bucket.buffer


# the hooks `ringmpi train --hook` offers, with their state's maker
HOOKS: dict[str, tuple[Callable[[Any, GradBucket], Any], Callable[[], Any]]] = {
    "allreduce": (allreduce_hook, lambda: None),
    "fp16": (fp16_hook, dict),
    "bf16": (bf16_hook, dict),
    "powersgd": (powersgd_hook, PowerSGD),
}


def named(name: str) -> tuple[Callable[[Any, GradBucket], Any] | None, Any]:
    """(hook, a fresh state) for `DataParallel(comm_hook=, hook_state=)` by name; the plain
    all-reduce as None, which lets a blocking step take the blocking call (shared memory's
    zero-copy algorithms included) instead of a request."""
    hook, make = HOOKS[name]
    return (None if hook is allreduce_hook else hook), make()
