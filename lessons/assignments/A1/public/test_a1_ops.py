"""A1 public tests: each op's backward against central finite differences, called directly.

The tests call ``Function.forward`` / ``Function.backward`` on float64 arrays without going through
``Tensor.backward``, so an op's task is graded on its own even if your backward pass (A1.5) is not done.
Tolerance: central differences with eps = 1e-6 in float64 are accurate to ~1e-9 for these smooth
functions; rtol 1e-5 leaves a wide margin and still catches any wrong factor or sign.
"""

from __future__ import annotations

import numpy as np
import pytest
from gradelib import assert_close, check_op, expected_unbroadcast, parts

from minidist.ops.arithmetic import Div, MatMul, Mul, unbroadcast
from minidist.ops.elementwise import ReLU, Sigmoid, Tanh
from minidist.ops.reduction import Mean, Sum
from minidist.ops.softmax import CrossEntropy


@pytest.mark.parametrize(
    "grad_shape, shape", [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 2, 3), (2, 1)), ((2, 3), ())]
)
def test_unbroadcast(grad_shape, shape):
    grad = np.random.default_rng(1).standard_normal(grad_shape)
    got = unbroadcast(grad, shape)
    assert_close(got, expected_unbroadcast(grad, shape), f"unbroadcast(grad of shape {grad_shape}, {shape})")


def test_mul_div_backward():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4)), rng.uniform(0.5, 2.0, (3, 4))
    with parts() as part:  # Mul and Div score separately (A1/tasks.toml)
        with part("Mul"):
            check_op(Mul, [a, b], "Mul, both (3, 4)")
            check_op(Mul, [a, rng.standard_normal(4)], "Mul, (3, 4) * (4,)")
        with part("Div"):
            check_op(Div, [a, b], "Div, both (3, 4)")


def test_matmul_backward():
    rng = np.random.default_rng(3)
    check_op(MatMul, [rng.standard_normal((3, 4)), rng.standard_normal((4, 2))], "MatMul (3, 4) @ (4, 2)")


def test_elementwise_backward():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5))
    x[np.abs(x) < 0.1] = 0.5  # keep finite differences away from ReLU's kink at 0
    with parts() as part:  # one part per function (A1/tasks.toml)
        for op in (Tanh, Sigmoid, ReLU):
            with part(op.__name__):
                check_op(op, [x], op.__name__)


def test_reduction_backward():
    x = np.random.default_rng(5).standard_normal((3, 4))
    with parts() as part:  # Sum and Mean score separately (A1/tasks.toml)
        for op in (Sum, Mean):
            with part(op.__name__):
                check_op(op, [x], f"{op.__name__} over all axes")
                check_op(op, [x], f"{op.__name__}(axis=0)", axis=0)
                check_op(op, [x], f"{op.__name__}(axis=1, keepdims=True)", axis=1, keepdims=True)


def test_cross_entropy_backward():
    rng = np.random.default_rng(6)
    logits, targets = rng.standard_normal((4, 3)), np.array([0, 2, 1, 2])
    check_op(CrossEntropy, [logits], "CrossEntropy (4 samples, 3 classes)", targets=targets)
