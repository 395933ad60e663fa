"""Neural-network building blocks: ``Module``, ``Parameter``, layers and ``functional``."""

from minidist.nn import functional
from minidist.nn.layers import GELU, Dropout, Embedding, LayerNorm, Linear, ReLU, Sequential, Tanh
from minidist.nn.module import Module, Parameter

__all__ = [
    "Module", "Parameter", "Linear", "Embedding", "LayerNorm", "Sequential", "ReLU", "GELU", "Tanh",
    "Dropout", "functional",
]  # fmt: skip
