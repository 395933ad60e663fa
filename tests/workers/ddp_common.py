"""The problems that DDP tests train: shared by the MPI workers and the single-process reference."""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist import nn, optim


def make_data(seed: int, n_samples: int, n_in: int = 6, n_classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 1000)
    return rng.standard_normal((n_samples, n_in)), rng.integers(0, n_classes, n_samples)


def make_model(seed: int, dtype, n_in: int = 6, n_classes: int = 4) -> nn.Sequential:
    md.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(n_in, 16, dtype=dtype), nn.Tanh(), nn.Linear(16, 8, dtype=dtype), nn.GELU(),
        nn.Linear(8, n_classes, dtype=dtype),
    )  # fmt: skip


class TwoHeads(nn.Module):
    """trunk -> head, plus a head ``extra`` that only some ranks use in a step (an unused parameter)."""

    def __init__(self, seed: int, dtype, n_in: int = 6, n_classes: int = 4) -> None:
        super().__init__()
        md.manual_seed(seed)
        self.trunk = nn.Linear(n_in, 8, dtype=dtype)
        self.head = nn.Linear(8, n_classes, dtype=dtype)
        self.extra = nn.Linear(8, n_classes, dtype=dtype)

    def forward(self, x, use_extra: bool = True):
        h = self.trunk(x).tanh()
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


def uses_extra(rank: int, step: int) -> bool:
    """Whether rank's loss uses TwoHeads.extra in step: ranks 0, 2, ... on even steps, 1, 3, ... on odd."""
    return (rank + step) % 2 == 0


def make_optimizer(name: str, params):
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return optim.AdamW(params, lr=0.01)


def global_batch(x: np.ndarray, y: np.ndarray, step: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The step-th global batch (wrapping around the data)."""
    idx = (np.arange(batch) + step * batch) % len(x)
    return x[idx], y[idx]


def share(n: int, parts: int, index: int) -> np.ndarray:
    """Indices of part ``index`` of ``range(n)`` split into ``parts`` in numpy.array_split order."""
    return np.array_split(np.arange(n), parts)[index]
