"""Data parallelism on ringmpi under mpirun: equivalence to single-process training and to
MPI_Allreduce averaging, the uneven-shard pitfall, accumulation, unused parameters,
checkpoint/resume, the parameter server's traffic."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from ringmpi.dp import MLP, CharRNN, DataParallel, partition_indices
from ringmpi.dp.data import char_sequences, classification
from ringmpi.dp.ddp import load_checkpoint, save_checkpoint
from ringmpi.dp.ps import ParameterServer
from ringmpi.dp.train import make_optimizer, make_task, max_diff, params_digest, train_dp, train_single

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank


def identical_everywhere(params):
    return len(set(COMM.allgather(params_digest(params)))) == 1


@pytest.mark.parametrize("model", ["mlp", "rnn"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_equivalent_to_single_process_and_mpi_allreduce(model, optimizer):
    task = make_task(model, np.float64, seed=3)
    kw = dict(optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 0.01, momentum=0.9, seed=3)
    ddp, _, losses = train_dp(task, 20, 48, algorithm="ring", **kw)
    assert identical_everywhere(ddp.params)
    single, ref_losses = train_single(task, 20, 48, **kw)
    assert max_diff(ddp.params, single.params) <= 1e-12
    assert np.allclose(losses, ref_losses, rtol=1e-12, atol=1e-12)
    mpi_ddp, _, _ = train_dp(task, 20, 48, algorithm="mpi", **kw)
    assert max_diff(ddp.params, mpi_ddp.params) <= 1e-12
    assert losses[-1] < losses[0]


def _grad(model, batch, comm, weighting):
    ddp = DataParallel(model, comm, algorithm="ring", weighting=weighting)
    ddp.zero_grad()
    ddp.backward(batch)
    return np.concatenate([ddp.grads[k].ravel() for k in model.params])


def test_uneven_shards_pitfall_samples():
    """10 samples on P ranks: averaging per-rank means weighs samples unequally (on 4 ranks
    shards are 3,3,2,2: weights 1/12 and 1/8 instead of 1/10); weighting by the global count
    gives the whole-batch gradient to rounding."""
    x, y = classification(10, 8, 3, seed=5)
    model = MLP([8, 6, 3], seed=1)
    mine = partition_indices(10, P, R, seed=11)
    whole = model.loss_and_grads((x, y))
    g_whole = np.concatenate([whole[1][k].ravel() for k in model.params]) / 10
    g_global = _grad(MLP([8, 6, 3], seed=1), (x[mine], y[mine]), COMM, "global")
    g_mean = _grad(MLP([8, 6, 3], seed=1), (x[mine], y[mine]), COMM, "mean")
    rel = lambda g: np.linalg.norm(g - g_whole) / np.linalg.norm(g_whole)  # noqa: E731
    assert rel(g_global) < 1e-14
    sizes = COMM.allgather(len(mine))
    if len(set(sizes)) == 1:
        assert rel(g_mean) < 1e-14  # equal shards: the mean of means is the mean
    else:
        weights = sorted({1 / (P * n) for n in sizes})
        if P == 4:
            assert weights == pytest.approx([1 / 12, 1 / 8])
        assert rel(g_mean) > 0.02, rel(g_mean)  # not rounding: a real bias
        if R == 0:
            print(f"\n[uneven shards {sizes}] mean-of-means gradient off by {rel(g_mean):.1%}; "
                  f"global weighting {rel(g_global):.1e}")


def test_uneven_token_counts():
    seqs, vocab = char_sequences(seed=2)
    seqs = seqs[:7]
    mine = partition_indices(len(seqs), P, R, seed=0)
    whole = CharRNN(len(vocab), 8, seed=4).loss_and_grads(seqs)
    g_whole = np.concatenate([whole[1][k].ravel() for k in whole[1]]) / whole[2]
    g_global = _grad(CharRNN(len(vocab), 8, seed=4), [seqs[i] for i in mine], COMM, "global")
    g_mean = _grad(CharRNN(len(vocab), 8, seed=4), [seqs[i] for i in mine], COMM, "mean")
    assert np.linalg.norm(g_global - g_whole) / np.linalg.norm(g_whole) < 1e-14
    if P > 1:  # token counts differ between ranks whenever P > 1 here
        assert np.linalg.norm(g_mean - g_whole) / np.linalg.norm(g_whole) > 1e-3


def test_gradient_accumulation_equals_data_parallelism():
    """4 micro-batches accumulated on one rank = 4 ranks' worth of data parallelism; inside
    no_sync nothing is communicated, and one window costs one all-reduce per bucket."""
    x, y = classification(64, 8, 3, seed=9)
    micro = [partition_indices(64, 4, k, seed=1) for k in range(4)]
    acc = DataParallel(MLP([8, 16, 3], seed=2), MPI.COMM_SELF, algorithm="ring")
    acc.zero_grad()
    with acc.no_sync():
        for m in micro[:-1]:
            acc.backward((x[m], y[m]))
    assert acc.allreduce_calls == 0
    acc.backward((x[micro[-1]], y[micro[-1]]))
    assert acc.allreduce_calls == len(acc.buckets) == 1
    whole = MLP([8, 16, 3], seed=2).loss_and_grads((x, y))
    for k, g in whole[1].items():
        assert np.allclose(acc.grads[k], g / 64, rtol=1e-14, atol=1e-16)
    # the same window split over the ranks of COMM_WORLD, each accumulating its own share
    dp = DataParallel(MLP([8, 16, 3], seed=2), COMM, algorithm="ring")
    dp.zero_grad()
    mine = [k for k in range(4) if k % P == R]
    with dp.no_sync():
        for k in mine[:-1]:
            dp.backward((x[micro[k]], y[micro[k]]))
    dp.backward((x[micro[mine[-1]]], y[micro[mine[-1]]]) if mine else (x[:0], y[:0]))
    assert dp.allreduce_calls == 1
    for k in acc.grads:
        assert np.allclose(dp.grads[k], acc.grads[k], rtol=1e-13, atol=1e-16)


class Partial:
    """A model whose parameter 'extra' gets a gradient on rank 0 only."""

    def __init__(self):
        self.params = {"w": np.arange(4.0), "extra": np.ones(3), "never": np.zeros(2)}

    def loss_and_grads(self, batch):
        g = {"w": np.full(4, float(R + 1))}
        if R == 0:
            g["extra"] = np.full(3, 2.0)
        return 1.0, g, 1


def test_unused_parameters_are_handled_consistently():
    ddp = DataParallel(Partial(), COMM, find_unused_parameters=True, algorithm="ring")
    ddp.zero_grad()
    ddp.backward(None)
    assert np.allclose(ddp.grads["w"], sum(range(1, P + 1)) / P)
    assert np.allclose(ddp.grads["extra"], 2.0 / P)
    assert ddp.grads["never"] is None  # no rank had it: skipped on every rank
    strict = DataParallel(Partial(), COMM, algorithm="ring")
    strict.zero_grad()
    with pytest.raises(RuntimeError, match="got no gradient"):
        strict.backward(None)  # raised on every rank alike, so nobody hangs


@pytest.mark.parametrize("cap_mb", [25.0, 8e-6])
def test_gradients_live_in_their_buckets_and_other_dtypes_are_copied(cap_mb):
    """DDP's gradient_as_bucket_view: a gradient accumulates in its bucket's buffer (nothing
    packed); a parameter of another dtype than its bucket keeps an array of its own, copied
    in and cast back. Both give the whole batch's gradient, step after step, and a rank
    without a gradient for a parameter sends zeros for it, not the last step's values. With
    one bucket, and with 8-byte buckets that cut every parameter into pieces of rows (the
    float32 one's pieces copied in one at a time)."""
    x, y = classification(24, 8, 3, seed=7)
    model = MLP([8, 6, 3], seed=1)
    model.params["b1"] = model.params["b1"].astype(np.float32)
    ddp = DataParallel(model, COMM, algorithm="ring", bucket_cap_mb=cap_mb, first_bucket_mb=cap_mb,
                       overlap=P > 1)   # float64 buckets
    assert (len(ddp.buckets) == 1) == (cap_mb == 25.0) and (cap_mb == 25.0 or set(ddp.cuts) == set(ddp.params))
    flats = [b.flat for b in ddp.buckets]
    for step in range(3):
        idx = np.random.default_rng(step).permutation(24)
        mine = idx[partition_indices(24, P, R, seed=step)]
        ddp.zero_grad()
        ddp.backward((x[mine], y[mine]))
        ref = MLP([8, 6, 3], seed=1)
        ref.params = {k: v.astype(np.float64) for k, v in ddp.params.items()}
        _, whole, n = ref.loss_and_grads((x, y))
        for k, g in ddp.grads.items():
            assert g.dtype == ddp.params[k].dtype, k
            assert any(np.shares_memory(g, f) for f in flats) == (k != "b1"), k
            assert np.allclose(g, whole[k] / n, rtol=1e-6 if k == "b1" else 1e-12, atol=1e-7), (k, step)
    unused = DataParallel(Taking(), COMM, find_unused_parameters=True, algorithm="ring")
    for _ in range(3):   # "extra" from one rank a step, another each time: never a stale value
        unused.zero_grad()
        unused.backward(None)
        assert np.allclose(unused.grads["extra"], 2.0 / P)


class Taking(Partial):
    """Partial, but the rank that has a gradient for 'extra' changes at every call."""
    calls = 0

    def loss_and_grads(self, batch):
        g = {"w": np.full(4, float(R + 1))}
        if R == self.calls % P:
            g["extra"] = np.full(3, 2.0)
        self.calls += 1
        return 1.0, g, 1


def test_parameters_broadcast_from_rank_0():
    m = MLP([4, 5, 2], seed=100 + R)  # deliberately different on every rank
    ddp = DataParallel(m, COMM)
    assert identical_everywhere(ddp.params)
    assert max_diff(ddp.params, MLP([4, 5, 2], seed=100).params) == 0


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_checkpoint_resume_is_bitwise(optimizer):
    task = make_task("mlp", np.float64, seed=1)
    kw = dict(algorithm="ring", optimizer=optimizer, lr=0.05, momentum=0.9, seed=1)
    ddp, opt, _ = train_dp(task, 10, 32, **kw)
    path = Path(COMM.bcast(tempfile.mkdtemp() if R == 0 else None, 0)) / "ckpt"
    assert load_checkpoint(path, ddp, opt) is None   # nothing there yet
    save_checkpoint(path, ddp, opt, 10)
    train_dp(task, 10, 32, start=10, ddp=ddp, opt=opt, **kw)
    fresh = DataParallel(task.make_model(), COMM, algorithm="ring")
    opt2 = make_optimizer(optimizer, 0.05, 0.9)
    start = load_checkpoint(path, fresh, opt2)
    assert start == 10
    train_dp(task, 10, 32, start=start, ddp=fresh, opt=opt2, **kw)
    assert params_digest(fresh.params) == params_digest(ddp.params)


@pytest.mark.skipif(P < 2, reason="needs a server and at least one worker")
def test_parameter_server_traffic():
    """Per step a worker sends N (push) and the server K*N (pull to K workers)."""
    x, y = classification(64, 8, 3, seed=0)
    model = MLP([8, 12, 3], seed=0)
    n_bytes = sum(v.nbytes for v in model.params.values())
    ps = ParameterServer(model, COMM, server=0, lr=0.5)
    k = P - 1
    losses = []
    for step in range(5):
        mine = partition_indices(64, k, R - 1, seed=step) if R else []
        losses.append(ps.step((x[mine], y[mine])))
        if R == 0:  # the server sends the parameters to K workers and receives K gradients
            assert ps.traffic == {"pull_sent": k * n_bytes, "push_sent": 0}
        else:       # a worker receives N and sends N: 2N moved, whatever K is
            assert ps.traffic == {"pull_sent": 0, "push_sent": n_bytes}
    assert losses[-1] < losses[0]


# -- overlapped training: buckets all-reduced as requests while backward goes on ----------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("algorithm", ["ring", "ordered"])
def test_overlapped_training_gives_the_bits_of_blocking_training(dtype, algorithm):
    task = make_task("mlp", dtype, seed=5)
    kw = dict(optimizer="sgd", lr=0.05, momentum=0.9, seed=5)
    # small buckets: several requests in flight, the first started after the last layer
    runs = {}
    for overlap in (True, False):
        ddp = DataParallel(task.make_model(), COMM, algorithm=algorithm, overlap=overlap, bucket_cap_mb=0.0005,
                           first_bucket_mb=0.0001)
        assert ddp.overlap is (overlap and P > 1) and len(ddp.buckets) > 2
        ddp, _, losses = train_dp(task, 12, 48, ddp=ddp, **kw)
        runs[overlap] = (params_digest(ddp.params), losses)
        assert identical_everywhere(ddp.params)
    assert runs[True] == runs[False]
    auto = DataParallel(task.make_model(), COMM, algorithm=algorithm, overlap=None)   # one choice everywhere
    assert len(set(COMM.allgather(auto.overlap))) == 1 and (auto.overlap is False or P > 1)
    single, ref = train_single(task, 12, 48, **kw)
    assert np.allclose(runs[True][1], ref, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    assert runs[True][1][-1] < runs[True][1][0]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("overlap", [True, False])
def test_step_updates_each_parameter_as_its_buckets_arrive_with_the_bits_of_one_update(optimizer, overlap):
    """`DataParallel.step` updates a parameter as soon as its last bucket is averaged (SGD
    and Adam: `begin` once, `update` a few at a time); against `backward` then one
    `optimizer.step` on the same buckets: the same bits, step after step."""
    task = make_task("mlp", np.float64, seed=6)
    runs = []
    for stepwise in (True, False):
        ddp = DataParallel(task.make_model(), COMM, algorithm="ring", overlap=overlap, bucket_cap_mb=0.0005,
                           first_bucket_mb=0.0001)
        opt = make_optimizer(optimizer, 0.05, 0.9)
        assert len(ddp.buckets) > 2 and ddp.cuts
        for s in range(4):
            mine = partition_indices(48, P, R, seed=s)
            data = task.take(task.data, [(s * 48 + i) % task.size for i in mine])
            if stepwise:
                ddp.step(opt, data)
            else:
                ddp.zero_grad()
                ddp.backward(data)
                opt.step(ddp.params, {k: g for k, g in ddp.grads.items() if g is not None})
        runs.append(params_digest(ddp.params))
    assert runs[0] == runs[1]


class Watched(MLP):
    """An MLP that notes, as backward reports each gradient, how many buckets have begun."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.ddp = None
        self.begun: list[int] = []
        self.reported: list[str] = []

    def loss_and_grads(self, batch, on_grad=None, cuts=None):
        def note(name, g, row=0):
            on_grad(name, g, row)
            self.begun.append(sum(b.request is not None for b in self.ddp.buckets))
            self.reported.append(name)
        return super().loss_and_grads(batch, on_grad=note if on_grad else None, cuts=cuts)


def test_buckets_begin_during_backward_in_order():
    if P == 1:
        pytest.skip("one rank: nothing to overlap")
    x, y = classification(96, 8, 3, seed=4)
    model = Watched([8, 32, 32, 3], seed=1)
    ddp = DataParallel(model, COMM, algorithm="ring", overlap=True, bucket_cap_mb=0.001, first_bucket_mb=0.0001)
    model.ddp = ddp
    mine = partition_indices(96, P, R, seed=0)
    ddp.zero_grad()
    ddp.backward((x[mine], y[mine]))
    # the last layer's bucket began before the first layer's gradient was ready, and the
    # count only grows (bucket order); all were waited for and cleared
    assert model.begun[1] >= 1 and model.begun[-1] <= len(ddp.buckets) - 1   # (the last: a blocking call after)
    assert model.begun == sorted(model.begun)
    assert all(b.request is None for b in ddp.buckets)
    # W1 (8 KB) is over the cap (1 KB): cut into pieces of rows, reported one at a time, and
    # its first pieces travel while the next are computed
    assert len(ddp.cuts["W1"]) >= 2 and model.reported.count("W1") == len(ddp.cuts["W1"]) + 1
    during = [c for name, c in zip(model.reported, model.begun) if name == "W1"]
    assert during[-1] > during[0]
    ref = DataParallel(MLP([8, 32, 32, 3], seed=1), COMM, algorithm="ring", overlap=False, bucket_cap_mb=0.001,
                       first_bucket_mb=0.0001)   # (the same buckets: the same sums, bit for bit)
    ref.zero_grad()
    ref.backward((x[mine], y[mine]))
    for k in ddp.grads:
        assert np.array_equal(ddp.grads[k], ref.grads[k])


class PartialStream:
    """Gradients reported as they are final, in reverse order; 'b' only on even ranks, 'a'
    never: a rank whose bucket of 'b' never fills must still start buckets in order."""

    def __init__(self):
        self.params = {"a": np.zeros(3), "b": np.ones(5), "c": np.arange(4.0), "d": np.ones(2)}

    def loss_and_grads(self, batch, on_grad=None):
        g = {"d": np.full(2, R + 1.0), "c": np.full(4, 2.0 * R)}
        if R % 2 == 0:
            g["b"] = np.full(5, 3.0)
        for k in ("d", "c", "b"):
            if k in g and on_grad:
                on_grad(k, g[k])
        return float(R), g, 2


def test_a_missing_gradient_raises_everywhere_with_nothing_left_in_flight():
    """Buckets begun during backward, then a parameter no rank got: every rank raises, after
    waiting for its requests (none is left to the exit report), and the next call works."""
    from ringmpi.requests import engine
    ddp = DataParallel(PartialStream(), COMM, algorithm="ring", overlap=True, bucket_cap_mb=40e-6,
                       first_bucket_mb=1e-6)
    ddp.zero_grad()
    with pytest.raises(RuntimeError, match=r"parameters \[.*'a'.*\] got no gradient"):
        ddp.backward(None)
    assert all(b.request is None for b in ddp.buckets) and not engine().forgotten(ddp.t)
    assert COMM.allreduce(1) == P


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_with_unused_parameters_and_accumulation(overlap):
    ddp = DataParallel(PartialStream(), COMM, find_unused_parameters=True, algorithm="ring", overlap=overlap,
                       bucket_cap_mb=40e-6, first_bucket_mb=1e-6)   # one bucket per parameter
    assert len(ddp.buckets) == 4
    ddp.zero_grad()
    with ddp.no_sync():
        ddp.backward(None)
    assert all(b.request is None for b in ddp.buckets) and ddp.allreduce_calls == 0
    ddp.backward(None)
    count = 4 * P
    assert np.allclose(ddp.grads["d"], 2 * sum(r + 1.0 for r in range(P)) / count)
    assert np.allclose(ddp.grads["c"], 2 * sum(2.0 * r for r in range(P)) / count)
    assert np.allclose(ddp.grads["b"], 2 * 3.0 * len(range(0, P, 2)) / count)
    assert ddp.grads["a"] is None
    assert ddp.global_loss == pytest.approx(2 * sum(range(P)) / count)


# -- communication hooks ---------------------------------------------------------------

def _hooked(hook, state, overlap, dtype=np.float32, sizes=(8, 24, 16, 3)):
    """One synchronised backward of an MLP on this rank's share; the averaged gradients."""
    x, y = classification(64, sizes[0], sizes[-1], seed=6)
    ddp = DataParallel(MLP(list(sizes), seed=3, dtype=dtype), COMM, algorithm="ring", overlap=overlap,
                       comm_hook=hook, hook_state=state, bucket_cap_mb=0.001, first_bucket_mb=0.0005)
    mine = partition_indices(64, P, R, seed=2)
    ddp.zero_grad()
    ddp.backward((x[mine], y[mine]))
    return ddp, (x[mine], y[mine])


@pytest.mark.parametrize("overlap", [True, False])
def test_every_bucket_begins_before_any_is_waited_for(overlap, monkeypatch):
    """With a hook, every bucket's hook runs before the first future is waited for (each
    one's casts beside the earlier ones' transfers); with buckets in flight, the last one
    begins before the step's small all-reduce of loss and counts (behind them on the wire,
    it would hold the last bucket back). The sums are the plain all-reduce's all the same."""
    from ringmpi.dp import ddp as dp_module
    from ringmpi.dp.hooks import allreduce_hook
    events = []

    def hook(state, bucket):
        events.append(("begin", bucket.index))
        request = allreduce_hook(state, bucket)

        class Future:
            def wait(self):
                events.append(("wait", bucket.index))
                return request.wait()
        return Future()

    ref, _ = _hooked(None, None, False)
    got, _ = _hooked(hook, None, overlap)
    begun = [i for what, i in events if what == "begin"]
    first_wait = next(k for k, (what, _) in enumerate(events) if what == "wait")
    assert sorted(begun) == list(range(len(got.buckets))) and len(got.buckets) >= 3
    assert all(what == "begin" for what, _ in events[:first_wait]) and len(events[:first_wait]) == len(begun)
    for k in ref.grads:
        assert np.array_equal(got.grads[k], ref.grads[k]), k
    if P == 1 or not overlap:
        return
    x, y = classification(64, 8, 3, seed=6)   # the plain all-reduce, overlapped: the last bucket
    ddp = DataParallel(MLP([8, 24, 16, 3], seed=3), COMM, algorithm="ring", overlap=True,   # begun before
                       bucket_cap_mb=0.001, first_bucket_mb=0.0005)                          # the small one
    order = []
    plain, small = dp_module.DataParallel._communicate, dp_module.api.allreduce
    monkeypatch.setattr(dp_module.DataParallel, "_communicate",
                        lambda self, i, b, blocking: order.append(("bucket", i, blocking)) or plain(self, i, b, blocking))
    monkeypatch.setattr(dp_module.api, "allreduce", lambda *a, **k: order.append(("small",)) or small(*a, **k))
    mine = partition_indices(64, P, R, seed=2)
    ddp.zero_grad()
    ddp.backward((x[mine], y[mine]))
    last = len(ddp.buckets) - 1
    assert order.index(("bucket", last, False)) < order.index(("small",)), order
    assert all(not e[2] for e in order if e[0] == "bucket"), order   # (none blocking: all were in flight)


@pytest.mark.parametrize("overlap", [True, False])
def test_hooks_reduce_what_they_promise(overlap):
    from ringmpi.dp.hooks import allreduce_hook, bf16_hook, fp16_hook
    ref, _ = _hooked(None, None, False)
    plain, _ = _hooked(allreduce_hook, None, overlap)
    assert "W1" in plain.cuts      # (these hooks get parameters over the cap in pieces)
    for k in ref.grads:
        assert np.array_equal(plain.grads[k], ref.grads[k])
    for hook, tol in ((fp16_hook, 2e-3), (bf16_hook, 2e-2)):
        got, _ = _hooked(hook, {}, overlap)
        for k in ref.grads:
            scale = np.abs(ref.grads[k]).max()
            assert np.allclose(got.grads[k], ref.grads[k], rtol=tol, atol=tol * scale), (hook, k)
            assert got.grads[k].dtype == np.float32


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("block", [None, 64])
def test_powersgd_equals_its_definition(overlap, block, monkeypatch):
    """The hook's result against numpy on every rank's gradients gathered: P = sum M_k Q0,
    orthonormalised; Q = sum M_k^T P; P Q^T / count; vectors summed exactly; each rank's
    error feedback M_k - P P^T M_k; a second step adds it and starts from Q (warm). Also
    with blocks of one or two rows (`hooks.BLOCK` = 64 bytes) instead of whole matrices."""
    from ringmpi.dp import hooks
    from ringmpi.dp.hooks import PowerSGD, _orthonormalise, powersgd_hook
    if block is not None:
        monkeypatch.setattr(hooks, "BLOCK", block)
    state = PowerSGD(rank=2, seed=7, start=0)
    ddp, batch = _hooked(powersgd_hook, state, overlap, dtype=np.float64)
    _, local, count = MLP([8, 24, 16, 3], seed=3, dtype=np.float64).loss_and_grads(batch)
    every = COMM.allgather(local)
    total = COMM.allreduce(count)
    # (PowerSGD works on whole matrices: no parameter is cut, though W1 is over the cap)
    assert all(name == piece.name for b in ddp.buckets for piece, name in zip(b.pieces, b.names))
    assert ddp.params["W1"].nbytes > 0.001e6 and not ddp.cuts
    for b in ddp.buckets:
        for piece, key in zip(b.pieces, b.names):
            k, rows = piece.name, slice(piece.start, piece.stop)
            g, got = (local[k][rows], ddp.grads[k][rows]) if local[k].ndim else (local[k], ddp.grads[k])
            ms = [e[k][rows] if g.ndim else e[k] for e in every]
            if g.ndim == 2 and 2 < min(g.shape):
                q0 = np.random.default_rng([7, sum(map(ord, key))]).standard_normal((g.shape[1], 2))
                p = _orthonormalise(sum(m @ q0 for m in ms))
                q = sum(m.T @ p for m in ms)
                assert np.allclose(got, p @ q.T / total, rtol=1e-9, atol=1e-12), key
                assert np.allclose(state.error[key], g - p @ (g.T @ p).T, rtol=1e-9, atol=1e-12)
                assert np.allclose(state.q[key], q, rtol=1e-9, atol=1e-12)
            else:
                assert np.allclose(got, sum(ms) / total, rtol=1e-12, atol=1e-14), key
    assert identical_everywhere({k: v for k, v in ddp.grads.items()})


def test_powersgd_all_reduces_whole_for_its_first_steps():
    """`start` steps of every bucket all-reduced whole (the plain hook's bits), compressed
    after: the matrices then differ from the whole sum, the vectors do not (within the
    rounding of another summation order: they travel packed behind P)."""
    from ringmpi.dp.hooks import PowerSGD, allreduce_hook, powersgd_hook

    def whole(state, bucket):   # the plain sum, on PowerSGD's buckets (no parameter cut)
        return allreduce_hook(state, bucket)
    whole.whole_parameters = True
    plain, batch = _hooked(whole, None, False, dtype=np.float64)
    state = PowerSGD(rank=1, seed=1, start=2)   # (rank 1: W2's gradient, 3 classes, has rank 2)
    ddp, _ = _hooked(powersgd_hook, state, False, dtype=np.float64)    # call 1
    for call in (1, 2, 3):
        if call > 1:
            ddp.zero_grad()
            ddp.backward(batch)
        assert set(state.steps.values()) == {call}
        for k, g in plain.grads.items():
            if call <= state.start:
                assert np.array_equal(ddp.grads[k], g), (call, k)
            else:
                compressed = g.ndim == 2 and state.rank < min(g.shape)
                assert np.allclose(ddp.grads[k], g, rtol=1e-12, atol=1e-15) is not compressed, (call, k)


@pytest.mark.parametrize("hook", ["fp16", "bf16", "powersgd"])
def test_training_with_a_hook_learns_and_keeps_replicas_identical(hook):
    task = make_task("mlp", np.float32, seed=4)
    kw = dict(optimizer="sgd", lr=0.05, momentum=0.9, seed=4)
    ddp, _, losses = train_dp(task, 15, 48, algorithm="ring", hook=hook, **kw)
    assert identical_everywhere(ddp.params)
    _, ref = train_single(task, 15, 48, **kw)
    assert losses[-1] < losses[0]
    assert abs(losses[-1] - ref[-1]) <= 0.1 * ref[-1]


def test_tuned_buckets_are_one_choice_everywhere_and_train_as_that_cap():
    from ringmpi.dp.ddp import CAPS_MB
    task = make_task("mlp", np.float32, seed=8, sizes=(32, 256, 128, 4))
    kw = dict(optimizer="sgd", lr=0.05, momentum=0.9, seed=8)
    ddp = DataParallel(task.make_model(), COMM, algorithm="ring", overlap=P > 1)
    first = task.take(task.data, partition_indices(48, P, R, seed=8))
    plan = ddp.tune_buckets(first, caps_mb=(0.01, 0.05) + CAPS_MB)
    assert len(set(COMM.allgather((plan.cap_mb, tuple(plan.predicted))))) == 1
    # the caps timed as steps in the order of the prediction (those giving the same buckets
    # once); of those timed within 2% of the fastest, the one predicted fastest kept
    order = sorted(plan.predicted, key=lambda c: (plan.predicted[c], -c))
    layouts = [ddp._make_buckets(c * 1e6, min(c, 1.0) * 1e6) for c in order]
    assert list(plan.measured) == [c for i, c in enumerate(order) if layouts[i] not in layouts[:i]]
    fastest = min(plan.measured.values())
    ties = [c for c, v in plan.measured.items() if v <= fastest * 1.02]
    assert plan.cap_mb == min(ties, key=lambda c: (plan.predicted[c], -c)) and fastest > 0
    assert plan.backward > 0 and plan.alpha >= 0 and plan.beta >= 0 and "bucket cap" in plan.describe()
    assert [b.pieces for b in ddp.buckets] == ddp._make_buckets(plan.cap_mb * 1e6, min(plan.cap_mb, 1.0) * 1e6)
    assert all(not g.any() for g in ddp.grads.values())    # the measuring backward left nothing
    tuned, _, losses = train_dp(task, 6, 48, ddp=ddp, **kw)
    same = DataParallel(task.make_model(), COMM, algorithm="ring", overlap=P > 1, bucket_cap_mb=plan.cap_mb)
    same, _, ref = train_dp(task, 6, 48, ddp=same, **kw)
    assert params_digest(tuned.params) == params_digest(same.params) and losses == ref
