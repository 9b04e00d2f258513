"""Checkpoints that cannot be half-written, and a writer that keeps them off the step.

A checkpoint is one file, `step-00000010.ckpt` in the checkpoint directory:

    {"ringmpi_checkpoint": 1, "step": 10, "bytes": N, "sha256": HEX}   \\n   one JSON line (256 bytes)
    N bytes: an uncompressed .npz of the arrays, "meta" (JSON as uint8) and "step" among them

It is written to a temporary name in the same directory, flushed, fsync'ed, renamed over
its final name and the directory fsync'ed (POSIX rename is atomic: a reader sees the old
file or the new one, never a part), so a crash, a full disk or a SIGKILL in the middle
leaves at worst a `.tmp` file that no reader looks at. The digest covers the payload and
is checked before anything is parsed: a file truncated or changed later (a copy cut short,
a bad sector) is skipped with a line saying why, and the previous checkpoint is loaded
instead. The newest `keep` files are kept (2 by default: the one being written can fail
and the one before must still be there).

Writing goes on a thread (`Writer`): the step pays for a copy of the arrays into memory
the writer owns (the parameters change in the next step), the file system's time (write,
fsync) overlaps the next steps, as torch.distributed.checkpoint's async_save does, at the
low CPU priority (on a node whose cores all run ranks, the write takes little from them). A
failed write is raised at the next `save` or at `wait`, never lost.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import to_host

__all__ = ["Snapshot", "write", "read", "newest", "checkpoints", "Writer", "CheckpointError"]

FORMAT = 1
NAME = re.compile(r"step-(\d+)\.ckpt$")


#: bytes kept for the header line (its JSON is about 130)
HEADER = 256


class _Hashing:
    """A write-only stream over a file that hashes and counts what passes (the zip
    writer, finding no tell or seek, writes as a stream, sizes after the data)."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, b: Any) -> int:
        self.sha.update(b)
        self.size += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()

    def read(self, n: int = -1) -> bytes:   # numpy takes an object without `read` for a path
        raise io.UnsupportedOperation("write-only")


class CheckpointError(ValueError):
    """A checkpoint file that must not be loaded (truncated, changed, not a checkpoint)."""


@dataclass
class Snapshot:
    """What a checkpoint holds: the step to resume at, named arrays (parameters as
    "param:NAME", optimizer state as "opt:NAME") and a JSON-able dict of the rest (the
    run's configuration, the data order's position)."""
    step: int
    arrays: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        buf = io.BytesIO()
        self.dump(buf)
        return buf.getvalue()

    def dump(self, f: Any) -> None:
        """Write the checkpoint into the seekable binary file `f`, streaming: the payload
        goes out as numpy writes it, hashed on the way (no copy of the state in memory
        beside the arrays), and the header, whose place is kept, is written last."""
        if {"meta", "step"} & self.arrays.keys():
            raise CheckpointError(f"a checkpoint's arrays may not be named 'meta' or 'step' (got {sorted(self.arrays)})")
        start = f.tell()
        f.write(b" " * (HEADER - 1) + b"\n")
        out = _Hashing(f)
        meta = np.frombuffer(json.dumps(self.meta, sort_keys=True).encode(), np.uint8)
        np.savez(out, meta=meta, step=np.array(self.step, np.int64), **self.arrays)
        end = f.tell()
        head = json.dumps({"ringmpi_checkpoint": FORMAT, "step": self.step, "bytes": out.size,
                           "sha256": out.sha.hexdigest()}).encode()
        f.seek(start)
        f.write(head.ljust(HEADER - 1) + b"\n")   # JSON allows the trailing spaces
        f.seek(end)

    @staticmethod
    def decode(data: bytes, where: str = "checkpoint") -> "Snapshot":
        """The snapshot in `data`, or CheckpointError saying what is wrong with it."""
        line, sep, payload = data.partition(b"\n")
        try:
            head = json.loads(line) if sep else None
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("ringmpi_checkpoint") != FORMAT:
            raise CheckpointError(f"{where}: not a ringmpi checkpoint (format {FORMAT})")
        if len(payload) != head.get("bytes"):
            raise CheckpointError(f"{where}: truncated or extended: {len(payload)} bytes of payload, "
                                  f"the header says {head.get('bytes')}")
        if hashlib.sha256(payload).hexdigest() != head.get("sha256"):
            raise CheckpointError(f"{where}: sha256 of the payload differs from the header's: the file changed "
                                  "after it was written")
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes())
        step = int(arrays.pop("step"))
        if head.get("step") != step:    # the header is outside the digest: its step must agree
            raise CheckpointError(f"{where}: the header says step {head.get('step')}, the payload {step}")
        return Snapshot(step, arrays, meta)


def _fsync_dir(path: Path) -> None:
    if os.name == "posix":
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write(directory: str | Path, snap: Snapshot, keep: int = 2) -> Path:
    """Write `snap` atomically into `directory` (made if missing); delete all but the
    newest `keep` checkpoints there. Returns the file's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"step-{snap.step:08d}.ckpt"
    tmp = d / f".{final.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            snap.dump(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(d)
    for old in checkpoints(d)[keep:]:
        old.unlink(missing_ok=True)
    return final


def read(path: str | Path) -> Snapshot:
    p = Path(path)
    return Snapshot.decode(p.read_bytes(), str(p))


def checkpoints(directory: str | Path) -> list[Path]:
    """The checkpoint files in `directory`, newest step first (none: [])."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def newest(directory: str | Path, say=None) -> tuple[Path, bytes] | None:
    """The newest checkpoint in `directory` that verifies, as (path, its bytes), or None.
    Every newer file that does not verify is reported through `say` (default: stderr) and
    skipped."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    for p in checkpoints(directory):
        try:
            data = p.read_bytes()
            Snapshot.decode(data, str(p))
        except (OSError, CheckpointError, ValueError, KeyError) as err:
            say(f"ringmpi: skipping checkpoint {p}: {err}")
            continue
        return p, data
    return None


class Writer:
    """Writes snapshots on a thread of its own, one at a time (a second save waits for the
    first: at most one copy of the state is in memory beside the model)."""

    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        self.directory, self.keep = Path(directory), keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.written: list[Path] = []

    def save(self, step: int, arrays: dict[str, Any], meta: dict) -> None:
        """Copy `arrays` (host copies of device arrays) now; write them on the thread."""
        self.wait()
        snap = Snapshot(step, {k: np.array(to_host(v), copy=True) for k, v in arrays.items()}, dict(meta))
        self._thread = threading.Thread(target=self._write, args=(snap,), name="ringmpi-checkpoint", daemon=True)
        self._thread.start()

    def _write(self, snap: Snapshot) -> None:
        try:   # a low CPU priority (nice 10), this thread only: the ranks' steps come first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        try:
            self.written.append(write(self.directory, snap, self.keep))
        except BaseException as err:   # raised on the caller's thread at the next save or wait
            self._error = err

    def wait(self) -> None:
        """Until the write in flight is on disk; raises its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"writing a checkpoint into {self.directory} failed: {err}") from err
