"""PyTorch as the oracle: values, gradients and dtypes of the ops match torch's.

Skipped when torch is not installed (``pip install torch --index-url
https://download.pytorch.org/whl/cpu``, the ``bench`` extra); the library never imports it.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist import nn

torch = pytest.importorskip("torch")


def _pair(array: np.ndarray, requires_grad: bool = True) -> tuple[md.Tensor, torch.Tensor]:
    """The same array as a minidist and a torch leaf tensor."""
    return md.tensor(array, requires_grad=requires_grad), torch.tensor(array, requires_grad=requires_grad)


# ------------------------------------------------------------------------------ ---division
@pytest.mark.parametrize(("a", "b"), [(0.0, 1e-30), (1e30, 1e20), (1e-30, 1e-30), (3.0, -7.0)])
def test_division_gradients_match_torch_in_float32_at_the_edges(a, b):
    ma, ta = _pair(np.array([a], dtype=np.float32))
    mb, tb = _pair(np.array([b], dtype=np.float32))
    (ma / mb).sum().backward()
    (ta / tb).sum().backward()
    np.testing.assert_array_equal(ma.grad, ta.grad.numpy())  # bit-identical, NaN and 0 included
    np.testing.assert_array_equal(mb.grad, tb.grad.numpy())
    assert np.isfinite(mb.grad).all()


# ------------------------------------------------------------------------------ ----sigmoid
def test_log_sigmoid_of_the_negative_tail_is_finite_as_in_torch():
    x = np.array([-20.0, -30.0, -50.0, -80.0], dtype=np.float32)
    mx, tx = _pair(x)
    m_out, t_out = mx.sigmoid().log(), torch.log(torch.sigmoid(tx))
    m_out.sum().backward()
    t_out.sum().backward()
    np.testing.assert_allclose(m_out.numpy(), t_out.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(mx.grad, tx.grad.numpy(), rtol=1e-6)  # 1 - sigmoid(x), not NaN


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_matches_torch_on_minus_120_to_120(dtype):
    x = np.linspace(-120, 120, 4801).astype(dtype)
    mx, tx = _pair(x)
    m_out, t_out = mx.sigmoid(), torch.sigmoid(tx)
    m_out.sum().backward()
    t_out.sum().backward()
    expected, grad = t_out.detach().numpy(), tx.grad.numpy()
    # torch's float32 kernel, 1/(1 + e^-x), overflows to exactly 0 below x = -88.7; ours keeps the
    # subnormal values there (closer to the truth), so compare where torch's result is a normal float.
    normal = expected >= np.finfo(dtype).tiny
    assert (m_out.numpy() > 0).all() or dtype == np.float32  # float64 reaches no underflow here
    assert (m_out.numpy()[x > -80] > 0).all()
    rtol = 1e-14 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(m_out.numpy()[normal], expected[normal], rtol=rtol)
    np.testing.assert_allclose(mx.grad[normal], grad[normal], rtol=rtol * 10, atol=0)


# ------------------------------------------------------------------------------ ----transpose
def test_transpose_swaps_two_axes_as_torch():
    x = np.arange(24.0).reshape(2, 3, 4)
    mx, tx = _pair(x)
    for d0, d1 in [(0, 1), (1, 0), (0, 2), (-1, -2), (1, 1)]:
        np.testing.assert_array_equal(mx.transpose(d0, d1).numpy(), tx.transpose(d0, d1).detach().numpy())
    matrix = np.arange(6.0).reshape(2, 3)
    assert md.tensor(matrix).transpose(0, 1).shape == (3, 2)  # it used to be (2, 3), silently


def test_permute_and_T_and_their_gradients_match_torch():
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    weights = np.random.default_rng(1).standard_normal((4, 2, 3))
    mx, tx = _pair(x)
    (mx.permute(2, 0, 1) * md.tensor(weights)).sum().backward()
    (tx.permute(2, 0, 1) * torch.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(mx.grad, tx.grad.numpy())
    m2, t2 = _pair(x[0])
    np.testing.assert_array_equal(m2.T.numpy(), t2.T.detach().numpy())


def test_transpose_out_of_range_raises_index_error_as_torch():
    with pytest.raises(IndexError, match="out of range"):
        md.tensor(np.ones((2, 3))).transpose(0, 2)
    with pytest.raises(IndexError):
        torch.ones(2, 3).transpose(0, 2)


# ------------------------------------------------------------------------------ ----dtypes
DTYPES = {np.float32: torch.float32, np.float64: torch.float64, np.int64: torch.int64, np.int32: torch.int32}


def _same_dtype(m: md.Tensor, t: torch.Tensor) -> bool:
    return DTYPES[np.dtype(m.dtype).type] == t.dtype


@pytest.mark.parametrize(
    "data",
    [
        np.ones(3),
        np.ones(3, dtype=np.float32),
        np.arange(3),
        np.arange(3, dtype=np.int32),
        [1.5, 2.5],
        [1, 2],
        2.5,
    ],
    ids=["f64 array", "f32 array", "int64 array", "int32 array", "float list", "int list", "float"],
)
def test_tensor_constructor_dtype_matches_torch(data):
    assert _same_dtype(md.tensor(data), torch.tensor(data))


OPERANDS = {
    "f32": lambda lib: lib.tensor(np.ones(3, dtype=np.float32)),
    "f64": lambda lib: lib.tensor(np.ones(3, dtype=np.float64)),
    "i64": lambda lib: lib.tensor(np.arange(1, 4, dtype=np.int64)),
    "i32": lambda lib: lib.tensor(np.arange(1, 4, dtype=np.int32)),
    "0-d f64": lambda lib: lib.tensor(np.float64(2.0)),
    "0-d i64": lambda lib: lib.tensor(np.int64(2)),
    "python float": lambda lib: 0.5,
    "python int": lambda lib: 3,
}


@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv"])
@pytest.mark.parametrize("left", ["f32", "f64", "i64", "i32", "0-d f64", "0-d i64"])
@pytest.mark.parametrize("right", sorted(OPERANDS))
def test_binary_op_result_dtype_and_value_match_torch(op, left, right):
    fn = getattr(__import__("operator"), op)
    m = fn(OPERANDS[left](md), OPERANDS[right](md))
    t = fn(OPERANDS[left](torch), OPERANDS[right](torch))
    assert _same_dtype(m, t), f"{left} {op} {right}: minidist {m.dtype}, torch {t.dtype}"
    np.testing.assert_allclose(m.numpy(), t.numpy(), rtol=1e-7)


def test_float32_and_float64_tensors_give_float64_and_each_gradient_its_own_dtype():
    a, ta = _pair(np.array([1.0, 2.0], dtype=np.float32))
    b, tb = _pair(np.array([3.0, 4.0], dtype=np.float64))
    out, t_out = a * b, ta * tb
    assert out.dtype == np.float64 and t_out.dtype == torch.float64
    out.sum().backward()
    t_out.sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64  # torch's: each its input's dtype
    np.testing.assert_array_equal(a.grad, ta.grad.numpy())


def test_float32_linear_on_float64_input_raises_as_torch():
    x = np.ones((2, 3))  # float64, as NumPy makes it
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.nn.Linear(3, 2)(torch.tensor(x))
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 must have the same dtype.*x\.to\(np\.float32\)"):
        nn.Linear(3, 2)(md.tensor(x))
    assert nn.Linear(3, 2)(md.tensor(x).to(np.float32)).dtype == np.float32  # what the message says to do


# ------------------------------------------------------------------------------ ----dim= keywords
def test_reductions_accept_torch_dim_keywords():
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    mx, tx = _pair(x)
    for name in ("sum", "mean"):
        for dim in (0, -1, (0, 2)):
            m = getattr(mx, name)(dim=dim, keepdim=True)
            t = getattr(tx, name)(dim=dim, keepdim=True)
            np.testing.assert_allclose(m.numpy(), t.detach().numpy(), rtol=1e-14)
    np.testing.assert_allclose(md.ops.sum(mx, dim=1).numpy(), tx.sum(dim=1).detach().numpy(), rtol=1e-14)


def test_max_with_dim_returns_values_and_indices_and_its_gradient_as_torch():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])  # a tie in row 0: torch sends the gradient to one
    mx, tx = _pair(x)
    m_values, m_indices = mx.max(dim=1)
    t_values, t_indices = tx.max(dim=1)
    np.testing.assert_array_equal(m_values.numpy(), t_values.detach().numpy())
    np.testing.assert_array_equal(m_indices.numpy(), t_indices.numpy())
    m_values.sum().backward()
    t_values.sum().backward()
    np.testing.assert_array_equal(mx.grad, tx.grad.numpy())
    assert mx.max(dim=0, keepdim=True).values.shape == tuple(tx.max(dim=0, keepdim=True).values.shape)


def test_axis_and_dim_together_raise():
    with pytest.raises(TypeError, match="both axis"):
        md.tensor(np.ones((2, 2))).sum(axis=0, dim=1)


# ------------------------------------------------------------------------------ op by op, float64
UNARY = {
    "exp": (lambda t: t.exp(), torch.exp),
    "log": (lambda t: t.log(), torch.log),
    "tanh": (lambda t: t.tanh(), torch.tanh),
    "sigmoid": (lambda t: t.sigmoid(), torch.sigmoid),
    "relu": (lambda t: t.relu(), torch.relu),
    "neg": (lambda t: -t, lambda t: -t),
    "pow 3": (lambda t: t**3, lambda t: t**3),
    "pow 0.5": (lambda t: t**0.5, lambda t: t**0.5),
    "sum": (lambda t: t.sum(), torch.sum),
    "mean dim 1": (lambda t: t.mean(dim=1), lambda t: t.mean(dim=1)),
    "max": (lambda t: t.max(), torch.amax),
    "reshape": (lambda t: t.reshape(4, 3), lambda t: t.reshape(4, 3)),
    "getitem": (lambda t: t[1:, ::2], lambda t: t[1:, ::2]),
    "matmul self.T": (lambda t: t @ t.T, lambda t: t @ t.T),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_op_values_and_gradients_match_torch_in_float64(name):
    x = np.random.default_rng(3).uniform(0.1, 2.0, size=(3, 4))
    upstream_seed = 4
    mx, tx = _pair(x)
    m_out, t_out = UNARY[name][0](mx), UNARY[name][1](tx)
    g = np.random.default_rng(upstream_seed).standard_normal(m_out.shape)
    m_out.backward(g)
    t_out.backward(torch.tensor(g))
    np.testing.assert_allclose(m_out.numpy(), t_out.detach().numpy(), rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(mx.grad, tx.grad.numpy(), rtol=1e-14, atol=1e-15)


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_broadcast_binary_op_gradients_match_torch_in_float64(name):
    rng = np.random.default_rng(5)
    ma, ta = _pair(rng.uniform(0.5, 2.0, size=(3, 4)))
    mb, tb = _pair(rng.uniform(0.5, 2.0, size=(4,)))
    m_out, t_out = BINARY[name](ma, mb), BINARY[name](ta, tb)
    g = rng.standard_normal((3, 4))
    m_out.backward(g)
    t_out.backward(torch.tensor(g))
    np.testing.assert_allclose(m_out.numpy(), t_out.detach().numpy(), rtol=1e-14)
    np.testing.assert_allclose(ma.grad, ta.grad.numpy(), rtol=1e-14)
    np.testing.assert_allclose(mb.grad, tb.grad.numpy(), rtol=1e-14)


def test_training_an_mlp_with_sgd_matches_torch_in_float64():
    """Five steps of Linear-tanh-Linear, cross-entropy and SGD with momentum: same losses and weights."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 5)), rng.integers(0, 3, 16)
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 3, dtype=np.float64))
    reference = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    with torch.no_grad():
        for p, q in zip(model.parameters(), reference.parameters()):
            q.copy_(torch.tensor(p.data))
    opt = md.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(md.tensor(x)), y)
        ref_loss = torch.nn.functional.cross_entropy(reference(torch.tensor(x)), torch.tensor(y))
        opt.zero_grad()
        ref_opt.zero_grad()
        loss.backward()
        ref_loss.backward()
        opt.step()
        ref_opt.step()
        np.testing.assert_allclose(loss.item(), ref_loss.item(), rtol=1e-14)
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-14, atol=1e-15)
