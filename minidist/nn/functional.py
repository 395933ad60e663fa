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
    scaled_dot_product_attention,
    sigmoid,
    softmax,
    tanh,
)

__all__ = [
    "linear", "relu", "gelu", "tanh", "sigmoid", "softmax", "log_softmax", "cross_entropy", "dropout",
    "embedding", "layer_norm", "scaled_dot_product_attention",
]  # fmt: skip
