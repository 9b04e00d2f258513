"""`ringmpi calibrate`: measure this machine and save the profile `auto` uses.

A benchmark sweep over every collective and algorithm plus point-to-point rounds, fitted by
`ringmpi.calibrate.fit_profile`, then saved where `auto` reads it (RINGMPI_PROFILE, or
~/.cache/ringmpi/profile-pP.json).
"""
from __future__ import annotations

import argparse

from ..units import SIZE_HELP
from . import args, bench

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
    c.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    return bench.run(bench.Options(minbytes=ns.minbytes, maxbytes=ns.maxbytes, stepfactor=ns.stepfactor,
                                   collectives=ns.collectives, dtype=ns.dtype, out=ns.out, rounds=3,
                                   p2p=True, quiet=True, save_profile=True))
