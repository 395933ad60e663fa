"""The transformer's ops (issue 17): embedding, layer_norm, scaled_dot_product_attention.

Each against central finite differences in float64 on hypothesis shapes (``gradcheck``, see
tests/test_gradcheck.py for the tolerances), against torch where it is importable (float64, 1e-12:
the same formulas in another order of summation differ by a few ulps, a wrong one by O(1)), and on
its error cases (torch's exception types).
"""

from __future__ import annotations

import numpy as np
import pytest
import strategies as S
from hypothesis import given
from hypothesis import strategies as st
from test_gradcheck import gradcheck

import minidist as md
from minidist import nn
from minidist.nn import functional as F
from minidist.ops.embedding import ONE_HOT_MAX_ROWS

try:
    import torch
except ImportError:  # torch is an optional oracle: its tests skip without it
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (optional oracle)")


# ------------------------------------------------------------------------------------------ embedding
@given(data=st.data(), rows=st.integers(1, 6), width=st.integers(1, 4))
def test_embedding_gradient_adds_repeated_indices(data, rows, width):
    indices = data.draw(S.repeated_integer_indices(rows)).reshape(1, -1)  # (1, T): (B, T) with a repeat
    weight = data.draw(S.arrays((rows, width)))
    gradcheck(lambda w: F.embedding(indices, w), weight)

    # padding_idx: that row's gradient is zero by definition (torch's), every other row unchanged
    padding_idx = data.draw(st.integers(-rows, rows - 1))
    grads = []
    for padding in (None, padding_idx):
        w = md.tensor(weight, requires_grad=True)
        F.embedding(indices, w, padding_idx=padding).sum().backward()
        grads.append(w.grad)
    grads[0][padding_idx] = 0
    np.testing.assert_array_equal(grads[1], grads[0])


@pytest.mark.parametrize("rows", [5, ONE_HOT_MAX_ROWS + 1])  # the one-hot and the add.at path
def test_embedding_gradient_counts_every_occurrence(rows):
    w = md.tensor(np.zeros((rows, 2)), requires_grad=True)
    F.embedding(md.tensor(np.array([[3, 3, 1], [3, 0, 1]])), w).sum().backward()
    expected = np.zeros((rows, 2))
    expected[[0, 1, 3]] = [[1, 1], [2, 2], [3, 3]]
    np.testing.assert_array_equal(w.grad, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_module_shape_dtype_and_init(dtype):
    md.manual_seed(0)
    layer = nn.Embedding(11, 4, padding_idx=2, dtype=dtype)
    out = layer(np.array([[1, 2, 3], [4, 5, 10]]))
    assert out.shape == (2, 3, 4) and out.dtype == dtype
    np.testing.assert_array_equal(layer.weight.data[2], 0)
    np.testing.assert_array_equal(out.numpy()[1, 2], layer.weight.data[10])


@pytest.mark.parametrize(
    ("indices", "error", "words"),
    [
        (np.array([[0, 5]]), IndexError, "index out of range in self"),
        (np.array([-1]), IndexError, "index out of range in self"),
        (np.array([1.0]), RuntimeError, "scalar types: Long, Int"),
        (np.array([True]), RuntimeError, "scalar types: Long, Int"),
    ],
)
def test_embedding_bad_indices_raise_as_torch(indices, error, words):
    with pytest.raises(error, match=words):
        F.embedding(indices, md.tensor(np.ones((5, 3)), requires_grad=True))
    if torch is not None:
        with pytest.raises(error):
            torch.nn.functional.embedding(torch.tensor(indices), torch.ones(5, 3))


@needs_torch
@pytest.mark.parametrize("rows", [7, ONE_HOT_MAX_ROWS + 3])
def test_embedding_matches_torch(rows):
    rng = np.random.default_rng(0)
    w, idx, g = rng.standard_normal((rows, 5)), rng.integers(0, rows, (3, 8)), rng.standard_normal((3, 8, 5))
    mw, tw = md.tensor(w, requires_grad=True), torch.tensor(w, requires_grad=True)
    out = F.embedding(idx, mw, padding_idx=2)
    expected = torch.nn.functional.embedding(torch.tensor(idx), tw, padding_idx=2)
    out.backward(g)
    expected.backward(torch.tensor(g))
    np.testing.assert_array_equal(out.numpy(), expected.detach().numpy())
    np.testing.assert_allclose(mw.grad, tw.grad.numpy(), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------ layer_norm
@given(
    data=st.data(),
    normalized_ndim=st.integers(1, 2),
    weight=st.booleans(),
    bias=st.booleans(),
    eps=st.sampled_from([1e-5, 0.1]),
)
def test_layer_norm_gradient(data, normalized_ndim, weight, bias, eps):
    shape = data.draw(S.shapes(min_dims=normalized_ndim, max_dims=3, min_side=2))
    normalized = shape[len(shape) - normalized_ndim :]
    inputs = [data.draw(S.arrays(shape))]
    inputs += [data.draw(S.arrays(normalized)) for present in (weight, bias) if present]

    def fn(x, *params):
        params = list(params)
        gamma = params.pop(0) if weight else None
        beta = params.pop(0) if bias else None
        return F.layer_norm(x, normalized, gamma, beta, eps=eps)

    gradcheck(fn, *inputs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_module_normalizes_rows_in_the_input_dtype(dtype):
    x = np.random.default_rng(1).normal(5.0, 3.0, size=(4, 3, 8)).astype(dtype)
    out = nn.LayerNorm(8, dtype=dtype)(md.tensor(x))
    assert out.dtype == dtype
    np.testing.assert_allclose(out.numpy().mean(axis=-1), 0, atol=1e-5)
    np.testing.assert_allclose(out.numpy().std(axis=-1), 1, rtol=1e-3)  # eps makes it a bit below 1


def test_layer_norm_module_parameters():
    assert [name for name, _ in nn.LayerNorm((2, 3)).named_parameters()] == ["weight", "bias"]
    assert [name for name, _ in nn.LayerNorm(3, bias=False).named_parameters()] == ["weight"]
    assert list(nn.LayerNorm(3, elementwise_affine=False).parameters()) == []


@pytest.mark.parametrize(
    ("shape", "normalized", "weight_shape"),
    [((2, 4, 3), (3, 4), None), ((3,), (3, 4), None), ((2, 3), (3,), (4,))],
)
def test_layer_norm_mismatched_shapes_raise_runtime_error_as_torch(shape, normalized, weight_shape):
    weight = None if weight_shape is None else md.tensor(np.ones(weight_shape))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(md.tensor(np.ones(shape)), normalized, weight)
    if torch is not None:
        with pytest.raises(RuntimeError):
            tw = None if weight_shape is None else torch.ones(weight_shape, dtype=torch.float64)
            torch.nn.functional.layer_norm(torch.ones(shape, dtype=torch.float64), normalized, tw)


@needs_torch
@pytest.mark.parametrize("normalized", [(6,), (3, 6)])
@pytest.mark.parametrize(("weight", "bias"), [(True, True), (True, False), (False, True), (False, False)])
def test_layer_norm_matches_torch(normalized, weight, bias):
    rng = np.random.default_rng(2)
    x, g = rng.normal(2.0, 3.0, (2, 3, 6)), rng.standard_normal((2, 3, 6))
    gamma, beta = rng.standard_normal(normalized), rng.standard_normal(normalized)
    ours = [md.tensor(a, requires_grad=True) for a in (x, gamma, beta)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, gamma, beta)]
    for lib, (tx, tg, tb), fn in ((md, ours, F.layer_norm), (torch, theirs, torch.nn.functional.layer_norm)):
        out = fn(tx, normalized, tg if weight else None, tb if bias else None, 1e-5)
        out.backward(g if lib is md else torch.tensor(g))
        if lib is md:
            result = out.numpy()
    np.testing.assert_allclose(result, out.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, reference, used in zip(ours, theirs, (True, weight, bias)):
        if used:
            np.testing.assert_allclose(mine.grad, reference.grad.numpy(), rtol=1e-12, atol=1e-12)
