"""One rank of mpi4py's own test module, unchanged, its report written to a file per rank.

    python -m ringmpi.run rank_runner.py TESTDIR MODULE OUTDIR    (or without ringmpi.run)

Launchers interleave the ranks' output, so each rank writes unittest's report to
OUTDIR/rankR.txt and the counts to OUTDIR/rankR.json; the exit status is unittest's.
"""
import json
import sys
import unittest
from pathlib import Path

from mpi4py import MPI

testdir, module, outdir = sys.argv[1:4]
sys.path.insert(0, testdir)
rank = MPI.COMM_WORLD.Get_rank()
out = Path(outdir)
suite = unittest.defaultTestLoader.loadTestsFromName(module)
with open(out / f"rank{rank}.txt", "w") as fh:
    result = unittest.TextTestRunner(stream=fh, verbosity=2).run(suite)
(out / f"rank{rank}.json").write_text(json.dumps({
    "run": result.testsRun, "failures": len(result.failures), "errors": len(result.errors),
    "skipped": len(result.skipped), "wrapped": type(MPI.COMM_WORLD).__module__ != "mpi4py.MPI"}))
sys.exit(0 if result.wasSuccessful() else 1)
