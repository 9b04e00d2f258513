"""Calibration recovers known parameters; auto picks the lowest prediction, keeps MPI's own
unless another is >= 10% faster, and never reuses a choice made under another profile."""
from __future__ import annotations

import types

import numpy as np
import pytest

from ringmpi import auto, settings
from ringmpi.calibrate import Sample, fit_profile, fit_quality, nnls
from ringmpi.call import Call
from ringmpi.collectives import SPECS
from ringmpi.cost import Profile
from ringmpi.model import cost
from ringmpi.ops import OPS
from ringmpi.schedules import names as algorithm_names
from ringmpi.tools.bench import exact_input
from ringmpi.transport import LRU
from ringmpi.units import human_bytes, parse_rate, parse_size, parse_time, size_label


def synthetic(prof: Profile, p: int):
    """Exact timings from the formulas. All-reduce alone moves 2 bytes per byte reduced in
    every algorithm, so beta and gamma are only separable with a collective that does not
    reduce (broadcast, all-gather): calibration measures them all for that reason."""
    out = []
    for coll, a in (("allreduce", "ring"), ("allreduce", "tree"), ("allreduce", "naive"),
                    ("broadcast", "tree"), ("allgather", "ring")):
        for n in (256, 4096, 65536, 1 << 20, 1 << 22):
            c = cost(coll, a, p, n, 4)
            out.append(Sample(coll, a, n, 4, c.time(prof)))
    return out


def test_nnls_recovers_parameters_exactly():
    true = Profile(alpha=7e-6, beta=1 / 9e9, gamma=1 / 4e9, overhead=12e-6)
    got = fit_profile(synthetic(true, 4), 4)
    assert got.alpha == pytest.approx(true.alpha, rel=1e-6)
    assert got.beta == pytest.approx(true.beta, rel=1e-6)
    assert got.gamma == pytest.approx(true.gamma, rel=1e-6)
    assert got.overhead == pytest.approx(true.overhead, rel=1e-6)
    assert fit_quality(synthetic(true, 4), got, 4)["max_rel_err"] < 1e-6


def test_nnls_never_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])  # unconstrained slope would be -1
    x = nnls(a, b)
    assert np.all(x >= 0)


def test_p2p_samples_and_tuning_table():
    true = Profile(alpha=3e-6, beta=1 / 5e9, gamma=0.0, overhead=0.0)
    samples = [Sample("p2p", "sendrecv", n, 1, true.alpha + n * true.beta) for n in (1, 1000, 10**6)]
    prof = fit_profile(samples + [Sample("allreduce", "mpi", 100, 4, 9e-6)], 2)
    # a point-to-point round alone cannot tell per-call overhead from alpha: their sum is fixed
    assert prof.alpha + prof.overhead == pytest.approx(3e-6, rel=1e-6)
    assert prof.beta == pytest.approx(1 / 5e9, rel=1e-6)
    assert prof.measured == {"allreduce": {"mpi": [[400, 9e-6]]}}


def fake_transport(prof, size=4, other=None):
    """The per-communicator state auto keeps (a transport's profile, choices and tuners);
    `other(values)` is another rank's contribution to online tuning's MAX exchanges."""
    t = types.SimpleNamespace(rank=0, size=size, nodes=[0] * size, profile=None, choices=LRU(8), tuners=LRU(8),
                              on_device=False, nonblocking=False, mpi_serves=lambda call: True,
                              allreduce_max=lambda v: [max(a, b) for a, b in zip(v, other(v))] if other else v)
    auto.set_profile(t, prof)
    return t


def choose(t, collective, count, itemsize=4, full=False):
    dtype = np.dtype(f"f{itemsize}")
    op = "SUM" if SPECS[collective].reduces else None
    c = auto.choose(t, Call(SPECS[collective], np.empty(0, dtype), None, count, op))
    return c if full else c["algorithm"]


@pytest.fixture(autouse=True)
def plain_settings():
    settings.reload({"RINGMPI_TUNE": "0"})  # the profile's prediction alone; online tuning below
    yield
    settings.reload()


def explore(t, collective, count, speed):
    """Drive the bucket's exploration to its decision, every call taking speed[name]."""
    first = choose(t, collective, count, full=True)
    tuner, c, calls = first["tuner"], first, []
    while tuner.winner is None:
        calls.append(c["algorithm"])
        tuner.done(t, c["algorithm"], speed[c["algorithm"]])
        if tuner.winner is None:
            c = choose(t, collective, count, full=True)
    return tuner, calls


def test_online_tuning_explores_then_picks_the_fastest_over_ranks():
    """Every candidate once untimed and twice timed, back to back, MAX over ranks (a
    candidate fast here but slow on another rank loses); those within 2x five more calls
    each (MPI's own always stays, and so do ringmpi's two fastest)."""
    settings.reload({})
    exchanges = []

    def rank1(v):  # rank 1 found the first candidate slow in stage 1
        exchanges.append(v)
        return [1.0] + list(v[1:]) if len(exchanges) == 1 else v
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2, other=rank1)
    names = choose(t, "allreduce", 1000, full=True)["tuner"].candidates
    t.tuners.clear()
    speed = {a: 10e-6 * (i + 1) for i, a in enumerate(names)}   # here: names[0] is fastest
    assert names[-1] == "mpi"
    tuner, calls = explore(t, "allreduce", 1000, speed)
    best = speed[names[1]]                                     # names[0] lost on rank 1
    stage1 = [a for a in names[1:] if speed[a] <= 2.0 * best or a == "mpi"]
    assert "mpi" in names and calls == [a for a in names for _ in "utt"] + [a for a in stage1 for _ in "utttt"]
    assert all(calls.count(a) == 3 for a in names if a not in stage1)  # the slow ones: three calls
    assert tuner.winner == names[1] and tuner.tuned[names[0]] == 1.0
    assert choose(t, "allreduce", 1000) == names[1]
    assert choose(t, "allreduce", 900) == names[1]           # same size bucket (2-4 KiB): same tuner
    assert choose(t, "allreduce", 3000, full=True)["why"] == "online tuning: exploring"  # next bucket


def test_close_candidates_get_a_second_stage():
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    names = choose(t, "allreduce", 1000, full=True)["tuner"].candidates
    t.tuners.clear()
    speed = {a: 10e-6 if a in names[:2] else 50e-6 for a in names}
    speed[names[1]] = 10.5e-6
    tuner, calls = explore(t, "allreduce", 1000, speed)
    close = [a for a in names if a in (names[0], names[1], "mpi")]
    assert calls == [a for a in names for _ in "utt"] + [a for a in close for _ in "utttt"]
    assert tuner.winner == names[0]
    assert tuner.exploration_cost == pytest.approx(sum(speed[c] - 10e-6 for c in calls))


def test_online_tuning_switches_only_past_the_hysteresis():
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    tuner = auto.Tuner(("allreduce", "float32", "SUM", 10, ()), ["mpi", "ring"],
                       seed={"winner": "mpi", "tuned": {"mpi": 10e-6, "ring": 12e-6}})
    for _ in range(tuner.CHECK):  # 12.9 us: slower than it was, but not 10% over ring's 12 us
        assert tuner.done(t, "mpi", 12.9e-6) is False
    assert tuner.winner == "mpi"
    changed = [tuner.done(t, "mpi", 13.5e-6) for _ in range(tuner.CHECK)]
    assert changed[-1] is True and tuner.winner == "ring" and tuner.tuned["mpi"] == pytest.approx(13.5e-6)


def test_one_preempted_call_does_not_rule_out_the_fastest():
    """Stage 0 keeps a candidate by the faster of its two calls: "ring" (10 us a call) had its
    timed stage-0 call stretched 10x by a preemption, its cold call was 15 us; it goes on
    to stage 1 and wins (with one timed call it was pruned, 100 us against mpi's 18)."""
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    tuner = auto.Tuner(("allreduce", "float32", "SUM", 17, ()), ["mpi", "ring"])
    seen: dict = {}
    while tuner.winner is None:
        name = tuner.pick()["algorithm"]
        seen[name] = seen.get(name, 0) + 1
        if name == "ring":
            took = {1: 15e-6, 2: 100e-6}.get(seen[name], 10e-6)
        else:
            took = 18e-6
        tuner.done(t, name, took)
    assert seen["ring"] > 2 and tuner.winner == "ring"


def test_calls_still_paying_for_the_switch_do_not_decide():
    """MPI's own 512 KiB broadcast on shared memory, measured: after another algorithm's calls
    and one untimed call of its own it took 45, 25, 22 us, then 17-19 us a call; "naive"
    took 25-26 us every call. Scored by the mean of three calls, MPI's own lost (30.7 us
    against 25.3) and the broadcast ran at twice plain mpi4py's time; without the slowest of
    four it wins."""
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    tuner = auto.Tuner(("broadcast", "uint8", None, 20, ()), ["naive", "mpi"])
    since, last = 0, None
    while tuner.winner is None:
        name = tuner.pick()["algorithm"]
        since = since + 1 if name == last else 0
        last = name
        took = (60e-6, 45e-6, 25e-6, 22e-6)[since] if name == "mpi" and since < 4 else 18e-6 if name == "mpi" else \
            (25e-6, 26e-6)[since % 2]
        tuner.done(t, name, took)
    assert tuner.winner == "mpi", tuner.tuned


def test_an_algorithm_still_paying_for_the_switch_in_stage_0_goes_on():
    """64 KiB all-reduce, 2 ranks, measured: recursive doubling takes 13-15 us a call in a
    loop, MPI's own 17, but just after another algorithm's calls its first two took 36-48
    us. Timed once after the cold call, it was pruned in stage 0 (2x MPI's own) and requests,
    which choose among ringmpi's by their tuned times, ran tree or rabenseifner at 1.5-2x
    its time. Now stage 0 times two calls after the cold one, and ringmpi's two fastest go
    on to stage 1 whatever: it wins."""
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    tuner = auto.Tuner(("allreduce", "float32", "SUM", 17, ()), ["recursive_doubling", "tree", "mpi"])
    since, last = 0, None
    while tuner.winner is None:
        name = tuner.pick()["algorithm"]
        since = since + 1 if name == last else 0
        last = name
        if name == "recursive_doubling":
            took = (60e-6, 45e-6)[since] if since < 2 else 14e-6
        else:
            took = {"mpi": 17e-6, "tree": 25e-6}[name]
        tuner.done(t, name, took)
    assert tuner.winner == "recursive_doubling" and tuner.tuned["recursive_doubling"] == pytest.approx(14e-6)


def test_a_winner_far_slower_than_it_was_tuned_sends_the_bucket_back_to_exploring():
    """A winner chosen on times from another state (a cold start, a noisy moment: "tree"
    tuned at 10 us, the others at 40-45) that runs at 3x its tuned time in steady state,
    with no other tuned time 10% below it: the candidates are explored afresh, and the
    times of now decide; at most REEXPLORES times a bucket."""
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    key = ("allreduce", "float32", "SUM", 17, ())
    tuner = auto.Tuner(key, ["mpi", "tree", "ring"], seed={"winner": "tree",
                                                           "tuned": {"tree": 10e-6, "mpi": 40e-6, "ring": 45e-6}})

    def explore_at(times: dict) -> None:
        while tuner.winner is None:
            name = tuner.pick()["algorithm"]
            tuner.done(t, name, times[name])
    changed = [tuner.done(t, "tree", 30e-6) for _ in range(tuner.CHECK)]
    assert changed[-1] is True and not any(changed[:-1]) and tuner.winner is None
    now = {"mpi": 10e-6, "tree": 40e-6, "ring": 45e-6}
    explore_at(now)
    assert tuner.winner == "mpi" and tuner.tuned == pytest.approx(now) and tuner.exploration_cost is not None
    for _ in range(auto.Tuner.REEXPLORES - 1):   # mpi now 3x its tuned time, below the others: again
        assert [tuner.done(t, "mpi", 30e-6) for _ in range(tuner.CHECK)][-1] is True and tuner.winner is None
        explore_at(now)
    assert tuner.reexplored == auto.Tuner.REEXPLORES and tuner.winner == "mpi"
    assert not any(tuner.done(t, "mpi", 30e-6) for _ in range(tuner.CHECK)) and tuner.winner == "mpi"


def test_monitoring_costs_about_one_percent_of_the_bucket():
    """A settled bucket times one call in `sample`: rarely for microsecond calls (a timed
    call costs ~0.5 us of bookkeeping), often for long ones, within [4, 256]; the rate comes
    from the tuned times, which every rank shares, and follows a switch of the winner."""
    key = ("allreduce", "float32", "SUM", 10, ())
    rate = {w: auto.Tuner(key, ["mpi", "ring"], seed={"winner": "mpi", "tuned": {"mpi": w, "ring": 2 * w}}).sample
            for w in (1e-7, 1e-6, 1e-5, 1e-3)}
    assert rate == {1e-7: 256, 1e-6: 50, 1e-5: 5, 1e-3: 4}
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    tuner = auto.Tuner(key, ["mpi", "ring"], seed={"winner": "mpi", "tuned": {"mpi": 1e-6, "ring": 1e-5}})
    assert tuner.sample == 50
    timed = [tuner.pick()["timed"] for _ in range(150)]   # the one countdown: every 50th call timed
    assert [i for i, x in enumerate(timed) if x] == [49, 99, 149]
    for _ in range(tuner.CHECK):             # mpi now 20 us: past ring's 10 us, switch
        tuner.done(t, "mpi", 2e-5)
    assert tuner.winner == "ring" and tuner.sample == 5


def test_a_request_runs_mpi_s_own_only_where_measured_far_faster():
    """A request takes the algorithm online tuning measured fastest for blocking calls, but
    MPI's own only where it is REQUEST_MARGIN times faster than ringmpi's best (its
    nonblocking collective is another implementation); an algorithm that cannot run as a
    request is passed over. With margin 1 (the drop-in's: its caller asked for MPI's own),
    whatever was measured fastest, MPI's own included; with a request's own cost added to
    ringmpi's (the drop-in's `REQUEST_S`), MPI's own also where ringmpi's was faster by less
    than that cost."""
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    view = types.SimpleNamespace(**vars(t))
    call = Call(SPECS["allreduce"], np.empty(0, np.float32), None, 16384, "SUM")
    names = choose(t, "allreduce", 16384, full=True)["tuner"].candidates
    assert "mpi" in names and "recursive_doubling" in names
    for mpi, ours, want in ((16e-6, 17e-6, "recursive_doubling"),   # MPI's own barely faster
                            (1e-6, 15e-6, "mpi"),                    # far faster: kept
                            (20e-6, 17e-6, "recursive_doubling"),    # not the winner at all
                            (40e-6, 17e-6, "recursive_doubling")):   # nor with a request's cost added
        t.tuners.clear()
        speed = {a: mpi if a == "mpi" else ours if a == "recursive_doubling" else 1.0 for a in names}
        tuner, _ = explore(t, "allreduce", 16384, speed)
        got = auto.choose_request(view, t, call)
        assert got["algorithm"] == want, (mpi, ours, got)
        assert ("ringmpi's measured" in got["why"]) == (tuner.winner != want)
        asked = auto.choose_request(view, t, call, auto.Margins(1.0, 1.0))
        assert asked["algorithm"] == tuner.winner == ("mpi" if mpi < ours else "recursive_doubling"), (mpi, ours, asked)
        costed = auto.choose_request(view, t, call, auto.Margins(1.0, 1.0, 5e-6))
        assert costed["algorithm"] == ("mpi" if mpi <= ours + 5e-6 else "recursive_doubling"), (mpi, ours, costed)
        assert ("within 5 us of" in costed["why"]) == (costed["algorithm"] != tuner.winner), costed


def test_a_request_weighs_its_own_cost_where_only_predicted():
    """Without online tuning, a request's choice between ringmpi's best predicted algorithm
    and MPI's own adds the request's own cost (`Margins.seconds`) to ringmpi's: where MPI's
    own is predicted fastest but not REQUEST_MARGIN times faster, ringmpi's runs; where a
    request of ringmpi's costs a second more, MPI's own does."""
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=8)
    t.request_choices = LRU(8)
    view = types.SimpleNamespace(**vars(t))
    call = Call(SPECS["allreduce"], np.empty(0, np.float32), None, 1 << 24, "SUM")
    preds = auto.choose_request(view, t, call, auto.Margins(1.0, 1.0))["predicted_s"]
    ours = min(s for a, s in preds.items() if a != "mpi")
    assert preds["mpi"] <= ours < auto.REQUEST_MARGIN * preds["mpi"], preds
    assert auto.choose_request(view, t, call)["algorithm"] != "mpi"
    costed = auto.choose_request(view, t, call, auto.Margins(seconds=1.0))
    assert costed["algorithm"] == "mpi", costed


def test_candidates_predicted_far_slower_are_never_tried():
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=8)
    tuner = choose(t, "allreduce", 1 << 24, full=True)["tuner"]  # 64 MiB on 8 ranks
    assert "mpi" in tuner.candidates and "ring" in tuner.candidates
    assert "naive" not in tuner.candidates and "tree" not in tuner.candidates


def test_learned_choices_seed_the_next_run(tmp_path):
    settings.reload({"RINGMPI_PROFILE": str(tmp_path / "p.json")})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, world_size=2), size=2)
    names = choose(t, "allreduce", 1000, full=True)["tuner"].candidates
    t.tuners.clear()
    tuner, _ = explore(t, "allreduce", 1000, {a: 1e-6 if a == "ring" else 2e-6 for a in names})
    assert tuner.winner == "ring"
    path = auto.save_learned(t)
    fresh = fake_transport(Profile.load(path), size=2)
    c = choose(fresh, "allreduce", 1000, full=True)
    assert c["algorithm"] == "ring" and c["why"] == "online tuning: the fastest measured"


def test_auto_interpolates_measurements_and_keeps_mpi_within_margin():
    base = Profile(alpha=5e-6, beta=1 / 5e9, gamma=0, overhead=0)
    meas = {"allreduce": {"mpi": [[4, 10e-6], [4000, 20e-6]], "ring": [[4, 9.5e-6], [4000, 10e-6]]}}
    prof = Profile(**{**vars(base), "measured": meas, "world_size": 4})
    t = fake_transport(prof)
    assert auto.predict_time("allreduce", "mpi", 4, 1000, 4, prof) == pytest.approx(20e-6)
    # at 1 element ring is 5% faster than mpi: not enough, mpi is kept
    assert choose(t, "allreduce", 1) == "mpi"
    # at 1000 elements ring is measured 2x faster
    assert choose(t, "allreduce", 1000) == "ring"
    # outside the measured range the formula decides (ring is bandwidth optimal here)
    big = {a: auto.predict_time("allreduce", a, 4, 1 << 24, 4, prof) for a in algorithm_names("allreduce")}
    assert big["ring"] == pytest.approx(cost("allreduce", "ring", 4, 1 << 24, 4).time(prof))


def test_auto_cache_is_per_profile():
    """A choice made under one profile is never served under another."""
    meas_fast_mpi = {"allreduce": {"mpi": [[1, 1e-6], [1 << 20, 1e-5]]}}
    meas_slow_mpi = {"allreduce": {"mpi": [[1, 1.0], [1 << 20, 1.0]]}}
    net = dict(alpha=1e-6, beta=1e-10, world_size=4)
    t = fake_transport(Profile(**net, measured=meas_fast_mpi))
    first = choose(t, "allreduce", 1 << 16)
    auto.set_profile(t, Profile(**net, measured=meas_slow_mpi))
    second = choose(t, "allreduce", 1 << 16)
    assert first == "mpi"
    assert first != second


def test_choice_cache_is_bounded():
    t = fake_transport(Profile(alpha=1e-6, beta=1e-9))
    for n in range(100):
        choose(t, "allreduce", n)
    assert len(t.choices) == t.choices.maxsize == 8


def test_forced_algorithm():
    settings.reload({"RINGMPI_ALGO": "broadcast=tree,ring"})
    t = fake_transport(Profile(alpha=1e-6, beta=1e-9))
    assert choose(t, "broadcast", 10) == "tree"
    assert choose(t, "allreduce", 10) == "ring"
    assert choose(t, "allgather", 10) == "ring"
    assert choose(t, "reduce", 10) == "ring"
    settings.reload({"RINGMPI_ALGO": "allreduce=bogus"})
    with pytest.raises(ValueError, match="unknown algorithm 'bogus' for allreduce"):
        choose(t, "allreduce", 10)


def test_profile_roundtrip(tmp_path):
    prof = Profile(alpha=1e-6, beta=2e-10, gamma=3e-10, overhead=4e-6, name="x", world_size=3,
                   measured={"allreduce": {"mpi": [[8, 1e-6]]}})
    prof.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == prof


def test_units():
    """One size parser everywhere: binary multiples as nccl-tests (K = KB = KiB = 1024);
    decimal sizes are written as numbers; rates are decimal GB/s as in nccl-tests' columns."""
    assert parse_size("1K") == parse_size("1KB") == parse_size("1KiB") == 1024
    assert parse_size("64MB") == parse_size("64M") == 64 << 20 and parse_size("256KiB") == 262_144
    assert parse_size("10") == 10 and parse_size("64e6") == 64_000_000 and parse_size("1.5K") == 1536
    for bad in ("1X", "-5", "abc", "", "0.5"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert parse_time("5us") == pytest.approx(5e-6) and parse_time("20ms") == pytest.approx(0.02)
    assert parse_rate("25GB/s") == 25e9 and parse_rate("1Gbit/s") == 1.25e8
    assert human_bytes(65536) == "64 KiB" and size_label(1 << 24) == "16M" and size_label(1536) == "1.5K"


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int32", "uint16", "complex64"])
@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX", "MIN"])
def test_bench_inputs_reduce_exactly_in_any_order(dtype, op):
    dt = np.dtype(dtype)
    if dt.kind == "c" and op in ("MAX", "MIN"):
        return
    p, n = 8, 1000
    xs = [exact_input(r, p, n, dt, op) for r in range(p)]
    rng = np.random.default_rng(0)
    ref = None
    for _ in range(5):
        order = rng.permutation(p)
        acc = xs[order[0]].copy()
        for r in order[1:]:
            OPS[op](acc, xs[r], out=acc)
        if ref is None:
            ref = acc
        assert np.array_equal(acc, ref)
    if op == "PROD":
        assert np.all(ref == 2)


def test_unphysical_fits_are_not_saved():
    from ringmpi.calibrate import unphysical
    direct = {"beta": 1 / 10e9}
    good = Profile(alpha=2e-6, beta=1 / 9e9, gamma=1 / 20e9, meta={"direct": direct, "fit": {"median_rel_err": 0.1}})
    assert unphysical(good) is None
    assert "bound" in unphysical(Profile(**{**vars(good), "alpha": 0.0}))
    assert "twice what the exchanges measured" in unphysical(Profile(**{**vars(good), "beta": 1 / 50e9}))
    assert "miss the measurements by 70%" in unphysical(
        Profile(**{**vars(good), "meta": {"direct": direct, "fit": {"median_rel_err": 0.7}}}))
    assert "not measured directly" in unphysical(Profile(alpha=1e-6, beta=1e-10))


def test_no_profile_makes_the_pipeline_explode():
    """Whatever alpha a profile holds, a pipelined broadcast keeps segments of >= 1 KiB."""
    from ringmpi.schedules import get
    for alpha in (0.0, 1e-15, 5e-6):
        s = get("broadcast", "pipeline").tuned(8, 1 << 24, 4, Profile(alpha=alpha, beta=1e-10))["segments"]
        assert 1 <= s <= (1 << 26) // 1024


def test_a_failed_exploration_call_is_retried_not_skipped():
    """A call that raises (a bad buffer) between pick and done leaves the exploration step
    to the next call: the schedule is walked in full, never past its end."""
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    tuner = auto.Tuner(("allreduce", "float32", "SUM", 10, ()), ["mpi", "ring"])
    walked = []
    while tuner.winner is None:
        first = tuner.pick()["algorithm"]
        again = tuner.pick()["algorithm"]          # the first call failed: same step again
        assert again == first
        walked.append(first)
        tuner.done(t, first, 1e-6 if first == "ring" else 2e-6)
    assert walked[:6] == ["mpi"] * 3 + ["ring"] * 3 and tuner.winner == "ring"
    assert tuner.pick()["algorithm"] == "ring"


def test_close_candidates_are_scored_by_their_mean_in_a_loop():
    """Stage 1 scores the mean of calls back to back after an untimed one, but the slowest: a
    rank's fastest calls (the ones it came late to) and the first call after a switch
    mislead. Here "mpi" alternates 38 and 12 us (stage 1 timed: 12, 38, 12, 38; but the
    slowest, mean 20.7; its fastest: 12), the other takes 18 us a call after a first call of
    200 us: the other wins."""
    settings.reload({})
    t = fake_transport(Profile(alpha=5e-6, beta=1 / 5e9, gamma=1 / 10e9), size=2)
    names = choose(t, "allreduce", 1000, full=True)["tuner"].candidates
    other = next(a for a in names if a != "mpi")
    t.tuners.clear()

    def took(a: str, k: int) -> float:   # the k-th call of `a` since another algorithm's
        if a == "mpi":
            return 12e-6 if k % 2 else 38e-6
        return (200e-6 if k == 0 else 18e-6) if a == other else 1e-3
    first = choose(t, "allreduce", 1000, full=True)
    tuner, c, seen, last = first["tuner"], first, {}, None
    while tuner.winner is None:
        a = c["algorithm"]
        seen[a] = 0 if a != last else seen[a] + 1
        last = a
        tuner.done(t, a, took(a, seen[a]))
        if tuner.winner is None:
            c = choose(t, "allreduce", 1000, full=True)
    assert tuner.winner == other and tuner.tuned[other] == pytest.approx(18e-6), tuner.tuned
    assert tuner.tuned["mpi"] == pytest.approx(62e-6 / 3)
