"""The virtual cluster runs the real schedules: symbolic tables as in the lecture, results
equal to numpy, and simulated time / traffic / rounds equal to every registered formula."""
from __future__ import annotations

import types
from dataclasses import replace

import numpy as np
import pytest

from helpers import assert_within_ulp

from ringmpi import settings
from ringmpi.backend import phantom
from ringmpi.specs import SPECS
from ringmpi.ops import BFLOAT16
from ringmpi.cost import LECTURE, Profile
from ringmpi.model import cost
from ringmpi.schedules import get, names
from ringmpi.sim import BUCKET, Network, SimDeadlock, Sym, VirtualCluster, VirtualRank, phantoms, run_collective, symbolic
from ringmpi.tools.explain import parameter_server_traffic, symbolic_table

PROF = Profile(alpha=5e-6, beta=1 / 25e9, gamma=1 / 50e9)
FORMULA_ALGOS = [(c, a) for c in SPECS for a in names(c) if get(c, a).cost is not None]


def S(text: str) -> Sym:
    return Sym(*text.split("+"))


def test_ring_reduce_scatter_table_matches_lecture():
    """After the reduce-scatter (3 steps), worker 0 holds a0, a1+b1+c1+d1, a2+c2+d2, a3+d3."""
    steps = Profile(alpha=1, beta=0)
    cl, outs = run_collective("allreduce", "ring", symbolic("abcd", 4, 4), inplace=True, watch=True, profile=steps)
    after_rs = {r: [s for t, s in rk.snapshots if t <= 3][-1] for r, rk in enumerate(cl.ranks)}
    assert list(after_rs[0]) == [S("a0"), S("a1+b1+c1+d1"), S("a2+c2+d2"), S("a3+d3")]
    assert list(after_rs[1])[:3] == [S("a0+b0"), S("b1"), S("a2+b2+c2+d2")]
    full = [S(f"a{j}+b{j}+c{j}+d{j}") for j in range(4)]
    assert all(list(o) == full for o in outs)
    assert cl.time == 6  # 2(p-1) steps


def test_three_worker_exercise():
    text = symbolic_table("allreduce", 3)
    lines = text.splitlines()
    assert lines[2].split()[2:] == ["a0", "a1", "a2+c2", "a0+b0", "b1", "b2", "c0", "b1+c1", "c2"]
    assert len(lines) == 1 + 1 + 4  # header, start, 4 steps


def test_pipeline_broadcast_steps():
    """p-2+S steps: with 4 workers and 3 segments worker 3 gets x0 at step 3, all at step 5."""
    text = symbolic_table("broadcast", 4, 3).splitlines()
    assert text[-1].startswith("step 5")
    assert text[4].startswith("step 3") and text[4].split()[-3:] == ["x0", "-", "-"]  # worker 3


#: (payload dtype, bytes of its partial sums): float32, and a 16-bit float with float32
#: partial sums and with 16-bit hops (the reductions' only; the others move the bytes)
PAYLOADS = [(np.float32, 0), (np.float16, 4), (np.float16, 2)]


@pytest.mark.parametrize("collective,algorithm", FORMULA_ALGOS)
def test_simulated_time_and_traffic_equal_formula(collective, algorithm):
    spec = SPECS[collective]
    for p, (dtype, partials) in ((p, d) for p in range(1, 17) for d in (PAYLOADS if spec.reduces else PAYLOADS[:1])):
        n = 720720  # divisible by 1..16 (and by every segment count used)
        inputs = [phantom(n // p if spec.per_rank and not spec.reduces else n, dtype) for _ in range(p)]
        extra = {"partials": partials} if partials else {}
        cl, _ = run_collective(collective, algorithm, inputs, profile=PROF, params={"segments": 6, **extra})
        c = cost(collective, algorithm, p, n, np.dtype(dtype).itemsize, segments=6, **extra)
        tr = cl.traffic()
        what = f"{collective}/{algorithm} p={p} {np.dtype(dtype)} partials={partials}"
        assert cl.time == pytest.approx(c.time(PROF) - PROF.overhead, rel=1e-12, abs=1e-15), what
        assert tr["busiest_sent"] == c.busiest_sent, what
        assert tr["avg_sent"] == pytest.approx(c.avg_sent, rel=1e-12, abs=1e-9), what
        assert tr["rounds"] == c.rounds, what


@pytest.mark.parametrize("collective,algorithm", [(c, a) for c in SPECS for a in names(c)])
def test_simulated_results_equal_numpy(collective, algorithm):
    """Every algorithm (and the simulator's stand-in for MPI's own) gives the exact numpy
    result on every virtual rank, in place and out of place, for p = 1..11 and any root."""
    spec = SPECS[collective]
    rng = np.random.default_rng(7)
    for p in (1, 2, 3, 5, 6, 8, 11):
        for n in (0, 1, p - 1, 3 * p + 2):
            if collective == "alltoall":
                n *= p  # whole blocks, one per rank
            xs = [rng.integers(-100, 100, n).astype(np.int64) for _ in range(p)]
            root = p // 2
            for inplace in (False, True):
                cl, outs = run_collective(collective, algorithm, xs, root=root, params={"segments": 3},
                                          inplace=inplace)
                for r, o in enumerate(outs):
                    want = spec.expected(xs, r, "SUM", root)
                    assert (o is None) if want is None else np.array_equal(o, want), (p, n, r, inplace)


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 16, 64])
def test_ring_sends_2_p_minus_1_over_p_n(p):
    n = 256 * 1024 * p
    cl, _ = run_collective("allreduce", "ring", [np.zeros(n, np.uint8) for _ in range(p)])
    assert cl.traffic()["sent"] == [2 * (p - 1) * n // p] * p


def test_parameter_server_traffic():
    """A worker moves 2N per step whatever K; the server 2KN."""
    for k in (2, 4, 8):
        tr = parameter_server_traffic(k, 1000)
        assert tr["busiest_moved"] == 2 * k * 1000
        assert tr["sent"][:k] == [1000] * k


def test_deadlock_is_reported_not_hung():
    cl = VirtualCluster(2)

    def bad(t):  # both ranks only receive
        t.sendrecv(None, None, np.empty(3), 1 - t.rank)
    with pytest.raises(SimDeadlock, match="blocked: rank 0"):
        cl.run(bad)


def test_size_mismatch_is_reported():
    cl = VirtualCluster(2)

    def bad(t):
        t.sendrecv(np.zeros(3 + t.rank), 1 - t.rank, np.empty(3 + t.rank), 1 - t.rank)
    with pytest.raises(SimDeadlock, match="rank 1 sent 4 elements to rank 0, which posted a receive of 3"):
        cl.run(bad)


@pytest.mark.parametrize("algorithm", ["tree", "recursive_doubling", "rabenseifner", "naive"])
def test_1024_virtual_ranks(algorithm):
    cl, outs = run_collective("allreduce", algorithm, [np.full(1024, r, np.int64) for r in range(1024)])
    assert np.array_equal(outs[517], np.full(1024, 1023 * 1024 // 2))
    assert cl.time == pytest.approx(cost("allreduce", algorithm, 1024, 1024, 8).time(Profile(5e-6, 1 / 25e9)))


@pytest.mark.parametrize("collective,algorithm", [(c, a) for c in ("allreduce", "reduce_scatter", "broadcast")
                                                    for a in names(c) if get(c, a).cost is not None])
def test_a_cluster_of_several_windows_gives_the_results_and_the_formula(collective, algorithm):
    """An odd number of buckets (the windows wrap around the last one): the ranks run in
    another order than at one bucket, the results and the clock are the same."""
    p = 3 * BUCKET + 5
    spec, rng = SPECS[collective], np.random.default_rng(p)
    count = 2 * p + 3
    inputs = [rng.integers(-9, 9, count).astype(np.int64) for _ in range(p)]
    _, outs = run_collective(collective, algorithm, inputs, profile=PROF)
    for r in (0, 1, BUCKET, p - 2, p - 1):
        if outs[r] is not None:
            assert np.array_equal(outs[r], spec.expected(inputs, r, "SUM" if spec.reduces else None)), r
    n = 6 * p << 8    # (the formulas assume blocks, halves and segments of equal sizes)
    count = n // p if spec.per_rank and not spec.reduces else n
    cl, _ = run_collective(collective, algorithm, phantoms(p, count, np.int64), profile=PROF, params={"segments": 6})
    c = cost(collective, algorithm, p, n, 8, segments=6)
    assert cl.time == pytest.approx(c.time(PROF) - PROF.overhead, rel=1e-12)
    assert cl.traffic()["rounds"] == c.rounds


def test_the_ring_runs_in_windows_many_rounds_at_a_time():
    """The ready set's windows (`sim.BUCKET`): a sweep over 16 buckets of ranks moves the
    ring tens of rounds, so each rank's state is fetched into cache once for tens of its
    exchanges, not once for every exchange."""
    p = 16 * BUCKET
    cl, _ = run_collective("allreduce", "ring", phantoms(p, 1 << 26))
    rounds = cl.traffic()["rounds"]
    assert rounds == 2 * (p - 1)
    assert 1 <= cl.sweeps <= rounds / (BUCKET / 4), cl.sweeps


def test_a_failure_among_many_windows_names_its_rank():
    cl = VirtualCluster(4 * BUCKET)

    def fn(t):
        if t.rank == 3 * BUCKET + 1:
            raise ValueError("boom")
        t.sendrecv(np.zeros(1), (t.rank + 1) % t.size, np.empty(1), (t.rank - 1) % t.size)
    with pytest.raises(RuntimeError, match=f"virtual rank {3 * BUCKET + 1} failed: ValueError"):
        cl.run(fn)


# -- timing without data, and the network's realism knobs ------------------------------

@pytest.mark.parametrize("collective,algorithm", FORMULA_ALGOS)
def test_phantom_buffers_time_and_count_like_real_data(collective, algorithm):
    """The same schedule code on phantoms (no memory, nothing copied or reduced): the same
    clock, bytes, messages and rounds as on real data."""
    spec = SPECS[collective]
    for p in (1, 3, 8):
        n = 5040
        count = n // p if spec.per_rank and not spec.reduces else n
        real, _ = run_collective(collective, algorithm, [np.ones(count, np.float32) for _ in range(p)],
                                 profile=PROF, params={"segments": 6})
        ghost, _ = run_collective(collective, algorithm, phantoms(p, count, np.float32), profile=PROF,
                                  params={"segments": 6})
        assert not ghost.data and real.data
        assert ghost.time == real.time and ghost.traffic() == real.traffic(), (collective, algorithm, p)
        assert [r.counters.bytes_reduced for r in ghost.ranks] == [r.counters.bytes_reduced for r in real.ranks]


def test_phantoms_need_no_memory():
    """64 ranks x 64 MiB would be 4 GiB of real buffers."""
    import tracemalloc
    tracemalloc.start()
    cl, _ = run_collective("allreduce", "ring", phantoms(64, 64 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 20, peak
    assert cl.time == pytest.approx(cost("allreduce", "ring", 64, 64 << 20, 1).time(LECTURE) - LECTURE.overhead)
    assert cl.traffic()["busiest_sent"] == 2 * 63 * (64 << 20) // 64


def test_a_straggler_slows_the_ring_every_round_and_a_tree_only_on_its_path():
    p, n = 16, 1 << 20
    slow = Network(slow_ranks={p - 1: 1.5})
    ratio = {}
    for alg in ("ring", "tree", "naive"):
        base, _ = run_collective("allreduce", alg, phantoms(p, n), profile=PROF)
        hit, _ = run_collective("allreduce", alg, phantoms(p, n), profile=PROF, network=slow)
        ratio[alg] = hit.time / base.time
    assert ratio["ring"] == pytest.approx(1.5, rel=1e-9)  # its link is on every round's path
    assert 1 < ratio["tree"] < 1.3                        # a leaf: two rounds of 2 lg p
    assert 1 < ratio["naive"] < ratio["tree"]             # one message among p-1 at the root


def test_a_slow_link_and_per_message_overhead_follow_their_formulas():
    p, n = 8, 8 << 20
    prof = Profile(alpha=5e-6, beta=1 / 25e9, gamma=0.0)
    b = n / p * prof.beta
    base, _ = run_collective("allreduce", "ring", phantoms(p, n), profile=prof)
    assert base.time == pytest.approx(2 * (p - 1) * (prof.alpha + b))
    link, _ = run_collective("allreduce", "ring", phantoms(p, n), profile=prof, network=Network(slow_links={(2, 3): 3.0}))
    assert link.time == pytest.approx(2 * (p - 1) * (prof.alpha + 3 * b))   # every round waits for that link
    o = 2e-6
    ovh, _ = run_collective("allreduce", "ring", phantoms(p, n), profile=prof, network=Network(overhead=o))
    assert ovh.time == pytest.approx(base.time + 2 * (p - 1) * 2 * o)       # a sendrecv posts two messages
    ps, _ = run_collective("allreduce", "naive", phantoms(p, n), profile=prof, network=Network(overhead=o))
    nb, _ = run_collective("allreduce", "naive", phantoms(p, n), profile=prof)
    assert ps.time == pytest.approx(nb.time + 2 * (p - 1) * o)              # the root posts p-1 at once, twice


def test_network_knobs_are_checked():
    for bad in (Network(slow_ranks={9: 2.0}), Network(slow_ranks={1: 0.5}), Network(slow_links={(0, 9): 2.0}),
                Network(overhead=-1.0)):
        with pytest.raises(ValueError):
            VirtualCluster(4, network=bad)


# -- a cluster of nodes: two kinds of link, the hierarchical all-reduce -------------------

NODES = Profile(alpha=10e-6, beta=1 / 1.25e9, gamma=1 / 50e9, alpha_local=1e-6, beta_local=1 / 20e9)


@pytest.mark.parametrize("nodes,per_node", [(2, 2), (4, 1), (3, 4), (2, 5), (2, 4)])
def test_hierarchical_and_flat_ring_on_nodes_equal_their_formulas(nodes, per_node):
    p, n = nodes * per_node, 60 * 64 * 5 * 7
    for alg in ("ring", "hierarchical", "hierarchical_oneway"):
        cl, _ = run_collective("allreduce", alg, phantoms(p, n), profile=NODES, per_node=per_node)
        assert cl.time == pytest.approx(cost("allreduce", alg, p, n, 1, per_node=per_node).time(NODES)
                                        - NODES.overhead, rel=1e-12), (alg, nodes, per_node)
    flat, _ = run_collective("allreduce", "ring", phantoms(p, n), profile=NODES, per_node=per_node)
    hier, _ = run_collective("allreduce", "hierarchical", phantoms(p, n), profile=NODES, per_node=per_node)
    if nodes > 1 and per_node > 1:
        assert hier.time < flat.time   # n/k per rank on the slow links instead of every round on them


@pytest.mark.parametrize("p,per_node", [(4, 2), (5, 2), (7, 3), (6, 4), (3, 1), (8, 4)])
@pytest.mark.parametrize("alg", ["hierarchical", "hierarchical_oneway"])
def test_hierarchical_is_exact_on_uneven_nodes(p, per_node, alg):
    rng = np.random.default_rng(p * 10 + per_node)
    xs = [rng.integers(-9, 9, 37).astype(np.int64) for _ in range(p)]
    cl, outs = run_collective("allreduce", alg, xs, profile=NODES, per_node=per_node)
    assert all(np.array_equal(o, sum(xs)) for o in outs)
    assert len({o.tobytes() for o in outs}) == 1


def test_host_link_bytes_flat_ring_versus_hierarchical():
    """2 nodes x 2 ranks: the flat ring puts 1.5n on each host's link, the hierarchical n."""
    n = 1 << 20
    out = {}
    for alg in ("ring", "hierarchical"):
        cl = VirtualCluster(4, NODES, per_node=2, data=False)
        spec = SPECS["allreduce"]
        xs = phantoms(4, n)
        a = get("allreduce", alg)

        def fn(t, a=a):
            call = spec.make(t.rank, 4, xs[t.rank], op="SUM")
            a.run(t, call._replace(params=tuple(sorted(a.tuned(4, n, 1, replace(NODES, per_node=2)).items()))))
        crossing = [0, 0]
        orig = VirtualRank.sendrecv

        def counting(self, sendbuf, dest, recvbuf, source):
            if sendbuf is not None and dest is not None and self.cluster.nodes[dest] != self.cluster.nodes[self.rank]:
                crossing[self.cluster.nodes[self.rank] // 2] += sendbuf.nbytes
            orig(self, sendbuf, dest, recvbuf, source)
        VirtualRank.sendrecv = counting
        try:
            cl.run(fn)
        finally:
            VirtualRank.sendrecv = orig
        out[alg] = crossing
    assert out["ring"] == [3 * n // 2] * 2 and out["hierarchical"] == [n] * 2, out


HALVES = [np.dtype(np.float16), BFLOAT16]


@pytest.mark.parametrize("collective", [c for c in SPECS if SPECS[c].reduces])
def test_sixteen_bit_reductions_within_one_ulp_on_every_algorithm(collective):
    """float16 and bfloat16 SUM, AVG and PROD with float32 partial sums: within one ulp of
    the exact result rounded once, for every algorithm (MPI's stand-in included), p = 1..9,
    counts 0, 1, p-1, p, 7p+3, in place or not; MAX and MIN exact; every rank the same bits."""
    spec = SPECS[collective]
    rng = np.random.default_rng(11)
    for p in (1, 2, 3, 4, 5, 8, 9):
        for dtype in HALVES:
            for n in sorted({0, 1, p - 1, p, 7 * p + 3}):
                for op in ("SUM", "AVG", "PROD", "MAX", "MIN"):
                    xs = [(rng.uniform(0.5, 2.0, n) if op == "PROD" else rng.standard_normal(n)).astype(dtype)
                          for _ in range(p)]
                    for algorithm in names(collective):
                        for inplace in (False, True):
                            _, outs = run_collective(collective, algorithm, xs, op=op, inplace=inplace, root=p // 2)
                            for r, o in enumerate(outs):
                                want = spec.expected([x.astype(np.float64) for x in xs], r, op, p // 2)
                                what = f"{collective}/{algorithm} p={p} {dtype} {op} n={n} rank {r}"
                                if want is None:
                                    assert o is None, what
                                    continue
                                assert o.dtype == dtype, what
                                if op in ("MAX", "MIN"):
                                    assert np.array_equal(o.astype(np.float64), want), what
                                else:
                                    assert_within_ulp(o, want.astype(dtype), what)
                            if collective == "allreduce":
                                assert len({o.tobytes() for o in outs}) == 1, what


@pytest.mark.parametrize("collective", [c for c in SPECS if SPECS[c].reduces])
def test_deterministic_algorithms_give_the_rank_order_fold(collective, monkeypatch):
    """The algorithms that keep the deterministic mode (`ordered`) give the bits of the
    rank-order fold at every p, count and root, in place or not; in float32 for 16-bit data."""
    monkeypatch.setenv("RINGMPI_DETERMINISTIC", "1")
    settings.reload()
    spec = SPECS[collective]
    rng = np.random.default_rng(5)
    keeping = [a for a in names(collective) if get(collective, a).ordered]
    assert keeping, f"{collective} has no algorithm for the deterministic mode"
    if collective != "scan":   # (the chain is a scan's rank order itself)
        assert "ordered" in keeping and "naive" in keeping
    try:
        for p in (2, 3, 5, 8, 11):
            for dtype in (np.float32, np.float64, np.complex64, np.float16, BFLOAT16):
                for n in sorted({0, 1, p - 1, 7 * p + 3}):
                    xs = [rng.standard_normal(n).astype(dtype) for _ in range(p)]
                    wide = [x.astype(np.float32) for x in xs] if np.dtype(dtype).itemsize == 2 else xs
                    for op in ("SUM", "AVG"):
                        for algorithm in keeping:
                            for inplace in (False, True):
                                _, outs = run_collective(collective, algorithm, xs, op=op, inplace=inplace, root=p // 2)
                                for r, o in enumerate(outs):
                                    want = spec.expected(wide, r, op, p // 2)
                                    if want is not None:
                                        assert o.tobytes() == want.astype(dtype).tobytes(), (algorithm, p, dtype, n)
    finally:
        monkeypatch.delenv("RINGMPI_DETERMINISTIC")
        settings.reload()


def test_error_study_shows_what_float32_partials_buy():
    """`ringmpi sim accuracy` on real data: a 16-bit payload with float32 partial sums stays at
    the one final rounding (half an ulp of the sum) at every p; 16-bit hops grow with p; the
    rank-order fold is what `ordered` computes; and the formula's bytes: 16-bit hops send
    half a float32 ring's, float32 partials three quarters."""
    from ringmpi.tools.precision import CASES, study
    res = study([2, 8, 64], 2048, "uniform")
    for half, eps in (("float16", 2.0 ** -11), ("bfloat16", 2.0 ** -8)):
        wide, hops = res[f"ring {half}, float32 partials"], res[f"ring {half}, 16-bit hops"]
        assert all(mx <= eps * 1.01 for _, mx, _ in wide), wide
        assert hops[-1][1] > 4 * wide[-1][1] and hops[-1][2] > 2 * wide[-1][2], (hops, wide)
    f32 = get("allreduce", "ring").formula(8, 1 << 20, 4).busiest_sent
    assert get("allreduce", "ring").formula(8, 1 << 20, 2, partials=2).busiest_sent == f32 / 2
    assert get("allreduce", "ring").formula(8, 1 << 20, 2, partials=4).busiest_sent == f32 * 3 / 4
    assert {c.label for c in CASES} == set(res)


def test_the_lectures_float32_ring_difference_at_64_ranks():
    """The lecture: the ring's float32 sum at K = 64 differs from np.sum by about 1e-5."""
    from ringmpi.tools.precision import lecture_check
    worst, rel = lecture_check()
    assert 2e-6 < worst < 5e-5 and rel < 1e-6


def test_sim_time_rows_in_parallel_processes_read_as_in_one(monkeypatch):
    """`sim time` runs its rows in processes of their own when they are many messages; the table
    is the one a single process prints (but for each row's own wall time)."""
    import concurrent.futures
    import re

    from ringmpi.tools import explain
    submitted = []

    class Pool(concurrent.futures.ProcessPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(fn)
            return super().submit(fn, *args, **kwargs)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(explain, "PARALLEL_MESSAGES", 0)
    table = [explain.time_table("allreduce", 3 << 20, [8, 12], LECTURE, straggler=(None, 1.5), jobs=j) for j in (2, 1)]
    walls = [re.findall(r"\[\d+\.\d s\]", t) for t in table]
    assert len(submitted) == len(walls[0])
    assert len(walls[0]) == len(walls[1]) >= 10 and "slowed" in table[0] and "# p=12: rank 11 x1.5" in table[0]
    assert [re.sub(r"\[\d+\.\d s\]", "", t) for t in table[0:1]] == [re.sub(r"\[\d+\.\d s\]", "", table[1])]


def test_sim_time_forks_only_a_process_without_threads_or_mpi(monkeypatch):
    """A forked process needs no imports (the rows start at once), but a fork of a process
    that runs threads or has loaded MPI is unsafe: then the processes are spawned."""
    import sys
    import threading

    from ringmpi.tools import explain
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert explain._start_method() == "fork"
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", types.ModuleType("mpi4py.MPI"))
    assert explain._start_method() == "spawn"
    monkeypatch.delitem(sys.modules, "mpi4py.MPI")
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert explain._start_method() == "spawn"
    finally:
        stop.set()
        worker.join()
