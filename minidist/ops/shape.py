"""Ops that move elements without changing them: reshape, transpose, indexing.

Their backward moves the gradient back: reshape back, transpose by the inverse permutation,
and scatter-add into a zero array for indexing (adding, so an index repeated k times gets k
gradients).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import Function, Tensor
from minidist.backend import array_module, is_gpu_array


def _shape_args(shape: tuple) -> tuple:
    """Accept both ``reshape(2, 3)`` and ``reshape((2, 3))``, as PyTorch and NumPy do."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


class Reshape(Function):
    """y = x viewed with a new shape of the same size;  dL/dx = reshape(dL/dy, x.shape)."""

    def forward(self, x, shape=()):
        self.shape = x.shape
        try:
            return x.reshape(shape)
        except ValueError:
            raise ValueError(
                f"cannot reshape a tensor of shape {tuple(x.shape)} ({x.size} elements) into {shape}"
            ) from None

    def backward(self, grad):
        return (grad.reshape(self.shape),)


class Transpose(Function):
    """y = x with axes permuted by ``axes`` (default: reversed);  dL/dx = dL/dy permuted back."""

    def forward(self, x, axes=None):
        self.axes = tuple(reversed(range(x.ndim))) if axes is None else axes
        if sorted(a % max(x.ndim, 1) for a in self.axes) != list(range(x.ndim)):
            raise ValueError(f"transpose: axes {axes} are not a permutation of the {x.ndim} axes")
        return x.transpose(self.axes)

    def backward(self, grad):
        return (grad.transpose(np.argsort([a % grad.ndim for a in self.axes])),)


class GetItem(Function):
    """y = x[index] (basic slicing or integer-array indexing);  dL/dx = scatter-add of dL/dy."""

    def forward(self, x, index=None):
        self.shape, self.dtype, self.index = x.shape, x.dtype, index
        return x[index]

    def backward(self, grad):
        xp = array_module(grad)
        out = xp.zeros(self.shape, dtype=grad.dtype)
        if is_gpu_array(grad):
            import cupyx  # noqa: PLC0415  (only on the GPU backend)

            cupyx.scatter_add(out, self.index, grad)
        else:
            np.add.at(out, self.index, grad)  # unlike out[index] += grad, adds repeated indices twice
        return (out,)


def _unwrap_index(index: Any) -> Any:
    """Replace tensors inside an index by their arrays."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(_unwrap_index(i) for i in index)
    return index


def reshape(x, *shape):
    return Reshape.apply(x, shape=_shape_args(shape))


def transpose(x, *axes):
    axes = _shape_args(axes)
    return Transpose.apply(x, axes=axes or None)


def getitem(x, index):
    return GetItem.apply(x, index=_unwrap_index(index))
