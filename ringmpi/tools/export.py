"""Tuning for MPI libraries, from what ringmpi measured: users who will not run Python in
production still get the size bands where another algorithm beats the library's default.

    ompi-rules  an Open MPI `coll_tuned_dynamic_rules_filename` file (the classic format,
                read by Open MPI 4 and 5): mpirun --mca coll_tuned_use_dynamic_rules 1
                --mca coll_tuned_dynamic_rules_filename FILE
    mpich-json  an MPICH `MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE`: MPICH's own default
                selection tree (read from the loaded libmpi) with the measured bands put in
                front of it for this communicator size (MPICH aborts on any collective a
                selection file leaves out, so the file must be complete)

A band becomes a rule only where the measured best is an algorithm the library also has
(ring, recursive doubling, Rabenseifner, binomial tree, pipelined chain, Bruck, pairwise);
elsewhere the library keeps its own choice.
"""
from __future__ import annotations

import copy
import json
from typing import Any
from pathlib import Path

from ..cost import Profile

__all__ = ["bands", "ompi_rules", "mpich_json", "OMPI", "MPICH", "FORMATS"]

#: Open MPI coll/tuned: collective id, and ringmpi algorithm -> its algorithm id
OMPI = {
    "allgather": (0, {"naive": 1, "recursive_doubling": 3, "ring": 4}),
    "allreduce": (2, {"naive": 1, "recursive_doubling": 3, "ring": 4, "rabenseifner": 6}),
    "alltoall": (3, {"naive": 1, "pairwise": 2, "bruck": 3}),
    "broadcast": (7, {"naive": 1, "pipeline": 3, "tree": 6, "scatter_allgather": 9}),
    "reduce": (11, {"naive": 1, "tree": 5}),
    "reduce_scatter": (12, {"naive": 1, "ring": 3}),
}
#: MPICH: collective key, size condition, and ringmpi algorithm -> MPIR algorithm
MPICH = {
    "allreduce": ("allreduce", "avg_msg_size", {"recursive_doubling": "MPIR_Allreduce_intra_recursive_doubling",
                                                 "rabenseifner": "MPIR_Allreduce_intra_reduce_scatter_allgather",
                                                 "ring": "MPIR_Allreduce_intra_ring"}),
    "broadcast": ("bcast", "avg_msg_size", {"tree": "MPIR_Bcast_intra_binomial",
                                             "scatter_allgather": "MPIR_Bcast_intra_scatter_ring_allgather"}),
    "reduce": ("reduce", "avg_msg_size", {"tree": "MPIR_Reduce_intra_binomial",
                                           "ring": "MPIR_Reduce_intra_reduce_scatter_gather"}),
    "allgather": ("allgather", "total_msg_size", {"ring": "MPIR_Allgather_intra_ring",
                                                   "recursive_doubling": "MPIR_Allgather_intra_recursive_doubling"}),
}
FORMATS = ("ompi-rules", "mpich-json")


def bands(prof: Profile, collective: str) -> list[tuple[int, str]]:
    """[(from bytes, fastest algorithm), ...] from the profile's measured table: each
    measured size's fastest algorithm, consecutive equal ones merged; the first from 0."""
    table = prof.measured.get(collective, {})
    sizes = sorted({b for pts in table.values() for b, _ in pts})
    out: list[tuple[int, str]] = []
    for i, size in enumerate(sizes):
        here = {a: s for a, pts in table.items() for b, s in pts if b == size}
        best = min(here, key=here.get)
        if not out or out[-1][1] != best:
            start = 0 if i == 0 else (sizes[i - 1] + size) // 2  # the switch halfway between measured sizes
            out.append((start, best))
    return out


def ompi_rules(prof: Profile, p: int) -> str:
    """The classic rules file: per collective one communicator size (p), then one line per
    size band "bytes algorithm topo segsize" (0 = Open MPI's own fixed decision)."""
    lines = [f"# ringmpi tuning for {p} ranks, from profile '{prof.name}'", ""]
    blocks = []
    for coll, (cid, ids) in OMPI.items():
        rules = []
        for start, alg in bands(prof, coll):
            seg = 0
            if alg == "pipeline":  # segment size in bytes: the measured band's tuned S
                seg = _pipeline_segment(prof, p, start)
            rules.append(f"{start} {ids.get(alg, 0)} 0 {seg}   # {alg}")
        if rules:
            blocks.append([f"{cid}   # collective {coll}", "1   # communicator sizes", f"{p}   # size",
                           f"{len(rules)}   # rules: bytes alg topo segsize"] + rules)
    lines.append(f"{len(blocks)}   # collectives")
    for b in blocks:
        lines += b
    return "\n".join(lines) + "\n"


def _pipeline_segment(prof: Profile, p: int, nbytes: int) -> int:
    from .. import schedules
    tuned = schedules.get("broadcast", "pipeline").tuned(p, max(nbytes, 1), 1, prof)
    return max(1024, max(nbytes, 1) // max(tuned.get("segments", 1), 1))


def mpich_json(prof: Profile, p: int, default: dict) -> dict:
    """MPICH's selection tree `default` with, for communicators of exactly p ranks, the
    measured bands in front of MPICH's own choice (kept for the bands we do not replace)."""
    tree = copy.deepcopy(default)
    known = _algorithms_in(default)
    for coll, (key, cond, names) in MPICH.items():
        node = tree.get(f"collective={key}", {}).get("comm_type=intra")
        if coll == "allgather" and p & (p - 1):
            # ringmpi's recursive doubling is Bruck's off powers of two; MPICH's asserts one
            names = {**names, "recursive_doubling": "MPIR_Allgather_intra_brucks"}
        # only algorithms this MPICH names in its own tree (MPICH 4.0 has no ring all-reduce
        # and aborts at MPI_Init on a key it does not know)
        names = {a: n for a, n in names.items() if n in known}
        found = bands(prof, coll)
        if node is None or not any(alg in names for _, alg in found):
            continue
        ends = [start - 1 for start, _ in found[1:]] + [None]
        ours = {f"{cond}<={end}" if end is not None else f"{cond}=any":
                {f"algorithm={names[alg]}": {}} if alg in names else copy.deepcopy(node)
                for (_, alg), end in zip(found, ends)}
        tree[f"collective={key}"]["comm_type=intra"] = {f"comm_size<={p - 1}": copy.deepcopy(node),
                                                         f"comm_size<={p}": ours, "comm_size=any": node}
    return tree


def _algorithms_in(tree: Any) -> set[str]:
    """Every "algorithm=NAME" key's NAME in an MPICH selection tree."""
    out: set[str] = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k.startswith("algorithm="):
                out.add(k.split("=", 1)[1])
            out |= _algorithms_in(v)
    return out


def write(fmt: str, prof: Profile, p: int, path: str, mpich_default: dict | None = None) -> None:
    if fmt == "ompi-rules":
        text = ompi_rules(prof, p)
    elif fmt == "mpich-json":
        if not mpich_default:
            raise ValueError("mpich-json needs MPICH's own selection tree (run under the MPICH library)")
        text = json.dumps(mpich_json(prof, p, mpich_default), indent=1)
    else:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {', '.join(FORMATS)}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
