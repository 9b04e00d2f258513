"""SGD with momentum and Adam over a dict of parameters, with state for checkpoints."""
from __future__ import annotations

import numpy as np

from .arrays import module_of

__all__ = ["SGD", "Adam"]


class _Stepwise:
    """`step` is `begin` (what a step does once) then `update` of every parameter; a caller
    that has the gradients a few at a time (`DataParallel.step`, as buckets arrive) calls
    `begin` once and `update` with each few: the same bits as one `step`."""

    def step(self, params: dict, grads: dict) -> None:
        self.begin()
        self.update(params, grads)

    def begin(self) -> None:
        pass

    def update(self, params: dict, grads: dict) -> None:
        raise NotImplementedError


class SGD(_Stepwise):
    def __init__(self, lr: float = 0.1, momentum: float = 0.0) -> None:
        self.lr, self.momentum = lr, momentum
        self.state: dict[str, np.ndarray] = {}

    def update(self, params: dict, grads: dict) -> None:
        for k, g in grads.items():
            if self.momentum:
                v = self.state.setdefault(k, module_of(g).zeros_like(g))
                v *= self.momentum
                v += g
                g = v
            params[k] -= self.lr * g

    def load_state(self, state: dict) -> None:
        self.state = {k: v.copy() for k, v in state.items()}


class Adam(_Stepwise):
    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], eps
        self.state: dict[str, np.ndarray] = {}
        self.t = 0

    def begin(self) -> None:
        """The step count, once a step (`update` takes its bias corrections from it)."""
        self.t += 1
        self.state["t"] = np.array(self.t)

    def update(self, params: dict, grads: dict) -> None:
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for k, g in grads.items():
            xp = module_of(g)
            m = self.state.setdefault("m:" + k, xp.zeros_like(g))
            v = self.state.setdefault("v:" + k, xp.zeros_like(g))
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            params[k] -= self.lr * (m / c1) / (xp.sqrt(v / c2) + self.eps)

    def load_state(self, state: dict) -> None:
        self.state = {k: v.copy() for k, v in state.items()}
        self.t = int(self.state.get("t", 0))
