"""Stall inspector: nothing hangs silently.

Every collective records (call, algorithm, start time) on entry. A daemon thread, started
at the first call, wakes once a second: when one call has been waiting longer than
RINGMPI_STALL_WARN seconds (default 60; 0 turns the inspector off) it prints which call on
which rank, once; past RINGMPI_STALL_ABORT seconds (default: never) it aborts the whole job
with that message, like Horovod's stall inspector. The usual cause is a rank that skipped
the collective (inside an `if`) or called another one.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Iterator

__all__ = ["watch", "enter", "leave", "settings"]

_STATE: dict = {"call": None}
_THREAD: list = []


def settings() -> tuple[float, float]:
    warn = float(os.environ.get("RINGMPI_STALL_WARN", "60") or 0)
    abort = float(os.environ.get("RINGMPI_STALL_ABORT", "0") or 0)
    return warn, abort


def _watch(warn: float, abort: float, period: float) -> None:
    warned = None
    while True:
        time.sleep(period)
        cur = _STATE["call"]
        if cur is None:
            continue
        name, t, started = cur
        waited = time.monotonic() - started
        where = f"ringmpi: rank {t.rank} of {t.size} has waited {waited:.0f} s in {name}"
        if abort and waited > abort:
            sys.stderr.write(f"{where}; aborting the job (RINGMPI_STALL_ABORT={abort:g}). A rank may have "
                             "skipped this collective or called another one.\n")
            sys.stderr.flush()
            t.abort(3)
        if warn and waited > warn and warned is not cur:
            warned = cur
            sys.stderr.write(f"{where} (RINGMPI_STALL_WARN={warn:g}). Did every rank call it with "
                             "the same arguments? RINGMPI_CHECK=1 compares them.\n")
            sys.stderr.flush()


@contextlib.contextmanager
def watch(name: str, t) -> Iterator[None]:
    """The inspector watches the block: a call still inside it after the limits is reported."""
    enter(name, t)
    try:
        yield
    finally:
        leave()


def enter(name: str, t) -> None:
    if not _THREAD:
        warn, abort = settings()
        if warn or abort:
            period = max(min(x for x in (warn, abort) if x) / 4, 0.05)
            th = threading.Thread(target=_watch, args=(warn, abort, min(period, 1.0)),
                                  name="ringmpi-stall", daemon=True)
            th.start()
        _THREAD.append(True)
    _STATE["call"] = (name, t, time.monotonic())


def leave() -> None:
    _STATE["call"] = None
