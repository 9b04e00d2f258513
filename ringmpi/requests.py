"""Collectives as requests: nonblocking and persistent calls on the schedule bodies unchanged.

A request runs its algorithm's body (`body(t, call)`, the very function a blocking call
runs) in a greenlet on a suspending transport (`mpicomm.RequestView`): each exchange posts
its Isend/Irecv pairs, or MPI's own nonblocking collective, and switches back to whoever
advanced the request; the request is advanced again once those MPI requests are complete.
The simulator runs the same bodies the same way (`sim.VirtualRank` posts and yields), so
one body serves blocking calls, requests, persistent requests and the virtual cluster.
libNBC (Hoefler et al., SC'07) compiles each collective into a schedule of rounds instead;
that is every algorithm written twice, and a body with a data-dependent loop (the segmented
pipeline, Bruck's rounds) written as data. A suspended body is its own round schedule.

Progress. A request advances when ringmpi is called on the thread that owns it (its
`test`, `wait`, `waitall`, any collective), and, with the progress thread (RINGMPI_PROGRESS,
`ringmpi.settings`), while the caller computes: numpy releases the GIL inside large kernels
and mpi4py inside MPI calls. Greenlets belong to one thread, so a request is owned by the
thread that first advances it, and only that thread can move it on. The progress thread
takes the requests started while it runs, GRACE after their start; a caller's thread takes
only the request it tests or waits for: a `wait` that comes first (start then wait at
once, nothing to overlap) runs its body on its own stack, not in a greenlet, as a blocking
call (`Engine._inline`; with nothing else in flight its messages are MPI_Sendrecv's, not
Isend/Irecv pairs). A blocking call, or a wait for another request, leaves the others to
the thread, which it wakes (`Engine._urge`): one taken there would stand still once the
caller went on to compute, or to block in MPI outside ringmpi, however long a peer waited
for it (a job that MPI's own requests finish would hang). The shared-memory bodies
(`ringmpi.shm`) wait on flags in memory instead of MPI requests: their transport takes one
call at a time, in the order of the starts. A caller polling yields the core with sched_yield, never time.sleep(0), which
sleeps Linux's timer slack each time (`yield_core`). The progress thread never
waits inside MPI (Open MPI spins there, and would take the core the caller computes on): it
tests, and sleeps between tests, less and less often while nothing completes, and not at
all while a caller waits for one of its requests. With nothing to do it naps, longer and
longer, then sleeps on a condition; a start wakes it only for a request that is worth a
wake (`Engine._loop`): each wake takes a core and the GIL from the ranks.

While requests are in flight, a blocking call's own messages are waited for by testing
them and the requests of its thread in turn, so a rank blocked in one collective still
advances the others (MPI's progress rule: rank 0 in a blocking call, rank 1 waiting for a
request that needs rank 0's next round).

The stall inspector (`ringmpi.stall`) watches a request while a caller waits for it (a
request is allowed to stay in flight for as long as its caller computes). A request never
waited for is reported when its communicator is freed and when the process exits.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from greenlet import GreenletExit, getcurrent, greenlet

from .settings import first_use

__all__ = ["Request", "MPIRequest", "Persistent", "waitall", "testall", "progress", "on_progress_thread", "yield_core", "engine",
           "Engine", "ACTIVE"]


class _Handed:
    """What a request's caller gets at its completion (`Request`, `MPIRequest`): the call's
    result, or its error raised; and a nonblocking call's kept persistent request
    (`collectives.RequestMemo`) lets go of it."""
    __slots__ = ()

    def _hand_over(self) -> Any:
        source = self.source
        if source is not None and source.transient and source.request is self:
            source.request = None
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return self.result

    def __repr__(self) -> str:
        state = "complete" if self.done else "in flight"
        return f"<ringmpi.Request {self.label}, call {self.seq} on rank {self.group.rank} of {self.group.size}: {state}>"


@dataclass(eq=False, slots=True, repr=False)
class Request(_Handed):
    """One collective call in flight (or completed, until waited for).

    `test()` advances it and says whether it is complete; `wait()` returns the call's result
    (what the blocking call returns), or raises what the call raised, on this rank."""
    label: str                     # what runs ("allreduce/ring"), as the stall inspector names it
    seq: int                       # the call's sequence number on its communicator
    group: Any                     # the communicator's transport (the stall watch's state)
    view: Any                      # the suspending transport the body runs on
    body: Callable[[], Any]        # runs the algorithm; returns the call's result
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    waited: bool = False           # the caller has had its result (or its error)
    owner: int | None = None       # the thread whose greenlet runs the body (None: not begun)
    let: Any = None                # that greenlet
    resumer: Any = None            # the greenlet that advanced it last (where it suspends to)
    inline: bool = False           # its body runs on its waiter's stack, not in a greenlet (`Engine._inline`)
    waiter: bool = False           # a caller waits for it (`Engine.wait_for`), and collects it once complete
    on_done: Callable[["Request"], None] | None = None       # (a generalized MPI request's completion)
    posted: bool = False           # MPI's own collective was posted at the start: `body` only finishes it
    wakes: bool = False            # worth waking the progress thread for at its start (`Engine.start`)
    finished: threading.Event | None = None   # made for a waiter on another thread, set when done
    started: float = 0.0           # when it began (perf_counter)
    source: Any = None             # the `Persistent` that began it (a nonblocking call's: kept for the next
                                   # call on the very same arrays, `collectives.RequestMemo`)

    def test(self) -> bool:
        """Advance this request (and the others this thread owns); True once complete, which
        completes it as a wait does (MPI_Test's rule: the result is in the caller's buffer,
        and `wait()` still returns it). A call that failed raises its error here."""
        if not self.done:
            engine().advance_mine(take=self)
        if self.done:
            self._collect()
        return self.done

    def wait(self) -> Any:
        """Complete the request and return the call's result (raises what the call raised)."""
        if not self.done:
            engine().wait_for(self)
        return self._collect()

    def _collect(self) -> Any:
        if not self.waited:
            self.waited = True
            if not self.inline:
                eng = engine()
                if not self.waiter or self in eng.unwaited:   # (completed by another thread before its waiter came)
                    eng.collected(self)
        return self._hand_over()


@dataclass(eq=False)
class Persistent:
    """A persistent collective (MPI-4 `MPI_Allreduce_init`): buffers bound, arguments
    checked, algorithm chosen and tunables set once; `start()` begins one call, `wait()`
    completes it and returns its result, as many times as wanted; `free()` when done. Every
    start is a collective call: the ranks start their persistent requests in the same order.
    Where MPI's own collective serves it as one call, `mpi` is the library's persistent
    request itself and a start and a wait are its MPI_Start and MPI_Wait."""
    label: str
    group: Any
    launch: Callable[["Persistent"], Request] | None   # begins one call of the bound collective
    request: Request | None = None                       # the call of the last start
    freed: bool = False
    mpi: Any = None                                      # MPI's own persistent request, where it serves
    finish: Callable[[], Any] | None = None              # (mpi) the result after each completion, where
    #                                                      there is something to do (AVG's division)
    active: bool = False                                 # (mpi) started, not yet waited for
    seq: int = 0                                         # (mpi) the last start's call number
    result: Any = None                                   # (mpi) the last call's result, once complete
    bound: Any = None                                    # what its starts run (`api._Bound`)
    #: a nonblocking call's, kept for the next call on the same arrays: it forgets its call
    #: once waited for (the call's result is the caller's buffer: nothing kept holds it)
    transient: bool = False

    def start(self) -> "Persistent":
        if self.mpi is not None and not self.active:
            g = self.group
            g.seq += 1
            self.seq = g.seq
            try:
                self.mpi.Start()
            except Exception as err:   # noqa: BLE001 (MPI's error: the other ranks are told)
                _raise_failed(g, err, self.label, self.seq)
            self.active = True
            return self
        if self.freed:
            raise ValueError(f"ringmpi: persistent {self.label} was freed")
        if self.active or self.request is not None and not self.request.waited:
            raise ValueError(f"ringmpi: persistent {self.label} started again before its last call was waited for")
        self.request = self.launch(self)
        self.request.source = self
        return self

    def test(self) -> bool:
        if self.mpi is not None:
            if not self.active:
                return True
            try:
                complete = self.mpi.Test()
            except Exception as err:   # noqa: BLE001
                self.active = False
                _raise_failed(self.group, err, self.label, self.seq)
            if not complete:
                return False
            self._done()
            return True
        return self.request is None or self.request.test()

    def wait(self) -> Any:
        """The result of the last start's call (None when never started)."""
        if self.mpi is not None:
            if self.active:
                err = self.group.wait_watched(self.mpi, self.label, self.seq)
                if err is not None:
                    self.active = False
                    raise err
                self._done()
            return self.result
        return None if self.request is None else self.request.wait()

    def _done(self) -> None:
        """MPI's call is complete: its result kept for this wait and any after it (a test
        that found it complete, then a wait), finished once where there is something to
        finish (AVG's division)."""
        self.active = False
        self.result = self.bound.result if self.finish is None else self.finish()

    def free(self) -> None:
        if self.active or self.request is not None and not self.request.done:
            raise ValueError(f"ringmpi: persistent {self.label} freed while its call is in flight; wait() first")
        self.freed = True
        if self.mpi is not None:
            self.mpi.Free()
            self.mpi = None

    def __enter__(self) -> "Persistent":
        return self

    def __exit__(self, *exc: Any) -> None:
        """`with ringmpi.allreduce_init(...) as bound:` frees it at the end (after the last
        call's wait when the block ends normally)."""
        if exc[0] is None and (self.active or self.request is not None and not self.request.done):
            self.wait()
        if not self.active and (self.request is None or self.request.done):
            self.free()

    def __repr__(self) -> str:
        return f"<ringmpi.Persistent {self.label} on rank {self.group.rank} of {self.group.size}>"


def _raise_failed(group: Any, err: BaseException, label: str, seq: int) -> NoReturn:
    """MPI failed call `seq` on this rank: the other ranks, who may wait for this one inside
    it, are told (`group.failed`: they abort if still there a few seconds later); raises
    ringmpi's error, caused by MPI's."""
    raised = group.failed(err, label, seq)
    if raised is err:
        raise err
    raise raised from err


class MPIRequest(_Handed):
    """A request that is one of MPI's own nonblocking collectives, where nothing can overlap
    it anyway (`api._Bound.lean`: one host whose cores all compute): begun on the caller's
    thread, tested and waited for in MPI (the stall inspector watching the wait), its
    result then finished (`finish`: AVG's division). No body, greenlet or engine step, and
    the progress thread never looks at it: MPI advances its own collective inside any MPI
    call. `Request`'s interface; never waited for, it is named as theirs are."""
    __slots__ = ("label", "seq", "group", "inner", "finish", "done", "waited", "result", "error", "source")

    def __init__(self, label: str, seq: int, group: Any, inner: Any, finish: Callable[[], Any] | None,
                 result: Any = None) -> None:
        self.label, self.seq, self.group, self.inner, self.finish = label, seq, group, inner, finish
        self.done = self.waited = False
        self.result, self.error, self.source = result, None, None
        engine().unwaited[self] = None   # (one dict store, atomic: `Engine.forgotten` copies it under the lock)

    def test(self) -> bool:
        if not self.done:
            try:
                if not self.inner.Test():
                    return False
            except Exception as err:   # noqa: BLE001 (MPI's error: raised by _collect, as a call's; an
                self._failed(self.group.failed(err, self.label, self.seq))   # interrupt leaves it in flight)
            else:
                self._finish()
        self._collect()
        return True

    def wait(self) -> Any:
        if not self.done:
            err = self.group.wait_watched(self.inner, self.label, self.seq)
            if err is None:
                self._finish()
            else:
                self._failed(err)
        return self._collect()

    def _finish(self) -> None:
        """Complete: `finish()` gives the result, where there is one (else it is `result`)."""
        self.done = True
        finish, self.finish = self.finish, None
        if finish is not None:
            try:
                self.result = finish()
            except Exception as err:   # noqa: BLE001
                self.error = err

    def _failed(self, err: BaseException) -> None:
        """Complete with `err`, the call's error as the group made it (`failed`)."""
        self.done, self.finish, self.error = True, None, err

    def _collect(self) -> Any:
        if not self.waited:
            self.waited = True
            engine().unwaited.pop(self, None)
        return self._hand_over()


def waitall(requests: Any) -> list:
    """Wait for every request (any order of completion); their results, in order. A call
    that failed raises after all the others are complete."""
    first: BaseException | None = None
    out = []
    for r in requests:
        try:
            out.append(r.wait())
        except BaseException as err:   # noqa: BLE001 (re-raised below, after the others)
            first = first or err
            out.append(None)
    if first is not None:
        raise first
    return out


def testall(requests: Any) -> bool:
    """Advance every request; True when all are complete."""
    return all([r.test() for r in requests])   # (each tested: each takes itself, `Request.test`)


class Engine:
    """The requests in flight in this process and what advances them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        # (dicts as ordered sets: a request leaves them in O(1), in whatever order it completes)
        self.active = ACTIVE                 # begun, not complete, in the order of the starts
        self.unwaited: dict[Request, None] = {}   # complete, not yet waited for (reported at exit)
        self.thread: threading.Thread | None = None
        self.urgent = 0                      # callers waiting for a request the thread owns
        self.asleep = False                  # the progress thread naps or sleeps (`_loop`)
        self.deep = False                    # it sleeps until a start wakes it
        self.until = 0.0                     # when its nap ends (perf_counter)
        self.lively = 0.0                    # until when its naps stay PROMPT long
        self._local = threading.local()      # per thread: idle worker greenlets

    # -- starting --------------------------------------------------------------------------
    def start(self, req: Request, thread: bool) -> Request:
        """Begin `req`: on the progress thread when `thread`, else its first round now."""
        req.started = time.perf_counter()
        with self.lock:
            self.active[req] = None
            if thread:
                if self.thread is None:   # (not `is_alive()` at every start: it takes a lock;
                    self._ensure_thread()  # a thread that ended forgets itself)
                worth = req.wakes or len(self.active) > 1
                if worth:
                    self.lively = req.started + LIVELY
                if self.asleep and (self.deep or worth and self.until > req.started + GRACE + PROMPT):
                    self.wake.notify()
                return req
        self._step(req)
        return req

    def _ensure_thread(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._thread, name="ringmpi-progress", daemon=True)
            self.thread.start()

    def _thread(self) -> None:
        try:
            self._loop()
        finally:
            self.thread = None

    # -- advancing -------------------------------------------------------------------------
    def _claim(self, req: Request, grace: float = 0.0) -> bool:
        """Whether this thread may run `req` (claiming it when nobody has yet; the progress
        thread leaves a request begun less than `grace` seconds ago to its caller, whose
        wait may come at once). A posted request (MPI's own) has no greenlet: it is claimed
        for one step at a time (`release`), since two threads must not test one MPI request."""
        me = threading.get_ident()
        if req.owner == me:
            return True
        if grace and not req.waiter and time.perf_counter() - req.started < grace:
            return False
        with self.lock:
            if req.owner is None and not req.done:   # (done: another thread completed it since the caller looked)
                req.owner = me
                return True
        return False

    @staticmethod
    def _release(req: Request) -> None:
        if req.posted:
            req.owner = None

    def _step(self, req: Request, grace: float = 0.0) -> bool:
        """Advance `req` once if its posted messages are complete (this thread owns it):
        True when it moved."""
        if req.done or req.inline or not self._claim(req, grace):
            return False
        view = req.view
        if req.posted:
            try:
                return self._complete(req)
            finally:
                self._release(req)
        here = getcurrent()
        if req.let is None:
            req.let = self._idle.pop() if self._idle else greenlet(self._work)
            req.resumer = here
            view.suspend = here.switch
            req.let.switch([req])   # (in a list it empties: a new greenlet keeps its first arguments)
            return True
        failed = None
        try:
            if view.pending and not view.ready():
                return False
        except BaseException as err:   # noqa: BLE001 (MPI's error in the messages of this round)
            failed = err
        req.resumer = here
        view.suspend = here.switch
        if failed is not None:
            req.let.throw(failed)      # raised where the body waits for them, as a blocking call's
        else:
            req.let.switch()
        return True

    @property
    def _idle(self) -> list:
        """This thread's idle worker greenlets (making one costs over ten times as much as
        switching into an idle one)."""
        idle = getattr(self._local, "idle", None)
        if idle is None:
            idle = self._local.idle = []
        return idle

    def _work(self, first: list) -> None:
        """A worker greenlet: runs one request's body at a time, then waits for the next."""
        req = first.pop()
        while True:
            self._run(req)
            resumer, req = req.resumer, None   # (an idle worker holds no request, nor its result)
            self._idle.append(getcurrent())
            req = resumer.switch().pop()

    def _run(self, req: Request, error: BaseException | None = None) -> None:
        try:
            if error is not None:
                raise error
            req.result = req.body()
        except GreenletExit:
            raise
        except BaseException as err:   # noqa: BLE001 (the caller gets it from wait())
            req.error = err if error is None else req.group.failed(err, req.label, req.seq)
        req.body = None       # (it holds the call's buffers: a kept request keeps no user array alive)
        req.view.close()
        with self.lock:
            req.done = True
            self.active.pop(req, None)
            if not (req.waited or req.inline or req.waiter):   # (one with a waiter: collected next)
                self.unwaited[req] = None
            finished = req.finished
        if finished is not None:
            finished.set()
        if req.on_done is not None:
            req.on_done(req)

    def collected(self, req: Request) -> None:
        """`req` was waited for: no longer kept for the report of those never waited for
        (nor its result with it)."""
        with self.lock:
            self.unwaited.pop(req, None)

    def mine(self, take: Any = None) -> list[Request]:
        """The requests this thread may advance: those it owns, MPI's own posted ones (no
        greenlet: any thread tests them, one step at a time), and of those nobody has taken
        yet, `take`: the request its caller tests or waits for, or ALL (the progress thread,
        and the exit). The others are the progress thread's to take: a body begun on this
        thread resumes only on it, and would stand still while it computes or blocks outside
        ringmpi, however long a peer waits for it (benchmarks/README.md, "Requests the
        progress thread keeps")."""
        me = threading.get_ident()
        with self.lock:
            return [r for r in self.active if r.owner == me or r.owner is None and
                    (r.posted or take is ALL or r is take)]

    def advance_mine(self, grace: float = 0.0, take: Any = None) -> bool:
        """Advance every request this thread owns or may take (`mine`; `_claim`'s `grace`);
        True when any moved."""
        moved = False
        for r in self.mine(take):
            moved |= self._step(r, grace)
        return moved

    def _urge(self, besides: Any = None) -> bool:
        """A caller blocks (in a wait, or in a blocking call beside requests): where a request
        nobody has taken is in flight (but `besides`, the one it waits for), the progress
        thread is woken and neither naps nor leaves a young request its GRACE until `_calm`,
        since that request may be what a peer, or the call waited for, needs next. Whether
        it was urged."""
        if len(self.active) <= (besides is not None):   # (nothing else in flight: no lock)
            return False
        with self.lock:
            urge = any(r.owner is None and not r.posted and r is not besides for r in self.active)
            if urge:
                self.urgent += 1
                if self.asleep:
                    self.wake.notify()
        return urge

    def _calm(self) -> None:
        with self.lock:
            self.urgent -= 1

    def wait_for(self, req: Request) -> None:
        """Until `req` is complete: run it here if this thread owns it or may take it
        (blocking in MPI on the posted messages of this thread's requests), else wait for
        the progress thread, which stops sleeping meanwhile. Watched by the stall inspector."""
        g, me = req.group, threading.get_ident()
        before = g.waiting(req.label, req.seq)
        req.waiter = True
        others = self._urge(req)
        try:
            self._wait_here(req, me, others)
        finally:
            if others:
                self._calm()
            g.waited(before)

    def _wait_here(self, req: Request, me: int, others: bool) -> None:
        """`wait_for`'s loop: `req` run here (inline, or stepped with this thread's own
        requests), or waited for on the progress thread. Where `others` (requests nobody
        has taken are in flight beside it), a `req` not yet begun is the thread's too: it
        runs them all in one loop while this thread sleeps, where this thread running
        `req` beside it would take turns with it for the GIL and the core."""
        hand = others and req.owner is None and req.let is None
        while not req.done:
            if req.posted:
                self._wait_posted(req)
                continue
            if not hand and self._claim(req):
                if req.let is None and not req.inline:
                    self._inline(req)
                elif not self.advance_mine(take=req) and not req.done:
                    self.block([r for r in self.mine(req) if r.owner is not None and r.let is not None])
                continue
            with self.lock:
                if req.done:
                    break
                if req.finished is None:
                    req.finished = threading.Event()
                finished = req.finished
                self.urgent += 1
                # (this thread's own requests in flight keep moving meanwhile: the one
                # waited for may need one of them, as a shared-memory call needs those
                # started before it to leave the transport)
                own = any(r.owner == me for r in self.active)
            try:
                if own:
                    self.advance_mine()
                    finished.wait(OWN_NAP)
                else:
                    finished.wait()
            finally:
                with self.lock:
                    self.urgent -= 1

    def _inline(self, req: Request) -> None:
        """A request waited for before its body began (a start then a wait, nothing to
        overlap) runs here, on the waiter's stack, as a blocking call does: no greenlet, no
        switches, its waits held in place (`_hold`)."""
        req.inline = req.view.inline = True
        req.view.suspend = functools.partial(self._hold, req.view)
        self._run(req)

    def _hold(self, view: Any) -> None:
        """Where an inline body waits for its messages: in MPI when no other request is in
        flight, else testing them and advancing this thread's other requests in turn."""
        if len(self.active) > 1:
            self.alongside(view.ready)
            return
        while not view.ready():
            view.wait_all()

    def _wait_posted(self, req: Request) -> None:
        """MPI's own request: waited for in MPI, once no other thread is testing it."""
        if not self._claim(req):
            yield_core()
            return
        try:
            if not req.done:
                req.view.wait_all()
                view = req.view
                if view.failure is None and view.until is None:   # (complete: Waitall returned)
                    self._run(req)
                else:
                    self._complete(req)
        finally:
            self._release(req)

    def _complete(self, req: Request) -> bool:
        """A posted request (MPI's own collective) finished if its MPI request is complete
        (with MPI's error, if any, as the call's: raised by wait()); True when it is."""
        try:
            if not req.view.ready():
                return False
        except BaseException as err:   # noqa: BLE001
            self._run(req, err)
            return True
        self._run(req)
        return True

    def block(self, reqs: list[Request]) -> None:
        """Wait until a posted message of one of `reqs` completes: in MPI when one request
        has messages in flight (an MPI error is then its own: delivered to it by `_step`),
        else by testing them in turn (MPI_Waitany's error would name no request)."""
        views = [r.view for r in reqs if r.view.pending]
        if len(views) == 1:
            views[0].wait_all()
        elif views:
            yield_core()

    def alongside(self, test: Callable[[], bool]) -> None:
        """Until `test()` (a blocking call's own messages, tested): advance this thread's
        requests in turn, so a rank blocked in one collective still moves the others."""
        urged = self._urge()
        try:
            spins = 0
            while not test():
                if not self.advance_mine():
                    spins += 1
                    yield_core() if spins < 100 else time.sleep(2e-5)
                else:
                    spins = 0
        finally:
            if urged:
                self._calm()

    # -- the progress thread ---------------------------------------------------------------
    def _loop(self) -> None:
        """Test the requests in flight, napping MAX_NAP at most between tests. With none of
        its own, and none left unclaimed for GRACE (a wait that comes at once runs its
        request itself), it naps, longer each time (LINGER_NAP doubled up to LONG_NAP), and
        after LINGER of that sleeps until a start wakes it. Each wake takes the GIL and a
        core from the caller and its peers: a wake at every start, or naps of a millisecond
        beside a loop of small requests, cost each request a measurable share of its time
        (benchmarks/README.md, "A progress thread that wakes only when it is worth it"). A
        request worth it (`Request.wakes`: large, or
        completed by MPI's own waits; or not the only one in flight: its caller overlaps
        several) keeps the naps at PROMPT for LIVELY seconds, and wakes a thread that naps
        longer; any other is found at the nap's end: none waits longer than LONG_NAP for
        the thread while its caller blocks elsewhere."""
        me = threading.get_ident()
        nap = idle = 0.0
        linger = LINGER_NAP
        while True:
            with self.lock:
                now = time.perf_counter()
                look = self._next_look(me, now)
                if look > now:   # (nothing to do before `look`)
                    young = look < INF   # (a request its caller may yet wait for: looked at when GRACE old)
                    self.deep = not young and idle >= LINGER
                    timeout = look - now if young else None if self.deep else linger
                    self.until = now + timeout if timeout is not None else INF
                    self.asleep = True
                    woken = self.wake.wait(timeout)
                    self.asleep = False
                    if woken or self.deep:   # (by a start)
                        self.deep, idle, linger = False, 0.0, LINGER_NAP
                    elif not young:
                        idle += linger
                        linger = min(2 * linger, LONG_NAP if now > self.lively else PROMPT)
                    continue
            idle, linger = 0.0, LINGER_NAP
            moved = self.advance_mine(self._grace(), ALL)   # (its loop's names die with it)
            if moved or self.urgent:
                nap = 0.0
                yield_core()        # (gives the GIL away, the caller may be waiting for it, without a timer's slack)
            else:
                nap = min(max(2 * nap, 2e-5), MAX_NAP)
                time.sleep(nap)

    def _grace(self) -> float:
        """How long the thread leaves a request nobody has taken to its caller: GRACE, none
        while a caller waits (it waits for another request, or for this thread)."""
        return 0.0 if self.urgent else GRACE

    def _next_look(self, me: int, now: float) -> float:
        """When the thread has something to do (under the lock): now if it owns a request in
        flight or one was left unclaimed for GRACE; else when the youngest unclaimed one
        turns GRACE old (INF: none)."""
        look = INF
        for r in self.active:
            if r.owner == me:
                return now
            if r.owner is None:
                look = min(look, r.started + self._grace())
        return look

    # -- what was never waited for ---------------------------------------------------------
    def forgotten(self, group: Any = None) -> list[Request]:
        with self.lock:
            every = [*self.active, *self.unwaited]
        return [r for r in every if not r.waited and (group is None or r.group is group)]

    def at_exit(self, seconds: float = 2.0) -> None:
        """The process is exiting (before MPI_Finalize): name the requests never waited
        for, then give those still in flight up to `seconds` to complete (the peers may be
        waiting for this rank's part; MPI_Finalize with messages in flight can wait forever)."""
        self.report()
        end = time.monotonic() + seconds
        while self.active and time.monotonic() < end:
            if not self.advance_mine(take=ALL):
                time.sleep(1e-3)

    def report(self, group: Any = None, why: str = "at exit") -> None:
        """Name on stderr the requests never waited for (of `group`, or all)."""
        left = self.forgotten(group)
        if not left:
            return
        for r in left:
            r.waited = True
        g = left[0].group
        names = "; ".join(f"{r.label} (call {r.seq}, {'complete' if r.done else 'in flight'})" for r in left[:8])
        more = f" and {len(left) - 8} more" if len(left) > 8 else ""
        sys.stderr.write(f"ringmpi WARN: rank {g.rank} of {g.size}: {len(left)} request(s) never waited for "
                         f"{why}: {names}{more}. Call wait() (or ringmpi.waitall) on every request.\n")
        sys.stderr.flush()


#: gives the core (and the GIL) away for a moment while a caller polls: about a microsecond,
#: where time.sleep(0) sleeps Linux's timer slack, tens of microseconds (benchmarks/README.md)
yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))
#: seconds a caller waiting for the progress thread's request sleeps between advancing its
#: own requests in flight (`Engine.wait_for`)
OWN_NAP = 1e-4
#: seconds the progress thread leaves a new request to its caller: a wait that comes at once
#: (nothing to overlap) then runs it at a blocking call's speed, without a thread's hand-off
GRACE = 1e-4
#: seconds the progress thread naps after its last request completed, LINGER_NAP first,
#: twice as long each time up to LONG_NAP, before it sleeps until a start wakes it
#: (`Engine._loop`): a request that wakes nobody waits up to LONG_NAP for the thread, if its
#: caller does not wait for it first
LINGER, LINGER_NAP, LONG_NAP = 0.25, 1e-3, 32e-3
#: a request of at least this many bytes may wake the napping progress thread at its start
#: (`Request.wakes`): it takes longer than the wake costs on any link; it waits at most
#: PROMPT seconds more than GRACE for the thread's first look
WAKE_BYTES, PROMPT = 256 << 10, 1e-3
#: seconds after the start of such a request during which the thread's naps stay PROMPT long
#: (its next start then need not wake it)
LIVELY = 8e-3
#: the longest the progress thread sleeps between tests while requests are in flight: a
#: large message over TCP advances only when it is tested, so a longer nap stretches the
#: transfer (benchmarks/README.md, "Requests"); Linux's timer slack adds to any nap anyway
MAX_NAP = 2e-5
#: every request begun and not complete in this process (a blocking call tests it, one
#: global read while nothing is in flight, and then advances the requests beside its own
#: messages: `Engine.alongside`)
ACTIVE: dict[Request, None] = {}
_ENGINE: list[Engine] = []
INF = float("inf")
#: `Engine.mine`'s `take` for a thread that may take any request nobody has taken yet
ALL = object()
_MAKING = threading.Lock()


def _after_fork() -> None:
    """A fork's child has none of its parent's requests (MPI does not follow a fork), nor its
    progress thread, and maybe a lock its parent's other thread held: a fresh engine at its
    first use."""
    _ENGINE.clear()
    ACTIVE.clear()


os.register_at_fork(after_in_child=_after_fork)


def engine() -> Engine:
    """The process's engine, made at first use."""
    return _ENGINE[0] if _ENGINE else first_use(_ENGINE, _MAKING, lambda: _ENGINE.append(Engine()))


def on_progress_thread() -> bool:
    """Whether the caller is the progress thread (which polls nothing in a loop: it holds
    the GIL and a core that the caller's computation and the peers need)."""
    return bool(_ENGINE) and _ENGINE[0].thread is threading.current_thread()


def progress() -> bool:
    """Advance the requests this thread owns (a loop that computes and has no progress
    thread calls this now and then); True when any moved."""
    return engine().advance_mine() if _ENGINE else False
