"""Shared by the vocabulary-parallel MPI workers and the single-process references in the tests.

A config (drawn by hypothesis in ``tests/parallel/tensor_parallel/test_tensor_parallel_vocab.py``) names a
vocabulary size V, an embedding width C, a batch shape, a ``padding_idx``, a loss ``reduction`` and a seed.
From the seed come the same token ids, logits, targets and upstream gradients in every process, so the workers
(vocabulary split over the ranks) and the test (one process) compute the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import minidist as md

F64 = np.float64


def inputs(cfg: dict) -> dict[str, Any]:
    """ids (*batch) in [0, V), the embedding's upstream gradient (*batch, C), logits (*batch, V),
    targets (*batch) and the loss's upstream gradient ((*batch) for "none", else a scalar)."""
    rng = np.random.default_rng(cfg["seed"] + 1)
    batch, vocab = tuple(cfg["batch"]), cfg["vocab"]
    return {
        "ids": rng.integers(0, vocab, batch),
        "w": rng.standard_normal((*batch, cfg["dim"])),
        "logits": 3 * rng.standard_normal((*batch, vocab)),  # spread: softmax far from uniform
        "targets": rng.integers(0, vocab, batch),
        "g": rng.standard_normal(batch) if cfg["reduction"] == "none" else np.float64(rng.uniform(0.5, 2)),
    }


def host(a: Any) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy (or tests/helpers/cupy_stand_in.py) array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def run_embedding(layer: Callable[[Any], md.Tensor], weight: md.Tensor, data: dict) -> dict[str, np.ndarray]:
    """y = layer(ids); backward of sum(y * w). Returns y, the weight (before) and its gradient."""
    before = weight.numpy().copy()
    y = layer(data["ids"])
    (y * md.tensor(data["w"], dtype=F64)).sum().backward()
    return {"y": y.numpy(), "weight": before, "weight.grad": host(weight.grad)}


def run_loss(loss_fn: Callable[[md.Tensor, np.ndarray], md.Tensor], logits: np.ndarray, data: dict):
    """loss = loss_fn(logits, targets); backward of sum(loss * g). Returns the loss and logits.grad."""
    z = md.tensor(logits, dtype=F64, requires_grad=True)
    loss = loss_fn(z, data["targets"])
    (loss * md.tensor(data["g"], dtype=F64)).sum().backward()
    return {"loss": loss.numpy(), "logits.grad": host(z.grad)}
