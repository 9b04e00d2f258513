"""`ringmpi calibrate`: measure this machine and save the profile `auto` uses.

A benchmark sweep over every collective and algorithm, point-to-point rounds and the
reduction alone, fitted by `ringmpi.calibrate.fit_measured`, then saved where `auto` reads
it (RINGMPI_PROFILE, or ~/.cache/ringmpi/profile-pP.json). `--export ompi-rules FILE` and
`--export mpich-json FILE` also write the measured bands as the MPI library's own tuning
file (`ringmpi.tools.export`).
"""
from __future__ import annotations

import argparse

from ..units import SIZE_HELP
from ..api import group
from . import args, bench, export

__all__ = ["add_parser", "run"]


def add_parser(sub, name: str = "calibrate", text: str = "") -> None:
    c = sub.add_parser(name, help=text, description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    c.add_argument("-b", "--minbytes", type=args.size, default="1K", help=f"smallest size ({SIZE_HELP})")
    c.add_argument("-e", "--maxbytes", type=args.size, default="4M", help="largest size")
    c.add_argument("-f", "--stepfactor", type=float, default=4, help="size growth factor")
    c.add_argument("-C", "--collectives", default="all", help="comma-separated collectives or all")
    c.add_argument("-d", "--dtype", default="float32", help="element type")
    c.add_argument("--out", default="", help="also write the benchmark report here")
    c.add_argument("--export", nargs=2, action="append", default=[], metavar=("FORMAT", "FILE"),
                   help=f"also write the MPI library's tuning file: {' or '.join(export.FORMATS)} (repeatable)")
    c.add_argument("--force", action="store_true", help="save the profile even when the fit looks unphysical")
    c.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    for fmt, _ in ns.export:
        if fmt not in export.FORMATS:
            args.fail("calibrate", f"--export {fmt}: expected one of {', '.join(export.FORMATS)}")
    base = None
    if any(fmt == "mpich-json" for fmt, _ in ns.export):
        from ..mpicomm import selection_default
        base = selection_default()
        if base is None:
            args.fail("calibrate", "--export mpich-json: expected the MPICH library (its built-in selection "
                      "tree is the file's base); this process runs another MPI")
    rc = bench.run(bench.Options(minbytes=ns.minbytes, maxbytes=ns.maxbytes, stepfactor=ns.stepfactor,
                                 collectives=ns.collectives, dtype=ns.dtype, out=ns.out, rounds=3,
                                 quiet=True, save_profile=True, force_profile=ns.force))
    t = group()
    if ns.export and t.rank == 0:
        for fmt, path in ns.export:
            export.write(fmt, t.profile, t.size, path, base)
            print(f"# {fmt} tuning written to {path}")
    return rc
