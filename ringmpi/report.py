"""The benchmark's files: JSON (every row and the banner), CSV, a Markdown report, plots."""
from __future__ import annotations

import csv
import json
from pathlib import Path


__all__ = ["write_report", "plot"]


def _label(n: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def plot(out: Path, rows: list[dict], prof, p: int) -> list[str]:
    """busbw vs size, time vs size with the fitted model, ratio to MPI vs size."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    colls = list(dict.fromkeys(r["collective"] for r in rows))
    names = list(dict.fromkeys(r["algorithm"] for r in rows if r["algorithm"] != "mpi"))
    color = {a: f"C{i % 10}" for i, a in enumerate(names)}  # one colour per algorithm in every panel
    files = []
    kinds = [("busbw", "bus bandwidth (GB/s)", "Bus bandwidth per algorithm: higher is better", "busbw.png"),
             ("time_us", "time per call (us)", "Time per call: lower is better; dotted lines are the "
              "fitted alpha-beta-gamma model of each algorithm", "time.png"),
             ("ratio_mpi", "time / MPI's own", "Time divided by the MPI library's own collective at the "
              "same size: below 1 is faster than MPI", "ratio.png")]
    ncols = min(3, len(colls))
    nrows = -(-len(colls) // ncols)
    for key, ylabel, title, fname in kinds:
        fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 4.2 * nrows), squeeze=False)
        for ax in axes.flat[len(colls):]:
            ax.set_visible(False)
        for ax, coll in zip(axes.flat, colls):
            sel = [r for r in rows if r["collective"] == coll and r["size"] > 0]
            place = "out" if any(r["placement"] == "out" for r in sel) else "in"
            sel = [r for r in sel if r["placement"] == place]
            for alg in dict.fromkeys(r["algorithm"] for r in sel):
                pts = sorted((r["size"], r[key], r.get("predicted_us")) for r in sel if r["algorithm"] == alg
                             and r[key] is not None)
                if not pts:
                    continue
                xs = [a for a, _, _ in pts]
                style = dict(color="black", linewidth=2.5, linestyle="--") if alg == "mpi" else dict(color=color[alg])
                ax.plot(xs, [b for _, b, _ in pts], marker="o", markersize=3,
                        label="MPI's own" if alg == "mpi" else alg, **style)
                if key == "time_us" and alg != "mpi" and all(c is not None for _, _, c in pts):
                    ax.plot(xs, [c for _, _, c in pts], linestyle=":", color=style["color"], linewidth=1)
            if key == "ratio_mpi":
                ax.axhline(1.0, color="black", linewidth=1)
            ax.set_xscale("log", base=2)
            if key != "busbw":
                ax.set_yscale("log")
            ticks = sorted({r["size"] for r in sel})
            ax.set_xticks(ticks)
            ax.set_xticklabels([_label(x) for x in ticks], rotation=45, fontsize=7)
            ax.set_title(f"{coll} ({place}-of-place), {p} ranks")
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=80)
        plt.close(fig)
        files.append(fname)
    return files


def write_report(out: Path, info: dict, rows: list[dict], auto_rows: list[dict], prof, p: int,
                 args: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    args = {k: v for k, v in args.items() if k != "func"}
    (out / "bench.json").write_text(json.dumps({"banner": info, "args": args, "rows": rows, "auto": auto_rows,
                                                "profile": {k: v for k, v in vars(prof).items()}}, indent=1))
    with open(out / "bench.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    prof.save(out / "profile.json")
    pics = plot(out, rows, prof, p)
    md = [f"# ringmpi benchmark: {p} ranks", "",
          f"- {info['mpi_library']}; mpi4py {info['mpi4py']}, numpy {info['numpy']}, ringmpi {info['ringmpi']}",
          f"- hosts: {', '.join(f'{h} ({n} ranks)' for h, n in info['ranks_per_host'].items())}; "
          f"{info['cpus_per_host']} CPUs per host; backend {info['backend']}; {info['date']}",
          f"- dtype {args.get('dtype')}, op {args.get('op')}; time = median of {args.get('rounds')} interleaved "
          "rounds, averaged over ranks; algbw = size/time (GB = 1e9 B); busbw = algbw x factor (nccl-tests)",
          "", "## Fitted model", "",
          "| alpha (us) | bandwidth 1/beta (GB/s) | reduction 1/gamma (GB/s) | overhead per call (us) | median / worst fit error |",
          "|---|---|---|---|---|",
          f"| {prof.alpha * 1e6:.3g} | {1 / prof.beta / 1e9 if prof.beta else float('inf'):.3g} | "
          f"{1 / prof.gamma / 1e9 if prof.gamma else float('inf'):.3g} | {prof.overhead * 1e6:.3g} | "
          f"{prof.meta.get('fit', {}).get('median_rel_err') or 0:.0%} / {prof.meta.get('fit', {}).get('max_rel_err') or 0:.0%} |",
          "", "`auto` uses this profile: measured times (interpolated) inside the measured sizes, "
          "the fitted formulas outside them. It was saved as `profile.json`.", ""]
    for coll in dict.fromkeys(r["collective"] for r in rows):
        sel = [r for r in rows if r["collective"] == coll]
        place = "out" if any(r["placement"] == "out" for r in sel) else "in"
        algs = list(dict.fromkeys(r["algorithm"] for r in sel))
        md += [f"## {coll} ({place}-of-place time in us; in brackets: ratio to MPI's own)", "",
               "| size | " + " | ".join(algs) + " | fastest | auto chose | auto / fastest | auto / MPI |",
               "|---|" + "---|" * (len(algs) + 4)]
        for size in sorted({r["size"] for r in sel}):
            cells = []
            here = {r["algorithm"]: r for r in sel if r["size"] == size and r["placement"] == place}
            for a in algs:
                r = here.get(a)
                cells.append("-" if r is None else f"{r['time_us']:.1f}" + (
                    f" ({r['ratio_mpi']:.2f})" if r.get("ratio_mpi") and a != "mpi" else ""))
            best = min(here.values(), key=lambda r: r["time_us"])["algorithm"]
            au = next((a for a in auto_rows if a["collective"] == coll and a["size"] == size), None)
            tail = f"{au['chose']} | {au['auto_over_best']:.2f} | {au['auto_over_mpi']:.2f} |" if au else "- | - | - |"
            md.append(f"| {_label(size)} | " + " | ".join(cells) + f" | {best} | " + tail)
        wrong = sum(r["wrong"] for r in sel)
        md += ["", f"#wrong over all rows: {wrong}. `mpi` is the MPI library's own collective called "
               "directly; `auto / fastest` compares auto with the fastest candidate called through "
               "ringmpi's API (the same per-call overhead), timed side by side after the fit.", ""]
    from .bench import best_bands
    md += ["## Fastest algorithm by size band", ""]
    for coll, bands in best_bands(rows).items():
        md.append(f"- {coll}: " + "; ".join(f"{lo if lo == hi else lo + '-' + hi}: **{alg}**" for lo, hi, alg in bands))
    md.append("")
    if pics:
        md += ["## Plots", ""]
        captions = {"busbw.png": "Bus bandwidth per algorithm; the thick dashed line is the MPI library's own.",
                    "time.png": "Time per call; dotted lines are the fitted alpha-beta-gamma model of each algorithm.",
                    "ratio.png": "Each algorithm's time divided by MPI's own at the same size: below 1 is faster than MPI."}
        for f in pics:
            md += [f"![{f}]({f})", "", captions[f], ""]
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path
