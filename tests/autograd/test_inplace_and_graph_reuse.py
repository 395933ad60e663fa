"""In-place changes and graph reuse, as a user meets them, without PyTorch.

1. Changing a tensor in place between forward and backward (``w.data *= 10``, ``optimizer.step()``)
    must raise torch's "modified by an inplace operation" error, not give gradients of the new values.
2. ``with no_grad(): p -= lr * p.grad`` updates ``p`` in place; ``x += 1`` on a leaf that requires grad
    raises torch's "a leaf Variable that requires grad is being used in an in-place operation."
3. A second ``backward()`` through a freed graph raises; ``retain_graph=True`` keeps the graph.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist import nn, optim

INPLACE = "modified by an inplace operation"
SECOND_BACKWARD = "backward through the graph a second time"


def _float32(*shape: int, seed: int = 0) -> md.Tensor:
    return md.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=np.float32)


# -------------------------------------------------------------------------------------- 1: versions
def test_scaling_a_weight_between_forward_and_backward_raises():
    model = nn.Linear(3, 2)
    loss = model(_float32(4, 3)).sum()
    model.weight.data *= 10  # tmp = w.data; tmp *= 10; w.data = tmp: the setter sees it
    with pytest.raises(RuntimeError, match=INPLACE) as err:
        loss.backward()
    assert "Linear" in str(err.value) and "version 1; expected version 0" in str(err.value)


@pytest.mark.parametrize("make_optimizer", [lambda p: optim.SGD(p, lr=0.1), lambda p: optim.AdamW(p, lr=0.1)])
def test_optimizer_step_before_backward_raises(make_optimizer):
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = make_optimizer(model.parameters())
    x = _float32(5, 3)
    model(x).sum().backward()  # gradients exist, so step() really changes the parameters
    loss = model(x).sum()
    opt.step()  # the usual bug: step() and backward() in the wrong order
    with pytest.raises(RuntimeError, match=INPLACE):
        loss.backward()


def test_changing_a_saved_input_under_no_grad_raises_but_an_unsaved_one_does_not():
    x = md.tensor([1.0, 2.0], requires_grad=True)
    c = md.tensor([3.0, 4.0])
    product = (x * c).sum()  # Mul saves c for dL/dx = c
    total = (x + c).sum()  # Add saves nothing: changing c later is harmless (as in torch)
    with md.no_grad():
        c += 1
    with pytest.raises(RuntimeError, match=INPLACE):
        product.backward()
    total.backward()
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])


def test_changing_an_output_that_backward_needs_raises():
    x = md.tensor([0.5, -1.0], requires_grad=True)
    y = x.exp()  # dy/dx = y: exp saves its output
    y.data *= 2
    with pytest.raises(RuntimeError, match=INPLACE):
        y.sum().backward()


def test_a_view_and_its_base_share_the_version():
    w = md.tensor(np.ones((2, 3), dtype=np.float32), requires_grad=True)
    x = md.tensor(np.ones((4, 2), dtype=np.float32))
    loss = (x @ w).sum()  # MatMul saved w
    with md.no_grad():
        w.T.mul_(2)  # changes w through its transposed view
    with pytest.raises(RuntimeError, match=INPLACE):
        loss.backward()


def test_a_change_after_backward_is_fine():
    model = nn.Linear(3, 2)
    model(_float32(4, 3)).sum().backward()
    model.weight.data *= 10
    model(_float32(4, 3)).sum().backward()  # a new forward: new saved versions
    assert model.weight.grad is not None


# ------------------------------------------------------------------------------ 2: in-place operators
def test_sgd_step_by_hand_under_no_grad_updates_the_parameter_in_place():
    p = md.tensor([1.0, 2.0], requires_grad=True)
    (p * p).sum().backward()  # grad = 2p = [2, 4]
    same_array = p.data
    with md.no_grad():
        p -= 0.25 * md.tensor(p.grad)
        p *= 2
        p += 1
        p /= 2
    assert p.is_leaf and p.requires_grad
    np.testing.assert_allclose(p.numpy(), [1.0, 1.5])  # ((1 - .5) * 2 + 1) / 2, ((2 - 1) * 2 + 1) / 2
    assert p.data is same_array  # in place: optimizers and views keep seeing it
    assert p._version == 4


def test_inplace_add_on_a_leaf_that_requires_grad_raises():
    x = md.tensor([1.0, 2.0], requires_grad=True)
    for update in (lambda t: t.__iadd__(1), lambda t: t.add_(1), lambda t: t.zero_(), lambda t: t.mul_(2)):
        with pytest.raises(
            RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"
        ):
            update(x)
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0])


def test_inplace_operator_on_a_non_leaf_gives_torchs_gradient():
    x = md.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y += x  # out of place inside the graph: y = 3x + x
    y *= 2
    y.sum().backward()
    np.testing.assert_array_equal(y.numpy(), [8.0, 16.0])
    np.testing.assert_array_equal(x.grad, [8.0, 8.0])


def test_inplace_methods_on_plain_tensors():
    t = md.tensor([1.0, 2.0, 3.0])
    t.add_(md.tensor([1.0, 1.0, 1.0]), alpha=2).mul_(2).sub_(1).div_(3)
    np.testing.assert_allclose(t.numpy(), [5 / 3, 7 / 3, 3.0])
    t.copy_(md.tensor([7.0, 8.0, 9.0]))
    np.testing.assert_array_equal(t.numpy(), [7.0, 8.0, 9.0])
    t.zero_()
    np.testing.assert_array_equal(t.numpy(), [0.0, 0.0, 0.0])


def test_integer_tensor_divided_in_place_raises_a_clear_error():
    labels = md.tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="can't be cast"):
        labels /= 2


def test_tensor_copies_its_input_so_inplace_updates_stay_inside():
    array = np.ones(3)
    t = md.tensor(array)
    t += 1
    np.testing.assert_array_equal(array, [1.0, 1.0, 1.0])


# ------------------------------------------------------------------------------- 3: graph reuse
def test_second_backward_through_the_same_graph_raises():
    model = nn.Linear(3, 2)
    loss = model(_float32(4, 3)).sum()
    loss.backward()
    first = model.weight.grad.copy()
    with pytest.raises(RuntimeError, match=SECOND_BACKWARD) as err:
        loss.backward()
    assert "retain_graph=True" in str(err.value)
    np.testing.assert_array_equal(model.weight.grad, first)  # nothing was added twice


def test_retain_graph_keeps_the_graph_for_a_second_backward():
    x = md.tensor([1.0, 2.0], requires_grad=True)
    loss = (x * x).sum()
    loss.backward(retain_graph=True)
    loss.backward()  # accumulates: 2x + 2x
    np.testing.assert_array_equal(x.grad, [4.0, 8.0])
    with pytest.raises(RuntimeError, match=SECOND_BACKWARD):
        loss.backward()  # the second one did not retain


def test_two_losses_sharing_a_hidden_layer_need_retain_graph():
    x = md.tensor([1.0, 2.0], requires_grad=True)
    hidden = x.tanh()
    first, second = hidden.sum(), (hidden * hidden).sum()
    first.backward()
    with pytest.raises(RuntimeError, match=SECOND_BACKWARD):
        second.backward()


def test_grad_fn_and_repr_name_the_op():
    x = md.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert x.grad_fn is None and y.grad_fn is not None
    assert type(y.grad_fn).__name__ == "Mul"
    assert "grad_fn=<MulBackward>" in repr(y)
    assert "requires_grad=True" in repr(x) and "grad_fn" not in repr(x)
