"""The command line refuses nonsense with a one-line error and a non-zero exit status, never
a traceback; and its commands that need no MPI never start it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

BAD = [
    ("bench -b 1X", "unknown unit"),
    ("bench -d float33", "-d float33"),
    ("bench -C bogus", "-C bogus"),
    ("bench -b 16M -e 1K", "is above -e"),
    ("bench -A bogus", "unknown algorithm"),
    ("bench -A ring -C broadcast", "broadcast has none of them"),
    ("bench -f 1", "must be above 1"),
    ("bench -b 1 -e 1G -f 1.01", "more than 64 sizes"),
    ("bench -n 0", "at least one iteration"),
    ("bench -w -1", "cannot be negative"),
    ("bench --rounds 0", "at least one round"),
    ("bench -r -1", "the root is a rank"),
    ("bench -c 2", "expected 0 or 1"),
    ("bench -o median", "-o median"),
    ("bench -a 7", "invalid choice"),
    ("bench -r 7 -b 1K -e 1K -C allreduce", "the root must be a rank below 1"),
    ("calibrate --export bogus x.rules", "--export bogus"),
    ("model segments --size -5", "non-negative number"),
    ("model segments --alpha 0", "must be above 0"),
    ("model segments --size 1X", "unknown unit"),
    ("model speedup --step 5parsecs", "unknown unit"),
    ("model predict --collective bogus", "invalid choice"),
    ("model bogus", "invalid choice"),
    ("sim table --workers 100", "at most 26 workers"),
    ("sim table --workers 0", "must be >= 1"),
    ("sim traffic --workers two", "comma-separated integers"),
    ("sim time --bandwidth 25furlongs", "unknown unit"),
    ("sim time --nodes 4", "give --per-node too"),
    ("sim time --per-node -2", "non-negative integer"),
    ("sim time --straggler 0.5", "factor >= 1"),
    ("sim time --slow-link 1:1=2", "two different ranks"),
    ("sim time --workers 4 --straggler 9=2 --size 1K", "slow rank 9"),
    ("sim time --slow-link 0-1", "SRC:DST=FACTOR"),
    ("bench -R 2", "invalid choice"),
    ("train --steps 0", "must be above 0"),
    ("train --batch -3", "must be above 0"),
    ("train --algorithm bogus", "invalid choice"),
    ("train --dtype float16", "invalid choice"),
    ("bogus", "invalid choice"),
]
SETTINGS = [
    ({"RINGMPI_DEBUG": "1"}, "RINGMPI_DEBUG='1'"),
    ({"RINGMPI_ALGO": "allreduce=bogus"}, "unknown algorithm 'bogus' for allreduce"),
    ({"RINGMPI_CHECK": "yes"}, "RINGMPI_CHECK='yes'"),
    ({"RINGMPI_STALL_ABORT": "-1"}, "RINGMPI_STALL_ABORT='-1'"),
    ({"RINGMPI_TUNE": "maybe"}, "RINGMPI_TUNE='maybe'"),
]


def ringmpi(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RINGMPI_", "OMPI_COMM", "PMI", "PMIX"))}
    return subprocess.run([sys.executable, "-m", "ringmpi", *args], capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})})


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode not in (0, None), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and needle in errors[0], proc.stderr


@pytest.mark.parametrize("line,needle", BAD, ids=[b for b, _ in BAD])
def test_bad_command_lines(line, needle):
    assert_one_line_error(ringmpi(line.split()), needle)


@pytest.mark.parametrize("env,needle", SETTINGS, ids=[next(iter(e)) for e, _ in SETTINGS])
def test_bad_settings(env, needle):
    """Through a command whose calls use auto (where RINGMPI_ALGO applies)."""
    line = "bench -b 1K -e 1K -C allreduce -A ring -n 1 -w 0 --rounds 1 --no-progress --quiet"
    assert_one_line_error(ringmpi(line.split(), env), needle)


def test_launcher_refuses_no_ranks():
    proc = subprocess.run([sys.executable, "-m", "ringmpi.launch", "-n", "0", "--", "true"], capture_output=True,
                          text=True, timeout=60)
    assert_one_line_error(proc, "-n must be at least 1")


def test_help_and_version():
    assert ringmpi(["--version"]).stdout.startswith("ringmpi ")
    for sub in ("bench", "calibrate", "demo", "sim", "model", "train"):
        out = ringmpi([sub, "--help"]).stdout
        assert "(default:" in out or sub in ("demo",), sub  # every option shows its default
        assert "--help" in out


def test_the_launcher_of_the_programs_own_python_comes_first(tmp_path, monkeypatch):
    """A system python's folder may hold another MPI's mpirun (Debian's /usr/bin): the one
    beside the program's Python is the launcher of the MPI that program links."""
    from ringmpi.tools import launch
    mine, other = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin"
    for d in (mine, other):
        d.mkdir(parents=True)
        (d / "mpirun").write_text("#!/bin/sh\n")
    monkeypatch.delenv("MPIRUN", raising=False)
    monkeypatch.setattr(launch.sys, "executable", str(other / "python3"))
    assert launch.find_mpirun([str(mine / "python"), "x.py"]) == [str(mine / "mpirun")]
    assert launch.find_mpirun(["python", "x.py"]) == [str(other / "mpirun")]   # no folder: this Python's


def test_hosts_are_spelled_for_the_launcher(tmp_path, monkeypatch):
    from ringmpi.tools import launch
    monkeypatch.setenv("MPIRUN", "mpiexec")
    monkeypatch.setattr(launch, "open_mpi_version", lambda cmd: (5, 0, 11))
    assert launch.mpirun_command(2, ["prog"], hosts="a:1,b:1")[-3:] == ["--host", "a:1,b:1", "prog"]
    monkeypatch.setattr(launch, "open_mpi_version", lambda cmd: None)
    assert launch.mpirun_command(2, ["prog"], hosts="a:1,b:1") == ["mpiexec", "-n", "2", "-hosts", "a:1,b:1", "prog"]


def test_fault_tolerance_asks_for_open_mpi_5(monkeypatch):
    """--fault-tolerant passes ULFM's flags to Open MPI 5's launcher, and stops with one line
    naming the launcher where it has no ULFM (Open MPI 4 refuses --with-ft; MPICH)."""
    from ringmpi.tools import launch
    monkeypatch.setenv("MPIRUN", "mpirun")
    monkeypatch.setattr(launch, "open_mpi_version", lambda cmd: (5, 0, 11))
    assert "--with-ft" in launch.mpirun_command(2, ["prog"], fault_tolerant=True)
    for version, named in (((4, 1, 4), "is Open MPI 4.1.4's"), (None, "is another MPI's launcher")):
        monkeypatch.setattr(launch, "open_mpi_version", lambda cmd, v=version: v)
        with pytest.raises(SystemExit, match=f"--fault-tolerant needs Open MPI 5 .*{named}"):
            launch.mpirun_command(2, ["prog"], fault_tolerant=True)


def test_open_mpi_versions_are_read_from_the_launcher(tmp_path):
    from ringmpi.tools import launch
    for said, version in (("mpiexec.openmpi (OpenRTE) 4.1.4", (4, 1, 4)), ("mpirun (Open MPI) 5.0.11", (5, 0, 11)),
                          ("HYDRA build details:", None)):
        fake = tmp_path / "mpirun"
        fake.write_text(f"#!/bin/sh\necho '{said}'\n")
        fake.chmod(0o755)
        assert launch.open_mpi_version([str(fake)]) == version, said


def test_open_mpis_tcp_messages_go_eagerly_unless_the_user_says(monkeypatch):
    from ringmpi.tools import launch
    monkeypatch.setenv("MPIRUN", "mpirun")
    monkeypatch.delenv("OMPI_MCA_btl_tcp_eager_limit", raising=False)
    monkeypatch.setattr(launch, "open_mpi_version", lambda cmd: (5, 0, 11))
    cmd = launch.mpirun_command(2, ["prog"])
    assert cmd[cmd.index("btl_tcp_eager_limit") + 1] == str(launch.TCP_EAGER_LIMIT)
    mine = ["--mca", "btl_tcp_eager_limit", "65536"]
    assert launch.mpirun_command(2, ["prog"], extra=mine).count("btl_tcp_eager_limit") == 1
    monkeypatch.setenv("OMPI_MCA_btl_tcp_eager_limit", "65536")
    assert "btl_tcp_eager_limit" not in launch.mpirun_command(2, ["prog"])
    monkeypatch.setattr(launch, "open_mpi_version", lambda cmd: None)
    monkeypatch.delenv("OMPI_MCA_btl_tcp_eager_limit")
    assert "btl_tcp_eager_limit" not in launch.mpirun_command(2, ["prog"])


def test_open_mpis_nonblocking_allreduce_on_two_ranks_is_recursive_doubling_unless_the_user_says(monkeypatch):
    from ringmpi.tools import launch
    name = launch.LIBNBC_ALLREDUCE
    monkeypatch.setenv("MPIRUN", "mpirun")
    monkeypatch.delenv(f"OMPI_MCA_{name}", raising=False)
    monkeypatch.setattr(launch, "open_mpi_version", lambda cmd: (5, 0, 11))
    cmd = launch.mpirun_command(2, ["prog"])
    assert cmd[cmd.index(name) + 1] == "4"
    assert name not in launch.mpirun_command(3, ["prog"]) and name not in launch.mpirun_command(4, ["prog"])
    assert launch.mpirun_command(2, ["prog"], extra=["--mca", name, "2"]).count(name) == 1
    monkeypatch.setenv(f"OMPI_MCA_{name}", "2")
    assert name not in launch.mpirun_command(2, ["prog"])
    monkeypatch.setattr(launch, "open_mpi_version", lambda cmd: None)
    monkeypatch.delenv(f"OMPI_MCA_{name}")
    assert name not in launch.mpirun_command(2, ["prog"])


def test_sim_accuracy_takes_the_workers_given():
    """`--workers 8` is the ranks asked for, not the default list of the study."""
    proc = ringmpi(["sim", "accuracy", "--workers", "8", "--count", "64"])
    assert proc.returncode == 0, proc.stderr
    head = next(ln for ln in proc.stdout.splitlines() if ln.startswith("relative error"))
    assert head.split()[-1] == "p=8" and head.count("p=") == 1, head
