"""Stateless neural-network functions (PyTorch's ``torch.nn.functional``), built from minidist ops."""

from __future__ import annotations

from minidist import ops
from minidist.autograd import Tensor
from minidist.ops import cross_entropy, dropout, gelu, log_softmax, relu, sigmoid, softmax, tanh

__all__ = ["linear", "relu", "gelu", "tanh", "sigmoid", "softmax", "log_softmax", "cross_entropy", "dropout"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight^T + bias for x (..., in), weight (out, in), bias (out,); returns (..., out)."""
    y = ops.matmul(x, ops.transpose(weight))
    return y if bias is None else y + bias
