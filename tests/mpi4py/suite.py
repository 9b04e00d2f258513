"""mpi4py's own collective tests, unchanged, through ringmpi.Comm, on 1-4 ranks.

    .venv/bin/python tests/mpi4py/suite.py [--ranks 1 2 3 4] [--modules test_cco_buf]

Fetches the source distribution of the installed mpi4py with pip (once, into build/; pass
--src DIR to use an unpacked one), then for each rank count runs each test module twice
under ringmpi.launch: with plain mpi4py, and under `python -m ringmpi.run --stats` (MPI.
COMM_WORLD and MPI.COMM_SELF replaced by ringmpi.Comm before the module is imported). It
passes when every wrapped run passes with the same number of tests and of skips as the
plain run, and prints one line per run with what ringmpi served.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import mpi4py

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def source(build: Path) -> Path:
    """The test/ folder of the installed mpi4py's source distribution (downloaded once)."""
    version = mpi4py.__version__
    tests = build / f"mpi4py-{version}" / "test"
    if not (tests / "test_cco_buf.py").exists():
        build.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "-d", str(build), f"mpi4py=={version}"], check=True)
        with tarfile.open(build / f"mpi4py-{version}.tar.gz") as tar:
            tar.extractall(build, filter="data") if sys.version_info >= (3, 12) else tar.extractall(build)  # noqa: S202
    return tests


def run(n: int, tests: Path, module: str, wrapped: bool, timeout: int) -> tuple[int, list[dict], str]:
    with tempfile.TemporaryDirectory() as out:
        prog = [sys.executable, *(["-m", "ringmpi.run", "--stats"] if wrapped else []),
                str(HERE / "rank_runner.py"), str(tests), module, out]
        proc = subprocess.run([sys.executable, "-m", "ringmpi.launch", "-n", str(n), "--timeout", str(timeout), "--",
                               *prog], capture_output=True, text=True, errors="replace", cwd=ROOT)
        ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
        reports = "".join(p.read_text() for p in sorted(Path(out).glob("rank*.txt")) if "FAIL" in p.read_text()
                          or "ERROR" in p.read_text())
    served = re.search(r"ringmpi\.run: calls served by ringmpi on rank 0: (.*)", proc.stderr)
    detail = served.group(1) if served else ""
    if proc.returncode or len(ranks) != n:
        detail += f"\n{reports[-6000:]}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.returncode, ranks, detail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--modules", nargs="+", default=["test_cco_buf", "test_cco_vec", "test_cco_nb_buf", "test_cco_pr_buf",
                                                     "test_comm", "test_subclass"])
    ap.add_argument("--src", type=Path, default=None, help="an unpacked mpi4py source tree")
    ap.add_argument("--timeout", type=int, default=300)
    o = ap.parse_args()
    tests = o.src / "test" if o.src else source(ROOT / "build")
    bad = 0
    for module in o.modules:
        for n in o.ranks:
            rc0, plain, _ = run(n, tests, module, False, o.timeout)
            rc1, wrapped, detail = run(n, tests, module, True, o.timeout)
            p, w = (plain or [{}])[0], (wrapped or [{}])[0]
            ok = rc1 == 0 and len(wrapped) == n and all(r.get("wrapped") for r in wrapped) and \
                (p.get("run"), p.get("skipped")) == (w.get("run"), w.get("skipped"))
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} mpi4py {mpi4py.__version__} {module} on {n} rank(s): "
                  f"plain {p.get('run')} tests, {p.get('skipped')} skipped (exit {rc0}); through ringmpi.Comm "
                  f"{w.get('run')} tests, {w.get('failures', '?')} failures, {w.get('errors', '?')} errors, "
                  f"{w.get('skipped')} skipped (exit {rc1}); served: {detail}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
