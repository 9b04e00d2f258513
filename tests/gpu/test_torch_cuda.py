"""ringmpi.torch on CUDA tensors (cupy arrays on the tensors' memory), under mpirun on a
machine with an NVIDIA GPU and torch (`benchmarks/gpu_check.sh`); skips without them.
Reference: torch's own arithmetic on every rank's input gathered on the host by mpi4py."""
from __future__ import annotations

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)
import ringmpi.torch as rt  # noqa: E402

COMM = MPI.COMM_WORLD
P, R = COMM.size, COMM.rank


def gathered(t):
    """Every rank's `t` on the host (16-bit floats as float64, which holds them exactly)."""
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.to(torch.float64)
    return [torch.from_numpy(a) for a in COMM.allgather(t.cpu().numpy())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("algorithm", ["auto", "ring"])
def test_allreduce_on_cuda_tensors(dtype, algorithm):
    g = torch.Generator().manual_seed(R)
    host = (torch.randn(4099, generator=g) * 10).to(dtype)
    t = host.cuda()
    want = torch.stack([x.to(torch.float64) for x in gathered(host)]).sum(0)
    got = rt.allreduce(t, algorithm=algorithm)
    assert got.device.type == "cuda" and got.dtype == dtype
    assert torch.equal(t.cpu(), host), "send tensor written"
    tol = {torch.float16: 1e-2, torch.bfloat16: 4e-2}.get(dtype, 1e-5)
    assert torch.allclose(got.cpu().to(torch.float64), want, rtol=tol, atol=tol * P * 10)
    assert rt.allreduce(t, t, algorithm=algorithm) is t
    assert torch.equal(t.cpu(), got.cpu()) or dtype.is_floating_point


@pytest.mark.parametrize("name", ["allgather", "broadcast", "reduce_scatter", "alltoall"])
def test_other_collectives_on_cuda_tensors(name):
    host = torch.arange(8 * P, dtype=torch.int64) + 1000 * R
    t = host.cuda()
    everyone = gathered(host)
    got = {"allgather": lambda: rt.allgather(t),
           "broadcast": lambda: rt.broadcast(t.clone(), root=P - 1),
           "reduce_scatter": lambda: rt.reduce_scatter(t),
           "alltoall": lambda: rt.alltoall(t)}[name]().cpu().reshape(-1)
    want = {"allgather": lambda: torch.cat(everyone),
            "broadcast": lambda: everyone[P - 1],
            "reduce_scatter": lambda: torch.stack(everyone).sum(0).chunk(P)[R],
            "alltoall": lambda: torch.cat([e.chunk(P)[R] for e in everyone])}[name]()
    assert torch.equal(got, want), name


def test_requests_on_cuda_tensors_complete_in_any_order():
    ts = [torch.full((1000,), float(R + k), device="cuda") for k in range(3)]
    reqs = [rt.iallreduce(t, t) for t in ts]
    for k, req in reversed(list(enumerate(reqs))):
        req.wait()
        assert torch.equal(ts[k].cpu(), torch.full((1000,), float(sum(range(P)) + k * P)))
