"""Lazy initialisation is thread-safe, and settings are read at first use (no MPI here)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest


def _at_once(fn, n: int = 8) -> list:
    """fn() on n threads released together; what each returned or raised."""
    start, out = threading.Barrier(n), [None] * n

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = fn()
        except Exception as e:  # noqa: BLE001 (compared below)
            out[i] = e
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return out


CODE = """
import threading, sys
from ringmpi import schedules
start = threading.Barrier(8)
got = []
def ask():
    start.wait()
    try:
        got.append(tuple(schedules.names("allreduce")))
    except Exception as e:
        got.append(repr(e))
ts = [threading.Thread(target=ask) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(len(set(got)), got[0])
"""


@pytest.mark.parametrize("attempt", range(5))
def test_registry_first_load_from_many_threads_sees_every_algorithm(attempt):
    """A fresh interpreter each time: the registry's first load happens under the threads
    (it once marked itself loaded before importing: `unknown collective 'allreduce'`)."""
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    distinct, first = proc.stdout.split(" ", 1)
    assert distinct == "1" and "'ring'" in first and "'mpi'" in first, proc.stdout


def test_settings_first_read_from_many_threads_is_one_object(monkeypatch):
    from ringmpi import settings as st
    monkeypatch.setattr(st, "_CURRENT", [])
    got = _at_once(st.settings)
    assert all(g is got[0] for g in got) and isinstance(got[0], st.Settings), got


LATE = """
import os, ringmpi
from ringmpi.settings import settings
os.environ["RINGMPI_CHECK"] = "1"
os.environ["RINGMPI_STALL_ABORT"] = "7"
s = settings()
print(s.check, s.stall_abort, s.abort_on_exception)
"""


def test_settings_set_after_import_are_read_at_first_use():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGMPI_")}
    proc = subprocess.run([sys.executable, "-c", LATE], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "7.0", "True"], proc.stdout


def test_the_defaults_keep_the_promise():
    """Nothing hangs by default: a stall ends the job after 10 minutes (torch's default
    timeout), an uncaught exception at once."""
    from ringmpi.settings import _read
    s = _read({}, 1)
    assert s.stall_abort == 600 and s.stall_warn == 60 and s.abort_on_exception
    off = _read({"RINGMPI_STALL_ABORT": "0", "RINGMPI_ABORT_ON_EXCEPTION": "0"}, 1)
    assert off.stall_abort == 0 and not off.abort_on_exception


def test_labels_that_cannot_both_be_right():
    from ringmpi.stall import _differ
    assert _differ("allreduce/ring", "broadcast/pipeline, root 0")
    assert _differ("allreduce/ring", "allreduce/tree")
    assert _differ("broadcast/pipeline, root 0", "broadcast/pipeline, root 1")
    assert not _differ("allreduce/auto", "allreduce/ring")
    assert not _differ("allreduce/ring (tuning exchange)", "allreduce/ring")


def test_the_progress_thread_is_made_again_where_it_is_gone():
    """The engine knows its thread without asking it at every start (`is_alive` takes a
    lock): a fork's child (which has no thread, nor its parent's requests) gets a fresh
    engine whose first start makes its own thread."""
    from ringmpi import requests
    eng = requests.Engine()
    eng._ensure_thread()
    first = eng.thread
    assert first is not None and first.is_alive()
    requests._ENGINE.insert(0, eng)
    try:
        pid = os.fork()
        if pid == 0:
            child = requests.engine()
            child._ensure_thread()
            os._exit(0 if child is not eng and child.thread.is_alive() and not requests.ACTIVE else 3)
        assert os.waitpid(pid, 0)[1] == 0
        assert requests.engine() is eng and eng.thread is first   # (the parent keeps its own)
    finally:
        requests._ENGINE.remove(eng)
