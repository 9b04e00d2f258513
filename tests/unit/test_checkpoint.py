"""Checkpoints (ringmpi.dp.checkpoint) and the launcher's failure report, without MPI: a
damaged file is never loaded, the previous one is; the writer's thread loses no error."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringmpi.dp.checkpoint import CheckpointError, Snapshot, Writer, checkpoints, newest, read, write
from ringmpi.tools.launch import Ending, failure_line


def snapshot(step: int, seed: int = 0) -> Snapshot:
    rng = np.random.default_rng(seed)
    return Snapshot(step, {"param:w": rng.standard_normal((5, 3)), "param:b": rng.standard_normal(3).astype(np.float32),
                           "opt:t": np.array(step)},
                    {"config": {"seed": seed}, "data": {"epoch": 0, "batch_in_epoch": step}})


def same(a: Snapshot, b: Snapshot) -> bool:
    return (a.step == b.step and a.meta == b.meta and a.arrays.keys() == b.arrays.keys()
            and all(a.arrays[k].dtype == b.arrays[k].dtype and np.array_equal(a.arrays[k], b.arrays[k])
                    for k in a.arrays))


def test_round_trip_is_bitwise(tmp_path):
    snap = snapshot(7, seed=3)
    path = write(tmp_path, snap)
    assert path.name == "step-00000007.ckpt"
    assert same(read(path), snap)


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(0, 10**6), flip=st.integers(0, 10**6), how=st.sampled_from(["truncate", "flip", "append"]))
def test_damaged_file_is_refused_never_misread(tmp_path_factory, cut, flip, how):
    """Any truncation, any single flipped bit, any bytes appended: CheckpointError, not a
    snapshot with other numbers."""
    d = tmp_path_factory.mktemp("ck")
    data = write(d, snapshot(3)).read_bytes()
    if how == "truncate":
        bad = data[:cut % len(data)]
    elif how == "flip":
        i = flip % len(data)
        bad = data[:i] + bytes([data[i] ^ (1 << (cut % 8))]) + data[i + 1:]
    else:
        bad = data + b"x" * (1 + cut % 100)
    try:
        got = Snapshot.decode(bad)
    except CheckpointError:
        return
    # a flipped bit inside the JSON header may still parse as the same header (a space, a
    # digit of no consequence is impossible: bytes and sha256 are checked), never to other data
    assert same(got, snapshot(3)), "a damaged checkpoint was read as different data"


def test_header_step_outside_the_digest_is_checked_too():
    data = snapshot(3).encode()
    head, _, payload = data.partition(b"\n")
    with pytest.raises(CheckpointError, match="the header says step 2, the payload 3"):
        Snapshot.decode(head.replace(b'"step": 3', b'"step": 2') + b"\n" + payload)


def test_newest_skips_truncated_and_loads_the_previous(tmp_path):
    write(tmp_path, snapshot(5, seed=1))
    newer = write(tmp_path, snapshot(10, seed=2))
    newer.write_bytes(newer.read_bytes()[:-100])     # a copy cut short
    (tmp_path / ".step-00000015.ckpt.123.tmp").write_bytes(b"half")  # a write killed midway
    said = []
    path, data = newest(tmp_path, said.append)
    assert path.name == "step-00000005.ckpt" and same(Snapshot.decode(data), snapshot(5, seed=1))
    assert len(said) == 1 and "step-00000010.ckpt" in said[0] and "truncated" in said[0], said


def test_newest_none_when_nothing_verifies(tmp_path):
    assert newest(tmp_path / "absent") is None
    (tmp_path / "step-00000001.ckpt").write_bytes(b"not a checkpoint\n")
    said = []
    assert newest(tmp_path, said.append) is None and "not a ringmpi checkpoint" in said[0]


def test_keep_prunes_oldest(tmp_path):
    for s in (1, 2, 3, 4):
        write(tmp_path, snapshot(s), keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-00000004.ckpt", "step-00000003.ckpt"]


def test_writer_copies_then_writes_on_its_thread(tmp_path):
    w = Writer(tmp_path, keep=3)
    snap = snapshot(2)
    w.save(snap.step, snap.arrays, snap.meta)
    before = {k: v.copy() for k, v in snap.arrays.items()}
    for v in snap.arrays.values():     # the next step changes the parameters in place
        v[...] = 0
    w.wait()
    got = read(w.written[0])
    assert all(np.array_equal(got.arrays[k], before[k]) for k in before)


def test_writer_error_comes_back_at_the_next_call(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory should be")
    w = Writer(blocker)
    w.save(1, {"param:w": np.zeros(3)}, {})
    with pytest.raises(CheckpointError, match="writing a checkpoint into"):
        w.wait()
    w.wait()   # reported once, then the writer is usable again


def test_failure_line_names_the_first_rank_and_its_signal():
    found = [Ending(0, 100, "h", 10.0, 12.5, 1), Ending(1, 101, "h", 10.0, 12.0, -signal.SIGKILL),
             Ending(2, 102, "h", 10.0, 12.6, -signal.SIGTERM)]
    line = failure_line(0, 3, 137, found, 4)
    assert line.startswith("ringmpi.launch: attempt 1 of 3 failed (launcher exit status 137): rank 1 (pid 101 on h) "
                           "was killed by signal 9 (SIGKILL) 2.0 s after it started"), line
    assert "ranks 0, 2 ended after it" in line and "1 ranks never started" in line, line
    assert "every rank exited 0" in failure_line(1, 3, 1, [Ending(r, r, "h", 0.0, 1.0, 0) for r in range(2)], 2)
    assert "exited with status 3" in failure_line(0, 1, 3, [Ending(0, os.getpid(), "h", 0.0, 1.0, 3)], 1)
