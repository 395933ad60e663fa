"""The transformer's ops: embedding, layer_norm, scaled_dot_product_attention.

Each against central finite differences in float64 on hypothesis shapes (``gradcheck``, see
tests/ops/test_gradcheck.py for the tolerances), against torch where it is importable (float64, 1e-12:
the same formulas in another order of summation differ by a few ulps, a wrong one by O(1)), and on
its error cases (torch's exception types).
"""

from __future__ import annotations

import numpy as np
import pytest
import strategies as S
from gradcheck import gradcheck
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist as md
from minidist import nn
from minidist.backend import _try_import_cupy
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


# ------------------------------------------------------------------------- scaled_dot_product_attention
@given(
    data=st.data(),
    batch=S.shapes(min_dims=0, max_dims=2, max_side=2),  # small: 3 inputs, 2 forwards per element
    sizes=st.tuples(*[st.integers(1, 4)] * 4),  # L, S, E, Ev
    mask=st.sampled_from(["none", "causal", "bool", "float"]),
    scale=st.sampled_from([None, 0.7]),
)
def test_attention_gradient(data, batch, sizes, mask, scale):
    length, keys, features, value_features = sizes
    q = data.draw(S.arrays(batch + (length, features)))
    k = data.draw(S.arrays(batch + (keys, features)))
    v = data.draw(S.arrays(batch + (keys, value_features)))
    rng = np.random.default_rng(data.draw(S.seeds))
    attn_mask = {
        "bool": rng.random((length, keys)) < 0.7,  # some rows may be all False: zero output there
        "float": rng.standard_normal(batch + (length, keys)),
    }.get(mask)
    gradcheck(
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask, is_causal=mask == "causal", scale=scale
        ),
        q,
        k,
        v,
    )


@settings(max_examples=6)  # 3 inputs x 12 elements x 2 forwards each per example: keep it cheap
@given(data=st.data(), p=st.sampled_from([0.2, 0.5]), seed=S.seeds, causal=st.booleans())
def test_attention_gradient_with_seeded_dropout(data, p, seed, causal):
    q, k, v = (data.draw(S.arrays((2, 3, 2))) for _ in range(3))
    gradcheck(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal),
        q,
        k,
        v,
        before_each=lambda: md.manual_seed(seed),  # the same mask in every evaluation
    )


def test_attention_dropout_mask_follows_the_seed():
    q = md.tensor(np.random.default_rng(0).standard_normal((2, 8, 4)))
    outs = []
    for seed in (1, 1, 2):
        md.manual_seed(seed)
        outs.append(F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_keeps_the_dtype_and_is_stable_for_large_scores(dtype):
    q = md.tensor(np.full((1, 3, 2), 300.0, dtype=dtype), requires_grad=True)  # scores ~ 1e5: e^s overflows
    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    out.sum().backward()
    assert out.dtype == dtype and q.grad.dtype == dtype
    assert np.isfinite(out.numpy()).all() and np.isfinite(q.grad).all()
    np.testing.assert_allclose(out.numpy(), 300.0)  # equal keys: any weights average 300 to 300


@pytest.mark.parametrize(
    ("shapes", "kwargs", "words"),
    [
        (
            ((2, 3), (2, 3), (2, 3)),
            {"attn_mask": np.ones((2, 2), bool), "is_causal": True},
            "should not be set",
        ),
        (((2, 3), (2, 4), (2, 3)), {}, "same last axis"),
        (((2, 3), (2, 3), (5, 3)), {}, "same length"),
        (((2, 3), (2, 3), (2, 3)), {"attn_mask": np.ones((2, 2), np.int64)}, "attn_mask dtype"),
        (((2, 3), (2, 3), (2, 3)), {"attn_mask": np.ones((3, 2), bool)}, "does not broadcast"),
        (((2, 2, 3), (3, 2, 3), (3, 2, 3)), {}, "do not broadcast"),
    ],
)
def test_attention_bad_arguments_raise_runtime_error_as_torch(shapes, kwargs, words):
    q, k, v = (md.tensor(np.ones(s)) for s in shapes)
    with pytest.raises(RuntimeError, match=words):
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    if torch is not None:
        tq, tk, tv = (torch.ones(s, dtype=torch.float64) for s in shapes)
        torch_kwargs = {key: torch.tensor(a) if isinstance(a, np.ndarray) else a for key, a in kwargs.items()}
        with pytest.raises(RuntimeError):
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **torch_kwargs)


def test_attention_mixed_dtypes_raise_runtime_error():
    q32, q64 = md.tensor(np.ones((2, 3), np.float32)), md.tensor(np.ones((2, 3)))
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(q32, q64, q64)


@needs_torch
@pytest.mark.parametrize(
    ("kv_length", "mask", "scale"),
    [(5, "none", None), (5, "causal", None), (7, "causal", 0.3), (3, "causal", None), (6, "bool", None),
     (6, "float", 2.0), (6, "bool-empty-row", None), (0, "none", None), (0, "causal", None)],
)  # fmt: skip
def test_attention_matches_torch(kv_length, mask, scale):
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in ((2, 3, 5, 4), (2, 3, kv_length, 4), (2, 3, kv_length, 6))]
    attn_mask = {
        "bool": rng.random((5, kv_length)) < 0.6,
        "bool-empty-row": np.arange(kv_length) < np.array([[0], [1], [2], [0], [3]]),  # rows 0, 3: no key
        "float": rng.standard_normal((3, 5, kv_length)),
    }.get(mask)
    ours = [md.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    causal = mask == "causal"
    out = F.scaled_dot_product_attention(*ours, attn_mask, is_causal=causal, scale=scale)
    torch_mask = None if attn_mask is None else torch.tensor(attn_mask)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *theirs, torch_mask, is_causal=causal, scale=scale
    )
    g = rng.standard_normal(out.shape)
    out.backward(g)
    expected.backward(torch.tensor(g))
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad, reference.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_integer_inputs_are_runtime_errors_as_torch():
    """torch refuses integer inputs to both ops; layer_norm returned integer zeros, attention failed
    inside NumPy's exp with a casting error."""
    ints = md.tensor(np.ones((2, 3), dtype=np.int64))
    with pytest.raises(RuntimeError, match="layer_norm: expected a floating-point input, got int64"):
        F.layer_norm(ints, 3)
    with pytest.raises(RuntimeError, match="expected floating-point query, key and value, got int64"):
        F.scaled_dot_product_attention(ints, ints, ints)


def test_attention_refuses_a_mask_that_requires_grad():
    """torch differentiates a float mask (a learned bias); this op does not, so a mask that requires grad
    is an error (it returned an output that did not even require grad, and the bias never trained)."""
    q = md.tensor(np.ones((2, 3, 4)), requires_grad=True)
    bias = md.tensor(np.zeros((3, 3)), requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"attn_mask requires grad.*attn_mask.detach\(\)"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=bias)
    with md.no_grad():  # no gradient wanted: the mask is only added
        assert F.scaled_dot_product_attention(q, q, q, attn_mask=bias).shape == (2, 3, 4)
    assert F.scaled_dot_product_attention(q, q, q, attn_mask=bias.detach()).requires_grad


def test_attention_over_no_keys_is_zero():
    """S = 0 (no key at all): every output is an empty weighted sum, 0, and so is every gradient, as in
    torch (max() over the empty score rows raised ValueError before)."""
    q, k, v = (md.tensor(np.ones(s), requires_grad=True) for s in ((2, 3, 4), (2, 0, 4), (2, 0, 5)))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    assert out.shape == (2, 3, 5) and not out.numpy().any() and not q.grad.any()


# ------------------------------------------------------------------------------ the Tensor methods a GPT uses
def test_view_acts_as_reshape():
    x = md.tensor(np.arange(24.0).reshape(2, 3, 4), requires_grad=True)
    y = x.transpose(1, 2).view(2, 12)  # torch's spelling of "heads back into one axis"
    np.testing.assert_array_equal(
        y.numpy(), np.arange(24.0).reshape(2, 3, 4).transpose(0, 2, 1).reshape(2, 12)
    )
    y.backward(np.arange(24.0).reshape(2, 12))
    np.testing.assert_array_equal(x.grad, np.arange(24.0).reshape(2, 4, 3).transpose(0, 2, 1))


def test_slicing_q_k_v_out_of_one_projection_routes_each_gradient_back():
    qkv = md.tensor(np.random.default_rng(4).standard_normal((2, 3, 6)), requires_grad=True)
    grads = [np.full((2, 3, 2), float(i + 1)) for i in range(3)]
    for i, g in enumerate(grads):  # each slice's backward alone (basic indexing: a plain copy)
        qkv[..., 2 * i : 2 * i + 2].backward(g)
    np.testing.assert_array_equal(qkv.grad, np.concatenate(grads, axis=-1))


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.skipif(_try_import_cupy() is None, reason="needs CuPy and a CUDA GPU")
def test_the_ops_on_cupy_arrays_equal_numpy():
    import cupy  # noqa: PLC0415  (only with a GPU)

    rng = np.random.default_rng(5)
    arrays = {
        "w": rng.standard_normal((300, 4)),  # > ONE_HOT_MAX_ROWS: the scatter path (the one-hot one below)
        "small": rng.standard_normal((7, 4)),
        "x": rng.standard_normal((2, 5, 4)),
        "gamma": rng.standard_normal(4),
        "beta": rng.standard_normal(4),
    }
    idx = np.array([[1, 2, 1, 6, 0], [3, 3, 3, 5, 6]])

    def run(device_array):
        t = {name: md.Tensor(device_array(a), requires_grad=True) for name, a in arrays.items()}
        x = F.embedding(idx, t["w"]) + F.embedding(idx, t["small"]) + t["x"]
        x = F.layer_norm(x, (4,), t["gamma"], t["beta"])
        q = x.reshape(2, 5, 2, 2).transpose(1, 2)
        md.manual_seed(0)
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.3)
        out.backward(device_array(np.ones(out.shape)))
        to_host = cupy.asnumpy if device_array is cupy.asarray else np.asarray
        return [to_host(out.data)] + [to_host(t[name].grad) for name in arrays]

    for cpu, gpu in zip(run(np.asarray), run(cupy.asarray)):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------- GELU (exact)
@needs_torch
@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-12), (np.float32, 1e-6)])
def test_exact_gelu_matches_torch(dtype, tol):
    x = np.linspace(-8, 8, 2001).astype(dtype)  # both tails and the curved middle
    ours, theirs = md.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, expected = F.gelu(ours), torch.nn.functional.gelu(theirs)
    out.sum().backward()
    expected.sum().backward()
    assert out.dtype == dtype and ours.grad.dtype == dtype
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=tol, atol=tol)
