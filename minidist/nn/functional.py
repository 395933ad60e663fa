"""Stateless neural-network functions (PyTorch's ``torch.nn.functional``), built from minidist ops."""

from __future__ import annotations

from minidist.ops import (
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    relu,
    sigmoid,
    softmax,
    tanh,
)

__all__ = [
    "linear", "relu", "gelu", "tanh", "sigmoid", "softmax", "log_softmax", "cross_entropy", "dropout",
    "embedding", "layer_norm",
]  # fmt: skip
