"""The alpha-beta-gamma cost record, the machine profile, and the lecture's closed forms.

A message of n bytes costs alpha + n beta; reducing n bytes costs n gamma. Each algorithm
module registers its own formula (a `Cost`: critical-path counts of messages, bytes moved
and bytes reduced, plus traffic per rank) next to its schedule, so the model, the code and
the simulator's counts can be checked against each other. This module is a leaf; the
queries over registered algorithms (predict, crossover, data-parallel speedup) live in
`ringmpi.model`.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Cost", "FREE", "Profile", "LECTURE", "pipeline_time", "best_segments", "train_flops",
           "training_state_bytes", "gpu_hours", "mfu", "model_parallel_share", "parameter_server_time"]


@dataclass(frozen=True)
class Cost:
    """Critical-path counts: time = alphas*alpha + beta_bytes*beta + gamma_bytes*gamma,
    plus, for algorithms that use the links inside a node (shared memory, the node phases
    of the hierarchical all-reduce), local_alphas*alpha_local + local_beta_bytes*beta_local."""
    alphas: float
    beta_bytes: float
    gamma_bytes: float
    rounds: int
    busiest_sent: float   # bytes sent by the busiest rank
    avg_sent: float       # bytes sent by the average rank
    local_alphas: float = 0.0
    local_beta_bytes: float = 0.0

    def time(self, prof: "Profile") -> float:
        return (prof.overhead + self.alphas * prof.alpha + self.beta_bytes * prof.beta
                + self.local_alphas * prof.alpha_l + self.local_beta_bytes * prof.beta_l
                + self.gamma_bytes * prof.gamma)

    def local(self) -> "Cost":
        """The same counts on the links inside a node."""
        return Cost(0, 0, self.gamma_bytes, self.rounds, self.busiest_sent, self.avg_sent,
                    self.local_alphas + self.alphas, self.local_beta_bytes + self.beta_bytes)


#: A collective that does nothing (one rank, or nothing to send).
FREE = Cost(0, 0, 0, 0, 0, 0)


@dataclass
class Profile:
    """Machine parameters: alpha (s/message), beta (s/byte), gamma (s/byte reduced), and a
    fixed per-call overhead of ringmpi's Python layer. `measured` holds a tuning table,
    {collective: {algorithm: [[bytes, seconds], ...]}}, taken at `world_size` ranks;
    `learned` what online tuning settled on, {"collective/dtype/op/bucket": {"winner": name,
    "tuned": {algorithm: seconds}}} (bucket: the bit length of the byte count)."""
    alpha: float
    beta: float
    gamma: float = 0.0
    overhead: float = 0.0
    name: str = "custom"
    world_size: int | None = None
    measured: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    learned: dict = field(default_factory=dict)
    #: the links inside a node (shared memory), when they differ from alpha and beta (the
    #: network between nodes); None: the same
    alpha_local: float | None = None
    beta_local: float | None = None
    #: ranks per node (0: every rank on one node); the hierarchical all-reduce's formula
    per_node: int = 0

    @property
    def bandwidth(self) -> float:
        return 1.0 / self.beta if self.beta else math.inf

    @property
    def alpha_l(self) -> float:
        return self.alpha if self.alpha_local is None else self.alpha_local

    @property
    def beta_l(self) -> float:
        return self.beta if self.beta_local is None else self.beta_local

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        return cls(**json.loads(Path(path).read_text()))


#: The lecture's network: alpha = 5 us, B = 25 GB/s, reduction free.
LECTURE = Profile(alpha=5e-6, beta=1 / 25e9, gamma=0.0, name="lecture (5 us, 25 GB/s)")


def pipeline_time(p: int, nbytes: float, segments: int, alpha: float, beta: float) -> float:
    """(p - 2 + S)(alpha + n/S beta): the segmented chain broadcast."""
    if p <= 1:
        return 0.0
    return (p - 2 + segments) * (alpha + nbytes / segments * beta)


def best_segments(p: int, nbytes: float, alpha: float, beta: float, max_segments: int | None = None):
    """(exact best S by integer search, closed-form S* = sqrt((p-2) n beta / alpha)).

    dT/dS = alpha - (p-2) n beta / S^2 = 0 gives S*; the integer search checks the
    neighbourhood and the bounds (S >= 1, S <= max_segments, e.g. the element count).
    """
    hi = max_segments if max_segments is not None else max(1, int(nbytes))
    star = math.sqrt((p - 2) * nbytes * beta / alpha) if alpha > 0 and p > 2 else (hi if alpha == 0 else 1.0)
    cands = {1, hi, *(min(hi, max(1, int(math.floor(star)) + d)) for d in (-1, 0, 1, 2))}
    best = min(sorted(cands), key=lambda s: pipeline_time(p, nbytes, s, alpha, beta))
    return best, star


def train_flops(params: float, tokens: float) -> float:
    """6ND: forward (2ND) plus backward (4ND)."""
    return 6.0 * params * tokens


def training_state_bytes(params: float, bytes_per_param: float = 16.0) -> float:
    """Mixed-precision Adam: fp16 weights and grads (2+2) + fp32 master, m, v (4+4+4)."""
    return bytes_per_param * params


def gpu_hours(flops: float, flops_per_gpu: float) -> float:
    return flops / flops_per_gpu / 3600.0


def mfu(params: float, tokens: float, hours: float, peak_flops: float) -> float:
    """Model FLOPs utilisation implied by a reported run."""
    return train_flops(params, tokens) / (hours * 3600.0 * peak_flops)


def model_parallel_share(params: float, tensor: int, pipeline: int, bytes_per_param: float = 16.0) -> float:
    """Training-state bytes per GPU when the model is split tensor x pipeline ways."""
    return training_state_bytes(params, bytes_per_param) / (tensor * pipeline)


def parameter_server_time(workers: int, nbytes: float, bandwidth: float, duplex: bool = False) -> float:
    """One step of a parameter server's link: it receives K gradients and sends K copies of
    the parameters, 2KN bytes (KN each way at once when the link is full duplex)."""
    volume = workers * nbytes * (1 if duplex else 2)
    return volume / bandwidth
