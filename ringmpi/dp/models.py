"""Two small models with explicit forward and backward passes (numpy, float32 or float64;
on a GPU with cupy: `device="cuda"`, the same code on the parameters' array module).

Both return the *sum* of the per-sample (or per-token) losses and its gradients, plus the
number of samples (tokens) summed: the data-parallel wrapper divides by the global count,
which is what makes uneven shards weigh every sample equally.
"""
from __future__ import annotations

import numpy as np

from .arrays import device_module, module_of

__all__ = ["MLP", "CharRNN", "softmax_xent"]


def softmax_xent(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Summed cross-entropy and its gradient with respect to the logits."""
    xp = module_of(logits)
    z = logits - logits.max(axis=1, keepdims=True)
    e = xp.exp(z)
    total = e.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    rows = xp.arange(n)
    loss = float(xp.sum(xp.log(total[:, 0]) - z[rows, labels]))  # log-sum-exp: no log(0)
    g = e / total
    g[rows, labels] -= 1
    return loss, g


class MLP:
    """tanh MLP classifier: sizes = [inputs, hidden..., classes]."""

    def __init__(self, sizes: list[int], seed: int = 0, dtype=np.float64, device: str = "cpu") -> None:
        rng = np.random.default_rng(seed)   # on the host: the same initial values on every device
        xp = device_module(device)
        self.sizes = list(sizes)
        self.dtype = np.dtype(dtype)
        self.params: dict[str, np.ndarray] = {}
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            self.params[f"W{i}"] = xp.asarray((rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype))
            self.params[f"b{i}"] = xp.zeros(b, dtype)

    def loss_and_grads(self, batch, on_grad=None, cuts=None) -> tuple[float, dict[str, np.ndarray], int]:
        """The summed loss, every gradient and the sample count; `on_grad(name, grad, row)`
        is called as each gradient is final, last layer first, a layer's bias before its
        weights (the order autograd's hooks fire in, and the order of `DataParallel`'s
        buckets), so a data-parallel wrapper can start all-reducing it while backward goes
        on. `cuts[name]`: rows where a weight's gradient is cut into pieces, computed and
        reported one at a time (`row`: the piece's first row), so the first piece travels
        while the next is computed."""
        xp = module_of(self.params["W0"])
        x, y = batch
        x, y = xp.asarray(x).astype(self.dtype, copy=False), xp.asarray(y)
        layers = len(self.sizes) - 1
        acts = [x]
        for i in range(layers):
            z = acts[-1] @ self.params[f"W{i}"] + self.params[f"b{i}"]
            acts.append(xp.tanh(z) if i < layers - 1 else z)
        loss, g = softmax_xent(acts[-1], y)
        grads: dict[str, np.ndarray] = {}
        for i in reversed(range(layers)):
            w, b = f"W{i}", f"b{i}"
            grads[b] = g.sum(axis=0)
            if on_grad is not None:
                on_grad(b, grads[b], 0)
            gw = grads[w] = xp.empty_like(self.params[w])
            rows = [0, *(cuts or {}).get(w, ()), len(gw)]
            for start, stop in zip(rows, rows[1:]):   # dW[rows] = (a^T g)[rows] = a[:, rows]^T g
                xp.matmul(acts[i][:, start:stop].T, g, out=gw[start:stop])
                if on_grad is not None:
                    on_grad(w, gw[start:stop], start)
            if i:
                g = (g @ self.params[w].T) * (1 - acts[i] ** 2)
        return loss, {k: grads[k] for k in self.params}, len(y)


class CharRNN:
    """Character-level next-token model: h_t = tanh(W_xh[x_t] + h_{t-1} W_hh + b_h),
    logits_t = h_t W_hy + b_y. Sequences in a batch have different lengths, so ranks hold
    different token counts."""

    def __init__(self, vocab: int, hidden: int = 32, seed: int = 0, dtype=np.float64, device: str = "cpu") -> None:
        rng = np.random.default_rng(seed)
        xp = device_module(device)
        self.vocab, self.hidden, self.dtype = vocab, hidden, np.dtype(dtype)
        s = 1 / np.sqrt(hidden)
        self.params = {k: xp.asarray(v) for k, v in {
            "Wxh": (rng.standard_normal((vocab, hidden)) * 0.3).astype(dtype),
            "Whh": (rng.standard_normal((hidden, hidden)) * s * 0.5).astype(dtype),
            "bh": np.zeros(hidden, dtype),
            "Why": (rng.standard_normal((hidden, vocab)) * s).astype(dtype),
            "by": np.zeros(vocab, dtype),
        }.items()}

    def loss_and_grads(self, batch) -> tuple[float, dict[str, np.ndarray], int]:
        p = self.params
        xp = module_of(p["Wxh"])
        grads = {k: xp.zeros_like(v) for k, v in p.items()}
        total, tokens = 0.0, 0
        for seq in batch:
            seq = np.asarray(seq)
            x, y = seq[:-1], seq[1:]
            n = len(x)
            if n == 0:
                continue
            hs = xp.zeros((n + 1, self.hidden), self.dtype)
            for t in range(n):
                hs[t + 1] = xp.tanh(p["Wxh"][x[t]] + hs[t] @ p["Whh"] + p["bh"])
            logits = hs[1:] @ p["Why"] + p["by"]
            loss, g = softmax_xent(logits, xp.asarray(y))
            total += loss
            tokens += n
            grads["Why"] += hs[1:].T @ g
            grads["by"] += g.sum(axis=0)
            dh_next = xp.zeros(self.hidden, self.dtype)
            dhs = g @ p["Why"].T
            for t in reversed(range(n)):
                dz = (dhs[t] + dh_next) * (1 - hs[t + 1] ** 2)
                grads["Wxh"][x[t]] += dz
                grads["Whh"] += xp.outer(hs[t], dz)
                grads["bh"] += dz
                dh_next = dz @ p["Whh"].T
        return total, grads, tokens
