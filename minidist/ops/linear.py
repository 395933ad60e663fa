"""The affine map of a ``Linear`` layer, y = x W^T + b, as one op.

Written as transpose, matmul and add, a layer is three graph nodes, and the add allocates a second
array of y's size. One op does the same arithmetic with one node, adds the bias into the matmul's
fresh result in place, and skips the gradients nobody asked for (the input batch of the first
layer needs none). Measured on a small MLP: docs/performance.md, "What the cuts took out".

    y = x W^T + b        dL/dx = g W,   dL/dW = g^T x,   dL/db = sum_rows g

where g = dL/dy, and "rows" are all leading axes of x flattened into one (a batch of sequences is
a batch of rows for a Linear layer). The same formulas as ``MatMul`` and ``Add`` give, in one place.

Low precision (float16, bfloat16; ``minidist.autocast``): the inputs stay 2-byte arrays (so are the
saved x and W), the products run on float32 copies and the results are rounded to the low dtype once:
a tensor core's numerics (Micikevicius et al. 2018, §3.3), without NumPy's slow 2-byte arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minidist.autograd import autocast
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.ops.dtypes import autocast_low, autocast_output


class Linear(Function):
    """y = x W^T + b for x (..., in), W (out, in), b (out,) or absent; y is (..., out).

    Inputs must share one dtype (as torch's ``F.linear``: a float64 input to a float32 layer is a bug,
    not a promotion). Raises ``ValueError`` for mismatched shapes, ``RuntimeError`` for mixed dtypes.
    """

    saved_inputs = (0, 1)  # x and W; the bias gradient needs only the incoming gradient
    returns_new_arrays = True  # three new arrays: W and b keep theirs as .grad without a copy
    handles_low_precision = True  # float32 products of 2-byte inputs (module docstring)

    def forward(self, x, weight, bias=None):
        _check(x, weight, bias)
        self.x, self.weight = x, weight
        low = x.dtype if autocast.is_low(x.dtype) else None
        if low is not None:  # float32 copies for the arithmetic; the low arrays stay saved
            x, weight = x.astype(np.float32), weight.astype(np.float32)
            bias = None if bias is None else bias.astype(np.float32)
        # One 2-D product over all leading axes: NumPy's matmul of a stack (B, T, in) @ (in, out) runs
        # B small products, slower than one (B T, in) @ (in, out): 1.44 vs 1.17 ms for a GPT's c_attn
        # (docs/performance.md, "Changes measured before and after"). A contiguous x reshapes as a view.
        y = _rows(x) @ weight.T
        if bias is not None:
            y += bias  # y is the matmul's own new array: add in place, no second array of its size
        if low is not None:
            y = y.astype(low)
        return y.reshape(*x.shape[:-1], weight.shape[0]) if x.ndim != 2 else y

    def backward(self, grad):
        # Only the gradients that some input needs: the first layer's x is data, not a parameter.
        inputs = self.inputs
        has_bias = len(inputs) == 3
        x, weight = self.x, self.weight
        if autocast.is_low(x.dtype):  # float32 products; the graph walk rounds them to x's dtype
            x, weight = x.astype(np.float32), weight.astype(np.float32)
            grad = grad.astype(np.float32)
        rows = _rows(grad)  # (rows, out): all leading axes are rows, one 2-D product (see forward)
        grad_x = (rows @ weight).reshape(x.shape) if inputs[0].requires_grad else None
        # (out, rows) @ (rows, in): laid out like W itself, so W.grad can be this very array.
        grad_w = rows.T @ _rows(x) if inputs[1].requires_grad else None
        if not has_bias:
            return grad_x, grad_w
        return grad_x, grad_w, rows.sum(axis=0) if inputs[2].requires_grad else None


def _rows(a):
    """``a`` (..., n) as a matrix (rows, n), all leading axes as rows (a 1-D ``a`` as one row)."""
    if a.ndim == 2:  # every call of an MLP: no reshape (docs/performance.md, "What the cuts took out")
        return a
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])  # not -1: a size-0 axis would be ambiguous


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight^T + bias for x (..., in), weight (out, in), bias (out,) or None; returns (..., out).

    A bias of another shape that broadcasts against (..., out), e.g. (1, out) or a scalar, is added by
    the general ``add`` after the op, as torch allows; errors: see :class:`Linear` and ``add``.
    Under ``minidist.autocast`` the inputs are rounded to the low dtype and so is the result.
    """
    if autocast.low_dtype is not None:  # (one flag check when off: no extra call, the MLP's budget)
        x, weight, bias = autocast_low(x), autocast_low(weight), autocast_low(bias)
        if autocast.emulated:  # bfloat16 on CuPy: round the float32 result (autograd/autocast.py)
            with autocast.paused():
                y = linear(x, weight, bias)
            return autocast_output(y)
    if bias is None:
        return Linear.apply(x, weight)
    shape = tuple(getattr(bias, "shape", ()))
    if one_per_output(bias, weight) or (shape and shape[-1] not in (1, weight.shape[0])):
        return Linear.apply(x, weight, bias)  # the op itself, or its error for a bias that cannot fit
    if getattr(bias, "dtype", weight.dtype) != weight.dtype:
        _check(x, weight, None)
        raise _dtype_error(x, weight, bias)
    return Linear.apply(x, weight) + bias


def one_per_output(bias: Any, weight: Any) -> bool:
    """Whether ``bias`` has the op's own shape (out,), one value per output feature (not a scalar, a list
    or another shape that only broadcasts): then the op adds it itself (``linear``, ``linear_relu``)."""
    return tuple(getattr(bias, "shape", ())) == (weight.shape[0],)


def _check(x, weight, bias) -> None:
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: input of shape {tuple(x.shape)} and weight of shape {tuple(weight.shape)} do not "
            "match: the weight must be (out_features, in_features) (in_features: the input's last axis)"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"linear: bias of shape {tuple(bias.shape)} for a weight of shape {tuple(weight.shape)}; "
            f"the bias must be ({weight.shape[0]},), one value per output feature"
        )
    # ``is`` first: NumPy shares one dtype object per type, so the common case skips the slower ``!=``.
    dtype = x.dtype
    if (weight.dtype is not dtype and weight.dtype != dtype) or (
        bias is not None and bias.dtype is not dtype and bias.dtype != dtype
    ):
        raise _dtype_error(x, weight, bias)


def _dtype_error(x, weight, bias) -> RuntimeError:
    convert = "e.g. x.to(np.float32) or md.tensor(array, dtype=np.float32) for a float32 model"
    if x.dtype != weight.dtype:  # torch's words for the matmul part
        return RuntimeError(
            f"linear: mat1 and mat2 must have the same dtype, but got {x.dtype} (input) and "
            f"{weight.dtype} (weight); convert one of them, {convert}"
        )
    return RuntimeError(
        f"linear: the bias must have the dtype of the input and weight ({weight.dtype}), got {bias.dtype}; "
        f"convert it, {convert}"
    )
