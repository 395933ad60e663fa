"""Every differentiable op against central finite differences, in float64 (docs/design.md, property 1).

For an op y = f(x_1, ..., x_k) we draw a random array R of y's shape and compare, for each input x_j,

    analytic:  the gradient that ``y.backward(R)`` accumulates into x_j.grad  (= R · ∂y/∂x_j)
    numeric:   d/dx_j of the scalar  L(x) = sum(f(x) * R),  by central differences.

R is random so that every output element contributes and errors cannot cancel, and ``backward(R)``
is called directly so the check does not rely on the ``mul``/``sum`` ops it is also testing.
"""

from __future__ import annotations

import numpy as np
import pytest
import strategies as S
from gradcheck import gradcheck
from hypothesis import assume, given
from hypothesis import strategies as st

import minidist as md
from minidist.nn import functional as F
from minidist.ops.linear_relu import linear_relu

# ------------------------------------------------------------------------ binary ops, broadcasting
BINARY_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
}


@pytest.mark.parametrize("name", sorted(BINARY_OPS))
@given(data=st.data())
def test_binary_op_gradient_with_broadcasting(name, data):
    shape_a, shape_b = data.draw(S.broadcastable_shapes())
    gradcheck(BINARY_OPS[name], data.draw(S.arrays(shape_a)), data.draw(S.arrays(shape_b)))


@given(data=st.data())
def test_div_gradient_with_broadcasting(data):
    shape_a, shape_b = data.draw(S.broadcastable_shapes())
    gradcheck(lambda a, b: a / b, data.draw(S.arrays(shape_a)), data.draw(S.nonzero_arrays(shape_b)))


# ------------------------------------------------------------------------------------------- unary
UNARY_OPS = {
    # name: (function, strategy for the input values)
    "neg": (lambda x: -x, S.arrays),
    "exp": (lambda x: x.exp(), S.arrays),
    "log": (lambda x: x.log(), S.positive_arrays),
    "tanh": (lambda x: x.tanh(), S.arrays),
    "sigmoid": (lambda x: x.sigmoid(), S.arrays),
    "relu": (lambda x: x.relu(), S.nonzero_arrays),  # |x| >= 0.2: never within EPS of the kink at 0
    "gelu": (F.gelu, S.arrays),
    "functional_relu": (F.relu, S.nonzero_arrays),
    "functional_tanh": (F.tanh, S.arrays),
    "functional_sigmoid": (F.sigmoid, S.arrays),
}


@pytest.mark.parametrize("name", sorted(UNARY_OPS))
@given(data=st.data())
def test_elementwise_op_gradient(name, data):
    fn, values = UNARY_OPS[name]
    gradcheck(fn, data.draw(values(data.draw(S.shapes()))))


# Exponent -> input strategy: non-integer powers need x > 0, negative powers need x away from 0.
POW_CASES = {
    2: S.arrays,
    3: S.arrays,
    1: S.arrays,
    0.5: S.positive_arrays,
    1.5: S.positive_arrays,
    -1: S.nonzero_arrays,
    -2.5: S.positive_arrays,
}


@pytest.mark.parametrize("exponent", sorted(POW_CASES))
@given(data=st.data())
def test_pow_gradient_for_constant_exponent(exponent, data):
    x = data.draw(POW_CASES[exponent](data.draw(S.shapes())))
    gradcheck(lambda t: t**exponent, x)


# ------------------------------------------------------------------------------------------ matmul
@given(data=st.data())
def test_matmul_gradient_2d_and_batched_with_broadcast_batch_axes(data):
    shape_a, shape_b = data.draw(S.matmul_shapes())
    gradcheck(lambda a, b: a @ b, data.draw(S.arrays(shape_a)), data.draw(S.arrays(shape_b)))


# ------------------------------------------------------------------------------------------ linear
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@given(data=st.data())
def test_linear_gradient_for_any_leading_axes(bias, data):
    """F.linear is one op (minidist/ops/linear.py): x (..., in) with 1-3 axes, W (out, in), b (out,)."""
    lead = data.draw(S.shapes(min_dims=0, max_dims=2))
    n_in, n_out = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    x, w = data.draw(S.arrays((*lead, n_in))), data.draw(S.arrays((n_out, n_in)))
    if bias:
        gradcheck(F.linear, x, w, data.draw(S.arrays((n_out,))))
    else:
        gradcheck(F.linear, x, w)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@given(data=st.data())
def test_linear_relu_gradient_for_any_leading_axes(bias, data):
    """The fused Linear + ReLU (minidist/ops/linear_relu.py), away from the kink at 0: every
    pre-activation at least 1e-3 from 0, far beyond what the ±1e-6 steps of the differences move it."""
    lead = data.draw(S.shapes(min_dims=0, max_dims=2))
    n_in, n_out = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    x, w = data.draw(S.arrays((*lead, n_in))), data.draw(S.arrays((n_out, n_in)))
    b = [data.draw(S.arrays((n_out,)))] if bias else []
    assume(np.all(np.abs(x @ w.T + sum(b)) > 1e-3))
    gradcheck(linear_relu, x, w, *b)


# -------------------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("name", ["sum", "mean"])
@given(data=st.data())
def test_sum_and_mean_gradient_over_any_axes(name, data):
    x = data.draw(S.arrays(data.draw(S.shapes())))
    axis, keepdims = data.draw(S.reduction_args(x.ndim))
    gradcheck(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims), x)


@given(data=st.data())
def test_max_gradient_over_any_axes_without_ties(data):
    x = data.draw(S.distinct_arrays(data.draw(S.shapes())))  # pairwise gaps >= 0.05 >> EPS: no ties
    axis, keepdims = data.draw(S.reduction_args(x.ndim))
    gradcheck(lambda t: t.max(axis=axis, keepdims=keepdims), x)


def test_max_gradient_splits_evenly_between_tied_maxima():
    x = md.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 0.0]], dtype=np.float64, requires_grad=True)
    x.max(axis=1).backward(np.array([1.0, 6.0]))
    np.testing.assert_allclose(x.grad, [[0.0, 0.5, 0.5, 0.0], [2.0, 2.0, 2.0, 0.0]])

    y = md.tensor([4.0, 1.0, 4.0, 4.0], dtype=np.float64, requires_grad=True)
    y.max().backward()
    np.testing.assert_allclose(y.grad, [1 / 3, 0.0, 1 / 3, 1 / 3])
    assert y.grad.sum() == pytest.approx(1.0)  # the output gradient is conserved


# ------------------------------------------------------------------------------------- shape moves
@given(data=st.data())
def test_reshape_gradient(data):
    x = data.draw(S.arrays(data.draw(S.shapes())))
    new_shape = data.draw(S.reshape_targets(x.shape))
    gradcheck(lambda t: t.reshape(*new_shape), x)


@given(data=st.data())
def test_transpose_gradient_for_random_permutation(data):
    x = data.draw(S.arrays(data.draw(S.shapes())))
    perm = data.draw(S.permutations(x.ndim))
    gradcheck(lambda t: t.permute(*perm), x)


@given(data=st.data())
def test_T_property_gradient_reverses_axes(data):
    x = data.draw(S.arrays(data.draw(S.shapes())))
    gradcheck(lambda t: t.T, x)


@given(data=st.data())
def test_getitem_gradient_basic_slices(data):
    x = data.draw(S.arrays(data.draw(S.shapes())))
    index = data.draw(S.basic_indices(x.shape))
    gradcheck(lambda t: t[index], x)


@given(data=st.data())
def test_getitem_gradient_integer_array_with_repeated_indices(data):
    x = data.draw(S.arrays(data.draw(S.shapes())))
    rows = data.draw(S.repeated_integer_indices(x.shape[0]))
    gradcheck(lambda t: t[rows], x)


@given(data=st.data())
def test_getitem_gradient_integer_arrays_on_two_axes(data):
    x = data.draw(S.arrays(data.draw(S.shapes(min_dims=2))))
    rows = data.draw(S.repeated_integer_indices(x.shape[0]))
    cols = np.array(
        data.draw(st.lists(st.integers(0, x.shape[1] - 1), min_size=len(rows), max_size=len(rows)))
    )
    gradcheck(lambda t: t[rows, cols], x)


def test_getitem_repeated_index_accumulates_hand_example():
    x = md.tensor([10.0, 20.0, 30.0], dtype=np.float64, requires_grad=True)
    x[np.array([2, 0, 2, 2])].backward(np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(x.grad, [2.0, 0.0, 8.0])


# ------------------------------------------------------------------------------- softmax and loss
@pytest.mark.parametrize("op", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@given(data=st.data())
def test_softmax_family_gradient_along_any_axis(op, data):
    x = data.draw(S.arrays(data.draw(S.shapes()), -3.0, 3.0))
    axis = data.draw(S.single_axis(x.ndim))
    gradcheck(lambda t: op(t, axis=axis), x)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@given(batch=S.classification_batches())
def test_cross_entropy_gradient(reduction, batch):
    logits, targets = batch
    gradcheck(lambda t: F.cross_entropy(t, targets, reduction=reduction), logits)


# ----------------------------------------------------------------------------------------- dropout
@given(data=st.data(), p=st.sampled_from([0.1, 0.5, 0.9]), seed=S.seeds)
def test_dropout_gradient_with_a_fixed_mask(data, p, seed):
    x = data.draw(S.nonzero_arrays(data.draw(S.shapes())))  # nonzero: a zero output means "dropped"

    def reseed() -> None:
        md.manual_seed(seed)

    gradcheck(lambda t: F.dropout(t, p, training=True), x, before_each=reseed)

    # The mask is a function of the seed alone: the same seed drops the same elements, and the
    # gradient is exactly the mask scaled by 1/(1-p).
    t = md.tensor(x, dtype=np.float64, requires_grad=True)
    reseed()
    out1 = F.dropout(t, p, training=True)
    reseed()
    out2 = F.dropout(t, p, training=True)
    np.testing.assert_array_equal(out1.numpy(), out2.numpy())
    out1.backward(np.ones(x.shape))
    kept = out1.numpy() != 0
    np.testing.assert_allclose(t.grad, kept / (1 - p))
    np.testing.assert_allclose(out1.numpy(), x * kept / (1 - p))


# ------------------------------------------------------------------------------ operator spellings
# Each lambda exercises one Tensor dunder: Python numbers and NumPy arrays on either side.
SCALAR_OPERATOR_FORMS = {
    "tensor + number": lambda a: a + 2.0,
    "number + tensor (__radd__)": lambda a: 2.0 + a,
    "tensor - number": lambda a: a - 1.5,
    "number - tensor (__rsub__)": lambda a: 3 - a,
    "tensor * number": lambda a: a * 2.5,
    "number * tensor (__rmul__)": lambda a: -2 * a,
    "tensor / number": lambda a: a / 4.0,
    "number / tensor (__rtruediv__)": lambda a: 2.0 / a,
    "tensor ** int": lambda a: a**2,
    "tensor ** float": lambda a: a**3.0,
    "-tensor": lambda a: -a,
    "ndarray + tensor (__radd__)": lambda a: np.full(a.shape, 0.5) + a,
    "ndarray - tensor (__rsub__)": lambda a: np.full(a.shape, 0.5) - a,
    "ndarray * tensor (__rmul__)": lambda a: np.full(a.shape, -1.5) * a,
    "ndarray / tensor (__rtruediv__)": lambda a: np.full(a.shape, 3.0) / a,
    "tensor + ndarray": lambda a: a + np.full(a.shape, 0.5),
}


@pytest.mark.parametrize("form", sorted(SCALAR_OPERATOR_FORMS))
@given(data=st.data())
def test_operator_form_gradient(form, data):
    x = data.draw(S.nonzero_arrays(data.draw(S.shapes())))  # nonzero: 2.0 / a is safe
    gradcheck(SCALAR_OPERATOR_FORMS[form], x)


@given(data=st.data())
def test_tensor_over_tensor_operator_gradient(data):
    shape_a, shape_b = data.draw(S.broadcastable_shapes())
    gradcheck(
        lambda a, b: a / b - a * b + b, data.draw(S.arrays(shape_a)), data.draw(S.nonzero_arrays(shape_b))
    )


@given(data=st.data())
def test_ndarray_matmul_tensor_uses_rmatmul(data):
    shape_a, shape_b = data.draw(S.matmul_shapes(max_batch_dims=0))
    a = data.draw(S.arrays(shape_a))
    gradcheck(lambda b: a @ b, data.draw(S.arrays(shape_b)))


@given(data=st.data())
def test_composite_expression_gradient(data):
    """A small network-like expression: several ops, broadcasting and fan-out in one graph."""
    shape_x, shape_w = data.draw(S.matmul_shapes(max_batch_dims=1))
    b = data.draw(S.arrays(shape_w[-1:]))
    x, w = data.draw(S.arrays(shape_x)), data.draw(S.arrays(shape_w))

    def net(x, w, b):
        h = (x @ w + b).tanh()
        return F.log_softmax(h * h.sigmoid() + h, axis=-1).mean(axis=0)

    gradcheck(net, x, w, b)
