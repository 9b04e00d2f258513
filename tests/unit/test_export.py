"""The MPI libraries' tuning files written from a profile: the bands are the measured
fastest algorithms, mapped to the library's own ids where it has the algorithm."""
from __future__ import annotations

import json

from ringmpi.cost import Profile
from ringmpi.tools import export

MEASURED = {"allreduce": {"mpi": [[1024, 2e-6], [65536, 20e-6], [1 << 20, 300e-6], [1 << 24, 9e-3]],
                          "recursive_doubling": [[1024, 3e-6], [65536, 15e-6], [1 << 20, 290e-6], [1 << 24, 8e-3]],
                          "ring": [[1024, 9e-6], [65536, 30e-6], [1 << 20, 200e-6], [1 << 24, 4e-3]]},
            "broadcast": {"mpi": [[1024, 1e-6], [1 << 24, 5e-3]], "pipeline": [[1024, 4e-6], [1 << 24, 3e-3]]},
            "reduce": {"mpi": [[1024, 1e-6]], "naive": [[1024, 2e-6]]}}
PROF = Profile(alpha=2e-6, beta=1e-10, world_size=4, measured=MEASURED, name="test")


def test_bands_are_the_measured_fastest():
    assert export.bands(PROF, "allreduce") == [(0, "mpi"), (33280, "recursive_doubling"), (557056, "ring")]


def parse_ompi(text: str) -> dict:
    """Read the classic rules file as Open MPI does: numbers, '#' comments, counts first."""
    nums = iter(int(line.split("#")[0].split()[i]) for line in text.splitlines() if line.split("#")[0].strip()
                for i in range(len(line.split("#")[0].split())))
    out = {}
    for _ in range(next(nums)):
        cid, ncomm = next(nums), next(nums)
        for _ in range(ncomm):
            size, nrules = next(nums), next(nums)
            out[(cid, size)] = [(next(nums), next(nums), next(nums), next(nums)) for _ in range(nrules)]
    assert next(nums, None) is None, "trailing numbers"
    return out


def test_ompi_rules_file_format():
    rules = parse_ompi(export.ompi_rules(PROF, 4))
    assert rules[(2, 4)] == [(0, 0, 0, 0), (33280, 3, 0, 0), (557056, 4, 0, 0)]  # fixed, recursive doubling, ring
    bcast = rules[(7, 4)]
    assert bcast[0] == (0, 0, 0, 0) and bcast[1][1] == 3 and bcast[1][3] >= 1024  # pipeline with its segment size
    assert rules[(11, 4)] == [(0, 0, 0, 0)]


KNOWN = {"collective=allreduce": {"comm_type=inter": {"avg_msg_size<=1": {"algorithm=MPIR_Allreduce_intra_ring": {}},
                                                       "avg_msg_size=any": {
                                                           "algorithm=MPIR_Allreduce_intra_recursive_doubling": {}}}}}


def test_mpich_json_puts_the_bands_in_front_of_the_default():
    default = {"collective=allreduce": {"comm_type=intra": {"avg_msg_size=any": {"algorithm=X": {}}},
                                        **KNOWN["collective=allreduce"]},
               "collective=barrier": {"algorithm=Y": {}}}
    tree = json.loads(json.dumps(export.mpich_json(PROF, 4, default)))
    node = tree["collective=allreduce"]["comm_type=intra"]
    assert list(node) == ["comm_size<=3", "comm_size<=4", "comm_size=any"]
    assert node["comm_size<=3"] == node["comm_size=any"] == default["collective=allreduce"]["comm_type=intra"]
    ours = node["comm_size<=4"]
    assert ours["avg_msg_size<=33279"] == default["collective=allreduce"]["comm_type=intra"]  # MPI's own band
    assert ours["avg_msg_size<=557055"] == {"algorithm=MPIR_Allreduce_intra_recursive_doubling": {}}
    assert ours["avg_msg_size=any"] == {"algorithm=MPIR_Allreduce_intra_ring": {}}
    assert tree["collective=barrier"] == default["collective=barrier"]


def test_mpich_json_uses_only_algorithms_the_library_names():
    """MPICH 4.0 has no ring all-reduce (its tree never names it, and an unknown key aborts
    MPI_Init): that band keeps MPICH's own choice."""
    default = {"collective=allreduce": {"comm_type=intra": {"avg_msg_size=any": {"algorithm=X": {}}},
                                        "comm_type=inter": {"avg_msg_size=any": {
                                            "algorithm=MPIR_Allreduce_intra_recursive_doubling": {}}}}}
    ours = export.mpich_json(PROF, 4, default)["collective=allreduce"]["comm_type=intra"]["comm_size<=4"]
    assert ours["avg_msg_size<=557055"] == {"algorithm=MPIR_Allreduce_intra_recursive_doubling": {}}
    assert ours["avg_msg_size=any"] == default["collective=allreduce"]["comm_type=intra"]
    assert "MPIR_Allreduce_intra_ring" not in json.dumps(ours)


def test_mpich_json_allgather_off_powers_of_two_is_bruck():
    """ringmpi's recursive-doubling all-gather is Bruck's where p is not a power of two;
    MPICH's recursive doubling asserts one (an exported file made 3 ranks abort)."""
    prof = Profile(alpha=2e-6, beta=1e-10, world_size=3, name="t",
                   measured={"allgather": {"mpi": [[8, 2e-6], [1 << 16, 20e-6]],
                                           "recursive_doubling": [[8, 1e-6], [1 << 16, 30e-6]]}})
    names = {"algorithm=MPIR_Allgather_intra_recursive_doubling": {}, "algorithm=MPIR_Allgather_intra_brucks": {}}
    default = {"collective=allgather": {"comm_type=intra": {"total_msg_size=any": {"algorithm=X": {}}},
                                        "comm_type=inter": {f"total_msg_size<={i}": {k: v} for i, (k, v) in
                                                            enumerate(names.items())}}}
    for p, want in ((3, "MPIR_Allgather_intra_brucks"), (4, "MPIR_Allgather_intra_recursive_doubling")):
        ours = export.mpich_json(prof, p, default)["collective=allgather"]["comm_type=intra"][f"comm_size<={p}"]
        assert next(iter(ours.values())) == {f"algorithm={want}": {}}, (p, ours)
