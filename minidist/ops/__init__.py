"""Differentiable operations, one ``Function`` subclass each, grouped by kind.

arithmetic: add sub mul div neg pow matmul · linear: linear (y = x W^T + b) · elementwise: exp log
tanh sigmoid relu gelu · reduction: sum mean max · shape: reshape transpose permute getitem ·
softmax: softmax log_softmax cross_entropy · dropout: dropout · embedding: embedding ·
layer_norm: layer_norm · attention: scaled_dot_product_attention
"""

from minidist.ops import inplace
from minidist.ops.arithmetic import add, div, matmul, mul, neg, pow, sub, unbroadcast
from minidist.ops.attention import scaled_dot_product_attention
from minidist.ops.dropout import dropout
from minidist.ops.dtypes import result_type, to
from minidist.ops.elementwise import exp, gelu, log, relu, sigmoid, tanh
from minidist.ops.embedding import embedding
from minidist.ops.layer_norm import layer_norm
from minidist.ops.linear import linear
from minidist.ops.reduction import max, mean, sum
from minidist.ops.shape import getitem, permute, reshape, transpose
from minidist.ops.softmax import cross_entropy, log_softmax, softmax

__all__ = [
    "add", "sub", "mul", "div", "neg", "pow", "matmul", "linear",
    "exp", "log", "tanh", "sigmoid", "relu", "gelu",
    "sum", "mean", "max", "reshape", "transpose", "permute", "getitem",
    "softmax", "log_softmax", "cross_entropy", "dropout", "embedding", "layer_norm",
    "scaled_dot_product_attention",
    "to", "inplace", "result_type", "unbroadcast",
]  # fmt: skip
