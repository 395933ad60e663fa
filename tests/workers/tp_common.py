"""Shared by the tensor-parallel MPI workers and the single-process references in the tests.

A layer check runs one config (a dict drawn by hypothesis in the test) through a layer and returns
its output, input gradient and parameters with their gradients; the worker runs it with the
tensor-parallel layer on every rank of a tp group, the test with the dense layer in one process.
"""

from __future__ import annotations

import numpy as np

import minidist as md
from minidist import nn

F64 = np.float64


def layer_inputs(cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """The full input x (*batch, in) and upstream gradient w (*batch, out) of a layer config."""
    rng = np.random.default_rng(cfg["seed"] + 1)
    batch = tuple(cfg["batch"])
    return rng.standard_normal((*batch, cfg["in"])), rng.standard_normal((*batch, cfg["out"]))


def dense_layer(cfg: dict) -> nn.Module:
    """The single-device layer a config describes, initialised from the config's seed."""
    md.manual_seed(cfg["seed"])
    if cfg["kind"] == "mlp":
        return nn.Sequential(
            nn.Linear(cfg["in"], cfg["hidden"], cfg["bias"], dtype=F64), nn.ReLU(),
            nn.Linear(cfg["hidden"], cfg["out"], cfg["bias"], dtype=F64),
        )  # fmt: skip
    return nn.Linear(cfg["in"], cfg["out"], cfg["bias"], dtype=F64)


def run_layer(layer: nn.Module, x: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
    """y = layer(x); backward of sum(y * w). Returns y, x.grad, each parameter and its gradient."""
    xt = md.tensor(x, dtype=F64, requires_grad=True)
    y = layer(xt)
    (y * md.tensor(w, dtype=F64)).sum().backward()
    out = {"y": y.numpy(), "x.grad": xt.grad.copy()}
    for i, p in enumerate(layer.parameters()):
        out[f"p{i}"], out[f"p{i}.grad"] = p.numpy(), p.grad.copy()
    return out


# --- the MLP training problem ------------------------------------------------------------------------
N_IN, N_CLASSES, HIDDEN = 6, 4, [8, 6, 8, 6]  # column, row, column, row, replicated Linear


def make_data(seed: int, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 1000)
    return rng.standard_normal((n, N_IN)), rng.integers(0, N_CLASSES, n)


def global_batch(x, y, step: int, batch: int):
    idx = (np.arange(batch) + step * batch) % len(x)
    return x[idx], y[idx]


def dropout_mask(generator: np.random.Generator, shape: tuple[int, ...], p: float) -> np.ndarray:
    """The scaled mask minidist's dropout draws from ``generator``: (u >= p) / (1 - p)."""
    return (generator.random(shape) >= p) / (1.0 - p)
