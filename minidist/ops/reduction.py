"""Reductions over axes: sum, mean, max (NumPy's ``axis`` / ``keepdims`` arguments).

Backward spreads the output gradient back over the reduced axes: :func:`_expand` re-inserts the
axes that ``keepdims=False`` removed, and broadcasting copies the gradient along them.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import Function
from minidist.backend import array_module as _xp


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


def sum(x, axis=None, keepdims: bool = False):  # noqa: A001  (mirrors Tensor.sum)
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims: bool = False):
    return Mean.apply(x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims: bool = False):  # noqa: A001  (mirrors Tensor.max)
    return Max.apply(x, axis=axis, keepdims=keepdims)
