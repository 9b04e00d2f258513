"""Stall inspector: nothing hangs silently, and nothing hangs for long.

Every communicator's transport says, for as long as a call may wait for another rank, what
it is `busy` with (a label), next to the call's sequence number `current` (the same on
every rank for the same call; a request's while a caller waits for it): the hot path pays two attribute writes, an increment and no
clock. A daemon thread, started when the first transport is tracked, looks at every live
transport about once a second and remembers when it first saw each (transport, seq) busy.
Each communicator is watched on its own, so a busy thread on one never hides a stuck one
on another.

What it knows of the other ranks comes in notes on the transport's watch channel
(`post`/`notes`, MPI's control duplicate; they need MPI_THREAD_MULTIPLE, `t.wire`):

    ("ask", seq)            a rank stuck in call `seq` asks the others where they are
    ("state", begun, current, label)   the answer: calls begun so far, the one in flight and
                            what it runs ("" if none)
    ("fail", seq, text)     a rank's call `seq` raised after it began (`t.failed`)
    ("bye", seq)            a rank reached MPI_Finalize after `seq` calls

From them, without waiting for any deadline, it aborts the job (MPI_Abort, the message
printed first) when the wait can never end:
- a rank finished (MPI_Finalize) before the call this rank is in;
- a rank failed in this very call and this rank is still in it FAIL_GRACE seconds later;
- a rank is in another collective at the same call (the ranks called different ones).
Otherwise a call in flight after RINGMPI_STALL_WARN seconds (default 60; 0: never) is named
on stderr once, and past RINGMPI_STALL_ABORT seconds (default 600, torch.distributed's
10 minutes; 0: never) the job is aborted, like Horovod's stall inspector: the message
names the ranks that have not arrived and where they are. The usual cause is a rank that
skipped the collective (inside an `if`) or called another one.

Asking costs a message to every peer, once per stuck call: after ASK_AFTER seconds on
communicators of up to NOTIFY_ALL ranks, at the warning on larger ones. Finalize notes go
to every peer on communicators of up to NOTIFY_ALL ranks only (a larger job relies on the
deadline), failure notes always (a failure is rare, a hang expensive).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from .settings import settings

__all__ = ["track", "tracked", "announce", "finish", "die", "WIRE", "ASK_AFTER", "FAIL_GRACE", "NOTIFY_ALL"]

ASK_AFTER = 5.0     # seconds in one call before a rank asks the others where they are
FAIL_GRACE = 3.0    # seconds a rank may stay in a call after a peer said it failed in it
NOTIFY_ALL = 64     # communicators up to this size: finalize notes to every peer, asks early

_TRACKED: "weakref.WeakSet[Any]" = weakref.WeakSet()
_THREAD: list[threading.Thread] = []
_LOCK = threading.Lock()            # guards _TRACKED and _THREAD
#: held around every use of a transport's watch channel. Never waited for inside an MPI
#: callback (a communicator's deletion, MPI_Finalize), where the library may hold its own
#: lock that the inspector's thread needs to finish the call it is in: a freed transport's
#: communicators are freed later by the inspector's thread (`free_later`), and MPI_Finalize
#: waits for this lock a bounded time.
WIRE = threading.Lock()
_STOPPED = threading.Event()        # MPI_Finalize has begun: no more notes
#: transport -> when this rank last told its peers it failed in a call (`announce`)
_TOLD: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()
_TO_FREE: list = []                 # communicators of freed transports, for the inspector's thread


@dataclass
class _Peers:
    """What this rank's inspector knows of the other ranks of one communicator."""
    seq: int = -1                # the call in flight it is timing (none yet: set-up is call 0)
    since: float = 0.0           # when it first saw that call in flight
    asked: int = 0               # the call for which the others were asked where they are
    warned: int = 0              # the call it warned about
    states: dict = field(default_factory=dict)     # rank -> (begun, current, label) as answered for `asked`
    failed: dict = field(default_factory=dict)     # seq -> (rank, text, when the note came)
    finished: dict = field(default_factory=dict)   # rank -> calls it made before MPI_Finalize
    last_bye: float = 0.0        # when the last of those notes came
    polled: float = 0.0          # when the notes were last read


#: seconds between the aborts of ranks that abort together (`die`), in rank order
ABORT_STAGGER = 0.3


def _abort_pause(rank: int) -> float:
    """Seconds `die` waits on `rank` before its abort: half a second for the launcher to
    forward the message, then the rank's turn (ABORT_STAGGER apart, the first ten)."""
    return 0.5 + ABORT_STAGGER * min(rank, 10)


def die(message: str, abort: Any, code: int, rank: int = 0) -> None:
    """Print `message` (one write), give the launcher half a second to forward it before the
    abort tears the job down, then abort the job with `code`. Ranks that abort together
    (every rank waiting for one that failed, or all raising the same error) abort in turn,
    `rank` by `rank`, ABORT_STAGGER apart: the first abort ends the job, and the others
    rarely come (Debian's Open MPI 4.1 launcher, given two at once, once logged a failed
    unpack of their messages, open-mpi/ompi#8356, and never ended the job: `_linger`).
    Written to the process's own standard error: a caller may have replaced `sys.stderr`
    for the moment (torch.distributed's excepthook collects the traceback in a StringIO to
    prefix its lines, and would print it after our abort: never)."""
    err = sys.__stderr__ or sys.stderr
    err.write(message)
    err.flush()
    time.sleep(_abort_pause(rank))
    # an MPI_Abort that never returns nor kills (seen once in seven runs with Debian's Open
    # MPI 4.1.4 after another rank had exited): leave anyway, and the launcher ends the job
    threading.Timer(10.0, os._exit, args=(code,)).start()
    abort(code)


def track(t: Any) -> None:
    """Watch transport `t` (rank, size, abort(), `seq` (calls begun), `current` (the call
    in flight), `busy`: a label or None, `wire`, and
    with a wire `post`, `notes`, `flush`)."""
    with _LOCK:
        _TRACKED.add(t)
        if not _THREAD:
            th = threading.Thread(target=_watch, name="ringmpi-stall", daemon=True)
            _THREAD.append(th)
            th.start()


def tracked() -> list[Any]:
    with _LOCK:
        return list(_TRACKED)


def announce(t: Any, note: tuple) -> None:
    """Send `note` to every other rank of `t` (a failure: the caller's thread)."""
    with WIRE:
        if t.wire and not t.freed and not _STOPPED.is_set():
            _to_peers(t, note)
            if note[0] == "fail":
                _TOLD[t] = time.monotonic()


def _to_peers(t: Any, note: tuple) -> None:
    """`note` to every other rank of `t` (under WIRE)."""
    for q in range(t.size):
        if q != t.rank:
            t.post(q, note)


def free_later(comms: list) -> None:
    """Free these communicators (`.Free()`) on the inspector's thread, after its last use
    of them: the caller may be inside an MPI callback (see WIRE)."""
    with _LOCK:
        _TO_FREE.extend(comms)


def _free_pending() -> None:
    with _LOCK:
        comms = _TO_FREE[:]
        del _TO_FREE[:]
    for c in comms:
        c.Free()


def finish() -> None:
    """MPI_Finalize has begun: tell the peers of every small communicator how many calls
    this rank made on it, give the notes a moment to leave, stay while peers left waiting
    for this rank may still abort (`_linger`), and stop using MPI."""
    if _STOPPED.is_set():
        return
    if not WIRE.acquire(timeout=1.0):   # the inspector's thread is stuck in MPI: leave without notes
        _STOPPED.set()
        return
    try:
        _STOPPED.set()
        for t in tracked():   # a failure note that came too late for the inspector's thread
            if t.wire and not t.freed:
                _take_notes(t, _known(t), time.monotonic())
        live = [t for t in tracked() if t.wire and not t.freed and t.size <= NOTIFY_ALL]
        for t in live:
            _to_peers(t, ("bye", t.seq))
        for t in live:
            t.flush(0.5)
        _linger(live)
        _free_pending()
    finally:
        WIRE.release()


def _linger(live: list) -> None:
    """A rank that leaves while its peers may still wait for it stays in MPI_Finalize until
    they have all finished too, or until those left waiting have had the time to abort the
    job (`_inspect`: a look of their inspector, `die`'s pause and turn, and a look more; for
    a rank that told its peers it failed in a call, or that leaves on an uncaught exception
    (`sys.last_value`, RINGMPI_ABORT_ON_EXCEPTION=0), FAIL_GRACE first). A rank that simply
    finished first is one the others may be waiting for too (it skipped a call), and its
    peers finish within milliseconds of it in a job that ends well. Debian's Open MPI 4.1
    launcher, given an abort after a rank has left, can print it and then never end the job
    (benchmarks/README.md, "An abort after a rank has left")."""
    now = time.monotonic()
    raised = getattr(sys, "last_value", None) is not None
    for t in live:
        told = _TOLD.get(t, now if raised else None)
        known = _known(t)
        until = (now if told is None else told + FAIL_GRACE) + _abort_pause(t.size - 1) + 2.0   # (+ two looks)
        while time.monotonic() < until and len(known.finished) < t.size - 1:
            time.sleep(0.01)
            _take_notes(t, known, time.monotonic())


def _period(warn: float, abort: float) -> float:
    limits = [x for x in (warn, abort) if x]
    return min(max(min(limits) / 4, 0.05), 1.0) if limits else 1.0


def _ask_after(t: Any, warn: float, abort: float) -> float:
    limits = [x / 3 for x in (warn, abort) if x]   # (the answers come in well before the limit)
    if t.size > NOTIFY_ALL:
        return warn or (abort / 2 if abort else float("inf"))
    return min([ASK_AFTER, *limits])


_KNOWN: "weakref.WeakKeyDictionary[Any, _Peers]" = weakref.WeakKeyDictionary()


def _known(t: Any) -> _Peers:
    known = _KNOWN.get(t)
    if known is None:
        known = _KNOWN[t] = _Peers()
    return known


def _watch() -> None:
    while not _STOPPED.is_set():
        try:
            s = settings()
        except ValueError:  # an invalid RINGMPI_* value: the calls themselves report it
            time.sleep(1.0)
            continue
        if _STOPPED.wait(_period(s.stall_warn, s.stall_abort)):
            return
        now = time.monotonic()
        with WIRE:
            if _STOPPED.is_set():
                return
            _free_pending()
        for t in tracked():
            if t.freed:
                continue
            known = _known(t)
            if _due(t, known, now, s):
                with WIRE:
                    if t.wire and not t.freed and not _STOPPED.is_set():
                        known.polled = now
                        _take_notes(t, known, now)
            _inspect(t, known, now, s)


def _due(t: Any, known: _Peers, now: float, s: Any) -> bool:
    """Whether to read `t`'s notes now: every tick while a call of this rank has been in
    flight since the last tick (it may be stuck), else every half of the time a stuck peer
    waits before asking (its question is answered before its deadline). Reading less often
    when nothing waits keeps the inspector's MPI calls away from a busy loop's: one probe a
    second made 8 B calls measurably slower on Open MPI (benchmarks/README.md, "Per-call
    overhead, and what the stall inspector costs")."""
    if t.busy and known.seq == t.current:
        return True
    return now - known.polled >= _ask_after(t, s.stall_warn, s.stall_abort) / 2


def _take_notes(t: Any, known: _Peers, now: float) -> None:
    """Take in the notes that arrived for `t`, answering the questions among them (under
    WIRE). A peer that failed in a call this rank has completed is reported at once: if the
    ranks' calls differed, this rank's result of that call is wrong too."""
    for source, note in t.notes():
        kind = note[0]
        if kind == "ask":
            t.post(source, ("state", t.seq, t.current, t.busy or ""))
        elif kind == "state" and known.asked:
            known.states[source] = (note[1], note[2], note[3])
        elif kind == "fail" and (note[1] < t.current or note[1] == t.current and not t.busy):
            sys.stderr.write(f"ringmpi WARN: rank {source} of {t.size} failed in call {note[1]} on a communicator "
                             f"where rank {t.rank} completed it ({note[2]}); if the ranks' calls differed, the "
                             f"result of that call on rank {t.rank} is wrong too\n")
            sys.stderr.flush()
        elif kind == "fail":
            known.failed[note[1]] = (source, note[2], now)
            for old in [q for q in known.failed if q < note[1] - 64]:
                del known.failed[old]
        elif kind == "bye":
            known.finished[source] = note[1]
            known.last_bye = now


def _inspect(t: Any, known: _Peers, now: float, s: Any) -> None:
    """Decide about `t`'s call in flight: nothing, ask the others, warn, or abort."""
    seq, label = t.current, t.busy
    if not label:
        return
    if known.seq != seq:
        known.seq, known.since, known.states = seq, now, {}
    waited = now - known.since
    where = f"ringmpi: rank {t.rank} of {t.size} " + (f"has waited {waited:.0f} s in {label}" if waited >= 1 else
                                                      f"is waiting in {label}")
    gone = sorted(q for q, made in known.finished.items() if made < seq)
    if gone:
        die(f"{where} (call {seq} on this communicator); ranks {gone} finished (MPI_Finalize) after "
            f"{', '.join(str(known.finished[q]) for q in gone)} calls and will never come: aborting the job. "
            "A rank may have skipped this collective.\n", t.abort, 3, t.rank)
    if len(known.finished) == t.size - 1 and now - max(known.last_bye, known.since) > FAIL_GRACE:
        die(f"{where} (call {seq} on this communicator), and every other rank has finished (MPI_Finalize) after "
            f"making that call: the ranks' calls differed (count, root, algorithm or collective). Aborting the "
            "job (RINGMPI_CHECK=1 compares every call first).\n", t.abort, 3, t.rank)
    fail = known.failed.get(seq)
    if fail is not None and now - fail[2] > FAIL_GRACE:
        die(f"{where}; rank {fail[0]} failed in this call ({fail[1]}): aborting the job\n", t.abort, 3, t.rank)
    if t.wire and known.asked != seq and waited > _ask_after(t, s.stall_warn, s.stall_abort):
        known.asked, known.states = seq, {}
        with WIRE:
            if not t.freed and not _STOPPED.is_set():
                _to_peers(t, ("ask", seq))
    other = {q: lab for q, (_, cur, lab) in sorted(known.states.items()) if cur == seq and lab and _differ(lab, label)}
    if other:
        die(f"{where} (call {seq} on this communicator), while " + "; ".join(f"rank {q} is in {lab}" for q, lab in
                                                                            other.items())
            + " at that call: the ranks called different collectives or algorithms. Aborting the job "
            "(RINGMPI_CHECK=1 compares every call first).\n", t.abort, 3, t.rank)
    missing = t.waiting_for or sorted(q for q, (begun, _, _) in known.states.items() if begun < seq) or None
    if missing:
        where += f" (ranks {missing} have not arrived)"
    detail = _whereabouts(t, known, seq)
    # a rank that knows who is missing aborts first, so that its message is the one printed
    if s.stall_abort and waited > s.stall_abort + (0 if missing else 1):
        die(f"{where}; aborting the job (RINGMPI_STALL_ABORT={s.stall_abort:g}). A rank may have skipped "
            f"this collective or called another one.{detail}\n", t.abort, 3, t.rank)
    if s.stall_warn and waited > s.stall_warn and known.warned != seq:
        known.warned = seq
        sys.stderr.write(f"{where} (RINGMPI_STALL_WARN={s.stall_warn:g}). Did every rank call it with "
                         f"the same arguments? RINGMPI_CHECK=1 compares them.{detail}\n")
        sys.stderr.flush()


def _differ(a: str, b: str) -> bool:
    """Whether two ranks' labels of the same call (`api.label`) cannot both be right: other
    collectives or roots, or other algorithms once both are resolved ("allreduce/auto" is
    not yet)."""
    (ca, aa, ra), (cb, ab, rb) = (_parts(x) for x in (a, b))
    return ca != cb or ra != rb or (aa != ab and "auto" not in (aa, ab) and "" not in (aa, ab))


def _parts(label: str) -> tuple[str, str, str]:
    collective, _, rest = label.split(" (")[0].partition("/")
    algorithm, _, root = rest.partition(", ")
    return collective, algorithm, root


def _whereabouts(t: Any, known: _Peers, seq: int) -> str:
    """' Rank 1: at call 40 on this communicator, in no collective. ...' from the answers."""
    if known.asked != seq:
        return ""
    parts = []
    for q, (sq, _, lab) in sorted(known.states.items()):
        if sq < seq:
            parts.append(f" Rank {q}: {sq} calls on this communicator, " +
                         (f"in {lab}." if lab else "in no ringmpi call on it."))
    silent = [q for q in range(t.size) if q != t.rank and q not in known.states]
    if silent:
        parts.append(f" Ranks {silent} did not answer (blocked, or holding the GIL).")
    return "".join(parts)
