"""Reductions over axes: sum, mean, max (NumPy's ``axis`` / ``keepdims``, or torch's ``dim`` / ``keepdim``).

Backward spreads the output gradient back over the reduced axes: :func:`_expand` re-inserts the
axes that ``keepdims=False`` removed, and broadcasting copies the gradient along them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from minidist.autograd import autocast
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module as _xp
from minidist.ops.dtypes import autocast_float32


def _normalize_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, int or tuple, negatives allowed) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < (ndim or 1):  # a 0-d tensor accepts axis 0 or -1
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis} repeats an axis")
    return tuple(sorted(out))


def _expand(grad: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    """Give ``grad`` back the reduced axes (length 1) so that it broadcasts against the input."""
    if keepdims:
        return grad
    for a in axes:
        grad = grad.reshape(grad.shape[:a] + (1,) + grad.shape[a:])
    return grad


class Sum(Function):
    """y = sum_i x_i over ``axis``;  dy/dx_i = 1."""

    saved_inputs = ()

    def forward(self, x, axis=None, keepdims=False):
        self.shape, self.keepdims = x.shape, keepdims
        self.axes = _normalize_axes(axis, x.ndim)
        return x.sum(axis=self.axes, keepdims=keepdims)

    def backward(self, grad):
        # BEGIN SOLUTION A1.3: spread the gradient of a sum over the reduced axes
        xp = _xp(grad)
        return (xp.broadcast_to(_expand(grad, self.axes, self.keepdims), self.shape).copy(),)
        # END SOLUTION


class Mean(Function):
    """y = (1/n) sum_i x_i over ``axis`` (n = number of elements reduced);  dy/dx_i = 1/n."""

    saved_inputs = ()

    def forward(self, x, axis=None, keepdims=False):
        self.shape, self.keepdims = x.shape, keepdims
        self.axes = _normalize_axes(axis, x.ndim)
        self.count = 1
        for a in self.axes:
            self.count *= x.shape[a]
        return x.mean(axis=self.axes, keepdims=keepdims)

    def backward(self, grad):
        # BEGIN SOLUTION A1.3: spread the gradient of a mean over the reduced axes
        xp = _xp(grad)
        return (xp.broadcast_to(_expand(grad, self.axes, self.keepdims) / self.count, self.shape).copy(),)
        # END SOLUTION


class Max(Function):
    """y = max_i x_i over ``axis``;  dy/dx_i = 1/k where x_i is one of the k tied maxima, else 0.

    Splitting the gradient evenly between ties (as PyTorch's ``amax`` does) keeps the sum of the
    gradient equal to the output gradient.
    """

    saved_inputs = ()  # the tie weights are a new array

    def forward(self, x, axis=None, keepdims=False):
        self.keepdims = keepdims
        self.axes = _normalize_axes(axis, x.ndim)
        if x.size == 0:
            raise ValueError(f"max of an empty tensor of shape {tuple(x.shape)} is undefined")
        y = x.max(axis=self.axes, keepdims=True)
        is_max = x == y
        self.weights = (is_max / is_max.sum(axis=self.axes, keepdims=True)).astype(x.dtype)
        return y if keepdims else y.reshape([n for i, n in enumerate(y.shape) if i not in self.axes])

    def backward(self, grad):
        return (_expand(grad, self.axes, self.keepdims) * self.weights,)


def _axis_of(name: str, axis: Any, keepdims: bool, dim: Any, keepdim: bool | None) -> tuple[Any, bool]:
    """Merge NumPy's (``axis``, ``keepdims``) and torch's (``dim``, ``keepdim``) spellings; not both."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"{name}() got both axis={axis!r} and dim={dim!r}; they mean the same, give one")
        axis = tuple(dim) if isinstance(dim, list) else dim
    if keepdim is not None:
        keepdims = keepdims or keepdim
    return axis, bool(keepdims)


def sum(x, axis=None, keepdims: bool = False, *, dim=None, keepdim: bool | None = None):  # noqa: A001
    """Sum over ``axis`` (None: all; int or tuple), as ``x.sum(axis)`` / torch's ``x.sum(dim=...)``."""
    axis, keepdims = _axis_of("sum", axis, keepdims, dim, keepdim)
    if autocast.low_dtype is not None:  # on autocast's float32 list (minidist/autograd/autocast.py)
        x = autocast_float32(x)
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims: bool = False, *, dim=None, keepdim: bool | None = None):
    """Mean over ``axis`` (None: all; int or tuple), as ``x.mean(axis)`` / torch's ``x.mean(dim=...)``."""
    axis, keepdims = _axis_of("mean", axis, keepdims, dim, keepdim)
    if autocast.low_dtype is not None:  # on autocast's float32 list
        x = autocast_float32(x)
    return Mean.apply(x, axis=axis, keepdims=keepdims)


class MaxResult(NamedTuple):
    """What torch's ``x.max(dim=d)`` returns: the maxima and where they are (int64 indices)."""

    values: Tensor
    indices: Tensor


def max(x, axis=None, keepdims: bool = False, *, dim=None, keepdim: bool | None = None):  # noqa: A001
    """The maximum over ``axis`` (NumPy's ``amax``): a tensor; the gradient is split between ties.

    With torch's ``dim=d`` (one int) it returns ``MaxResult(values, indices)`` as ``torch.max(x, dim)``
    does, and the gradient goes to the first maximum only (the one ``indices`` names), as in torch.
    """
    if dim is None:
        axis, keepdims = _axis_of("max", axis, keepdims, None, keepdim)
        return Max.apply(x, axis=axis, keepdims=keepdims)
    if axis is not None or not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"max(dim=...) takes one int dimension and no axis=, got dim={dim!r}, axis={axis!r}")
    if x.size == 0:
        raise ValueError(f"max of an empty tensor of shape {x.shape} is undefined")
    d = _normalize_axes(dim, x.ndim)[0] if x.ndim else 0
    xp = _xp(x.data)
    index = xp.argmax(x.data, axis=d) if x.ndim else xp.zeros((), dtype=np.int64)
    if x.ndim:  # pick x[i, ..., index[i, ...], ...] with the other axes broadcast around the index
        grid = list(xp.indices(index.shape, sparse=True))
        values = x[tuple(grid[:d] + [index] + grid[d:])]
    else:
        values = x.reshape(())
    keep = keepdims or bool(keepdim)
    if keep and x.ndim:
        kept = x.shape[:d] + (1,) + x.shape[d + 1 :]
        values, index = values.reshape(kept), index.reshape(kept)
    return MaxResult(values, Tensor(index.astype(np.int64)))
