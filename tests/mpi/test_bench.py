"""The benchmark end to end under mpirun: exit status, files, #wrong that can fail."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi
from ringmpi import auto, schedules, settings
from ringmpi.collectives import SPECS
from ringmpi.tools.cli import main

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank
ARGS = ["-b", "1K", "-e", "16K", "-f", "4", "-n", "4", "-w", "1", "--rounds", "2", "--no-progress"]


@pytest.fixture
def shared_dir():
    d = COMM.bcast(tempfile.mkdtemp(prefix="ringmpi-bench-") if R == 0 else None, 0)
    yield Path(d)


@pytest.fixture(autouse=True)
def keep_profile():
    from ringmpi.mpicomm import transport
    t = transport()
    saved = t.profile
    yield
    auto.set_profile(t, saved) if saved is not None else setattr(t, "profile", None)


def test_bench_report(shared_dir, capsys):
    rc = main(["bench", *ARGS, "--out", str(shared_dir / "r")])
    assert COMM.allgather(rc) == [0] * P
    assert not auto.profile_path(P).exists(), "a plain benchmark wrote the profile auto reads"
    if R == 0:
        out = capsys.readouterr().out
        assert "# Out of bounds values : 0 OK" in out and "# Avg bus bandwidth" in out
        assert "busbw = algbw x 2(n-1)/n" in out
        data = json.loads((shared_dir / "r" / "bench.json").read_text())
        rows = data["rows"]
        assert data["banner"]["ranks"] == P and "Open MPI" in data["banner"]["mpi_library"] or \
            "MPICH" in data["banner"]["mpi_library"] or data["banner"]["mpi_library"]
        assert {r["collective"] for r in rows} == set(SPECS)
        assert all(r["wrong"] == 0 for r in rows)
        for coll in SPECS:
            algs = {r["algorithm"] for r in rows if r["collective"] == coll}
            assert algs == set(ringmpi.algorithms(coll, COMM)), coll  # MPI's own always included
        ring = [r for r in rows if r["collective"] == "allreduce" and r["algorithm"] == "ring" and r["placement"] == "out"]
        for r in ring:  # counters: rank q sends every block but q+1, then every block but q+2
            c = schedules.block_counts(r["count"], P)
            expect = max(2 * r["count"] - c[(q + 1) % P] - c[(q + 2) % P] for q in range(P)) if P > 1 else 0
            assert r["sent_bytes"] == expect * 4
            assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (P - 1) / P)
            assert r["ratio_mpi"] > 0
        # auto beside the fastest at every size, in place too (not for the rooted collectives)
        places = {s.name: 2 if s.has_out_of_place and not s.rooted else 1 for s in SPECS.values()}
        assert len(data["auto"]) == 3 * sum(places.values())
        assert {(a["collective"], a["placement"]) for a in data["auto"]} >= {("allreduce", "in"), ("allreduce", "out")}
        for f in ("report.md", "bench.csv", "profile.json", "bench.json"):
            data_bytes = (shared_dir / "r" / f).read_bytes()
            assert data_bytes and b"\x00" not in data_bytes and b"\\u0000" not in data_bytes, f  # text, not binary
        assert "busbw.png" in (shared_dir / "r" / "report.md").read_text()


def test_wrong_results_are_counted_and_fail_the_run(shared_dir, monkeypatch, capsys):
    """A deliberately broken algorithm must show up in #wrong and the exit status."""
    real = schedules.get("allreduce", "ring")

    class Broken(schedules.Algorithm):
        def run(self, t, call):
            super().run(t, call)
            if t.rank == 0 and call.recv.size:
                call.recv[0] += 1
    monkeypatch.setitem(schedules._REGISTRY, ("allreduce", "ring"), Broken("allreduce", "ring", real.body, real.cost))
    rc = main(["bench", *ARGS, "-C", "allreduce", "-A", "ring", "--quiet"])
    assert COMM.allgather(rc) == [1] * P
    if R == 0:
        assert "# Out of bounds values : 6 FAILED" in capsys.readouterr().out  # 3 sizes x 2 placements


def test_calibrate_saves_profile_that_auto_loads(shared_dir, monkeypatch):
    monkeypatch.setenv("RINGMPI_PROFILE", str(shared_dir))
    settings.reload()
    # --force: whether a fit on a loaded, oversubscribed machine looks physical is the
    # machine's business (tests/unit test the refusal); here, that a saved profile is loaded
    rc = main(["calibrate", "-b", "1K", "-e", "64K", "-f", "8", "-C", "allreduce,broadcast", "--force"])
    assert rc == 0
    path = shared_dir / f"profile-p{P}.json"
    if R == 0:
        assert path.exists()
    COMM.barrier()
    from ringmpi.mpicomm import transport
    t = transport()
    t.profile = None  # reload from disk through rank 0 + broadcast
    prof = auto.profile_of(t)
    assert prof.world_size == P and prof.measured["allreduce"]["mpi"]
    x = np.ones(1000, np.float32)
    from ringmpi import allreduce
    assert np.all(allreduce(x) == P)
    monkeypatch.undo()
    settings.reload()


def test_average_mode_json_and_bands(shared_dir, capsys):
    """-a picks the time column like nccl-tests (3 = max over ranks); -J writes the rows."""
    path = shared_dir / "rows.json"
    rc = main(["bench", *ARGS, "-C", "allreduce", "-A", "ring", "-a", "3", "-J", str(path)])
    assert rc == 0
    if R == 0:
        rows = json.loads(path.read_text())["rows"]
        assert rows and all(r["time_us"] == r["time_max_us"] >= r["time_avg_us"] >= r["time_min_us"] for r in rows)
        assert "# fastest by size band, allreduce: " in capsys.readouterr().out


def test_bench_on_the_stand_in_device(shared_dir, capsys):
    """--device fake: every collective on device buffers (staged, reduced on the device),
    checked (#wrong 0), MPI's own staged whole as the reference, the D2H rate in the banner;
    --device cuda without cupy is a one-line usage error."""
    rc = main(["bench", *ARGS, "--device", "fake", "--out", str(shared_dir / "d")])
    assert COMM.allgather(rc) == [0] * P
    if R == 0:
        out = capsys.readouterr().out
        assert "# --device fake: buffers on the device" in out and "device-to-host copy" in out
        data = json.loads((shared_dir / "d" / "bench.json").read_text())
        assert data["banner"]["backend"] == "fake-device" and data["banner"]["d2h_GBps"] > 0
        rows = data["rows"]
        assert {r["collective"] for r in rows} == set(SPECS) and all(r["wrong"] == 0 for r in rows)
        if P > 1:   # (on one rank every algorithm is a local copy, which device buffers take)
            assert not {r["algorithm"] for r in rows} & {"ring_shm", "pipeline_shm", "hierarchical", "hierarchical_oneway"}
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert main(["bench", *ARGS, "--device", "cuda"]) == 2
        if R == 0:
            assert "--device cuda needs cupy" in capsys.readouterr().err


def test_train_on_cuda_without_cupy_is_a_usage_error(capsys):
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed: tests/gpu trains on the device")
    except ImportError:
        pass
    assert main(["train", "--device", "cuda", "--steps", "1", "--quiet"]) == 2
    assert "--device cuda: device 'cuda' needs cupy" in capsys.readouterr().err


def test_info_says_what_the_mpi_reads_and_how_it_was_decided(capsys):
    assert COMM.allgather(main(["info"])) == [0] * P
    if R == 0:
        out = capsys.readouterr().out
        assert f"job: {P} rank(s) on " in out and "MPI library: " in out
        assert "reads CUDA device memory: no (" in out   # neither wheel reads device memory
        assert "mpi_memory_alloc_kinds" in out or "MPIX_Query_cuda_support() = 0" in out
        assert "all-reduce algorithms that can run here: ring" in out
