"""Ops that move elements without changing them: reshape, permute / transpose, indexing.

Their backward moves the gradient back: reshape back, permute by the inverse permutation,
and scatter-add into a zero array for indexing (adding, so an index repeated k times gets k
gradients).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module, is_gpu_array


def _shape_args(shape: tuple) -> tuple:
    """Accept both ``reshape(2, 3)`` and ``reshape((2, 3))``, as PyTorch and NumPy do."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


class Reshape(Function):
    """y = x viewed with a new shape of the same size;  dL/dx = reshape(dL/dy, x.shape)."""

    is_view = True
    saved_inputs = ()  # only the shape is kept

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


class Permute(Function):
    """y = x with its axes reordered: axis i of y is axis ``dims[i]`` of x;  dL/dx = dL/dy permuted back.

    ``permute`` and ``transpose`` (a permutation that swaps two axes) both build this op.
    """

    is_view = True
    saved_inputs = ()  # only the permutation is kept

    def forward(self, x, dims=()):
        self.dims = dims
        return x.transpose(dims)

    def backward(self, grad):
        return (grad.transpose(np.argsort(self.dims)),)


def _dim(d: Any, ndim: int, name: str) -> int:
    """Dimension ``d`` (negatives count from the end) as a non-negative int; IndexError as torch."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
        raise TypeError(f"{name}: dimensions must be ints, got {d!r}")
    n = max(ndim, 1)  # a 0-d tensor accepts dimension 0 or -1, as in torch
    if not -n <= d < n:
        raise IndexError(f"{name}: dimension out of range (expected to be in [{-n}, {n - 1}], but got {d})")
    return int(d) % n


class GetItem(Function):
    """y = x[index] (basic slicing or integer-array indexing);  dL/dx = scatter-add of dL/dy."""

    is_view = True
    saved_inputs = ()  # only the shape and the index are kept

    def forward(self, x, index=None):
        self.shape, self.dtype, self.index = x.shape, x.dtype, index
        return x[index]

    def backward(self, grad):
        xp = array_module(grad)
        out = xp.zeros(self.shape, dtype=grad.dtype)
        if _is_basic(self.index):
            # Slices and integers pick each element at most once: a plain copy. (np.add.at, needed for
            # repeated array indices, was 6x slower than torch on a GPT's q, k, v = qkv[..., a:b].)
            out[self.index] = grad
        elif is_gpu_array(grad):
            import cupyx  # noqa: PLC0415  (only on the GPU backend)

            cupyx.scatter_add(out, self.index, grad)
        else:
            np.add.at(out, self.index, grad)  # unlike out[index] += grad, adds repeated indices twice
        return (out,)


def _is_basic(index: Any) -> bool:
    """True for NumPy's basic indexing (ints, slices, None, ...): no element is picked twice."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (slice, int, np.integer)) for p in parts)


def _unwrap_index(index: Any) -> Any:
    """Replace tensors inside an index by their arrays."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(_unwrap_index(i) for i in index)
    return index


def reshape(x, *shape):
    return Reshape.apply(x, shape=_shape_args(shape))


def permute(x, *dims):
    """x with its axes reordered as torch's ``permute``: ``permute(2, 0, 1)`` makes axis 2 the first.

    ``dims`` (ints or one tuple) must name every axis of x once; raises ``ValueError`` otherwise,
    ``IndexError`` for a dimension out of range.
    """
    dims = _shape_args(dims)
    ndim = x.ndim
    if len(dims) != ndim:
        raise ValueError(f"permute: the tensor has {ndim} dimensions but {len(dims)} were given ({dims})")
    normalized = tuple(_dim(d, ndim, "permute") for d in dims)
    if sorted(normalized) != list(range(ndim)):
        raise ValueError(f"permute: dims {dims} repeat a dimension; give each of the {ndim} axes once")
    return Permute.apply(x, dims=normalized)


def transpose(x, dim0=None, dim1=None):
    """x with axes ``dim0`` and ``dim1`` swapped, as torch's ``transpose``; no dims: ``.T`` (all reversed).

    Unlike NumPy's ``transpose(*axes)``, the two arguments are the axes to swap, not a permutation:
    ``transpose(0, 1)`` of a 2-D tensor is its transpose. Use :func:`permute` for a permutation.
    Raises ``IndexError`` for a dimension out of range.
    """
    ndim = x.ndim
    if dim0 is None and dim1 is None:
        return Permute.apply(x, dims=tuple(reversed(range(ndim))))
    if dim0 is None or dim1 is None:
        raise TypeError("transpose(dim0, dim1) needs two dimensions to swap; use permute(*dims)")
    dims = list(range(ndim))
    d0, d1 = _dim(dim0, ndim, "transpose"), _dim(dim1, ndim, "transpose")
    if ndim:
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return Permute.apply(x, dims=tuple(dims))


def getitem(x, index):
    return GetItem.apply(x, index=_unwrap_index(index))
