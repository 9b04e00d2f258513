"""What surviving a lost rank costs, measured: checkpoints on the step, work lost and time
to come back after a SIGKILL with restarts, and with ULFM's shrink.

    .venv/bin/python benchmarks/faults.py [--repeats 5] [--ranks 4]

1. checkpoint cost: the 12 MB model (MLP 512-2048-1024-10, float32, global batch 2048)
   trained 40 steps without checkpoints and with one every 10 steps, the runs interleaved
   (none, every 10, none, ...); per run the trainer's own ms per step; printed: the medians,
   their ratio, the spread, and the copy each checkpoint takes on the step (the trainer's
   line: the write itself runs on a thread);
2. restarts: `ringmpi.launch --restarts 2`, 150 steps of the small model, checkpoints every
   5, one rank (random) SIGKILLed up to 0.1 s after a random checkpoint before step 100
   (a kill timed from the first checkpoint alone can land after the last step: the whole
   run takes under a second on a quick machine); per run: the
   step reached before the kill, the step resumed at, seconds from the kill to the resumed
   run's first line, the whole job's seconds against an uninterrupted run's, and whether
   `params sha256` equals the uninterrupted run's;
3. ULFM (Open MPI): the same kill under `--fault-tolerant`, `--on-failure shrink`; per
   run: seconds from the kill to the survivors' "going on" line, whether the 3 replicas
   are identical, the last loss against the uninterrupted run's.
"""
from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "faults"))
from faultinject import DIGEST, killer, launch, steps_seen  # noqa: E402

BIG = ["--sizes", "512,2048,1024,10", "--dtype", "float32", "--batch", "2048", "--samples", "4096", "--steps", "40",
       "--quiet"]
EVERY, KILL_BY = 5, 100
SMALL = ["--steps", "150", "--sizes", "64,256,256,4", "--samples", "2048", "--batch", "256", "--checkpoint-every", str(EVERY)]


def ms_per_step(out: str) -> float:
    return float(re.search(r"^# ([\d.]+) ms per step", out, re.M).group(1))


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}"


def checkpoint_cost(repeats: int, ranks: int) -> None:
    plain, saving, copy, waits = [], [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            rc, out, _ = launch(None, train=BIG, ranks=ranks)
            assert rc == 0, out[-2000:]
            plain.append(ms_per_step(out))
            rc, out, _ = launch(Path(d) / "every10", train=[a for a in BIG if a != "--quiet"] + ["--checkpoint-every", "10"],
                                ranks=ranks)
            assert rc == 0, out[-2000:]
            saving.append(ms_per_step(out))
            found = re.search(r"([\d.]+) ms copying the state, ([\d.]+) ms waiting", out)
            copy.append(float(found.group(1)))
            waits.append(float(found.group(2)))
    a, b = statistics.median(plain), statistics.median(saving)
    print(f"checkpoint cost, 12 MB model, {ranks} ranks, {repeats} interleaved pairs of 40 steps:")
    print(f"  no checkpoint   {a:8.2f} ms/step (spread {spread(plain)})")
    print(f"  every 10 steps  {b:8.2f} ms/step (spread {spread(saving)})   ratio {b / a:.3f}")
    on_step = statistics.median(c + w for c, w in zip(copy, waits))
    print(f"  on the step, per checkpoint (medians): {statistics.median(copy):.2f} ms copying, "
          f"{statistics.median(waits):.2f} ms waiting for the write before; {on_step / 10 / a * 100:.2f} % "
          "of a step, spread over 10")


def _kill_run(flags: list[str], train: list[str], ranks: int, rank: int | None = None):
    rng = random.Random()
    rank = rng.randrange(ranks) if rank is None else rank
    after, delay = rng.randrange(EVERY, KILL_BY, EVERY), rng.uniform(0.0, 0.1)
    with tempfile.TemporaryDirectory() as d:
        th, kill = killer(Path(d), rank, delay, after)
        rc, out, seen = launch(Path(d), *flags, train=train, ranks=ranks)
        th.join(5)
    assert rc == 0 and not kill.missed, (kill, out[-3000:])
    return kill, out, seen


def restarts(repeats: int, ranks: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        rc, out, seen = launch(Path(d), train=SMALL, ranks=ranks)
    ref, ref_secs = DIGEST.findall(out)[0], seen[-1][0] - seen[0][0]
    print(f"restarts: {ranks} ranks, 150 steps, a checkpoint every 5, one rank SIGKILLed up to 0.1 s after a random one before step {KILL_BY} "
          f"(uninterrupted: {ref_secs:.1f} s from the first line to the last)")
    print(f"  {'rank':>4} {'reached':>7} {'resumed':>7} {'lost':>4} {'kill->resumed s':>15} {'job s':>6} digest")
    for _ in range(repeats):
        kill, out, seen = _kill_run(["--restarts", "2"], SMALL, ranks)
        before = out[:out.index("ringmpi.launch: attempt 1")]
        reached = max(steps_seen(before)) + 1
        back = next((at, int(m.group(1))) for at, ln in seen if (m := re.match(r"# resumed from \S+ at step (\d+)", ln)))
        same = DIGEST.findall(out) == [ref]
        print(f"  {kill.rank:>4} {reached:>7} {back[1]:>7} {reached - back[1]:>4} {back[0] - kill.at:>15.2f} "
              f"{seen[-1][0] - seen[0][0]:>6.1f} {'same' if same else 'DIFFERENT'}")


def ulfm(repeats: int, ranks: int) -> None:
    flags = SMALL + ["--algorithm", "ring", "--on-failure", "shrink"]
    with tempfile.TemporaryDirectory() as d:
        rc, out, _ = launch(Path(d), "--fault-tolerant", train=flags, ranks=ranks)
    want = float(re.findall(r"^step\s+149\s+loss (\S+)$", out, re.M)[0])
    print(f"ULFM: {ranks} ranks under --fault-tolerant, --on-failure shrink, the same kill")
    print(f"  {'rank':>4} {'lost in step':>12} {'kill->going on s':>16} {'replicas':>9} {'last loss - uninterrupted':>26}")
    for i in range(repeats):
        kill, out, seen = _kill_run(["--fault-tolerant"], flags, ranks, rank=0 if i == 0 else None)
        at, line = next((at, ln) for at, ln in seen if " lost in step " in ln)
        step = int(re.search(r"lost in step (\d+)", line).group(1))
        same = f"# replicas bitwise identical on all {ranks - 1} ranks: yes" in out
        last = float(re.findall(r"^step\s+149\s+loss (\S+)$", out, re.M)[0])
        print(f"  {kill.rank:>4} {step:>12} {at - kill.at:>16.2f} {'identical' if same else 'DIFFER':>9} "
              f"{last - want:>26.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--only", choices=["checkpoint", "restarts", "ulfm"], default=None)
    ns = ap.parse_args()
    for name, part in (("checkpoint", checkpoint_cost), ("restarts", restarts), ("ulfm", ulfm)):
        if ns.only in (None, name):
            part(ns.repeats, ns.ranks)


if __name__ == "__main__":
    main()
