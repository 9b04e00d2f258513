"""`ringmpi` / `python -m ringmpi`: bench, calibrate, demo, sim, model, train, info.

Only the module of the subcommand you run is imported (and MPI initialised only by the
subcommands that run collectives), so `ringmpi --help`, `ringmpi model` and `ringmpi sim`
start in a fraction of a second and are safe on a cluster's login node.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..errors import RingmpiUsageError

__all__ = ["main", "SUBCOMMANDS"]

#: subcommand -> (module in ringmpi.tools, one-line help)
SUBCOMMANDS = {
    "bench": ("bench", "benchmark collectives x algorithms x sizes, nccl-tests style (under mpirun)"),
    "calibrate": ("calibrate", "measure this machine and save the profile auto uses (under mpirun)"),
    "demo": ("demo", "run every algorithm once on random data, checked against MPI (under mpirun)"),
    "sim": ("explain", "virtual cluster: symbolic rounds, traffic and simulated time (no MPI)"),
    "model": ("explain", "alpha-beta-gamma predictions and the lecture's estimates (no MPI)"),
    "train": ("train", "data-parallel training on ringmpi (under mpirun)"),
    "info": ("info", "the MPI library, the job's hosts, whether MPI reads GPU memory and how that was decided"),
}


def _version() -> str:
    from .. import __version__
    return __version__


def build_parser(wanted: str | None) -> argparse.ArgumentParser:
    """The parser, with the full options of subcommand `wanted` (the others listed only)."""
    ap = argparse.ArgumentParser(prog="ringmpi", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"ringmpi {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, (module, text) in SUBCOMMANDS.items():
        if name == wanted:
            importlib.import_module(f"{__package__}.{module}").add_parser(sub, name, text)
        else:
            sub.add_parser(name, help=text, add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    ap = build_parser(wanted if wanted in SUBCOMMANDS else None)
    ns = ap.parse_args(argv)
    try:
        return ns.func(ns) or 0
    except RingmpiUsageError as e:  # a bad RINGMPI_* setting or argument: one line, no traceback
        print(f"ringmpi {ns.cmd}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ringmpi ... | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
