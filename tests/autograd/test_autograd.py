"""The autograd engine's contract: accumulation, graph walking, grad mode, dtypes, hooks and errors.

The numerical correctness of each op's derivative is checked in ``test_gradcheck.py``; this file
checks what ``Tensor.backward`` does with those derivatives, and how misuse is reported.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest
import strategies as S
from hypothesis import given
from hypothesis import strategies as st

import minidist as md
from minidist.autograd import enable_grad, queue_callback, run_backward
from minidist.nn import functional as F


def leaf(values, dtype=np.float64) -> md.Tensor:
    return md.tensor(np.asarray(values, dtype=dtype), dtype=dtype, requires_grad=True)


# ---------------------------------------------------------------------------------- accumulation
def test_backward_accumulates_into_grad_across_calls():
    x = leaf([1.0, 2.0, 3.0])
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad, [2.0, 4.0, 6.0])
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad, [5.0, 7.0, 9.0])  # 2x + 3, torch semantics: no reset


def test_backward_into_a_fresh_grad_does_not_alias_the_seed_gradient():
    x = leaf([1.0, 2.0])
    seed = np.array([1.0, 1.0])
    x.backward(seed)  # a leaf is its own output: the first .grad must be a copy of the seed
    seed[0] = 100.0
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])


@given(data=st.data())
def test_accumulated_grad_equals_sum_of_separate_grads(data):
    shape = data.draw(S.shapes())
    x0, r1, r2 = (data.draw(S.arrays(shape)) for _ in range(3))
    x = leaf(x0)
    x.tanh().backward(r1)
    first = x.grad.copy()
    (x * x).backward(r2)
    np.testing.assert_allclose(x.grad, first + 2 * x0 * r2, rtol=1e-12)


def test_value_used_twice_gets_summed_gradient():
    x = leaf([3.0, -2.0])
    (x * x).sum().backward()  # d(x²)/dx = x + x: both uses contribute
    np.testing.assert_allclose(x.grad, [6.0, -4.0])

    y = leaf([0.5])
    (y + y + y).sum().backward()
    np.testing.assert_allclose(y.grad, [3.0])


def test_fan_out_of_an_intermediate_gets_summed_gradient():
    x = leaf([0.3, -0.7])
    e = x.exp()  # used by three consumers below
    (e * e + e - e.tanh()).sum().backward()
    ex = np.exp([0.3, -0.7])
    np.testing.assert_allclose(x.grad, (2 * ex + 1 - (1 - np.tanh(ex) ** 2)) * ex, rtol=1e-12)


def test_long_chain_of_50000_ops_backpropagates_without_recursion_error():
    x = leaf([1.0])
    y = x
    for _ in range(50_000):
        y = y + 1.0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [1.0])
    assert y.numpy()[0] == 50_001.0


def test_only_inputs_that_require_grad_receive_gradients():
    x = leaf([1.0, 2.0])
    c = md.tensor(np.array([3.0, 4.0]), dtype=np.float64)  # a constant
    (x * c).sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 4.0])
    assert c.grad is None and not c.requires_grad


def test_intermediate_tensors_are_not_leaves_and_keep_no_grad():
    x = leaf([1.0, 2.0])
    h = x * 2.0
    h.sum().backward()
    assert x.is_leaf and not h.is_leaf
    assert h.grad is None


def test_detach_cuts_the_graph():
    x = leaf([1.0, 2.0])
    d = (x * 2.0).detach()
    assert not d.requires_grad and d.is_leaf
    ((x + d) * 1.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])


# ------------------------------------------------------------------------------- backward misuse
def test_backward_on_non_scalar_without_grad_raises_and_names_the_shape():
    y = leaf(np.ones((2, 3))) * 2.0
    with pytest.raises(RuntimeError, match=r"\(2, 3\)"):
        y.backward()


def test_backward_with_grad_of_wrong_shape_raises():
    y = leaf(np.ones((2, 3))) * 2.0
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(2, 3\)"):
        y.backward(np.ones((3, 2)))
    with pytest.raises(ValueError):
        y.backward(np.ones(()))  # no silent broadcasting of the seed either


def test_backward_on_tensor_that_does_not_require_grad_raises():
    c = md.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="does not require grad"):
        c.sum().backward()


# -------------------------------------------------------------------------------------- grad mode
def test_no_grad_records_no_graph():
    x = leaf([1.0, 2.0])
    with md.no_grad():
        assert not md.is_grad_enabled()
        y = (x * 2.0).exp().sum()
    assert not y.requires_grad and y.is_leaf
    assert md.is_grad_enabled()
    assert (x * 2.0).requires_grad  # recording is back on


def test_no_grad_restores_grad_mode_after_an_exception():
    with pytest.raises(ZeroDivisionError), md.no_grad():
        raise ZeroDivisionError
    assert md.is_grad_enabled()


def test_nested_no_grad_restores_the_outer_mode():
    with md.no_grad():
        with md.no_grad():
            pass
        assert not md.is_grad_enabled()
    assert md.is_grad_enabled()


def test_no_grad_works_as_a_decorator_and_one_object_can_be_entered_twice():
    # As torch.no_grad: a decorator too. The decorator enters the same object on every call, so a
    # recursive call enters it while it is still entered: the mode must come back step by step.
    seen = []

    @md.no_grad()
    def depth(n: int) -> None:
        seen.append(md.is_grad_enabled())
        if n:
            depth(n - 1)

    depth(2)
    assert seen == [False, False, False] and md.is_grad_enabled()
    mode = enable_grad()
    with md.no_grad(), mode:
        with mode:
            assert md.is_grad_enabled()
        assert md.is_grad_enabled()  # the outer `with mode` is still open
    assert md.is_grad_enabled()


def test_enable_grad_records_inside_no_grad():
    x = leaf([1.0, 2.0])
    with md.no_grad():
        with enable_grad():
            y = (x * 3.0).sum()
        assert not md.is_grad_enabled()
    assert y.requires_grad
    run_backward(y, np.ones(()))  # the graph walk alone: no pass, no end-of-pass callbacks
    np.testing.assert_array_equal(x.grad, [3.0, 3.0])


# ------------------------------------------------------------------------------------------ dtypes
def test_tensor_keeps_array_dtypes_and_makes_python_floats_float32():
    assert md.tensor(np.ones(3)).dtype == np.float64  # an array keeps its dtype, as torch.tensor
    assert md.tensor([1.5, 2.5]).dtype == np.float32  # Python floats: the default dtype
    assert md.tensor(np.ones(3), dtype=np.float64).dtype == np.float64
    assert md.tensor(np.array([0, 3, 1])).dtype == np.int64
    assert md.tensor(np.array([0, 3], dtype=np.int32)).dtype == np.int32
    assert md.tensor([True, False]).dtype == np.bool_


def test_requires_grad_on_integer_tensor_raises_type_error():
    with pytest.raises(TypeError, match="int"):
        md.tensor([1, 2], requires_grad=True)


def test_numpy_returns_a_host_copy():
    t = md.tensor(np.ones(3, dtype=np.float32))
    host = t.numpy()
    assert isinstance(host, np.ndarray) and host.dtype == np.float32 and t.shape == (3,) and t.ndim == 1
    host[0] = 5.0
    assert t.data[0] == 1.0


FLOAT32_SCALAR_OPS = {
    "a + 2.0": lambda a: a + 2.0,
    "2.0 + a": lambda a: 2.0 + a,
    "1 - a": lambda a: 1 - a,
    "a * 0.1": lambda a: a * 0.1,
    "a / 3": lambda a: a / 3,
    "3.0 / a": lambda a: 3.0 / a,
    "a ** 2": lambda a: a**2,
    "a ** 0.5": lambda a: a**0.5,
    "np.float64(2) * a": lambda a: np.float64(2.0) * a,
    "-a": lambda a: -a,
    "exp": lambda a: a.exp(),
    "log": lambda a: a.log(),
    "tanh": lambda a: a.tanh(),
    "sigmoid": lambda a: a.sigmoid(),
    "relu": lambda a: a.relu(),
    "gelu": F.gelu,
    "sum": lambda a: a.sum(),
    "mean": lambda a: a.mean(),
    "max": lambda a: a.max(),
    "softmax": F.softmax,
    "log_softmax": F.log_softmax,
    "matmul": lambda a: a @ a.T,
    "getitem": lambda a: a[np.array([0, 0])],
    "cross_entropy": lambda a: F.cross_entropy(a, np.array([0, 2])),
    "dropout": lambda a: F.dropout(a, 0.5, training=True),
}


@pytest.mark.parametrize("name", sorted(FLOAT32_SCALAR_OPS))
def test_float32_stays_float32_through_ops_with_python_scalars(name):
    a = md.tensor([[0.5, 1.0, 2.0], [1.5, 0.25, 3.0]], requires_grad=True)
    assert a.dtype == np.float32
    out = FLOAT32_SCALAR_OPS[name](a)
    assert out.dtype == np.float32, f"{name} gave {out.dtype}"


GRADIENT_DTYPE_OPS = {
    **FLOAT32_SCALAR_OPS,
    "max over axis": lambda a: a.max(axis=1),
    "sum over axis": lambda a: a.sum(axis=0),
    "mean over axis": lambda a: a.mean(axis=-1, keepdims=True),
    "reshape": lambda a: a.reshape(3, 2),
    "transpose": lambda a: a.transpose(1, 0),
    "broadcast add": lambda a: a + md.tensor(np.ones(3, dtype=np.float32)),
}


@pytest.mark.parametrize("name", sorted(GRADIENT_DTYPE_OPS))
def test_gradient_has_the_dtype_of_its_tensor(name):
    a = md.tensor([[0.5, 1.0, 2.0], [1.5, 0.25, 3.0]], requires_grad=True)
    out = GRADIENT_DTYPE_OPS[name](a)
    out.backward(np.ones(out.shape, dtype=np.float32))
    assert a.grad.dtype == np.float32, f"{name}: float32 tensor got a {a.grad.dtype} gradient"


def test_integer_tensor_plus_float_scalar_is_not_truncated():
    # torch.tensor([1, 2]) + 0.5 == tensor([1.5, 2.5]): a Python float promotes an integer tensor.
    out = md.tensor([1, 2]) + 0.5
    np.testing.assert_allclose(out.numpy(), [1.5, 2.5])


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid"])
def test_float_function_of_an_integer_tensor_is_float32_and_feeds_a_linear_layer(name):
    # torch: torch.tensor([1, 3]).log() is float32. A user log-scales integer counts and feeds them
    # to a float32 layer; NumPy's float64 made Linear raise "mat1 and mat2 must have the same dtype".
    counts = md.tensor(np.array([[1, 3, 7]]))
    features = getattr(counts, name)()
    assert features.dtype == np.float32, f"{name}: {features.dtype}"
    assert md.nn.Linear(3, 2)(features).dtype == np.float32
    torch = pytest.importorskip("torch")
    expected = getattr(torch.tensor([[1, 3, 7]]), name)()
    np.testing.assert_allclose(features.numpy(), expected.numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "reduce",
    [
        lambda x: x.sum(),
        lambda x: x.mean(),
        lambda x: x.max(),
        lambda x: F.cross_entropy(x, np.array([1, 0])),
    ],
    ids=["sum", "mean", "max", "cross_entropy"],
)
def test_full_reduction_data_is_a_0d_backend_array(reduce):
    # docs/design.md, public API contract: x.data is a numpy.ndarray on CPU; a bare NumPy scalar cannot
    # be written in place (loss.data[...] = ..., or an in-place all_reduce of a loss).
    out = reduce(md.tensor(np.ones((2, 3)), requires_grad=True))
    assert isinstance(out.data, np.ndarray) and out.shape == ()


def test_item_returns_a_python_number_and_rejects_many_elements():
    assert md.tensor([[2.5]]).item() == 2.5
    with pytest.raises(ValueError, match=r"\(2,\)"):
        md.tensor([1.0, 2.0]).item()


# ---------------------------------------------------------------------------- shape errors of ops
def test_matmul_shape_mismatch_error_names_both_shapes():
    a, b = md.tensor(np.ones((2, 3))), md.tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        a @ b


def test_matmul_batch_mismatch_error_names_both_shapes():
    a, b = md.tensor(np.ones((2, 3, 4))), md.tensor(np.ones((3, 4, 5)))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(3, 4, 5\)"):
        a @ b


def test_matmul_of_a_vector_raises_value_error():
    with pytest.raises(ValueError, match=r"\(3,\)"):
        md.tensor(np.ones((2, 3))) @ md.tensor(np.ones(3))


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv])
def test_incompatible_broadcast_error_names_both_shapes(op):
    a, b = md.tensor(np.ones((2, 3))), md.tensor(np.ones((4,)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
        op(a, b)


def test_pow_with_a_tensor_exponent_raises_type_error():
    a = leaf([1.0, 2.0])
    with pytest.raises(TypeError, match="exponent"):
        a ** md.tensor([2.0, 2.0])
    with pytest.raises(TypeError, match="exponent"):
        a ** np.array([2.0, 2.0])


def test_pow_zero_exponent_has_zero_gradient_everywhere():
    # d/dx x^0 = 0, also at x = 0 (PyTorch returns 0 there, not 0 * inf = nan).
    x = leaf([0.0, 2.0])
    (x**0).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0])


def test_reductions_accept_an_explicit_axis():
    a = np.arange(6.0).reshape(2, 3)
    x = md.tensor(a, dtype=np.float64)
    np.testing.assert_array_equal(x.sum(axis=0).numpy(), a.sum(axis=0))
    np.testing.assert_array_equal(x.mean(axis=(0, 1)).numpy(), a.mean())
    np.testing.assert_array_equal(x.max(axis=-1, keepdims=True).numpy(), a.max(axis=-1, keepdims=True))


@pytest.mark.parametrize("axis", [2, -3, (0, 0), (1, -1)])
def test_reduction_axis_out_of_range_or_repeated_raises(axis):
    x = md.tensor(np.ones((2, 3)))
    for reduce in (x.sum, x.mean, x.max):
        with pytest.raises(ValueError, match="axis"):
            reduce(axis=axis)


def test_reshape_to_wrong_size_raises_and_names_both():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 2\)"):
        md.tensor(np.ones((2, 3))).reshape(4, 2)


def test_permute_with_non_permutation_raises():
    with pytest.raises(ValueError, match="repeat"):
        md.tensor(np.ones((2, 3))).permute(0, 0)


# ------------------------------------------------------------------------------ hooks, callbacks
def test_post_accumulate_grad_hook_fires_once_per_leaf_per_backward_after_accumulation():
    x, w = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    seen: list[tuple[str, np.ndarray]] = []
    x.register_post_accumulate_grad_hook(lambda t: seen.append(("x", t.grad.copy())))
    w.register_post_accumulate_grad_hook(lambda t: seen.append(("w", t.grad.copy())))

    (x * w + x * x).sum().backward()  # x is used three times: still one call, with the full sum
    assert sorted(name for name, _ in seen) == ["w", "x"]
    grads = dict(seen)
    np.testing.assert_allclose(grads["x"], [3.0 + 2.0, 4.0 + 4.0])
    np.testing.assert_allclose(grads["w"], [1.0, 2.0])

    seen.clear()
    (x * 1.0).sum().backward()  # the next backward: only x is reached; it sees the accumulated grad
    assert [name for name, _ in seen] == ["x"]
    np.testing.assert_allclose(seen[0][1], [6.0, 9.0])


def test_post_accumulate_grad_hook_on_non_leaf_raises():
    h = leaf([1.0]) * 2.0
    with pytest.raises(RuntimeError, match="leaf"):
        h.register_post_accumulate_grad_hook(lambda t: None)


def test_queue_callback_runs_once_after_backward_finishes():
    x, w = leaf([1.0, 2.0]), leaf([3.0])
    events: list[str] = []

    def callback() -> None:
        # every leaf has its gradient by now
        events.append(f"callback x={x.grad is not None} w={w.grad is not None}")

    def hook(t: md.Tensor) -> None:
        events.append("hook")
        queue_callback(callback)

    x.register_post_accumulate_grad_hook(hook)
    (x * w).sum().backward()
    assert events == ["hook", "callback x=True w=True"]
    (x * w).sum().backward()  # the queue was emptied: the callback runs once per queueing
    assert events.count("callback x=True w=True") == 2


def test_queue_callback_outside_backward_raises():
    with pytest.raises(RuntimeError, match="backward"):
        queue_callback(lambda: None)


def test_callback_queued_by_a_failed_backward_does_not_leak_into_the_next():
    calls: list[str] = []
    x = leaf([1.0])

    def hook(t: md.Tensor) -> None:
        queue_callback(lambda: calls.append("stale"))
        raise KeyError("hook failed")

    x.register_post_accumulate_grad_hook(hook)
    with pytest.raises(KeyError):
        (x * 2.0).sum().backward()
    assert md.is_grad_enabled()
    with pytest.raises(RuntimeError):
        queue_callback(lambda: None)  # the engine has left backward mode

    y = leaf([1.0])
    (y * 2.0).sum().backward()  # an unrelated backward must not run the failed one's callback
    assert calls == []


# ---------------------------------------------------------------------------- cross-entropy misuse
def _logits() -> md.Tensor:
    return md.tensor(np.zeros((3, 4)), requires_grad=True)


@pytest.mark.parametrize("targets", [[0, 1, 4], [-1, 0, 1]], ids=["too-large", "negative"])
def test_cross_entropy_rejects_targets_outside_the_class_range(targets):
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        F.cross_entropy(_logits(), np.array(targets))


def test_cross_entropy_rejects_float_targets():
    with pytest.raises(TypeError, match="integer"):
        F.cross_entropy(_logits(), np.array([0.0, 1.0, 2.0]))


def test_cross_entropy_rejects_wrong_target_count():
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        F.cross_entropy(_logits(), np.array([0, 1]))


def test_cross_entropy_rejects_logits_that_are_not_2d():
    with pytest.raises(ValueError, match=r"\(N, C\).*\(12,\)"):
        F.cross_entropy(md.tensor(np.zeros(12)), np.array([0]))


def test_cross_entropy_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(_logits(), np.array([0, 1, 2]), reduction="elementwise")


def test_cross_entropy_accepts_target_tensor_and_matches_numpy():
    logits = np.array([[1.0, 2.0, 0.5], [0.1, -1.0, 3.0]])
    targets = np.array([1, 2])
    out = F.cross_entropy(md.tensor(logits, dtype=np.float64), md.tensor(targets))
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    assert out.item() == pytest.approx(-log_p[[0, 1], targets].mean(), rel=1e-12)


class _BareArrayBackward(md.Function):
    def forward(self, a):
        return a * 2

    def backward(self, grad):
        return grad * 2  # mistake: not a tuple


class _WrongShapeBackward(md.Function):
    def forward(self, a):
        return a * 2

    def backward(self, grad):
        return (grad.sum(axis=0),)  # mistake: wrong shape


class _TooFewGradients(md.Function):
    def forward(self, a, b):
        return a * b

    def backward(self, grad):
        return (grad,)  # mistake: one gradient for two inputs


def test_engine_rejects_a_backward_that_returns_a_bare_array():
    x = md.tensor(np.ones((1, 4)), requires_grad=True)
    with pytest.raises(TypeError, match="_BareArrayBackward.backward must return a tuple"):
        _BareArrayBackward.apply(x).sum().backward()


def test_engine_rejects_a_gradient_of_the_wrong_shape():
    x = md.tensor(np.ones((3, 4)), requires_grad=True)
    with pytest.raises(ValueError, match=r"shape \(4,\) for input 0 of shape \(3, 4\)"):
        _WrongShapeBackward.apply(x).sum().backward()


def test_engine_rejects_too_few_gradients():
    a, b = md.tensor(np.ones(3), requires_grad=True), md.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(ValueError, match="returned 1 gradients for 2 inputs"):
        _TooFewGradients.apply(a, b).sum().backward()


def test_parameters_finish_layer_by_layer_from_the_output():
    # DDP starts communicating a bucket as soon as its gradients are final; that needs the last
    # layer's parameters to be finished before backward moves on to earlier layers.
    from minidist import nn

    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    order = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, name=name: order.append(name))
    model(md.tensor(np.ones((5, 3), dtype=np.float32))).sum().backward()
    layers = [int(name.split(".")[0]) for name in order]
    assert layers == sorted(layers, reverse=True), order


def test_a_consumer_outside_the_loss_graph_does_not_block_backward():
    x = md.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 3.0
    dead = y[0:1] * 0.0  # a consumer of y whose output is not used by the loss
    del dead
    (y * y).sum().backward()
    np.testing.assert_allclose(x.grad, 18.0 * x.numpy())


class _StopGradient(md.Function):
    def forward(self, a):
        return a.copy()

    def backward(self, grad):
        return (None,)  # no gradient flows to the input


def test_a_none_gradient_still_releases_the_tensors_below():
    x = md.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * 2.0  # h feeds both a stopped branch and a live one: it must still be processed
    (_StopGradient.apply(h) + h).sum().backward()
    np.testing.assert_allclose(x.grad, [2.0, 2.0])
