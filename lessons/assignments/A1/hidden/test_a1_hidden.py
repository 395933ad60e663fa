"""A1 hidden tests: hypothesis shapes, batched and transposed matmul, edge cases, long chains."""

from __future__ import annotations

import numpy as np
from gradelib import assert_close, check_op, expected_unbroadcast
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import minidist as md
from minidist.ops.arithmetic import Div, MatMul, Mul, unbroadcast
from minidist.ops.reduction import Mean, Sum
from minidist.ops.softmax import CrossEntropy


@given(mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3), st.integers(0, 99))
def test_unbroadcast_any_shapes(shapes, seed):
    grad = np.random.default_rng(seed).standard_normal(shapes.result_shape)
    for shape in shapes.input_shapes:
        got = unbroadcast(grad, shape)
        assert_close(
            got, expected_unbroadcast(grad, shape), f"unbroadcast(grad {shapes.result_shape}, {shape})"
        )


def test_arithmetic_edge_cases():
    rng = np.random.default_rng(10)
    a = rng.standard_normal((2, 3))
    check_op(Mul, [a, np.array(1.5)], "Mul by a 0-d array")
    check_op(
        Div, [rng.standard_normal((2, 1)), rng.uniform(-2, -0.5, (1, 3))], "Div (2, 1) / (1, 3), negative b"
    )
    check_op(
        MatMul,
        [rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))],
        "MatMul batched (2,3,4) @ (4,5)",
    )
    check_op(
        MatMul, [rng.standard_normal((1, 3, 4)), rng.standard_normal((2, 4, 2))], "MatMul (1,3,4) @ (2,4,2)"
    )
    check_op(
        MatMul, [rng.standard_normal((3, 4)), rng.standard_normal((5, 4)).T], "MatMul with a transposed B"
    )


def test_reduction_edge_cases():
    x = np.random.default_rng(11).standard_normal((2, 3, 4))
    for op in (Sum, Mean):
        check_op(op, [x], f"{op.__name__}(axis=(0, 2))", axis=(0, 2))
        check_op(op, [x], f"{op.__name__}(axis=-1, keepdims=True)", axis=-1, keepdims=True)
        check_op(op, [np.array(1.7)], f"{op.__name__} of a 0-d array")


def test_cross_entropy_edge_cases():
    rng = np.random.default_rng(12)
    check_op(CrossEntropy, [rng.standard_normal((5, 4))], "CrossEntropy reduction='sum'",
             targets=np.array([3, 0, 1, 1, 2]), reduction="sum")  # fmt: skip
    check_op(CrossEntropy, [rng.standard_normal((1, 2)) * 30], "CrossEntropy, one sample, large logits",
             targets=np.array([1]))  # fmt: skip


class Scale(md.Function):
    def forward(self, x, c=2.0):
        self.c = c
        return x * c

    def backward(self, grad):
        return (grad * self.c,)


class Mult(md.Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, grad):
        return grad * self.b, grad * self.a


def test_long_chain_and_constants():
    """5,000 ops in a row (no recursion limit), a constant input, and a node reached at two depths."""
    x = md.tensor(np.array([1.0, 2.0]), dtype=np.float64, requires_grad=True)
    h = x
    for _ in range(5000):
        h = Scale.apply(h, c=1.0)
    const = md.tensor(np.array([3.0, 4.0]), dtype=np.float64)  # requires_grad=False: no gradient
    y = Mult.apply(h, const)
    y.backward(np.ones(2))
    assert np.allclose(x.grad, [3.0, 4.0]), f"chain of 5000 ops: x.grad = {x.grad}, expected [3, 4]"
    assert const.grad is None, "a tensor with requires_grad=False must not receive a gradient"

    w = md.tensor(np.array([0.5]), dtype=np.float64, requires_grad=True)
    a = Scale.apply(w, c=2.0)  # a = 2w
    deep = Scale.apply(Scale.apply(Scale.apply(a, c=1.0), c=1.0), c=1.0)  # a, three ops deeper
    z = Mult.apply(a, deep)  # z = a^2 = 4 w^2, dz/dw = 8 w
    z.backward(np.ones(1))
    assert np.allclose(w.grad, [4.0]), f"z = a * f(f(f(a))): w.grad = {w.grad}, expected 8w = [4.]"
