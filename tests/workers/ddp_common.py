"""The problem that DDP equivalence tests train: shared by the MPI worker and the single-process reference."""

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


def make_optimizer(name: str, params):
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return optim.AdamW(params, lr=0.01)


def global_batch(x: np.ndarray, y: np.ndarray, step: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The step-th global batch (wrapping around the data)."""
    idx = (np.arange(batch) + step * batch) % len(x)
    return x[idx], y[idx]
