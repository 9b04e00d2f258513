"""The benchmark's files: JSON (every row and the banner), CSV, a Markdown report, plots."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ..units import size_label

__all__ = ["write_report", "plot", "best_bands"]


def best_bands(rows: list[dict]) -> dict[str, list[tuple[str, str, str]]]:
    """Per collective, consecutive sizes with the same fastest algorithm: (from, to, name)."""
    out: dict = {}
    for coll in dict.fromkeys(r["collective"] for r in rows):
        sel = [r for r in rows if r["collective"] == coll and r["size"]]
        place = "out" if any(r["placement"] == "out" for r in sel) else "in"
        bands: list = []
        for size in sorted({r["size"] for r in sel}):
            best = min((r for r in sel if r["size"] == size and r["placement"] == place),
                       key=lambda r: r["time_us"])["algorithm"]
            if bands and bands[-1][2] == best:
                bands[-1][1] = size
            else:
                bands.append([size, size, best])
        out[coll] = [(size_label(a), size_label(b), alg) for a, b, alg in bands]
    return out


def _selected(rows: list[dict], coll: str) -> tuple[str, list[dict]]:
    """The placement a collective's table shows (out of place where it has one) and its rows."""
    sel = [r for r in rows if r["collective"] == coll]
    place = "out" if any(r["placement"] == "out" for r in sel) else "in"
    return place, [r for r in sel if r["placement"] == place]


def _panel(ax, key: str, ylabel: str, rows: list[dict], coll: str, color: dict, p: int) -> None:
    """One collective's curves of `key` against the message size: one colour per algorithm,
    out of place solid and in place dashed, min-max over ranks as error bars on the times,
    the fitted model dotted (one legend entry for all)."""
    from matplotlib.ticker import FuncFormatter, LogLocator
    sel = [r for r in rows if r["collective"] == coll and r["size"] > 0 and r.get(key) is not None]
    model_drawn = False
    for alg in dict.fromkeys(r["algorithm"] for r in sel):
        c = "black" if alg == "mpi" else color[alg]
        for place, dash in (("out", "-"), ("in", "--")):
            pts = sorted((r for r in sel if r["algorithm"] == alg and r["placement"] == place), key=lambda r: r["size"])
            if not pts:
                continue
            xs = [r["size"] for r in pts]
            ys = [r[key] for r in pts]
            label = ("MPI's own" if alg == "mpi" else alg) + ("" if place == "out" else " (in place)")
            width = 2.5 if alg == "mpi" else 1.3
            if key == "time_us":
                err = [[y - r["time_min_us"] for y, r in zip(ys, pts)], [r["time_max_us"] - y for y, r in zip(ys, pts)]]
                ax.errorbar(xs, ys, yerr=err, color=c, linestyle=dash, linewidth=width, marker="o", markersize=3,
                            capsize=2, elinewidth=0.8, label=label)
            else:
                ax.plot(xs, ys, color=c, linestyle=dash, linewidth=width, marker="o", markersize=3, label=label)
            if key == "time_us" and place == "out" and alg != "mpi" and all(r.get("predicted_us") for r in pts):
                ax.plot(xs, [r["predicted_us"] for r in pts], linestyle=":", color=c, linewidth=1.2,
                        label=None if model_drawn else "fitted model (dotted)")
                model_drawn = True
    if key == "ratio_mpi":
        ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xscale("log", base=2)
    if any(r[key] > 0 for r in sel):   # (one rank's bus bandwidth is 0 at every size: a linear axis)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ticks = sorted({r["size"] for r in sel})
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(x) for x in ticks], rotation=45, fontsize=7)
    ax.set_title(f"{coll}, {p} ranks")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="best")


PLOTS = [("busbw", "bus bandwidth (GB/s)", "Bus bandwidth per algorithm: higher is better", "busbw.png",
          "Bus bandwidth per algorithm, out of place (solid) and in place (dashed); the thick black lines are the "
          "MPI library's own."),
         ("time_us", "time per call (us)", "Time per call: lower is better; dotted lines are the "
          "fitted alpha-beta-gamma model of each algorithm", "time.png",
          "Time per call (bars: fastest to slowest rank); dotted lines are the fitted alpha-beta-gamma model of "
          "each algorithm."),
         ("ratio_mpi", "time / MPI's own", "Time divided by the MPI library's own collective at the "
          "same size: below 1 is faster than MPI", "ratio.png",
          "Each algorithm's time divided by MPI's own at the same size: below 1 is faster than MPI.")]


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
    ncols = min(3, len(colls))
    nrows = -(-len(colls) // ncols)
    files = []
    for key, ylabel, title, fname, _ in PLOTS:
        fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 4.2 * nrows), squeeze=False)
        for ax in axes.flat[len(colls):]:
            ax.set_visible(False)
        for ax, coll in zip(axes.flat, colls):
            _panel(ax, key, ylabel, rows, coll, color, p)
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=80)
        plt.close(fig)
        files.append(fname)
    return files


def _md_header(info: dict, prof, p: int, args: dict) -> list[str]:
    fit = prof.meta.get("fit", {})
    return [f"# ringmpi benchmark: {p} ranks", "",
            f"- {info['mpi_library']}; mpi4py {info['mpi4py']}, numpy {info['numpy']}, ringmpi {info['ringmpi']}",
            f"- hosts: {', '.join(f'{h} ({n} ranks)' for h, n in info['ranks_per_host'].items())}; "
            f"{info['cpus_per_host']} CPUs per host; backend {info['backend']}; {info['date']}",
            f"- dtype {args.get('dtype')}, op {args.get('op')}; time = median of {args.get('rounds')} interleaved "
            "rounds, averaged over ranks; algbw = size/time (GB = 1e9 B); busbw = algbw x factor (nccl-tests)",
            "", "## Fitted model", "",
            "| alpha (us) | bandwidth 1/beta (GB/s) | reduction 1/gamma (GB/s) | overhead per call (us) "
            "| median / worst fit error |", "|---|---|---|---|---|",
            f"| {prof.alpha * 1e6:.3g} | {1 / prof.beta / 1e9 if prof.beta else float('inf'):.3g} | "
            f"{1 / prof.gamma / 1e9 if prof.gamma else float('inf'):.3g} | {prof.overhead * 1e6:.3g} | "
            f"{fit.get('median_rel_err') or 0:.0%} / {fit.get('max_rel_err') or 0:.0%} |",
            "", "`auto` uses this profile: measured times (interpolated) inside the measured sizes, "
            "the fitted formulas outside them. It was saved as `profile.json`.", ""]


def _md_collective(rows: list[dict], auto_rows: list[dict], coll: str) -> list[str]:
    place, sel = _selected(rows, coll)
    algs = list(dict.fromkeys(r["algorithm"] for r in sel))
    where = "out of place" if place == "out" else "in place"
    md = [f"## {coll} ({where}, time in us; in brackets: ratio to MPI's own)", "",
          "| size | " + " | ".join(algs) + " | fastest | auto chose | auto / fastest | auto / MPI |",
          "|---|" + "---|" * (len(algs) + 4)]
    for size in sorted({r["size"] for r in sel}):
        here = {r["algorithm"]: r for r in sel if r["size"] == size}
        cells = ["-" if a not in here else f"{here[a]['time_us']:.1f}" + (
            f" ({here[a]['ratio_mpi']:.2f})" if here[a].get("ratio_mpi") and a != "mpi" else "") for a in algs]
        best = min(here.values(), key=lambda r: r["time_us"])["algorithm"]
        au = next((a for a in auto_rows if a["collective"] == coll and a["size"] == size
                   and a.get("placement", place) == place), None)
        tail = f"{au['chose']} | {au['auto_over_best']:.2f} | {au['auto_over_mpi']:.2f} |" if au else "- | - | - |"
        md.append(f"| {size_label(size)} | " + " | ".join(cells) + f" | {best} | " + tail)
    wrong = sum(r["wrong"] for r in rows if r["collective"] == coll)
    return md + ["", f"#wrong over all rows: {wrong}. `mpi` is the MPI library's own collective called "
                 "directly; `auto / fastest` compares auto with the fastest candidate called through "
                 "ringmpi's API (the same per-call overhead), timed side by side after the fit.", ""]


def write_report(out: Path, info: dict, rows: list[dict], auto_rows: list[dict], prof, p: int,
                 args: dict, overhead: list[dict] | None = None) -> Path:
    """bench.json, bench.csv, profile.json, the plots and report.md in folder `out`."""
    out.mkdir(parents=True, exist_ok=True)
    args = {k: v for k, v in args.items() if k != "func"}
    (out / "bench.json").write_text(json.dumps({"banner": info, "args": args, "rows": rows, "auto": auto_rows,
                                                "api_overhead": overhead or [],
                                                "profile": {k: v for k, v in vars(prof).items()}}, indent=1))
    with open(out / "bench.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    prof.save(out / "profile.json")
    pics = plot(out, rows, prof, p)
    if not pics:
        print("# plots left out: matplotlib is not installed (pip install 'ringmpi[plot]')")
    md = _md_header(info, prof, p, args)
    for coll in dict.fromkeys(r["collective"] for r in rows):
        md += _md_collective(rows, auto_rows, coll)
    md += ["## Fastest algorithm by size band", ""]
    for coll, bands in best_bands(rows).items():
        md.append(f"- {coll}: " + "; ".join(f"{lo if lo == hi else lo + '-' + hi}: **{alg}**" for lo, hi, alg in bands))
    md.append("")
    if not pics:
        md += ["## Plots", "", "Left out: matplotlib is not installed (`pip install 'ringmpi[plot]'`).", ""]
    else:
        md += ["## Plots", ""]
        captions = {f: caption for *_, f, caption in PLOTS}
        for f in pics:
            md += [f"![{f}]({f})", "", captions[f], ""]
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path
