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


@pytest.mark.parametrize("how", ["backend", "hook"])
def test_ddp_on_cuda_matches_single_process_training(how):
    """DDP on CUDA parameters over the ringmpi backend (no hook), or over it with ringmpi's
    hook: replicas bitwise identical, within 1e-10 of one process on the whole batch
    (float64), and trained."""
    import copy

    import torch.distributed as dist

    from ringmpi.torch.distributed import init_process_group
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(12, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3)).double().cuda()
    g = torch.Generator().manual_seed(7)
    data = [(torch.randn(8 * P, 12, generator=g).double().cuda(), torch.randint(0, 3, (8 * P,), generator=g).cuda())
            for _ in range(8)]

    def train(model, shard):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x[shard]), y[shard]).backward()
            opt.step()
        return model

    single = train(copy.deepcopy(start), slice(None))
    init_process_group("ringmpi")
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(start), bucket_cap_mb=0.001)
        if how == "hook":
            ddp.register_comm_hook(rt.HookState(), rt.allreduce_hook)
        model = train(ddp, slice(R, None, P)).module
        dist.barrier()
    finally:
        rt.destroy_process_group()
    params = [p.detach().cpu() for p in model.parameters()]
    assert len(set(COMM.allgather(b"".join(p.numpy().tobytes() for p in params)))) == 1, "replicas differ"
    diff = max(float((p - q.detach().cpu()).abs().max()) for p, q in zip(params, single.parameters()))
    assert diff <= 1e-10, diff
    assert max(float((p - q.detach().cpu()).abs().max()) for p, q in zip(params, start.parameters())) > 1e-3
