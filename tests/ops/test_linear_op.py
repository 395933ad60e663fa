"""The fused linear op (minidist/ops/linear.py) and the graph walk's rule for keeping a gradient
without a copy (``Function.returns_new_arrays``): what the speed-ups must not change.

The gradients themselves are checked against finite differences in tests/ops/test_gradcheck.py; here:
the same numbers as the unfused transpose + matmul + add, the errors, the gradients it skips, and
that no leaf's ``.grad`` is ever an array that something else can change.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist import nn, ops
from minidist.nn import functional as F


def _t(a, requires_grad=True):
    return md.tensor(a, requires_grad=requires_grad)


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (4,)], ids=["2d", "3d", "1d"])
def test_linear_equals_transpose_matmul_add_in_float32(shape):
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, (3, 4), (3,)))
    fused = [_t(x), _t(w), _t(b)]
    plain = [_t(x.reshape(-1, 4)), _t(w), _t(b)]  # MatMul needs 2-D: a 1-D x is a batch of one row
    g = rng.standard_normal((*shape[:-1], 3)).astype(np.float32)
    F.linear(*fused).backward(g)
    (ops.matmul(plain[0], ops.transpose(plain[1])) + plain[2]).backward(g.reshape(-1, 3))
    plain[0].grad = plain[0].grad.reshape(shape)
    for a, b_ in zip(fused, plain):  # same arithmetic; 3-D sums the rows in one GEMM: rounding only
        np.testing.assert_allclose(a.grad, b_.grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(F.linear(*fused).numpy(), x @ w.T + b)


def test_linear_skips_the_gradient_of_an_input_that_needs_none():
    x = _t(np.ones((2, 4), np.float32), requires_grad=False)  # data, as the first layer's input
    w, b = _t(np.ones((3, 4), np.float32)), _t(np.ones(3, np.float32))
    out = F.linear(x, w, b)
    grads = out.grad_fn.backward(np.ones((2, 3), np.float32))
    assert grads[0] is None and grads[1].shape == (3, 4) and grads[2].shape == (3,)


def test_linear_errors_name_the_shapes_and_the_dtypes():
    x = _t(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"input of shape \(2, 4\) and weight of shape \(3, 5\)"):
        F.linear(x, _t(np.ones((3, 5), np.float32)))
    with pytest.raises(ValueError, match=r"bias of shape \(4,\).*must be \(3,\)"):
        F.linear(x, _t(np.ones((3, 4), np.float32)), _t(np.ones(4, np.float32)))
    with pytest.raises(
        RuntimeError, match=r"bias must have the dtype.*got float64"
    ):  # as torch: no promotion
        F.linear(x, _t(np.ones((3, 4), np.float32)), _t(np.ones(3)))


def test_no_leaf_grad_is_shared_with_another_or_with_the_callers_gradient():
    """Add hands the same incoming array to both inputs; Linear's arrays are its own; a leaf root gets
    the caller's array. In every case each .grad must be an array no one else holds."""
    a, b = _t(np.ones(3, np.float32)), _t(np.ones(3, np.float32))
    (a + b).backward(np.ones(3, np.float32))
    assert not np.shares_memory(a.grad, b.grad)

    layer = nn.Linear(4, 3)
    g = np.ones((2, 3), np.float32)
    layer(_t(np.ones((2, 4), np.float32))).backward(g)
    grads = [layer.weight.grad, layer.bias.grad, g]
    assert not any(np.shares_memory(p, q) for i, p in enumerate(grads) for q in grads[i + 1 :])

    leaf, given = _t(np.ones(3, np.float32)), np.ones(3, np.float32)
    leaf.backward(given)
    leaf.grad += 1
    assert given[0] == 1.0  # the caller's array is not the leaf's .grad

    w = _t(np.ones((3, 4), np.float32))  # one weight used twice: the sum is a new array
    (
        F.linear(_t(np.ones((2, 4), np.float32)), w) + F.linear(_t(np.ones((2, 4), np.float32)), w)
    ).sum().backward()
    np.testing.assert_array_equal(w.grad, np.full((3, 4), 4.0, np.float32))


def test_a_kept_linear_gradient_accumulates_across_backward_calls():
    layer = nn.Linear(4, 3)
    x = _t(np.ones((2, 4), np.float32), requires_grad=False)
    layer(x).sum().backward()
    first = layer.weight.grad.copy()
    layer(x).sum().backward()  # accumulates into the array the first backward kept
    np.testing.assert_array_equal(layer.weight.grad, 2 * first)


@pytest.mark.parametrize("w_shape, x_shape", [((0, 3), (5, 3)), ((4, 0), (5, 0)), ((4, 3), (0, 3))])
def test_linear_with_zero_features_or_rows_gives_empty_gradients(w_shape, x_shape):
    x, w = _t(np.ones(x_shape)), _t(np.ones(w_shape))
    b = _t(np.ones(w_shape[0]))
    F.linear(x, w, b).sum().backward()
    assert x.grad.shape == x_shape and w.grad.shape == w_shape and b.grad.shape == (w_shape[0],)
    np.testing.assert_array_equal(b.grad, np.full(w_shape[0], x_shape[0], dtype=np.float64))


@pytest.mark.parametrize("bias_shape", [(1, 3), ()], ids=["row", "scalar"])
def test_linear_takes_a_bias_that_broadcasts_as_torch_does(bias_shape):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((5, 4)), rng.standard_normal((3, 4)), rng.standard_normal(bias_shape)
    tb = _t(b)
    out = F.linear(_t(x), _t(w), tb)
    np.testing.assert_allclose(out.numpy(), x @ w.T + b, rtol=1e-14)
    out.sum().backward()
    expected = np.full(bias_shape, 15.0 if bias_shape == () else 5.0)  # summed over what it broadcast to
    np.testing.assert_allclose(tb.grad, expected, rtol=1e-14)
    with pytest.raises(RuntimeError, match=r"bias must have the dtype .* \(float64\), got float32"):
        F.linear(_t(x), _t(w), _t(b.astype(np.float32)))
