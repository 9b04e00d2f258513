"""Stall inspector: nothing hangs silently.

Every communicator's transport says, for as long as a call may wait for another rank, what
it is `busy` with (a label), next to the call's sequence number `seq`: the hot path pays
two attribute writes, an increment and no clock. A daemon thread, started when the first transport is
tracked, looks at every live transport about once a second and remembers when it first saw
each (transport, seq) busy: a call still in flight after RINGMPI_STALL_WARN seconds
(default 60; 0 turns warnings off) is named on stderr once; past RINGMPI_STALL_ABORT seconds
(default: never) the whole job is aborted with that message, like Horovod's stall
inspector. Each communicator is watched on its own, so a busy thread on one communicator
never hides a stuck one on another. The usual cause is a rank that skipped the collective
(inside an `if`) or called another one.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any

from .settings import settings

__all__ = ["track", "tracked"]

_TRACKED: "weakref.WeakSet[Any]" = weakref.WeakSet()
_THREAD: list[threading.Thread] = []
_LOCK = threading.Lock()



def die(message: str, abort: Any, code: int) -> None:
    """Print `message` (one write), give the launcher half a second to forward it before the
    abort tears the job down, then abort the job with `code`."""
    sys.stderr.write(message)
    sys.stderr.flush()
    time.sleep(0.5)
    # an MPI_Abort that never returns nor kills (seen once in seven runs with Debian's Open
    # MPI 4.1.4 after another rank had exited): leave anyway, and the launcher ends the job
    threading.Timer(10.0, os._exit, args=(code,)).start()
    abort(code)

def track(t: Any) -> None:
    """Watch transport `t` (it has rank, size, abort(), `seq`, and `busy`: a label or None)."""
    with _LOCK:
        _TRACKED.add(t)
        if not _THREAD:
            th = threading.Thread(target=_watch, name="ringmpi-stall", daemon=True)
            _THREAD.append(th)
            th.start()


def tracked() -> list[Any]:
    with _LOCK:
        return list(_TRACKED)


def _period(warn: float, abort: float) -> float:
    limits = [x for x in (warn, abort) if x]
    return min(max(min(limits) / 4, 0.05), 1.0) if limits else 1.0


def _watch() -> None:
    warned: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
    seen: "weakref.WeakKeyDictionary[Any, tuple[int, float]]" = weakref.WeakKeyDictionary()
    while True:
        try:
            s = settings()
        except ValueError:  # an invalid RINGMPI_* value: the calls themselves report it
            time.sleep(1.0)
            continue
        time.sleep(_period(s.stall_warn, s.stall_abort))
        now = time.monotonic()
        for t in tracked():
            seq, label = t.seq, t.busy
            if not label:
                continue
            first = seen.get(t)
            if first is None or first[0] != seq:
                seen[t] = first = (seq, now)
            started = first[1]
            waited = now - started
            where = f"ringmpi: rank {t.rank} of {t.size} has waited {waited:.0f} s in {label}"
            missing = getattr(t, "waiting_for", None)
            if missing:
                where += f" (ranks {missing} have not arrived)"
            # a rank that knows who is missing aborts first, so that its message is the one printed
            if s.stall_abort and waited > s.stall_abort + (0 if missing else 1):
                die(f"{where}; aborting the job (RINGMPI_STALL_ABORT={s.stall_abort:g}). A rank may "
                    "have skipped this collective or called another one.\n", t.abort, 3)
            if s.stall_warn and waited > s.stall_warn and warned.get(t) != started:
                warned[t] = started
                sys.stderr.write(f"{where} (RINGMPI_STALL_WARN={s.stall_warn:g}). Did every rank call it with "
                                 "the same arguments? RINGMPI_CHECK=1 compares them.\n")
                sys.stderr.flush()
