"""Arithmetic ops with NumPy broadcasting: add, sub, mul, div, neg, pow, matmul.

Broadcasting copies an input along new or size-1 axes, so in backward the gradient of every copy
is summed back into the original: :func:`unbroadcast` does that for every binary op here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import autocast
from minidist.autograd.function import Function
from minidist.autograd.tensor import DEFAULT_DTYPE, Tensor
from minidist.ops.dtypes import autocast_low, autocast_output, promote, to


def unbroadcast(grad: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``grad`` over the axes that broadcasting added or stretched, giving an array of ``shape``."""
    # BEGIN SOLUTION A1.1: sum the gradient over the axes that broadcasting added or stretched
    if grad.shape == shape:  # nothing was broadcast (the common case): skip the search below
        return grad
    extra = grad.ndim - len(shape)
    if extra > 0:  # leading axes that did not exist in the input
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:  # axes of length 1 that were repeated
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad
    # END SOLUTION


def _check_broadcast(name: str, a: Any, b: Any) -> None:
    # The common cases (same shapes; a scalar, e.g. a lifted Python number) always broadcast: tuple
    # compares instead of ~10 us of broadcast_shapes per op.
    if a.shape == b.shape or not a.shape or not b.shape:
        return
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be broadcast together "
            "(trailing dimensions must be equal or 1); reshape one of them"
        ) from None


class Add(Function):
    """z = a + b;  dz/da = 1, dz/db = 1."""

    saved_inputs = ()  # backward needs only the shapes

    def forward(self, a, b):
        _check_broadcast("add", a, b)
        self.shapes = a.shape, b.shape
        return a + b

    def backward(self, grad):
        return unbroadcast(grad, self.shapes[0]), unbroadcast(grad, self.shapes[1])


class Sub(Function):
    """z = a - b;  dz/da = 1, dz/db = -1."""

    saved_inputs = ()

    def forward(self, a, b):
        _check_broadcast("sub", a, b)
        self.shapes = a.shape, b.shape
        return a - b

    def backward(self, grad):
        return unbroadcast(grad, self.shapes[0]), unbroadcast(-grad, self.shapes[1])


class Mul(Function):
    """z = a * b;  dz/da = b, dz/db = a."""

    def forward(self, a, b):
        _check_broadcast("mul", a, b)
        self.a, self.b = a, b
        return a * b

    def backward(self, grad):
        # BEGIN SOLUTION A1.2: the gradients of a * b
        return unbroadcast(grad * self.b, self.a.shape), unbroadcast(grad * self.a, self.b.shape)
        # END SOLUTION


class Div(Function):
    """z = a / b;  dz/da = 1/b, dz/db = -a/b^2, computed as -(a/b)/b.

    The order matters in floating point: b*b over- or underflows long before a/b does (float32
    ``1e30/1e20`` would give dz/db = 0 and ``0/1e-30`` NaN); ``(a/b)/b`` is what PyTorch computes.
    """

    def forward(self, a, b):
        _check_broadcast("div", a, b)
        self.a, self.b = a, b
        return a / b

    def backward(self, grad):
        # BEGIN SOLUTION A1.2: the gradients of a / b
        grad_a = grad / self.b
        grad_b = -grad * ((self.a / self.b) / self.b)
        return unbroadcast(grad_a, self.a.shape), unbroadcast(grad_b, self.b.shape)
        # END SOLUTION


class Neg(Function):
    """z = -a;  dz/da = -1."""

    saved_inputs = ()

    def forward(self, a):
        return -a

    def backward(self, grad):
        return (-grad,)


class Pow(Function):
    """z = a^p for a constant number p;  dz/da = p * a^(p-1)."""

    def forward(self, a, exponent: float):
        self.a, self.p = a, exponent
        return a**exponent

    def backward(self, grad):
        if self.p == 0:  # a^0 = 1 is constant; avoid 0 * 0^-1 = nan at a = 0
            return (grad * 0,)
        return (grad * self.p * self.a ** (self.p - 1),)


class MatMul(Function):
    """Z = A @ B for A (..., n, k) and B (..., k, m), batch axes broadcast;  Z is (..., n, m).

    dL/dA = dL/dZ @ B^T and dL/dB = A^T @ dL/dZ (transposing the last two axes), summed over
    broadcast batch axes. 2-byte inputs (autocast) are multiplied as float32 copies (ops/linear.py).
    """

    handles_low_precision = True

    def forward(self, a, b):
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(
                f"matmul needs operands with at least 2 dimensions, got shapes {tuple(a.shape)} and "
                f"{tuple(b.shape)}; reshape a vector v to (1, n) or (n, 1) first"
            )
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(
                f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not match: the last dimension "
                f"of the first ({a.shape[-1]}) must equal the second-to-last of the second ({b.shape[-2]})"
            )
        if a.dtype != b.dtype:  # torch does not promote here: a float64 input to a float32 layer is a bug
            raise RuntimeError(
                f"matmul: mat1 and mat2 must have the same dtype, but got {a.dtype} and {b.dtype}; convert "
                "one of them, e.g. x.to(np.float32) or md.tensor(array, dtype=np.float32) for a float32 model"
            )
        try:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise ValueError(
                f"matmul: batch dimensions of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                "broadcast together"
            ) from None
        self.a, self.b = a, b
        if autocast.is_low(a.dtype):  # 2-byte inputs: a float32 product rounded once (ops/linear.py)
            return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)
        return a @ b

    def backward(self, grad):
        if autocast.is_low(self.a.dtype):  # float32 products; the graph walk rounds them to the inputs' dtype
            f32 = np.float32
            self.a, self.b, grad = self.a.astype(f32), self.b.astype(f32), grad.astype(f32)
        # BEGIN SOLUTION A1.2: the gradients of A @ B (batched, broadcast batch axes)
        grad_a = grad @ self.b.swapaxes(-1, -2)
        if (
            grad.ndim == 2
            and self.a.ndim == 2
            and self.b.T.flags.c_contiguous
            and not self.b.flags.c_contiguous
        ):
            # B is a transposed view (Linear passes weight.T). (dL/dZ^T A)^T is the same matrix as
            # A^T dL/dZ, but laid out like the weight itself, so accumulating it into weight.grad is a
            # plain copy instead of a strided transposing one (measured: ~25 ms per 2048x2048 layer).
            grad_b = (grad.T @ self.a).T
        else:
            grad_b = self.a.swapaxes(-1, -2) @ grad
        return unbroadcast(grad_a, self.a.shape), unbroadcast(grad_b, self.b.shape)
        # END SOLUTION


# The binary ops first bring both operands to PyTorch's result dtype (minidist/ops/dtypes.py).
def add(a, b):
    return Add.apply(*promote(a, b))


def sub(a, b):
    return Sub.apply(*promote(a, b))


def mul(a, b):
    return Mul.apply(*promote(a, b))


def div(a, b):
    """True division: integer operands give float32, as in PyTorch."""
    return Div.apply(*promote(a, b, floating=True))


def neg(a):
    return Neg.apply(a)


def pow(a, exponent: float):  # noqa: A001  (mirrors Tensor.__pow__)
    """``a ** exponent`` for a constant Python number ``exponent``; raises ``TypeError`` otherwise."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"pow: the exponent must be a Python number, got {type(exponent).__name__}; "
            "for a tensor exponent use exp(b * log(a))"
        )
    if isinstance(exponent, (float, np.floating)) and isinstance(a, Tensor) and a.dtype.kind != "f":
        a = to(a, DEFAULT_DTYPE)  # int tensor ** 0.5 is float32 in torch (NumPy: float64)
    # A Python float keeps a float32 tensor float32 (a NumPy float64 scalar would not: NEP 50).
    exponent = float(exponent) if isinstance(exponent, (float, np.floating)) else int(exponent)
    return Pow.apply(a, exponent=exponent)


def matmul(a, b):
    """a @ b (``MatMul``); under ``minidist.autocast`` a low-precision op: inputs and result rounded."""
    if autocast.low_dtype is not None:
        return autocast_output(MatMul.apply(autocast_low(a), autocast_low(b)))
    return MatMul.apply(a, b)
