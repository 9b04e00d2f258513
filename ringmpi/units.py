"""Sizes, times and rates: one parser and one printer for every command and report.

Byte sizes use binary multiples, as nccl-tests does: ``1K`` = ``1KB`` = ``1KiB`` = 1024 and
``64M`` = ``64MB`` = 64 MiB; plain numbers (``1000``, ``64e6``) are bytes. Rates use the
decimal GB/s of nccl-tests' algbw and busbw columns: ``25GB/s`` = 25e9 bytes per second.
"""
from __future__ import annotations

import math
import re

__all__ = ["parse_size", "parse_time", "parse_rate", "human_bytes", "human_time", "human_rate",
           "size_label", "SIZE_HELP"]

SIZE_HELP = "bytes; K/KB/KiB = 1024, M/MB/MiB = 2^20, G/GB/GiB = 2^30 (as nccl-tests), e.g. 64M, 1.5K, 64e6"
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Zµ/]*)\s*$")
_SIZE_UNITS = {u + suffix: float(1 << (10 * i)) for i, u in enumerate(("", "K", "M", "G", "T"))
               for suffix in (("", "B", "IB") if u else ("", "B"))}
_TIME_UNITS = {k.upper(): v for k, v in {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "": 1.0}.items()}
_RATE_UNITS = {**{u + "/S": v for u, v in (("", 1.0), ("B", 1.0), ("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12),
                                           ("KIB", 2.0**10), ("MIB", 2.0**20), ("GIB", 2.0**30), ("TIB", 2.0**40),
                                           ("GBIT", 1e9 / 8), ("MBIT", 1e6 / 8))}, "": 1.0}


def _parse(text: str, what: str, units: dict[str, float], hint: str) -> float:
    """number x unit, the unit looked up case-insensitively in `units`."""
    m = _NUMBER.match(str(text).replace("_", ""))
    if not m:
        raise ValueError(f"{what} {text!r}: expected a non-negative number with an optional unit")
    unit = m.group(2)
    scale = units.get(unit.upper())
    if scale is None:
        raise ValueError(f"{what} {text!r}: unknown unit {unit!r} (use {hint})")
    return float(m.group(1)) * scale


def parse_size(text: str) -> int:
    """'1K' -> 1024, '64MB' -> 67108864, '256KiB' -> 262144, '64e6' -> 64000000."""
    value = _parse(text, "size", _SIZE_UNITS, "B, K, KB, KiB, M, MB, MiB, G, GB, GiB")
    if value != int(value):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def parse_time(text: str) -> float:
    """'5us' -> 5e-6, '20ms' -> 0.02, '1.5' -> 1.5 seconds."""
    return _parse(text, "time", _TIME_UNITS, "s, ms, us, ns")


def parse_rate(text: str) -> float:
    """'25GB/s' -> 25e9 bytes per second (decimal, as nccl-tests' GB/s); '10GiB/s' is binary."""
    t = str(text).strip()
    return _parse(t if "/" in t or not t else t + "/s", "rate", _RATE_UNITS, "B/s, MB/s, GB/s, GiB/s, Gbit/s")


def _scaled(x: float, steps: tuple, zero: str) -> str:
    for unit, scale in steps:
        if abs(x) >= scale:
            return f"{x / scale:.4g} {unit}"
    return zero


def human_bytes(n: float) -> str:
    """Binary units, as the sizes are parsed: 65536 -> '64 KiB'."""
    return _scaled(n, (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)), "0 B")


def human_time(s: float) -> str:
    """5e-6 -> '5 us'."""
    return "inf" if math.isinf(s) else _scaled(s, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)), "0 s")


def human_rate(bytes_per_s: float) -> str:
    return "inf" if math.isinf(bytes_per_s) else f"{bytes_per_s / 1e9:.3g} GB/s"


def size_label(n: float) -> str:
    """nccl-tests style labels: 1024 -> '1K', 16777216 -> '16M', 1536 -> '1.5K'."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"
