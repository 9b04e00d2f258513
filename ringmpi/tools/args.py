"""Argument types for the command-line tools: a bad value is a one-line usage error (argparse
prints it and exits 2), never a traceback."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, NoReturn

from ..units import parse_rate, parse_size, parse_time

__all__ = ["size", "time", "rate", "count", "positive", "int_list", "converter", "fail"]


def fail(command: str, message: str) -> NoReturn:
    """A usage error found after parsing: one line on stderr, exit status 2 (as argparse's)."""
    print(f"ringmpi {command}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def converter(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """`fn` as an argparse type: its ValueError becomes the usage error's message."""
    def convert(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = name
    return convert


size = converter(parse_size, "size")
time = converter(parse_time, "time")
rate = converter(parse_rate, "rate")


def bounded(kind: type, above: bool) -> Callable[[str], Any]:
    """A number of `kind` (int, float) above 0, or with `above` False at least 0."""
    what = f"{'positive' if above else 'non-negative'} {'integer' if kind is int else kind.__name__}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{text!r}: expected a {what}") from None
        if not (value > 0 if above else value >= 0):   # (NaN is neither)
            raise ValueError(f"{text!r}: expected a {what}: " + ("must be above 0" if above else "must be at least 0"))
        return value
    return converter(parse, what)


count = bounded(int, above=False)   # ranks, nodes, jobs


def positive(kind: type) -> Callable[[str], Any]:
    """A number of `kind` (int, float) above 0: steps, samples, rates."""
    return bounded(kind, above=True)


def int_list(text: str) -> list[int]:
    """'2,4,8' -> [2, 4, 8], every value >= 1."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 2,4,8") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return values
