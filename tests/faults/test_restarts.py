"""A rank killed (SIGKILL, from outside, at a random step after the first checkpoint) in a
4-rank `ringmpi train`:

- under `ringmpi.launch --restarts 2` the job ends by itself with the uninterrupted run's
  `params sha256`, having lost at most the steps since a checkpoint;
- without restarts it ends within seconds, and the failure line names the rank and signal;
- under `--fault-tolerant --on-failure shrink` (Open MPI's ULFM) the survivors go on without
  a restart, within seconds, as identical replicas, and train on as the uninterrupted run;
- a checkpoint truncated on purpose is skipped and the one before it is resumed.

Run by `make test` outside mpirun (each test starts its own job through ringmpi.launch).
"""
from __future__ import annotations

import random
import re
import sys

import pytest
from faultinject import DIGEST, killer, launch, steps_seen

from ringmpi.dp.checkpoint import checkpoints
from ringmpi.tools.launch import find_mpirun, open_mpi_version

RANKS = 4
EVERY = 5
#: about 17 ms a step at 4 ranks on 2 cores: a few seconds of training, time for a kill
#: a kill comes after a random checkpoint before this step (then up to 0.1 s): well inside
#: the 150 steps, however fast they run (6 ms each on an idle machine)
KILL_BY = 100
TRAIN = ["--steps", "150", "--sizes", "64,256,256,4", "--samples", "2048",
         "--batch", "256", "--checkpoint-every", str(EVERY)]


def uninterrupted(tmp_path_factory, key: str, train: list[str]) -> str:
    d = tmp_path_factory.mktemp(key)
    rc, out, _ = launch(d, train=TRAIN + train)
    found = DIGEST.findall(out)
    assert rc == 0 and len(found) == 1, out[-3000:]
    return found[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    return uninterrupted(tmp_path_factory, "reference", [])


def test_restart_after_a_kill_gives_the_uninterrupted_digest(tmp_path, reference):
    rng = random.Random()
    rank, after, delay = rng.randrange(RANKS), rng.randrange(EVERY, KILL_BY, EVERY), rng.uniform(0.0, 0.1)
    th, kill = killer(tmp_path, rank, delay, after)
    rc, out, _ = launch(tmp_path, "--restarts", "2", train=TRAIN)
    th.join(5)
    what = f"(rank {rank} killed {delay:.2f} s after the checkpoint of step {after} or later: {kill})\n{out[-4000:]}"
    assert not kill.missed and rc == 0, what
    assert DIGEST.findall(out) == [reference], what
    assert re.search(rf"attempt 1 of 3 failed \(launcher exit status \d+\): rank {rank} \(pid {kill.pid} on \S+\) "
                     r"was killed by signal 9 \(SIGKILL\)", out), what
    assert "ringmpi.launch: restart 1 of 2: relaunching all 4 ranks" in out, what
    resumed = re.search(r"^# resumed from \S+step-(\d+)\.ckpt at step (\d+) \(attempt 1\)$", out, re.M)
    assert resumed, what
    # lost work: the steps rank 0 had printed before the kill, less the step resumed at;
    # at most an interval, plus the steps run while the write in flight was on its thread
    before = out[:out.index("ringmpi.launch: attempt 1")]
    reached, back = max(steps_seen(before)) + 1, int(resumed.group(2))
    assert back >= EVERY and reached - back <= 2 * EVERY, (reached, back, what)


@pytest.mark.parametrize("restarts", [None, "0"], ids=["plain", "restarts-0"])
def test_without_restarts_the_job_ends_within_seconds_naming_the_rank(tmp_path, restarts):
    rank = random.Random().randrange(1, RANKS)
    th, kill = killer(tmp_path, rank, 0.2)
    rc, out, seen = launch(tmp_path, *(["--restarts", restarts] if restarts else []), train=TRAIN)
    th.join(5)
    what = f"(rank {rank} killed: {kill})\n{out[-4000:]}"
    assert not kill.missed and rc not in (0, 124), what
    assert seen[-1][0] - kill.at < 15, what
    assert not DIGEST.findall(out) and "# resumed" not in out, what
    if restarts:
        assert re.search(rf"attempt 1 of 1 failed .*: rank {rank} \(pid {kill.pid} on \S+\) was killed by "
                         r"signal 9 \(SIGKILL\)", out), what
        assert "restart 1" not in out, what
    elif "BAD TERMINATION" in out:   # MPICH's hydra names the first process it saw end, which may be
        # one it killed while cleaning up (seen: the next rank's PID): naming the rank for sure
        # is what --restarts 0 is for (README)
        assert re.search(r"PID \d+ RUNNING AT", out) and "signal 9" in out, what
    else:   # Open MPI's launcher names it: "rank 2 with PID ..."
        assert re.search(rf"rank {rank}\b|PID {kill.pid}\b", out), what


def test_truncated_checkpoint_is_skipped_and_the_previous_resumed(tmp_path, reference):
    """A run stopped at step 20 (checkpoints at 15 and 20), the newest cut short: the resumed
    run starts at 15 and still ends with the uninterrupted digest."""
    rc, out, _ = launch(tmp_path, train=TRAIN + ["--steps", "20"])
    assert rc == 0 and [p.name for p in checkpoints(tmp_path)] == ["step-00000020.ckpt", "step-00000015.ckpt"], out
    newest = checkpoints(tmp_path)[0]
    newest.write_bytes(newest.read_bytes()[:-1000])
    rc, out, _ = launch(tmp_path, train=TRAIN)
    assert rc == 0 and f"ringmpi: skipping checkpoint {newest}: " in out and "truncated" in out, out[-3000:]
    assert re.search(r"^# resumed from \S+step-00000015\.ckpt at step 15 ", out, re.M), out[-3000:]
    assert DIGEST.findall(out) == [reference], out[-3000:]


def _ulfm() -> bool:
    version = open_mpi_version(find_mpirun([sys.executable]))
    return version is not None and (not version or version >= (5,))


@pytest.mark.skipif(not _ulfm(), reason="ULFM (--fault-tolerant) is Open MPI 5's")
@pytest.mark.parametrize("who", ["rank 0", "another rank"])
def test_survivors_go_on_after_a_lost_rank_with_ulfm(tmp_path, tmp_path_factory, who):
    """--on-failure shrink: no restart, the survivors resume within 5 s of the kill, on 3
    ranks, as identical replicas, and their last loss is the uninterrupted run's (the same
    samples every step, only the summation order differs)."""
    flags = ["--algorithm", "ring", "--on-failure", "shrink"]
    ref_dir = tmp_path_factory.mktemp("ulfm-reference")
    rc, ref_out, _ = launch(ref_dir, "--fault-tolerant", train=TRAIN + flags)
    assert rc == 0, ref_out[-3000:]
    rng = random.Random()
    rank = 0 if who == "rank 0" else rng.randrange(1, RANKS)
    after, delay = rng.randrange(EVERY, KILL_BY, EVERY), rng.uniform(0.0, 0.1)
    th, kill = killer(tmp_path, rank, delay, after)
    rc, out, seen = launch(tmp_path, "--fault-tolerant", train=TRAIN + flags)
    th.join(5)
    what = f"(rank {rank} killed {delay:.2f} s after the checkpoint of step {after} or later: {kill})\n{out[-4000:]}"
    assert not kill.missed and rc == 0, what
    lost = [(at, ln) for at, ln in seen if re.match(rf"# rank {rank} of 4 lost in step \d+: going on with 3 ranks", ln)]
    assert len(lost) == 1 and lost[0][0] - kill.at < 5, what
    assert "# replicas bitwise identical on all 3 ranks: yes" in out and "restart" not in out, what
    last = re.findall(r"^step\s+149\s+loss (\S+)$", out, re.M)
    want = re.findall(r"^step\s+149\s+loss (\S+)$", ref_out, re.M)
    assert len(last) == 1 and len(want) == 1 and abs(float(last[0]) - float(want[0])) <= 1e-9 * abs(float(want[0])), \
        (last, want, what)
    assert len(DIGEST.findall(out)) == 1, what
    # the checkpoints went on after the shrink (the survivors' rank 0 writes, also when rank 0 died)
    assert checkpoints(tmp_path)[0].name == "step-00000150.ckpt", what
