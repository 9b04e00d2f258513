"""The cost model pins the lecture's numbers (section 3 and the exercises)."""
from __future__ import annotations

import pytest

from ringmpi import cost, model
from ringmpi.cost import LECTURE, Profile, best_segments, pipeline_time
from ringmpi.model import crossover, dp_step, predict


def test_pipelined_broadcast_best_segments():
    """p=8, N=64 MB, B=25 GB/s, alpha=5 us: best S ~ 55-64, 3.15 ms vs 17.96 ms unsegmented."""
    n, a, b = 64e6, 5e-6, 1 / 25e9
    s_best, s_star = best_segments(8, n, a, b)
    assert s_best == 55 and s_star == pytest.approx(55.4, abs=0.1)
    assert pipeline_time(8, n, s_best, a, b) == pytest.approx(3.1425e-3, rel=1e-3)
    assert pipeline_time(8, n, 64, a, b) == pytest.approx(3.15e-3, rel=1e-9)
    assert pipeline_time(8, n, 1, a, b) == pytest.approx(17.955e-3, rel=1e-9)
    # the registered algorithm's formula is the same formula
    assert predict("broadcast", "pipeline", 8, int(n), LECTURE, segments=64) == pytest.approx(3.15e-3, rel=1e-6)


def test_algorithm_ranking_and_crossovers():
    """p=8: naive fastest at 1-10 KB, tree at 100 KB, ring from 1 MB; ring = tree at ~235 KB."""
    def best(n):
        return min(("ring", "tree", "naive"), key=lambda a: predict("allreduce", a, 8, n, LECTURE))
    assert best(1000) == best(10_000) == "naive"
    assert best(100_000) == "tree"
    assert best(1_000_000) == best(100_000_000) == "ring"
    x = crossover("allreduce", "tree", "ring", 8, LECTURE)
    assert x == pytest.approx(8 * 5e-6 * 25e9 / 4.25, abs=8)  # 235.3 KB
    # exercise 7: ring = naive at 12 alpha B / 12.25 ~ 122 KB
    assert crossover("allreduce", "naive", "ring", 8, LECTURE) == pytest.approx(12 * 5e-6 * 25e9 / 12.25, abs=8)


def test_exercise_5_ring_allreduce():
    prof = Profile(alpha=10e-6, beta=1 / 25e9)
    assert predict("allreduce", "ring", 16, 10**9, prof) == pytest.approx(75.3e-3, rel=1e-9)
    latency = model.cost("allreduce", "ring", 16, 10**9).alphas * prof.alpha
    assert latency == pytest.approx(0.3e-3)


def test_exercise_6_pipeline():
    assert pipeline_time(4, 100e6, 1, 0, 1 / 10e9) == pytest.approx(30e-3)
    assert pipeline_time(4, 100e6, 100, 0, 1 / 10e9) == pytest.approx(10.2e-3)
    assert pipeline_time(4, 100e6, 100, 20e-6, 1 / 10e9) == pytest.approx(12.24e-3)


def test_exercise_8_parameter_server_vs_ring():
    from ringmpi.cost import parameter_server_time
    assert parameter_server_time(16, 2e9, 25e9, duplex=False) == pytest.approx(2.56)
    assert parameter_server_time(16, 2e9, 25e9, duplex=True) == pytest.approx(1.28)
    assert predict("allreduce", "ring", 16, int(2e9), Profile(alpha=0, beta=1 / 25e9)) == pytest.approx(0.15)


def test_data_parallel_speedups():
    """20 ms step, ring all-reduce at 5 us / 25 GB/s: 6.12x, 2.09x, 0.77x; exercise 11."""
    assert dp_step(20e-3, 8, 10e6).speedup == pytest.approx(6.12, abs=0.005)
    assert dp_step(20e-3, 8, 100e6).speedup == pytest.approx(2.09, abs=0.005)
    assert dp_step(20e-3, 2, 400e6).speedup == pytest.approx(0.77, abs=0.005)
    no_alpha = Profile(alpha=0, beta=1 / 25e9)
    got = [dp_step(0.1, k, 1e9, no_alpha).speedup for k in (2, 4, 8)]
    assert got == pytest.approx([1.11, 1.18, 1.21], abs=0.005)
    s = dp_step(0.1, 2, 1e9, no_alpha)
    assert s.comm_fraction == pytest.approx(40 / 90)


def test_scale_estimates():
    """Section 1 and exercise 1: 6ND, 16 bytes per parameter, GPU-hours, MFU."""
    assert cost.gpu_hours(cost.train_flops(70e9, 2e12), 350e12) == pytest.approx(666_667, rel=1e-5)
    assert cost.gpu_hours(cost.train_flops(70e9, 2e12), 350e12) / 1024 / 24 == pytest.approx(27.1, abs=0.1)
    assert cost.training_state_bytes(405e9) == pytest.approx(6.48e12)
    assert cost.model_parallel_share(405e9, 8, 16) == pytest.approx(50.6e9, rel=1e-3)
    assert cost.mfu(405e9, 15.6e12, 30.84e6, 989e12) == pytest.approx(0.345, abs=0.001)
    assert cost.mfu(37e9, 14.8e12, 2.664e6, 989e12) == pytest.approx(0.346, abs=0.001)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 16, 64])
def test_ring_traffic_is_bandwidth_optimal(p):
    """Every rank sends 2(p-1)/p N: busiest = average, independent of p (section 3.2)."""
    c = model.cost("allreduce", "ring", p, 256 * 1024 * p)
    assert c.busiest_sent == c.avg_sent == 2 * (p - 1) * 256 * 1024
    assert c.rounds == 2 * (p - 1)
