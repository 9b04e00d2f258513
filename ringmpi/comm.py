"""ringmpi.Comm: an mpi4py intracommunicator whose buffer collectives run ringmpi.

    comm = ringmpi.Comm(MPI.COMM_WORLD)              # the one-line switch
    comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)  # ringmpi's auto (or the algorithm chosen)
    comm.Bcast([weights, MPI.FLOAT], root=0)         # every mpi4py buffer spec is accepted

`Comm` is a subclass of `MPI.Intracomm` holding the same MPI handle as the communicator it
wraps (no MPI_Comm_dup): `isinstance(comm, MPI.Intracomm)` holds, C extensions that take the
communicator's handle work, and every method ringmpi does not override (point-to-point,
the lower-case object collectives, Gather, Scan, the nonblocking and persistent forms of
those, attributes, ...) is mpi4py's own. `Dup`, `Split`, `Split_type`, `Create`, `Create_group`,
`Clone` and `Idup` return `Comm`s with the same algorithm choices.

The overridden calls are Allreduce, Reduce, Bcast, Allgather, Allgatherv (contiguous
displacements), Alltoall, Reduce_scatter_block and Reduce_scatter; the nonblocking
Iallreduce, Ireduce, Ibcast, Iallgather, Ialltoall, Ireduce_scatter_block (`_Request`) and
the persistent Allreduce_init, Reduce_init, Bcast_init, Allgather_init, Alltoall_init,
Reduce_scatter_block_init (`_Persistent`; `_MPIPersistent`, MPI's own persistent request,
where that serves them) run as ringmpi's requests. Each parses its buffer
specifications as mpi4py does (`buf`, `[buf, type]`, `[buf, count, type]`,
`[buf, (count, displ), type]`, `[buf, count, displ, type]`, `MPI.IN_PLACE` or None) into
numpy views of the same memory, and runs ringmpi's collective on them. A call ringmpi cannot
serve goes to mpi4py unchanged, so the wrapper never makes a working program fail and a bad
call raises mpi4py's own exception: derived or non-numeric datatypes, user-defined or
MPI.REPLACE-like ops, MPI.BOTTOM, DLPack or CUDA-array-interface buffers, buffers that are
not contiguous or not writable where written, mismatched counts or types, aliased send and
receive buffers, zero-size messages, invalid roots.

The decision is made on each rank from its own arguments, as MPI's argument checks are: a
correct program passes matching arguments on every rank, so every rank decides alike. A
program whose ranks describe one message differently (a derived datatype on one rank, the
matching predefined one on another) must set RINGMPI_ALGO=mpi or use plain mpi4py.

This module and ringmpi/mpicomm.py are the only ones that import mpi4py: the wrapper *is* an
mpi4py communicator; it sends nothing itself (its collectives are ringmpi's public calls,
which reach MPI through the transport in mpicomm).
"""
from __future__ import annotations

import ctypes
import inspect
import mmap
import operator
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Literal, NamedTuple, Sequence

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import collectives as _c
from .api import CACHE, algorithms, group, request
from .auto import Margins
from .requests import ACTIVE, engine, progress
from .errors import RingmpiUsageError
from .ops import SUPPORTED_DTYPES, check_op_dtype, is_half
from .settings import settings
from .written import written

__all__ = ["Comm", "COLLECTIVES", "stats"]

_OPS = ((MPI.SUM, "SUM"), (MPI.PROD, "PROD"), (MPI.MAX, "MAX"), (MPI.MIN, "MIN"), (MPI.LAND, "LAND"),
        (MPI.LOR, "LOR"), (MPI.LXOR, "LXOR"), (MPI.BAND, "BAND"), (MPI.BOR, "BOR"), (MPI.BXOR, "BXOR"))
_OP_IDS = {id(mop): name for mop, name in _OPS}   # the module's constants live as long as MPI
_SUPPORTED = frozenset(SUPPORTED_DTYPES)
_DTYPES: dict[int, np.dtype | None] = {}   # predefined MPI datatype handle -> numpy dtype (finite)
#: calls left to mpi4py unchanged, per method (`stats()`); the rest ran ringmpi's collectives
PASSED: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
_HOT_SIZE = 16      # buffer pairs per communicator whose Allreduce plan is kept (DDP-style buckets)


def stats() -> dict[str, tuple[int, int]]:
    """{method: (calls, of which left to mpi4py)} on this process, for every overridden
    collective called so far (RINGMPI_DEBUG=INFO prints it at the end of `ringmpi.run`).
    Allreduce's repeats on the same arrays (its hot path, which counts nothing) are not
    included: they run as the first such call did."""
    calls = Counter(CALLS)
    for kept in _ALL_KEPT:
        calls[kept.method] += kept.calls
    return {m: (n, PASSED[m]) for m, n in sorted(calls.items())}


def _op(op: Any, dtype: np.dtype) -> str | None:
    """ringmpi's name of a predefined MPI op valid for `dtype`, or None (left to MPI)."""
    name = _OP_IDS.get(id(op))   # MPI.SUM itself: the common case, one lookup
    if name is None and isinstance(op, MPI.Op):
        name = next((n for mop, n in _OPS if op == mop), None)
    return name if name is not None and check_op_dtype(name, dtype) is None else None


def _dtype(datatype: Any) -> np.dtype | None:
    """The numpy dtype of a predefined, numeric MPI datatype; None for anything else."""
    if not isinstance(datatype, MPI.Datatype) or datatype == MPI.DATATYPE_NULL or not datatype.is_predefined:
        return None
    key = datatype.handle
    if key not in _DTYPES:
        try:
            dt = dtlib.to_numpy_dtype(datatype)
        except (ValueError, TypeError, KeyError):
            dt = None
        _DTYPES[key] = dt if dt in _SUPPORTED and datatype != MPI.PACKED else None
    return _DTYPES[key]


def _array(buf: Any, writable: bool) -> np.ndarray | None:
    """The memory of `buf` as a flat numpy array in memory order (a view), or None."""
    if type(buf) is np.ndarray:
        a = buf
    elif isinstance(buf, np.ndarray):
        a = buf.view(np.ndarray)
    else:
        try:
            a = np.asarray(memoryview(buf))
        except (TypeError, ValueError, BufferError):
            return None
    if writable and not a.flags.writeable:
        return None
    if a.ndim != 1:
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            return None
        a = a.reshape(-1, order="A")
    elif not a.flags.c_contiguous:
        return None
    return a


def _index(x: Any) -> int | None:
    try:
        v = operator.index(x)
    except TypeError:
        return None
    return v if v >= 0 else None


class _Msg:
    """One simple mpi4py message: the whole buffer after the displacement (`flat`) and the
    count given, if any (in datatype entries)."""
    __slots__ = ("flat", "count")

    def __init__(self, flat: np.ndarray, count: int | None) -> None:
        self.flat = flat
        self.count = count

    def take(self, blocks: int = 1) -> np.ndarray | None:
        """`count * blocks` entries (the whole buffer, `blocks` equal parts of it, when no
        count was given); None when the buffer is too short or does not split."""
        if self.count is None:
            return self.flat if self.flat.size % blocks == 0 else None
        n = self.count * blocks
        return self.flat[:n] if n <= self.flat.size else None


def _parts(msg: Any, pairs: tuple) -> tuple | None:
    """(buf, count, displ, dtype) of an mpi4py message specification: buf, [buf, dtype],
    [buf, count], [buf, (count, displ)], [buf, count, dtype], [buf, (count, displ), dtype],
    [buf, count, displ, dtype]; None when malformed. `pairs`: the types a (count, displ)
    pair may have (list or tuple in a simple message, tuple in a vector one, as mpi4py)."""
    if not (type(msg) is list or type(msg) is tuple):
        return msg, None, None, None
    n = len(msg)
    if n == 2:
        buf, count = msg
        dtype = None
        if isinstance(count, (MPI.Datatype, str)):
            return buf, None, None, count
    elif n == 3:
        buf, count, dtype = msg
    elif n == 4:
        return msg[0], msg[1], msg[2], msg[3]
    else:
        return None
    displ = None
    if type(count) in pairs:
        if len(count) != 2:
            return None
        count, displ = count
    return buf, count, displ, dtype


def _reduction(sendbuf: Any, recvbuf: Any, op: Any) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(send view, receive view, op name) when ringmpi serves a reduction into `recvbuf`
    exactly: an array of a dtype the op takes, and IN_PLACE (the same view) or a send array
    like it that does not overlap it; None: mpi4py serves the call."""
    r = _message(recvbuf, True)
    rv = r and r.take()
    if rv is None or not rv.size or not (name := _op(op, rv.dtype)):
        return None
    rv = _whole(recvbuf, rv)
    if _in_place(sendbuf):
        return rv, rv, name
    s = _message(sendbuf, False)
    sv = s and s.take()
    if sv is not None and sv.size == rv.size and sv.dtype == rv.dtype and _apart(sv, rv):
        return _whole(sendbuf, sv), rv, name
    return None


def _whole(buf: Any, flat: np.ndarray) -> np.ndarray:
    """`buf` itself where the call passed a bare C-contiguous array, of which `_message`
    made `flat` (no count, datatype or displacement: all of its memory, in its order);
    one in Fortran order stays flat (the call pairs elements in memory order). ringmpi's
    functions take the array as it is, and the memos that find a call's plan by its arrays
    (`Comm._remember`, the requests' `RequestMemo`) then find the very array the next call
    passes, where a fresh flat view each call is never found (a matrix's gradient
    all-reduced every step took the full path each time), a matrix that is itself a view
    of a larger buffer included."""
    return buf if type(buf) is np.ndarray and buf.flags.c_contiguous and flat.size == buf.size else flat


def _message(msg: Any, writable: bool) -> _Msg | None:
    """Parse an mpi4py buffer specification as mpi4py's message_simple does."""
    parts = _parts(msg, (tuple, list))
    if parts is None:
        return None
    buf, count, displ, dtype = parts
    if buf is None or buf is MPI.BOTTOM or isinstance(buf, (list, tuple, str)):
        return None
    a = _array(buf, writable)
    if a is None:
        return None
    if dtype is not None:
        dt = _dtype(dtype)
        if dt is None or a.nbytes % dt.itemsize:
            return None
        if a.dtype != dt:
            a = a.view(np.uint8).view(dt)
    elif a.dtype not in _SUPPORTED or not a.dtype.isnative:
        return None
    if count is not None and (count := _index(count)) is None:
        return None
    if displ is not None:
        if (displ := _index(displ)) is None or displ > a.size:
            return None
        a = a[displ:]
    return _Msg(a, count)


_BYTES_LIKE = (bytearray, mmap.mmap, memoryview)
_IN_PLACE = MPI.IN_PLACE
#: the dtypes of bare arrays whose calls `_Kept` may pass to mpi4py as they are (numpy's
#: own instances: a call's dtype is compared by identity)
_ARRAY_DTYPES = frozenset(d for d in SUPPORTED_DTYPES if not is_half(d))
_LABELS = {method: f"{name}/mpi" for name, spec in _c.SPECS.items() for method in spec.mpi_methods}
_LABELS.update({f"I{method[0].lower()}{method[1:]}": label for method, label in _LABELS.items()})


_ALL_KEPT: list = []   # the `_Kept` in use (for `stats`: the calls each passed; `_retire` folds them in)
#: the methods whose buffer forms `_Kept` passes to mpi4py as they are, and the `Comm`
#: attribute that holds each one's (None: none kept)
_KEPT_METHODS = {method: f"_kept_{method.lower()}" for method in (
    "Allreduce", "Bcast", "Allgather", "Alltoall", "Iallreduce", "Ibcast", "Iallgather", "Ialltoall")}


def _forget_kept() -> None:
    """The plans are forgotten (`api.PlanCache.forget`): every kept form is retired."""
    for kept in list(_ALL_KEPT):
        _retire(kept)


CACHE.on_forget.append(_forget_kept)


def _retire(kept: "_Kept") -> None:
    """A `_Kept` no longer used (the plans forgotten, replaced, or beyond the 256 most
    recent): nothing fits it any more, so the next call of its method takes the full
    path (inline: no buffer's type is None, nor an array's dtype; `_Kept.fits`: no
    generation is -1), and its calls go to CALLS."""
    kept.kind = kept.datatype = None
    kept.generation = -1
    CALLS[kept.method] += kept.calls
    kept.calls = 0
    if kept in _ALL_KEPT:
        _ALL_KEPT.remove(kept)


class _Form(NamedTuple):
    """What decides a call of one buffer specification (`_form`): the buffer's type, the
    count (a whole buffer's bytes, negated; an array's elements) and the datatype (an
    array's dtype)."""
    kind: type
    count: int
    datatype: Any


class _Kept:
    """Buffer forms of one method that ringmpi decided are MPI's own (`Comm._note`), and
    the plan cache's generation then (a tuner's switch, new settings or profile, a freed
    communicator forget them: `_forget_kept`). The method's `Comm` override compares a
    call with them field by field, the common `[buf, count, type]` inline (no key built,
    nothing hashed), and calls MPI's own on the arguments as they are, with the stall
    watch's bookkeeping of an MPI plan (`refused`: a call whose argument mpi4py refuses
    takes the full path, which explains or serves it). That comparison and bookkeeping are
    written out in each of `Comm.Bcast`, `Comm.Allreduce`, `Comm.Allgather` and
    `Comm.Alltoall` from one text (`_KEPT_CALL`), not called: at a few bytes, one more
    Python frame is a tenth of mpi4py's whole call. A nonblocking method's kept calls begin
    MPI's own request (`_KEPT_START`)."""
    __slots__ = ("method", "label", "generation", "transport", "send", "recv", "extra", "kind", "count",
                 "datatype", "calls")

    def __init__(self, method: str, key: tuple, generation: int, transport: Any) -> None:
        self.method, self.label = method, _LABELS[method]
        self.generation, self.transport = generation, transport
        #: the first buffer's form (True: MPI.IN_PLACE), the second's (None: a one-buffer call),
        #: the call's other argument (the op, the root, or None)
        self.send, self.recv, self.extra = (key[0], None, key[1]) if len(key) == 2 else key
        #: the last buffer's form (`recv`, or a one-buffer call's `send`) field by field, for the
        #: inline comparison (an attribute of a tuple costs twice one of these)
        last = self.send if self.recv is None else self.recv
        self.kind, self.count, self.datatype = last if last is not True else (None, None, None)
        self.calls = 0
        _ALL_KEPT.append(self)
        if len(_ALL_KEPT) > 256:
            _retire(_ALL_KEPT[0])

    def pair(self, a: Any, b: Any) -> bool:
        """A two-buffer call fits (`fits`), `[buf, count, type]`, bare arrays and IN_PLACE
        compared inline (an array's contiguity is left to mpi4py, which refuses one that is
        not: `refused`)."""
        f = self.send
        if type(b) is list and len(b) == 3 and b[2] is self.datatype and b[1] == self.count and \
                type(b[0]) is self.kind:
            return a is _IN_PLACE if f is True else (
                type(a) is list and len(a) == 3 and a[2] is f.datatype and a[1] == f.count and type(a[0]) is f.kind
                or _fits(a, f))
        if type(b) is np.ndarray:   # (`fits` takes no array this does not)
            if b.dtype is not self.datatype or b.size != self.count:
                return False
            if f is True:
                return a is _IN_PLACE
            if type(a) is not np.ndarray:
                return _fits(a, f)
            return a.dtype is f.datatype and a.size == f.count and not (   # (`_may_overlap`, inline)
                a is b or (a.base is not None or b.base is not None) and np.may_share_memory(a, b))
        return self.fits(a, b)

    def fits(self, a: Any, b: Any) -> bool:
        """The general comparison, for what the inline one in `Comm` does not take: lists of
        two, tuples, bare arrays (two that may overlap take the full path, which explains or
        serves them; two that own their memory cannot, and the bounds check costs as much as
        the call)."""
        if self.generation != CACHE.generation or not (a is _IN_PLACE if self.send is True else _fits(a, self.send)):
            return False
        if b is None:
            return True
        if not _fits(b, self.recv):
            return False
        return type(a) is not np.ndarray or type(b) is not np.ndarray or not _may_overlap(a, b)

    def refused(self, err: BaseException) -> None:
        """MPI's own call raised `err`: mpi4py refused this call's arguments (a read-only or
        strided buffer of the kept form: the caller takes the full path, which explains or
        serves it; the form stays kept, the next call's buffer is another), or MPI failed
        (the other ranks are told, as in a plan)."""
        t = self.transport
        if isinstance(err, (BufferError, ValueError, TypeError)):
            t.current = t.seq = t.seq - 1
            t.busy = None
            return
        raised = t.failed(err)
        t.busy = None
        raise raised from err


class _MPIRequest(MPI.Request):
    """What a kept nonblocking call returns (`_KEPT_START`): the library's own request for
    MPI's own collective, begun on the caller's specifications as they are, as plain
    mpi4py would (the drop-in's other requests are generalized requests that ringmpi
    completes, `_Request`, which cost more than such a call itself). It is an MPI request:
    `MPI.Request.Waitall` and the like take it beside any other and complete it themselves.
    Its own `Wait` tells the stall watch which call the caller waits for, as a ringmpi
    request's wait does; it is not reported when never waited for, as mpi4py's are not."""
    __slots__ = ("kept", "seq")   # (what began it: a `_Kept`, or a persistent one's `_Named`; the call's sequence number)

    def Wait(self, status: Any = None) -> Literal[True]:
        err = self.kept.transport.wait_watched(self, self.kept.label, self.seq, status)
        if err is not None:
            raise err
        return True

    def Test(self, status: Any = None) -> bool:
        try:
            return MPI.Request.Test(self, status)
        except MPI.Exception as err:
            raise self.kept.transport.failed(err, self.kept.label, self.seq) from err


def _fits(msg: Any, form: "_Form | Literal[True]") -> bool:
    """`msg` has `form` (`_form`)."""
    if form is True:
        return msg is _IN_PLACE
    if type(msg) is np.ndarray:   # (one not contiguous: the full path, which serves it or says why not)
        return form.kind is np.ndarray and msg.dtype is form.datatype and msg.size == form.count and \
            msg.flags.c_contiguous
    if type(msg) is not list and type(msg) is not tuple:
        return False
    if len(msg) == 3:
        return form.count >= 0 and msg[2] is form.datatype and msg[1] == form.count and type(msg[0]) is form.kind
    return len(msg) == 2 and form.count < 0 and msg[1] is form.datatype and type(msg[0]) is form.kind and \
        len(msg[0]) == -form.count


def _form(msg: Any) -> Any:
    """What decides a call of an mpi4py buffer specification `[buf, count, type]` or
    `[buf, type]` over bytes-like memory, or of a bare contiguous numpy array of a dtype
    whose MPI datatype mpi4py and ringmpi name alike (`_ARRAY_DTYPES`: not the 16-bit
    floats, which ringmpi sends as words and reduces in float32), or MPI.IN_PLACE: the
    buffer's type, the count (or the bytes; an array's elements) and the datatype (an
    array's dtype); None for anything else."""
    if msg is MPI.IN_PLACE:
        return True
    if type(msg) is np.ndarray:
        dt = msg.dtype
        return _Form(np.ndarray, msg.size, dt) if dt in _ARRAY_DTYPES and msg.flags.c_contiguous else None
    if type(msg) is not list and type(msg) is not tuple:
        return None
    n = len(msg)
    if n == 3:
        buf, count, dt = msg
        if type(count) is not int:
            return None
    elif n == 2:
        buf, dt = msg
        if type(buf) is memoryview:
            return None
        count = -len(buf)      # (the whole buffer: its bytes)
    else:
        return None
    if type(buf) not in _BYTES_LIKE or type(dt) is not MPI.Datatype:
        return None
    return _Form(type(buf), count, dt)


def _forms(a: Any, b: Any, extra: Any) -> tuple | None:
    """The key of a call's buffer forms (`_form` of both; `b` None: one buffer) and its other
    arguments, or None when a form is not one `Comm._passes` serves."""
    fa = _form(a)
    if fa is None:
        return None
    if b is None:
        return fa, extra
    fb = _form(b)
    return None if fb is None or fb is True else (fa, fb, extra)


def _reduces_as_mpi(name: str, recvbuf: Any, rv: np.ndarray) -> bool:
    """MPI's own reduction of a call's buffers as given (the datatype named, or the one
    mpi4py infers from an array) is ringmpi's `name` over `rv`: not MPI_BYTE but with the
    bitwise ops (MPI refuses it), not MAX and MIN of floats (ringmpi's propagate NaN), and
    over an array only integers and floats (not bool: MPI_C_BOOL takes the logical ops only)."""
    if name in ("MAX", "MIN") and rv.dtype.kind == "f":
        return False
    if type(recvbuf) is np.ndarray:
        return rv.dtype.kind in "iuf"
    return name in ("BAND", "BOR", "BXOR") or recvbuf[-1] is not MPI.BYTE


def _in_place(x: Any) -> bool:
    return x is None or x is MPI.IN_PLACE


def _apart(a: np.ndarray, b: np.ndarray) -> bool:
    return not np.may_share_memory(a, b)


def _may_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """`_apart`'s opposite, without the bounds check for two arrays that own their memory
    (which cannot overlap): what a kept call of two arrays compares (`_Kept`)."""
    return a is b or (a.base is not None or b.base is not None) and np.may_share_memory(a, b)


def _counts(x: Any, p: int) -> list[int] | None:
    if not isinstance(x, (list, tuple, np.ndarray)) or len(x) != p:
        return None
    out = [_index(c) for c in x]
    return None if any(c is None for c in out) else out


#: a drop-in method whose calls `_Kept` may pass to MPI's own, written out per method from
#: this one text (`_kept_method`, as `collectives._CALL` writes the public calls): the
#: comparison with the kept forms and the call-in-flight state of an MPI plan inline, where
#: one more Python frame is a tenth of mpi4py's whole call at a few bytes, and decides
#: whether the drop-in keeps within 1.5x of it (benchmarks/README.md, "The drop-in's kept
#: calls in one frame"); any other call goes on to `rest`, the method's full path. A call
#: whose argument mpi4py refuses takes the full path too (`_Kept.refused`).
_KEPT_HEAD = """def {method}(self, {params}):
    kept = self.{attribute}
    if kept is not None and {fits}:
        t = kept.transport
        if ACTIVE:
            progress()
"""
_KEPT_CALL = _KEPT_HEAD + """        t.current = t.seq = t.seq + 1
        t.busy = kept.label
        try:
            function(self, {args})
        except BaseException as err:
            kept.refused(err)
        else:
            t.busy = None
            kept.calls += 1
            return
    rest(self, {args})
"""
#: the same for a nonblocking method: MPI's own request begun on the arguments as they are,
#: where the full path's request would be (its sequence number taken, the requests in flight
#: advanced first; an argument mpi4py refuses takes the full path), as `_MPIRequest`
_KEPT_START = _KEPT_HEAD + """        t.seq += 1
        try:
            inner = function(self, {args})
        except (BufferError, ValueError, TypeError):
            t.seq -= 1
        except BaseException as err:
            raise t.failed(err, kept.label, t.seq) from err
        else:
            req = _MPIRequest(inner)
            req.kept, req.seq = kept, t.seq
            kept.calls += 1
            return req
    return rest(self, {args})
"""
#: `[buf, count, type]` of the kept form (the last buffer's, field by field: `_Kept`)
_LISTED = ("type({b}) is list and len({b}) == 3 and {b}[2] is kept.datatype and {b}[1] == kept.count and "
           "type({b}[0]) is kept.kind")
#: a two-buffer call's send buffer of the kept form: MPI.IN_PLACE, a `[buf, count, type]`
#: field by field, or what `_fits` takes
_SENT = ("(sendbuf is _IN_PLACE if kept.send is True else type(sendbuf) is list and len(sendbuf) == 3 and "
         "sendbuf[2] is kept.send.datatype and sendbuf[1] == kept.send.count and type(sendbuf[0]) is kept.send.kind "
         "or _fits(sendbuf, kept.send))")
#: a two-buffer call of the kept forms: the receive buffer a `[buf, count, type]`, else `_Kept.pair`
_PAIRED = "(" + _LISTED.format(b="recvbuf") + " and " + _SENT + " or kept.pair(sendbuf, recvbuf))"


def _kept_method(method: str, params: str, fits: str, rest: Callable, **defaults: Any) -> Callable:
    """`Comm.<method>` from `_KEPT_CALL` (a nonblocking method's: `_KEPT_START`): `params`
    its parameters after self (`defaults` named in them), `fits` the expression that
    compares a call with the kept forms, `rest` the full path (called with the same
    arguments)."""
    args = ", ".join(p.split("=")[0].strip() for p in params.split(","))
    template = _KEPT_START if method.startswith("I") else _KEPT_CALL
    source = template.format(method=method, params=params, attribute=_KEPT_METHODS[method], fits=fits, args=args)
    scope = {"ACTIVE": ACTIVE, "progress": progress, "function": getattr(MPI.Intracomm, method), "rest": rest,
             "_IN_PLACE": _IN_PLACE, "_fits": _fits, "np": np, "_MPIRequest": _MPIRequest, **defaults}
    made = written(source, f"<ringmpi.Comm.{method}>", scope, method)
    made.__qualname__, made.__doc__ = f"Comm.{method}", getattr(MPI.Intracomm, method).__doc__
    return made


#: a one-buffer call (`Bcast`, `Ibcast`) of the kept form: the root, the buffer a
#: `[buf, count, type]` or a bare array field by field, else `_Kept.fits`
_BCAST_FITS = ("root == kept.extra and (" + _LISTED.format(b="buf") +
               " or type(buf) is np.ndarray and buf.dtype is kept.datatype and buf.size == kept.count"
               " or kept.fits(buf, None))")


def _iblocks_rest(method: str, collective: str, whole_send: bool) -> Callable:
    """The full path of `Comm.Iallgather` and `Comm.Ialltoall`, as `_blocks_rest`'s: the
    call parsed and begun as ringmpi's request, or left to mpi4py."""
    def rest(self: "Comm", sendbuf: Any, recvbuf: Any) -> Any:
        return self._start(method, self._blocks(collective, sendbuf, recvbuf, whole_send), sendbuf, recvbuf,
                           key=_forms(sendbuf, recvbuf, None))
    return rest


def _blocks_rest(method: str, collective: str, whole_send: bool) -> Callable:
    """The full path of `Comm.Allgather` and `Comm.Alltoall`: the call parsed
    (`Comm._blocks`) and served by ringmpi, or left to mpi4py."""
    plain = getattr(MPI.Intracomm, method)

    def rest(self: "Comm", sendbuf: Any, recvbuf: Any) -> None:
        key = _forms(sendbuf, recvbuf, None)
        if not self._serve(method, self._blocks(collective, sendbuf, recvbuf, whole_send), key):
            plain(self, sendbuf, recvbuf)
    return rest


class Comm(MPI.Intracomm):
    """An mpi4py intracommunicator whose buffer collectives run ringmpi (see the module doc).

    Parameters:
        comm: the mpi4py intracommunicator to wrap (COMM_WORLD when None); the same MPI
            handle is used, nothing is duplicated, and freeing either frees both.
        allreduce, reduce, broadcast, allgather, alltoall, reduce_scatter: the algorithm
            of that collective on this communicator ("auto" by default: ringmpi's choice
            among its algorithms and the library's own; `ringmpi.algorithms(name)` lists them).

    Raises RingmpiUsageError for an unknown collective or algorithm name, TypeError for a
    communicator that is not an intracommunicator.

    Example (mpirun -n 4):
        >>> comm = ringmpi.Comm(MPI.COMM_WORLD, allreduce="ring")
        >>> comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    """
    _algorithms: dict[str, str] = {}   # class default: objects mpi4py makes itself (Dup) get "auto"
    _hot: dict | None = None           # Allreduce's hot path: id(recvbuf) -> `_Hot`
    _requests: dict | None = None      # the nonblocking calls' memos: collective -> `collectives.RequestMemo`
    _t: Any = None                     # this communicator's transport

    def __new__(cls, comm: MPI.Intracomm | None = None, **algorithm: str) -> "Comm":
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"ringmpi.Comm: expected an mpi4py intracommunicator, got {type(comm).__name__}")
        return super().__new__(cls, comm)

    def __init__(self, comm: MPI.Intracomm | None = None, **algorithm: str) -> None:
        inherited = getattr(comm, "_algorithms", {})
        for name, alg in algorithm.items():
            if name not in COLLECTIVES:
                raise RingmpiUsageError(f"ringmpi.Comm: unknown collective {name!r}; expected one of "
                                        f"{', '.join(COLLECTIVES)}")
            valid = [*algorithms(name), "auto"]
            if alg not in valid:
                raise RingmpiUsageError(f"ringmpi.Comm: unknown {name} algorithm {alg!r}; expected one of "
                                        f"{', '.join(valid)}")
        self._algorithms = {**inherited, **algorithm}

    def __repr__(self) -> str:
        chosen = ", ".join(f"{k}={v!r}" for k, v in self._algorithms.items())
        return f"<ringmpi.Comm of {self.Get_size()} ranks{': ' + chosen if chosen else ''}>"

    def __reduce__(self) -> tuple:
        """Pickled as mpi4py pickles communicators: the predefined ones by name (unpickled as
        the very object MPI.COMM_WORLD is now), others refused with mpi4py's ValueError."""
        for name in ("COMM_WORLD", "COMM_SELF"):
            if getattr(MPI, name) is self:
                return _predefined, (name,)
        return _rebuild, (MPI.Intracomm(self), self._algorithms)

    def _alg(self, name: str) -> str:
        return self._algorithms.get(name, "auto")

    def _wrap(self, new: Any) -> Any:
        if isinstance(new, MPI.Intracomm) and type(new) in (MPI.Intracomm, Comm) and new != MPI.COMM_NULL:
            return Comm(new, **self._algorithms)
        return new

    # -- communicators made from this one are wrapped too ---------------------------------
    def Dup(self, info: Any = None) -> "Comm":
        return self._wrap(MPI.Intracomm(super().Dup(info)) if info is not None else MPI.Intracomm(super().Dup()))

    def Clone(self) -> "Comm":
        return self.Dup()

    def Dup_with_info(self, info: Any) -> "Comm":
        return self._wrap(MPI.Intracomm(super().Dup_with_info(info)))

    def Idup(self, info: Any = None) -> tuple:
        new, req = super().Idup() if info is None else super().Idup(info)
        return self._wrap(MPI.Intracomm(new)), req

    def Split(self, color: int = 0, key: int = 0) -> Any:
        return self._wrap(super().Split(color, key))

    def Split_type(self, split_type: int, key: int = 0, info: Any = MPI.INFO_NULL) -> Any:
        return self._wrap(super().Split_type(split_type, key, info))

    def Create(self, group: Any) -> Any:
        return self._wrap(super().Create(group))

    def Create_group(self, group: Any, tag: int = 0) -> Any:
        return self._wrap(super().Create_group(group, tag))

    # -- the collectives ringmpi serves ----------------------------------------------------
    def _allreduce_rest(self, sendbuf: Any, recvbuf: Any, op: Any) -> None:
        """`Allreduce`'s full path, for a call that is not of its kept forms."""
        # the training loop's case with ringmpi's own algorithm: the same arrays as an
        # earlier call, whose plan (kept by the allreduce memo) is still current
        hot = self._hot
        if hot is not None:
            hit = hot.get(id(recvbuf))
            if hit is not None and hit.op is op and hit.generation == CACHE.generation and hit.send() is sendbuf \
                    and hit.recv() is recvbuf and recvbuf.dtype is hit.recv_dtype and \
                    (hit.in_place or sendbuf.dtype is hit.send_dtype):
                hit.plan(recvbuf if hit.in_place else sendbuf, recvbuf)
                return
        key = _forms(sendbuf, recvbuf, op)
        CALLS["Allreduce"] += 1
        got = _reduction(sendbuf, recvbuf, op)
        if got is not None:
            sv, rv, name = got
            _c.allreduce(sv, rv, op=name, comm=self, algorithm=self._alg("allreduce"))
            if not (key is not None and _reduces_as_mpi(name, recvbuf, rv) and self._note("Allreduce", key)):
                self._remember(sendbuf, recvbuf, op, sv, rv)
            return
        PASSED["Allreduce"] += 1
        super().Allreduce(sendbuf, recvbuf, op)

    Allreduce = _kept_method("Allreduce", "sendbuf, recvbuf, op=SUM",
                             "(op is kept.extra or op == kept.extra) and " + _PAIRED, _allreduce_rest, SUM=MPI.SUM)

    @staticmethod
    def _allreduce(sendbuf: Any, recvbuf: Any, op: Any) -> "_Served | None":
        got = _reduction(sendbuf, recvbuf, op)
        return None if got is None else _Served("allreduce", dict(sendbuf=got[0], recvbuf=got[1], op=got[2]))

    def _remember(self, sendbuf: Any, recvbuf: Any, op: Any, sv: np.ndarray, rv: np.ndarray) -> None:
        """Keep the plan ringmpi's allreduce memo holds for these very arrays (plain ndarrays
        that needed no view), so that the next identical call goes straight to it."""
        memo = CACHE.memo("allreduce")
        plan, send, comm = memo.plan, memo.send, memo.comm   # (one read each: another thread may rewrite it)
        in_place = sv is rv
        if rv is not recvbuf or not in_place and sv is not sendbuf or plan is None or send() is not sv \
                or comm is not self:
            return
        hot = self._hot
        if hot is None or len(hot) >= _HOT_SIZE:
            hot = self._hot = {}
        send_ref = (lambda v=sendbuf: v) if in_place else weakref.ref(sendbuf)
        # (and the arrays' dtypes, which can be set in place)
        hot[id(recvbuf)] = _Hot(op, CACHE.generation, send_ref, weakref.ref(recvbuf), plan, in_place, recvbuf.dtype,
                                None if in_place else sendbuf.dtype)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0) -> None:
        if not self._serve("Reduce", self._reduce(sendbuf, recvbuf, op, root)):
            super().Reduce(sendbuf, recvbuf, op, root)

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: Any, root: Any) -> "_Served | None":
        if type(root) is not int or not 0 <= root < self.Get_size():
            return None
        if self.Get_rank() == root:
            got = _reduction(sendbuf, recvbuf, op)
            return None if got is None else _Served("reduce", dict(sendbuf=got[0], recvbuf=got[1], root=root,
                                                                   op=got[2]))
        s = None if _in_place(sendbuf) else _message(sendbuf, False)
        sv = s and s.take()
        if sv is not None and sv.size and (name := _op(op, sv.dtype)):
            return _Served("reduce", dict(sendbuf=sv, recvbuf=None, root=root, op=name))
        return None

    def _bcast_rest(self, buf: Any, root: Any) -> None:
        """`Bcast`'s full path, for a call that is not of its kept form."""
        key = _forms(buf, None, root)
        if not self._serve("Bcast", self._bcast(buf, root), key):
            super().Bcast(buf, root)

    Bcast = _kept_method("Bcast", "buf, root=0", _BCAST_FITS, _bcast_rest)

    def _bcast(self, buf: Any, root: Any) -> "_Served | None":
        if type(root) is not int or not 0 <= root < self.Get_size():
            return None
        sending = self.Get_rank() == root
        m = _message(buf, not sending)
        v = m and m.take()
        if v is None or not v.size:
            return None
        v = _whole(buf, v)
        if sending and not v.flags.writeable:
            v = v.copy()      # ringmpi's broadcast takes one writable buffer; the root's is only read
        return _Served("broadcast", dict(buf=v, root=root))

    Allgather = _kept_method("Allgather", "sendbuf, recvbuf", _PAIRED, _blocks_rest("Allgather", "allgather", False))

    def _blocks(self, collective: str, sendbuf: Any, recvbuf: Any, whole_send: bool) -> "_Served | None":
        """Allgather and Alltoall, when both messages are arrays ringmpi serves exactly (the
        send buffer one block, or like the receive buffer: `whole_send`)."""
        p = self.Get_size()
        r = _message(recvbuf, True)
        rv = r and r.take(p)
        if rv is None or not rv.size:
            return None
        rv = _whole(recvbuf, rv)
        if _in_place(sendbuf):
            return _Served(collective, dict(sendbuf=rv, recvbuf=rv))
        s = _message(sendbuf, False)
        sv = s and (s.take(p) if whole_send else s.take())
        if sv is not None and sv.size * (1 if whole_send else p) == rv.size and sv.dtype == rv.dtype and _apart(sv, rv):
            return _Served(collective, dict(sendbuf=_whole(sendbuf, sv), recvbuf=rv))
        return None

    def _serve(self, method: str, served: "_Served | None", key: tuple | None = None) -> bool:
        """Run a parsed call (`_Served`) through ringmpi; False: mpi4py serves it. `key`: the
        call's buffer forms (`_forms`), noted when the call ran MPI's own (`_note`)."""
        CALLS[method] += 1
        if served is None:
            PASSED[method] += 1
            return False
        self._run(served)
        if key is not None:
            self._note(method, key)
        return True

    # -- buffer specifications MPI reads as they are: the decision kept, the parsing skipped --
    def _note(self, method: str, key: tuple, mpi: bool | None = None) -> bool:
        """If the call just served ran MPI's own collective as ringmpi's choice for its shape
        (auto settled on it, or it was asked for), the next calls with the same buffer forms
        (`_forms`: [buf, count, type] over bytes-like memory or a bare array, the same count,
        type and arguments) go to mpi4py with the user's own specifications (`_Kept`),
        skipping the numpy views and checks that cost several times a small call itself
        (benchmarks/README.md, the drop-in in mpi4py's demo style); returns whether they do.
        Kept until the plans are forgotten (a tuner's switch, new settings or profile, a
        freed communicator); never under RINGMPI_CHECK (each call is compared across ranks
        first) or RINGMPI_DEBUG=TRACE (each is logged), as plans are not."""
        st = settings()
        if st.check or st.debug == "TRACE":   # (every call compared across ranks, or logged: as plans)
            return False
        t = self._transport()
        if mpi is None:   # (a blocking call: ringmpi's last choice on this communicator)
            choice = t.last_choice or {}
            tuner = choice.get("tuner")
            mpi = choice.get("algorithm") == "mpi" and (tuner is None or tuner.winner == "mpi")
        if mpi:
            attribute = _KEPT_METHODS[method]
            old = getattr(self, attribute)
            if old is not None:
                _retire(old)
            setattr(self, attribute, _Kept(method, key, CACHE.generation, t))
            return True
        return False

    @property
    def _kept(self) -> dict[str, "_Kept"]:
        """{method: its `_Kept`}, those not retired (for tests)."""
        return {m: k for m, a in _KEPT_METHODS.items() if (k := getattr(self, a)) is not None and k.generation >= 0}

    def _transport(self) -> Any:
        t = self._t
        if t is None or t.freed:
            t = self._t = group(self)
        return t

    def _run(self, served: "_Served") -> None:
        result = getattr(_c, served.collective)(**served.args, comm=self, algorithm=self._alg(served.collective))
        if served.then is not None:
            served.then(result)

    def _start(self, method: str, served: "_Served | None", *args: Any, key: tuple | None = None) -> Any:
        """A parsed call begun as a request of ringmpi's (`_Request`; `..._init`: bound as a
        `_Persistent` one), or mpi4py's `method` on `args` where ringmpi does not serve it.
        `key`: the call's buffer forms (`_forms`), noted (`_note`) when its request is MPI's
        own collective on the very buffers given."""
        CALLS[method] += 1
        if served is None:
            PASSED[method] += 1
            return getattr(MPI.Intracomm, method)(self, *args)
        if method.endswith("_init"):
            return _Persistent.make(self, served, self._alg(served.collective))
        req = _Request.make(self, served, self._alg(served.collective))
        if key is not None and served.then is None:
            self._note(method, key, mpi=req._ring.posted)
        return req

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        CALLS["Allgatherv"] += 1
        p, rank = self.Get_size(), self.Get_rank()
        got = self._vector(recvbuf, p)
        if got is not None:
            rv, counts = got
            if _in_place(sendbuf):
                _c.allgather(rv, rv, comm=self, algorithm=self._alg("allgather"), counts=counts)
                return
            s = _message(sendbuf, False)
            sv = s and s.take()
            if sv is not None and sv.size == counts[rank] and sv.dtype == rv.dtype and _apart(sv, rv):
                _c.allgather(sv, rv, comm=self, algorithm=self._alg("allgather"), counts=counts)
                return
        PASSED["Allgatherv"] += 1
        super().Allgatherv(sendbuf, recvbuf)

    @staticmethod
    def _vector(msg: Any, p: int) -> tuple[np.ndarray, list[int]] | None:
        """A receive vector spec parsed as mpi4py's message_vector does, when its blocks lie
        back to back: (the buffer, the counts)."""
        parts = _parts(msg, (tuple,))
        if parts is None:
            return None
        buf, counts, displs, dtype = parts
        m = _message(buf if dtype is None else [buf, dtype], True)
        if m is None:
            return None
        size = m.flat.size
        if counts is None:                 # mpi4py: the buffer split evenly, the first blocks one longer
            counts = [size // p + (size % p > q) for q in range(p)]
        elif (c := _index(counts)) is not None:
            counts = [c] * p
        elif (counts := _counts(counts, p)) is None:
            return None
        if displs is not None:
            if (d := _index(displs)) is not None:
                displs = [d * q for q in range(p)]
            elif (displs := _counts(displs, p)) is None:
                return None
            if displs != [sum(counts[:q]) for q in range(p)]:
                return None
        total = sum(counts)
        if total == 0 or total > size:
            return None
        return m.flat[:total], counts

    Alltoall = _kept_method("Alltoall", "sendbuf, recvbuf", _PAIRED, _blocks_rest("Alltoall", "alltoall", True))

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        if not self._serve("Reduce_scatter_block", self._scatter_block(sendbuf, recvbuf, op)):
            super().Reduce_scatter_block(sendbuf, recvbuf, op)

    def _scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any) -> "_Served | None":
        p = self.Get_size()
        r = _message(recvbuf, True)
        if r is None:
            return None
        if _in_place(sendbuf):
            full = r.take(p)
            if full is not None and full.size and (name := _op(op, full.dtype)):
                return _in_place_scatter(full, name, None)
            return None
        rv = r.take()
        s = _message(sendbuf, False)
        sv = s and s.take(p)
        if rv is not None and sv is not None and rv.size and sv.size == rv.size * p and \
                sv.dtype == rv.dtype and _apart(sv, rv) and (name := _op(op, rv.dtype)):
            return _Served("reduce_scatter", dict(sendbuf=sv, recvbuf=rv, op=name, counts=None))
        return None

    # -- nonblocking (MPI-3) and persistent (MPI-4) forms: the same parsing, as requests --
    def _iallreduce_rest(self, sendbuf: Any, recvbuf: Any, op: Any) -> Any:
        """`Iallreduce`'s full path, for a call that is not of its kept forms."""
        served = self._allreduce(sendbuf, recvbuf, op)
        key = _forms(sendbuf, recvbuf, op) if served is not None and _reduces_as_mpi(
            served.args["op"], recvbuf, served.args["recvbuf"]) else None
        return self._start("Iallreduce", served, sendbuf, recvbuf, op, key=key)

    Iallreduce = _kept_method("Iallreduce", "sendbuf, recvbuf, op=SUM",
                              "(op is kept.extra or op == kept.extra) and " + _PAIRED, _iallreduce_rest, SUM=MPI.SUM)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0) -> Any:
        return self._start("Ireduce", self._reduce(sendbuf, recvbuf, op, root), sendbuf, recvbuf, op, root)

    def _ibcast_rest(self, buf: Any, root: Any) -> Any:
        """`Ibcast`'s full path, for a call that is not of its kept form."""
        return self._start("Ibcast", self._bcast(buf, root), buf, root, key=_forms(buf, None, root))

    Ibcast = _kept_method("Ibcast", "buf, root=0", _BCAST_FITS, _ibcast_rest)
    Iallgather = _kept_method("Iallgather", "sendbuf, recvbuf", _PAIRED, _iblocks_rest("Iallgather", "allgather", False))
    Ialltoall = _kept_method("Ialltoall", "sendbuf, recvbuf", _PAIRED, _iblocks_rest("Ialltoall", "alltoall", True))

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> Any:
        return self._start("Ireduce_scatter_block", self._scatter_block(sendbuf, recvbuf, op), sendbuf, recvbuf, op)

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: Any = MPI.INFO_NULL) -> Any:
        return self._start("Allreduce_init", self._allreduce(sendbuf, recvbuf, op), sendbuf, recvbuf, op, info)

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, root: int = 0,
                    info: Any = MPI.INFO_NULL) -> Any:
        return self._start("Reduce_init", self._reduce(sendbuf, recvbuf, op, root), sendbuf, recvbuf, op, root, info)

    def Bcast_init(self, buf: Any, root: int = 0, info: Any = MPI.INFO_NULL) -> Any:
        return self._start("Bcast_init", self._bcast(buf, root), buf, root, info)

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> Any:
        return self._start("Allgather_init", self._blocks("allgather", sendbuf, recvbuf, False), sendbuf, recvbuf, info)

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> Any:
        return self._start("Alltoall_init", self._blocks("alltoall", sendbuf, recvbuf, True), sendbuf, recvbuf, info)

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                                  info: Any = MPI.INFO_NULL) -> Any:
        return self._start("Reduce_scatter_block_init", self._scatter_block(sendbuf, recvbuf, op), sendbuf, recvbuf,
                           op, info)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
                       op: Any = MPI.SUM) -> None:
        CALLS["Reduce_scatter"] += 1
        p, rank = self.Get_size(), self.Get_rank()
        r = _message(recvbuf, True)
        rv = r and r.take()
        if rv is not None:
            if _in_place(sendbuf):
                counts = _counts(recvcounts, p)
                if counts is not None and sum(counts) == rv.size and rv.size and (name := _op(op, rv.dtype)):
                    self._run(_in_place_scatter(rv, name, counts))
                    return
            else:
                s = _message(sendbuf, False)
                sv = s and s.take()
                if recvcounts is None:   # as mpi4py: every rank's receive count, by MPI_Allgather
                    got = np.zeros(p, np.int64)
                    MPI.Intracomm.Allgather(self, [np.array([rv.size], np.int64), MPI.COUNT], [got, MPI.COUNT])
                    recvcounts = got.tolist()
                counts = _counts(recvcounts, p)
                if sv is not None and counts is not None and sum(counts) == sv.size and sv.size and \
                        counts[rank] == rv.size and sv.dtype == rv.dtype and _apart(sv, rv) and \
                        (name := _op(op, rv.dtype)):
                    _c.reduce_scatter(sv, rv, op=name, comm=self, algorithm=self._alg("reduce_scatter"),
                                      counts=counts)
                    return
        PASSED["Reduce_scatter"] += 1
        super().Reduce_scatter(sendbuf, recvbuf, recvcounts, op)


for _attribute in _KEPT_METHODS.values():   # each method's kept forms (`_Kept`): none yet
    setattr(Comm, _attribute, None)


def _reduction_methods(spec: Any) -> dict[str, Callable]:
    """The drop-in's methods for a collective its spec adds, where they take what
    MPI_Allreduce takes (`method(sendbuf, recvbuf, op)`, a result shaped like the input:
    MPI_Scan, MPI_Exscan; `mpicomm._send_recv` calls MPI's own so): the blocking one, its
    nonblocking one and its persistent one, each served by ringmpi where it serves the
    buffers and op (`_reduction`), else by mpi4py."""
    method = spec.mpi_methods[0]
    nonblocking, persistent = f"I{method[0].lower()}{method[1:]}", f"{method}_init"

    def served(sendbuf: Any, recvbuf: Any, op: Any) -> "_Served | None":
        got = _reduction(sendbuf, recvbuf, op)
        return None if got is None else _Served(spec.name, dict(sendbuf=got[0], recvbuf=got[1], op=got[2]))

    def blocking(self: Comm, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        if not self._serve(method, served(sendbuf, recvbuf, op)):
            getattr(MPI.Intracomm, method)(self, sendbuf, recvbuf, op)

    def begun(self: Comm, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> Any:
        return self._start(nonblocking, served(sendbuf, recvbuf, op), sendbuf, recvbuf, op)

    def bound(self: Comm, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, info: Any = MPI.INFO_NULL) -> Any:
        return self._start(persistent, served(sendbuf, recvbuf, op), sendbuf, recvbuf, op, info)
    return {method: blocking, nonblocking: begun, persistent: bound}


for _spec in _c.SPECS.values():   # (the collectives added by their specs alone, shaped as MPI_Allreduce)
    if _spec.mpi_methods and _spec.mpi_methods[0] not in vars(Comm) and \
            list(inspect.signature(_spec.prepare).parameters)[1:4] == ["sendbuf", "recvbuf", "op"]:
        for _name, _method in _reduction_methods(_spec).items():
            _method.__name__ = _method.__qualname__ = _name
            setattr(Comm, _name, _method)
#: the keyword arguments of Comm(...): which ringmpi collective serves which mpi4py calls
#: (the methods its spec names that `Comm` has)
COLLECTIVES = {name: served for name, spec in _c.SPECS.items()
               if (served := tuple(m for m in spec.mpi_methods if m in vars(Comm)))}


@dataclass
class _Hot:
    """One entry of Allreduce's hot path (`Comm._remember`): the call's op, the plan cache's
    generation then, the arrays (weak references; in place: the buffer itself), the plan
    ringmpi's allreduce memo held for them, and the arrays' dtypes then."""
    __slots__ = ("op", "generation", "send", "recv", "plan", "in_place", "recv_dtype", "send_dtype")
    op: Any
    generation: int
    send: Any
    recv: Any
    plan: Any
    in_place: bool
    recv_dtype: Any
    send_dtype: Any


@dataclass
class _Served:
    """An mpi4py call ringmpi serves, parsed: the collective, its public function's
    arguments (views of the caller's memory), and what to do with the result once the call
    is complete (MPI's in-place reduce-scatter moves this rank's block to the front)."""
    collective: str
    args: dict
    then: Callable[[Any], None] | None = None


def _in_place_scatter(full: np.ndarray, op: str, counts: list[int] | None) -> _Served:
    """MPI's in-place reduce-scatter: the input is the whole receive buffer, this rank's
    block of the result goes to its start, and the rest of the buffer is left as it was."""
    def front(mine: np.ndarray) -> None:
        full[:mine.size] = mine
    return _Served("reduce_scatter", dict(sendbuf=full, recvbuf=None, op=op,
                                          counts=None if counts is None or len(set(counts)) == 1 else counts), front)


def _query(status: Any) -> None:
    status.Set_source(MPI.UNDEFINED)
    status.Set_tag(MPI.UNDEFINED)
    status.Set_error(MPI.SUCCESS)


def _nothing(*_: Any) -> None:
    pass


#: the drop-in's requests run MPI's own nonblocking collective wherever the blocking calls'
#: tuning (or the model) found MPI's own the fastest once REQUEST_S is added to ringmpi's
#: (`auto.Margins` of 1), where ringmpi's own `iallreduce` and the like run an algorithm of
#: theirs that advances while its caller computes unless MPI's own is REQUEST_MARGIN
#: faster. The drop-in's caller asked for MPI's own call, and a program switched to the
#: drop-in must not get slower (benchmarks/README.md, "The drop-in's requests as asked").
#: REQUEST_S: what a drop-in request of ringmpi's algorithm costs over its blocking call
#: (the generalized request, the parsing, the progress thread woken at its start for MPI's
#: own waits: benchmarks/README.md, "The drop-in's requests weighed as requests")
REQUEST_S = 30e-6
AS_ASKED = Margins(1.0, 1.0, REQUEST_S)


class _CallWaits:
    """`Wait` and `Test` of a drop-in request behind which ringmpi's call runs (`_Request`,
    `_Persistent`): the call's, which advance it here and raise its error, then MPI's on
    the generalized request the call completed (none: a persistent request not started
    since its last wait)."""
    _ring: Any = None   # ringmpi's request (a `requests.Request`, or a `requests.Persistent`)

    def Wait(self, status: Any = None) -> Literal[True]:
        try:
            self._ring.wait()
        finally:
            if self != MPI.REQUEST_NULL:
                MPI.Request.Wait(self, status)   # type: ignore[arg-type]
        return True

    def Test(self, status: Any = None) -> bool:
        return self._ring.test() and self.Wait(status)


class _Request(_CallWaits, MPI.Grequest):
    """What the drop-in's nonblocking calls return: an MPI generalized request (the MPI
    standard's way for a library to hand out requests of its own), completed by ringmpi
    when its call is (`MPI.Grequest.Complete`), so that everything an `MPI.Request` does
    works with it: its own `Wait` and `Test` (which advance the call here, at a blocking
    call's speed), and `MPI.Request.Waitall`/`Waitany`/`Testall` over a mix of ringmpi's and
    mpi4py's requests, which MPI itself waits for: MPI's generalized requests have no
    progress callback (MPICH's MPIX_Grequest_start has one, mpi4py does not expose it), so
    these calls run on ringmpi's progress thread, whatever RINGMPI_PROGRESS says. An error
    of the call is raised by `Wait`/`Test`; MPI's class-level waits see the request complete."""

    @classmethod
    def make(cls, comm: "Comm", served: _Served, algorithm: str) -> "_Request":
        req = cls(MPI.Grequest.Start(_query, _nothing, _nothing))
        then = served.then

        def done(ring: Any) -> None:
            if then is not None and ring.error is None:
                then(ring.result)
            ring.waited = True     # (MPI's own waits complete it from here on: not "forgotten")
            req.Complete()
        # (a call on the very arrays of an earlier one starts its request again, as
        # ringmpi's own nonblocking functions do: parsed, a plain array is itself)
        memos = comm._requests
        if memos is None:
            memos = comm._requests = {}
        memo = memos.get(served.collective)
        if memo is None:
            memo = memos[served.collective] = _c.RequestMemo(_c.SPECS[served.collective], AS_ASKED)
        try:
            req._ring = memo.start({**served.args, "comm": comm, "algorithm": algorithm}, on_done=done)
        except BaseException:
            req.Complete()
            MPI.Grequest.Wait(req)
            raise
        return req


class _Persistent(_CallWaits, MPI.Prequest):
    """What the drop-in's persistent calls (`Allreduce_init`, ...) return where ringmpi's
    algorithm serves them: a ringmpi persistent request behind mpi4py's `Prequest` methods.
    MPI has no persistent generalized request, so each `Start` begins the call behind a
    fresh generalized request, completed when the call is (as the drop-in's nonblocking
    requests, `_Request`), whose handle this object then holds: `MPI.Request.Waitall`,
    `Testall`, `Waitany` over it wait for the call itself. (The handle is written into the
    object in place, through mpi4py's `MPI._addressof`, where a C program would assign the
    request variable; MPI's waits write MPI_REQUEST_NULL there when it completes.)
    `MPI.Prequest.Startall` cannot begin ringmpi's call: MPI refuses the null or
    generalized request it finds. Where MPI's own persistent collective serves the call,
    `make` returns that MPI request itself (`_MPIPersistent`), which Startall takes too."""
    _then: Any = None
    _current: Any = None    # this start's generalized request (None between a completion and the next start)

    @classmethod
    def make(cls, comm: "Comm", served: _Served, algorithm: str) -> "MPI.Prequest":
        req = cls()
        ring = request(_c.SPECS[served.collective], comm, algorithm, served.args, persistent=True,
                       on_done=req._done, margins=AS_ASKED, bare=served.then is None)
        if ring.mpi is not None:
            return _MPIPersistent.of(ring)
        req._ring, req._then = ring, served.then
        return req

    def _done(self, call: Any) -> None:
        """The call is complete (on whichever thread completed it): the result moved where
        MPI puts it, the call collected (MPI's own waits complete it from here on), and its
        generalized request completed."""
        if self._then is not None and call.error is None:
            self._then(call.result)
        call.waited = True
        engine().collected(call)
        self._current.Complete()

    def Start(self) -> None:
        if self != MPI.REQUEST_NULL:   # (its last call's generalized request, not yet waited for)
            raise ValueError(f"ringmpi: persistent {self._ring.label} started again before its last call was "
                             "waited for")
        current = self._current = MPI.Grequest.Start(_query, _nothing, _nothing)
        _hold(self, current)
        try:
            self._ring.start()
        except BaseException:
            current.Complete()
            MPI.Request.Wait(self)   # (the generalized request's end: this object null again)
            raise

    def Free(self) -> None:
        self._ring.free()
        if self != MPI.REQUEST_NULL:   # (complete: `_ring.free` refuses a call in flight)
            MPI.Request.Wait(self)


def _hold(req: MPI.Request, other: MPI.Request) -> None:
    """`req` holds `other`'s MPI handle from now on (mpi4py objects take a handle only when
    made; its waits write one in place as this does)."""
    ctypes.memmove(MPI._addressof(req), MPI._addressof(other), MPI._sizeof(MPI.Request))


class _MPIPersistent(_MPIRequest, MPI.Prequest):
    """What a drop-in persistent call returns where MPI's own persistent collective serves
    it (`requests.Persistent.mpi`; the drop-in's op is never AVG, so nothing follows its
    completion): that MPI request itself, so that `MPI.Prequest.Startall`,
    `MPI.Request.Waitall` and the like take it as they take any of mpi4py's (a ringmpi
    persistent request behind it would be a null request to them: `_Persistent`). Its
    `Start` takes the call's sequence number, as the ringmpi request's start did; `Wait` and
    `Test` are `_MPIRequest`'s."""
    __slots__ = ()

    @classmethod
    def of(cls, ring: Any) -> "_MPIPersistent":
        req = cls(ring.mpi)
        # (the handle is this object's now, its Free frees it; ringmpi's request, whose call
        # holds the arrays MPI was given, is kept with it: mpi4py's request does not hold them)
        req.kept = _Named(ring.group, ring.label, ring)
        ring.mpi, ring.freed = None, True
        return req

    def Start(self) -> None:
        t = self.kept.transport
        if ACTIVE:
            progress()
        t.seq += 1
        self.seq = t.seq
        try:
            MPI.Prequest.Start(self)
        except MPI.Exception as err:
            raise t.failed(err, self.kept.label, self.seq) from err


class _Named(NamedTuple):
    """The transport and the label of a call MPI's own persistent request serves, and
    ringmpi's persistent request that bound it (`_MPIPersistent.kept`)."""
    transport: Any
    label: str
    held: Any


def _predefined(name: str) -> Any:
    return getattr(MPI, name)


def _rebuild(comm: MPI.Intracomm, algorithms: dict[str, str]) -> Comm:
    return Comm(comm, **algorithms)
