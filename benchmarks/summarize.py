"""Write benchmarks/README.md's measured sections from benchmarks/results/*/bench.json.

python benchmarks/summarize.py > /tmp/summary.md   (the numbers are never copied by hand)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RES = Path(__file__).parent / "results"


def lab(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def load(name: str) -> dict:
    return json.loads((RES / name / "bench.json").read_text())


def rows_of(d: dict, coll: str) -> list[dict]:
    place = "in" if coll == "broadcast" else "out"
    return [r for r in d["rows"] if r["collective"] == coll and r["placement"] == place]


def at(d: dict, coll: str, size: int) -> dict:
    return {r["algorithm"]: r for r in rows_of(d, coll) if r["size"] == size}


def autos(d: dict, coll: str) -> list[dict]:
    return [a for a in d["auto"] if a["collective"] == coll]


def profile_line(d: dict) -> str:
    p = d["profile"]
    fit = p["meta"]["fit"]
    return (f"alpha {p['alpha'] * 1e6:.3g} us, bandwidth {1 / p['beta'] / 1e9:.3g} GB/s, reduction "
            f"{1 / p['gamma'] / 1e9 if p['gamma'] else float('inf'):.3g} GB/s, per-call overhead "
            f"{p['overhead'] * 1e6:.3g} us; median error of the formulas over the {fit['n']} points "
            f"{fit['median_rel_err']:.0%}")


def allreduce_table(d: dict) -> list[str]:
    out = ["| size | MPI_Allreduce (us) | ring (us) | ring / MPI | rabenseifner / MPI | fastest | auto chose | auto / fastest |",
           "|---|---|---|---|---|---|---|---|"]
    for a in autos(d, "allreduce"):
        h = at(d, "allreduce", a["size"])
        out.append(f"| {lab(a['size'])} | {h['mpi']['time_us']:.1f} | {h['ring']['time_us']:.1f} | "
                   f"{h['ring']['ratio_mpi']:.2f} | {h['rabenseifner']['ratio_mpi']:.2f} | {a['best']} | "
                   f"{a['chose']} | {a['auto_over_best']:.2f} |")
    return out


def collective_summary(d: dict, p: int) -> list[str]:
    out = []
    for coll in dict.fromkeys(r["collective"] for r in d["rows"]):
        big = sorted({r["size"] for r in rows_of(d, coll)})[-2:]
        cells = []
        for s in big:
            h = at(d, coll, s)
            best = min(h, key=lambda k: h[k]["time_us"])
            cells.append(f"{lab(s)}: {best}" + (f" {h[best]['ratio_mpi']:.2f}x" if best != "mpi" else ""))
        au = autos(d, coll)
        worst = max(au, key=lambda a: a["auto_over_best"])
        hits = sum(a["chose"] == a["best"] for a in au)
        out.append(f"| {coll}, {p} | {'; '.join(cells)} | {worst['auto_over_best']:.2f} ({lab(worst['size'])}) | "
                   f"{hits} of {len(au)} |")
    return out


def fresh_section(d: dict) -> list[str]:
    """Per-call overhead against MPI's own, and online tuning on a machine with no profile."""
    out = ["\n## Never slower than plain MPI: 2 ranks, no profile (`results/fresh-p2`, `bench --fresh`)", "",
           "API overhead: `ringmpi.allreduce(x, y)` and `ringmpi.allreduce(x)` (auto) against MPI_Allreduce called "
           "directly (mpi4py's bound method, preallocated result), float32 SUM, interleaved, median:", "",
           "| size | MPI_Allreduce (us) | ringmpi.allreduce(x, y) (us) | ratio | ringmpi.allreduce(x) (us) | ratio |",
           "|---|---|---|---|---|---|"]
    for r in d.get("api_overhead", []):
        out.append(f"| {lab(r['size'])} | {r['mpi_us']:.2f} | {r['auto_us']:.2f} | {r['auto_over_mpi']:.2f} | "
                   f"{r['auto_new_us']:.2f} | {r['auto_new_over_mpi']:.2f} |")
    out += ["", "Online tuning from scratch (RINGMPI_TUNE=1, no profile): auto after its exploration, timed "
            "beside the fastest candidate (both through the API) and MPI's own:", "",
            "| collective | auto / fastest, worst size | auto / MPI's own, worst | exploration calls | "
            "exploration cost, median (max) in calls of the slowest candidate tried | max cost (ms) |",
            "|---|---|---|---|---|---|"]
    for coll in dict.fromkeys(a["collective"] for a in d["auto"]):
        au = [a for a in d["auto"] if a["collective"] == coll]
        worst = max(au, key=lambda a: a["auto_over_best"])
        mpi = max(au, key=lambda a: a["auto_over_mpi"])
        ex = sorted(a["explore_in_slowest_calls"] for a in au if "explore_in_slowest_calls" in a)
        calls = sorted({a["explore_calls"] for a in au if "explore_calls" in a})
        cost = max(a["explore_cost_us"] for a in au if "explore_cost_us" in a) / 1e3
        out.append(f"| {coll} | {worst['auto_over_best']:.2f} ({lab(worst['size'])}) | {mpi['auto_over_mpi']:.2f} "
                   f"({lab(mpi['size'])}) | {calls[0]}-{calls[-1]} | {ex[len(ex) // 2]:.1f} ({ex[-1]:.1f}) | "
                   f"{cost:.2f} |")
    return out


def htb_section(d: dict) -> list[str]:
    p = d["profile"]
    direct = p["meta"].get("direct", {})
    return ["\n## Calibration over a shaped link: 4 hosts x 1 rank, HTB 1 Gbit/s per host "
            "(`results/multihost-htb-p4`)", "",
            f"The link gives 0.125 GB/s. Point-to-point rounds alone measured "
            f"{1 / direct['beta'] / 1e9:.3g} GB/s; the fitted profile: {profile_line(d)}; bandwidth "
            f"{1 / p['beta'] / 1e9 / 0.125:.2f}x the link's rate."]


def by_size(d: dict, coll: str) -> list[int]:
    return sorted({r["size"] for r in rows_of(d, coll)})


def shm_section(unshared: dict, shared: dict) -> list[str]:
    """ring_shm against MPI_Allreduce and the point-to-point ring, buffers shared (-R 1) or not."""
    top = max(by_size(shared, "allreduce"))
    beside = shared["banner"].get("copy_beside_GBps", {}).get(f"allreduce/{top}")
    copy = beside or shared["banner"].get("copy_GBps")
    out = ["\n## Shared memory on one host: 2 ranks, buffers shared (`-R 1`) or not "
           "(`results/shm-p2-R1`, `results/shm-p2-R0`)", "",
           "Time / MPI_Allreduce, float32 SUM, out of place; each column from its own run "
           "(the runs are minutes apart, and this VM's memory bandwidth drifts between runs). The ring runs "
           "in parts of 512 KiB of every block; with -R 0 (ordinary arrays) a part's blocks are staged "
           "through the shared segments, and blocks from 4 MiB are read whole from the peer's private "
           "memory (cross-memory attach, a megabyte at a time into the result).", "",
           "| size | MPI_Allreduce, -R 1 (us) | ring_shm, -R 1 | ring (p2p), -R 1 | ring_shm, -R 0 | ring (p2p), -R 0 | auto chose, -R 1 |",
           "|---|---|---|---|---|---|---|"]
    chose = {a["size"]: a["chose"] for a in autos(shared, "allreduce")}
    for size in by_size(shared, "allreduce"):
        r1, r0 = at(shared, "allreduce", size), at(unshared, "allreduce", size)
        out.append(f"| {lab(size)} | {r1['mpi']['time_us']:.1f} | {r1['ring_shm']['ratio_mpi']:.2f} | "
                   f"{r1['ring']['ratio_mpi']:.2f} | {r0['ring_shm']['ratio_mpi']:.2f} | {r0['ring']['ratio_mpi']:.2f} | "
                   f"{chose.get(size, '-')} |")
    if copy:
        big = at(shared, "allreduce", max(by_size(shared, "allreduce")))
        out += ["", f"At {lab(max(by_size(shared, 'allreduce')))} with shared buffers, bus bandwidth / one core's "
                f"memory copy ({copy:.3g} GB/s, every rank copying at once, "
                f"{'timed in the same rounds' if beside else 'at the start of the run'}): "
                + ", ".join(f"{a} {big[a]['busbw'] / copy:.2f}" for a in ("ring_shm", "ring", "mpi")) + "."]
    return out


def hierarchical_section(d: dict) -> list[str]:
    """hierarchical and hierarchical_oneway against the flat ring, and each one's use of the
    host link: the bytes a host sends across (flat ring 1.5n, hierarchical n, for 2 hosts of
    2) over the time, against the shaped rate (1 Gbit/s = 125 MB/s)."""
    algs = [a for a in ("hierarchical", "hierarchical_oneway") if a in {r["algorithm"] for r in rows_of(d, "allreduce")}]
    out = ["\n## Two hosts of two ranks, 1 Gbit/s HTB per host (`results/multihost-htb-2x2`)", "",
           f"Hosts {', '.join(d['banner']['hosts'])}: shared memory inside a host, TCP between. Link use: "
           "bytes a host sends across (flat ring 1.5n, hierarchical n) / time / 125 MB/s.", "",
           "| size | MPI_Allreduce (us) | ring / MPI | " + " | ".join(f"{a} / ring" for a in algs)
           + " | link use: ring, " + ", ".join(algs) + " | auto chose |",
           "|---|---|---|" + "---|" * len(algs) + "---|---|"]
    chose = {a["size"]: a["chose"] for a in autos(d, "allreduce")}
    for size in by_size(d, "allreduce"):
        h = at(d, "allreduce", size)
        use = [1.5 * size / (h["ring"]["time_us"] * 1e-6) / 125e6] + [size / (h[a]["time_us"] * 1e-6) / 125e6 for a in algs]
        out.append(f"| {lab(size)} | {h['mpi']['time_us']:.0f} | {h['ring']['ratio_mpi']:.2f} | "
                   + " | ".join(f"{h[a]['time_us'] / h['ring']['time_us']:.2f}" for a in algs) + " | "
                   + ", ".join(f"{u:.0%}" for u in use) + f" | {chose.get(size, '-')} |")
    return out


def main() -> int:
    w = sys.stdout.write
    d = load("p2-allreduce")
    ratios = {a["size"]: at(d, "allreduce", a["size"])["ring"]["ratio_mpi"] for a in autos(d, "allreduce")}
    big = [s for s in ratios if s >= 4 << 20]
    w(f"## All-reduce on 2 ranks, {lab(min(ratios))} to {lab(max(ratios))} (`results/p2-allreduce`)\n\n")
    w("\n".join(allreduce_table(d)) + "\n\n")
    au = autos(d, "allreduce")
    w("- ring / MPI_Allreduce from 4 MiB up: " + ", ".join(f"{ratios[s]:.2f} at {lab(s)}" for s in sorted(big)) + ".\n")
    w(f"- auto within {max(a['auto_over_best'] for a in au):.2f}x of the fastest candidate at all {len(au)} sizes; "
      f"it picked the fastest at {sum(a['chose'] == a['best'] for a in au)}.\n")
    w(f"- Fitted profile: {profile_line(d)}.\n\n")
    w("## Every collective, 2 ranks (`results/p2-all`) and 4 ranks (`results/p4-all`)\n\n")
    w("| collective, ranks | fastest at the two largest sizes (x MPI's own) | auto / fastest, worst size | auto picked the fastest |\n")
    w("|---|---|---|---|\n")
    for name, p in (("p2-all", 2), ("p4-all", 4)):
        w("\n".join(collective_summary(load(name), p)) + "\n")
    w(f"\nFitted profiles: 2 ranks {profile_line(load('p2-all'))}; 4 ranks {profile_line(load('p4-all'))}.\n")
    if (RES / "multihost-p4" / "bench.json").exists():
        m = load("multihost-p4")
        w("\n## Four hosts over TCP on one machine (`results/multihost-p4`)\n\n")
        w(f"Hosts {', '.join(m['banner']['hosts'])}, one rank each.\n\n")
        w("| size | MPI_Allreduce (us) | ring / MPI | rabenseifner / MPI | MPI_Bcast (us) | pipeline / MPI | tree / MPI |\n")
        w("|---|---|---|---|---|---|---|\n")
        for s in sorted({r["size"] for r in rows_of(m, "allreduce")}):
            if s < 64 << 10:
                continue
            a, b = at(m, "allreduce", s), at(m, "broadcast", s)
            w(f"| {lab(s)} | {a['mpi']['time_us']:.0f} | {a['ring']['ratio_mpi']:.2f} | {a['rabenseifner']['ratio_mpi']:.2f} | "
              f"{b['mpi']['time_us']:.0f} | {b['pipeline']['ratio_mpi']:.2f} | {b['tree']['ratio_mpi']:.2f} |\n")
        aus = autos(m, "allreduce") + autos(m, "broadcast")
        w(f"\n#wrong {sum(r['wrong'] for r in m['rows'])}; auto within {max(a['auto_over_best'] for a in aus):.2f}x of "
          f"the fastest at every size of both collectives (the fastest at {sum(a['chose'] == a['best'] for a in aus)} "
          f"of {len(aus)}). Fitted profile over TCP: {profile_line(m)}.\n")
    if (RES / "fresh-p2" / "bench.json").exists():
        w("\n".join(fresh_section(load("fresh-p2"))) + "\n")
    if (RES / "multihost-htb-p4" / "bench.json").exists():
        w("\n".join(htb_section(load("multihost-htb-p4"))) + "\n")
    if (RES / "shm-p2-R1" / "bench.json").exists() and (RES / "shm-p2-R0" / "bench.json").exists():
        w("\n".join(shm_section(load("shm-p2-R0"), load("shm-p2-R1"))) + "\n")
    if (RES / "multihost-htb-2x2" / "bench.json").exists():
        w("\n".join(hierarchical_section(load("multihost-htb-2x2"))) + "\n")
    wrong = sum(r["wrong"] for n in ("p2-allreduce", "p2-all", "p4-all") for r in load(n)["rows"])
    w(f"\n#wrong over every row of the three laptop runs: {wrong}.\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
