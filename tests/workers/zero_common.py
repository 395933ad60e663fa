"""The problem the ZeRO tests train: shared by the MPI workers and the single-process reference.

Besides a small MLP the optimizer gets two extra parameters, placed last in the flat vector (so the
last rank owns them):

* ``penalised`` (5 elements) enters the loss through ``PENALTY * sum(penalised**2)``, which the MPI
  workers add on rank 0 only (scaled by N): the other ranks have no gradient for it, the case where
  ZeRO must count a missing local gradient as zero;
* ``unused`` (3 elements) never gets a gradient: like a plain optimizer, ZeRO must leave it alone
  (no weight decay, no momentum).
"""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist import nn, optim

# (optimizer_class, kwargs) by name: SGD with momentum and weight decay (K = 1 buffer per element),
# AdamW (K = 2 buffers per element).
OPTIMIZERS = {
    "sgd": (optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-3)),
    "adamw": (optim.AdamW, dict(lr=0.01, weight_decay=1e-2)),
}
STATE_BUFFERS = {"sgd": 1, "adamw": 2}  # optimizer-state arrays per parameter element
CONFIGS = [(1, "sgd"), (1, "adamw"), (2, "sgd"), (2, "adamw")]  # (stage, optimizer)
PENALTY = 0.05


def make_data(seed: int, n_samples: int = 64, n_in: int = 6, n_classes: int = 4):
    rng = np.random.default_rng(seed + 1000)
    return rng.standard_normal((n_samples, n_in)), rng.integers(0, n_classes, n_samples)


def make_model(seed: int, dtype) -> tuple[nn.Sequential, dict[str, nn.Parameter]]:
    """The MLP (284 elements) and the two extra parameters; P = 292 elements in all."""
    md.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(6, 16, dtype=dtype), nn.Tanh(), nn.Linear(16, 8, dtype=dtype), nn.GELU(),
        nn.Linear(8, 4, dtype=dtype),
    )  # fmt: skip
    rng = np.random.default_rng(seed + 2000)
    extra = {
        "penalised": nn.Parameter(rng.standard_normal(5).astype(dtype)),
        "unused": nn.Parameter(rng.standard_normal(3).astype(dtype)),
    }
    return model, extra


def all_params(model: nn.Sequential, extra: dict[str, nn.Parameter]) -> list[nn.Parameter]:
    return [*model.parameters(), extra["penalised"], extra["unused"]]


def snapshot(model: nn.Sequential, extra: dict[str, nn.Parameter]) -> dict[str, np.ndarray]:
    """Every parameter by name, as host copies."""
    out = {k: np.array(v) for k, v in model.state_dict().items()}
    out.update({k: p.numpy() for k, p in extra.items()})
    return out


def penalty(extra: dict[str, nn.Parameter]):
    p = extra["penalised"]
    return (p * p).sum() * PENALTY


def global_batch(x: np.ndarray, y: np.ndarray, step: int, batch: int):
    """The step-th global batch (wrapping around the data)."""
    idx = (np.arange(batch) + step * batch) % len(x)
    return x[idx], y[idx]
