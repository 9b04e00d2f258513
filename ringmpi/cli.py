"""`ringmpi` / `python -m ringmpi`: bench, calibrate, sim, model, train, demo."""
from __future__ import annotations

import argparse
import sys

__all__ = ["main", "parse_size", "parse_time", "parse_rate"]

_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "KIB": 1024, "M": 1e6, "MB": 1e6, "MIB": 1024**2,
          "G": 1e9, "GB": 1e9, "GIB": 1024**3, "T": 1e12, "TB": 1e12, "TIB": 1024**4}


def _split(text: str) -> tuple[float, str]:
    s = text.strip().replace("_", "")
    i = len(s)
    while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    if i == 0:
        raise argparse.ArgumentTypeError(f"no number in {text!r}")
    return float(s[:i]), s[i:].strip()


def parse_size(text: str) -> int:
    """'64MB' -> 64e6, '256KiB' -> 262144, '1K' -> 1000 (nccl-tests' K/M/G: powers of 1024 there;
    here SI unless the 'i' form is used, as the lecture's 'MB' means 1e6)."""
    num, unit = _split(text)
    try:
        return int(round(num * _UNITS[unit.upper()]))
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown size unit in {text!r} (use B, KB, KiB, MB, MiB, GB, GiB)") from None


def parse_time(text: str) -> float:
    num, unit = _split(text)
    scale = {"s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "": 1}.get(unit.lower())
    if scale is None:
        raise argparse.ArgumentTypeError(f"unknown time unit in {text!r} (use s, ms, us, ns)")
    return num * scale


def parse_rate(text: str) -> float:
    """'25GB/s' -> 25e9 bytes per second."""
    t = text.strip()
    if t.lower().endswith("/s"):
        t = t[:-2]
    return float(parse_size(t))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ringmpi", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    from . import bench, calibrate, demo, explain
    from .dp import train
    for mod in (bench, calibrate, demo, explain, train):
        mod.add_parser(sub)
    ns = ap.parse_args(argv)
    return ns.func(ns) or 0


if __name__ == "__main__":
    sys.exit(main())
