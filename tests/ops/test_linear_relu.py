"""The fused Linear + ReLU (minidist/ops/linear_relu.py) and where ``nn.Sequential`` uses it.

Fusing is only allowed because it changes nothing a user can see but the time: the same numbers bit
for bit as ``relu(linear(...))`` (forward and every gradient, float32 and float64, 1-3 axes, with and
without bias), the same errors, and only for a plain ``nn.Linear`` followed by a plain ``nn.ReLU``.
Its gradient against finite differences: tests/ops/test_gradcheck.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist import nn
from minidist.nn import functional as F
from minidist.ops.linear_relu import LinearReLU, linear_relu


def _leaves(arrays):
    return [md.tensor(a.copy(), requires_grad=True) for a in arrays]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(6, 4), (2, 3, 4), (4,)], ids=["2d", "3d", "1d"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_fused_equals_linear_then_relu_bit_for_bit(dtype, shape, bias):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(dtype) for s in (shape, (5, 4), (5,))][: 3 if bias else 2]
    g = rng.standard_normal((*shape[:-1], 5)).astype(dtype)
    fused, plain = _leaves(arrays), _leaves(arrays)
    y_fused, y_plain = linear_relu(*fused), F.relu(F.linear(*plain))
    assert type(y_fused.grad_fn) is LinearReLU and y_fused.dtype == dtype
    y_fused.backward(g)
    y_plain.backward(g)
    assert np.array_equal(y_fused.data, y_plain.data) and (y_fused.data == 0).any()
    for a, b in zip(fused, plain):
        assert np.array_equal(a.grad, b.grad)


def test_fused_errors_are_linears():
    x, w = md.tensor(np.ones((2, 3), np.float32)), md.tensor(np.ones((4, 5), np.float32), requires_grad=True)
    with pytest.raises(ValueError, match=r"linear: input of shape \(2, 3\) and weight of shape \(4, 5\)"):
        linear_relu(x, w)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):
        linear_relu(md.tensor(np.ones((2, 5))), w)
    with pytest.raises(ValueError, match=r"Linear\(3, 4\) got input of shape \(2, 5\)"):
        nn.Sequential(nn.Linear(3, 4), nn.ReLU())(md.tensor(np.ones((2, 5), np.float32)))


def _ops_of(y):
    """The graph's op types from ``y`` back to the leaves (a chain here)."""
    names = []
    while y.grad_fn is not None:
        names.append(type(y.grad_fn).__name__)
        y = next(t for t in y.grad_fn.inputs if t.requires_grad)
    return names


class MyReLU(nn.ReLU):
    pass


def test_sequential_fuses_only_a_plain_linear_followed_by_a_plain_relu():
    md.manual_seed(0)
    x = md.tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    layers = [nn.Linear(4, 4), nn.ReLU(), nn.ReLU(), nn.Linear(4, 4), MyReLU(), nn.Linear(4, 2), nn.ReLU()]
    # forward order: fused pair, a lone ReLU, a Linear before a ReLU subclass (not fused), fused pair
    assert _ops_of(nn.Sequential(*layers)(x))[::-1] == ["LinearReLU", "ReLU", "Linear", "ReLU", "LinearReLU"]
    replaced = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    calls = []
    original = replaced[0].forward
    object.__setattr__(replaced[0], "forward", lambda t: calls.append(1) or original(t))  # as FSDP's units
    assert _ops_of(replaced(x)) == ["ReLU", "Linear"] and calls == [1]


def test_sequential_results_and_gradients_are_unchanged_by_fusing():
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    x = md.tensor(np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32))
    model(x).sum().backward()
    fused = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    h = x
    for m in model:  # one module at a time: nothing fused
        h = m(h)
    h.sum().backward()
    for a, p in zip(fused, model.parameters()):
        assert np.array_equal(a, p.grad)


def test_under_autocast_the_pair_runs_unfused():
    md.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = md.tensor(np.ones((2, 4), np.float32))
    with md.autocast("bfloat16"):
        y = seq(x)
    assert type(y.grad_fn).__name__ == "ReLU"


@pytest.mark.parametrize("cls", [nn.Linear, nn.ReLU])
def test_a_forward_patched_on_the_class_still_runs(cls, monkeypatch):
    # A spy or a leaky ReLU patched onto the class (as on torch.nn.ReLU) must run, as it does unfused.
    calls, original = [], cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, t: calls.append(cls) or original(self, t))
    md.manual_seed(0)
    y = nn.Sequential(nn.Linear(4, 4), nn.ReLU())(md.tensor(np.ones((2, 4), np.float32), requires_grad=True))
    assert calls == [cls] and _ops_of(y) == ["ReLU", "Linear"]


@pytest.mark.parametrize("name", ["linear", "relu"])
def test_a_patched_functional_still_runs(name, monkeypatch):
    # nn.Linear and nn.ReLU call nn.functional's linear and relu (as torch's modules call torch's F).
    calls, original = [], getattr(F, name)
    monkeypatch.setattr(F, name, lambda *a: calls.append(name) or original(*a))
    md.manual_seed(0)
    y = nn.Sequential(nn.Linear(4, 4), nn.ReLU())(md.tensor(np.ones((2, 4), np.float32), requires_grad=True))
    assert calls == [name] and _ops_of(y) == ["ReLU", "Linear"]


def test_the_memory_tracker_measures_the_fused_graph_that_runs_without_it():
    # The tracker wraps every module's forward to name the ops; that must not turn the fusion off, or it
    # would report (and enforce a budget on) one more (rows, out) array per pair than training holds.
    from minidist.memory import MemoryTracker, activations

    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    x = md.tensor(np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32))
    with MemoryTracker(None):  # no module wrapped: the graph training builds
        y = model(x)
        untracked = activations.held()
    del y
    with MemoryTracker(model) as tracker:
        y = model(x)
        assert _ops_of(y) == ["Linear", "LinearReLU"] and activations.held() == untracked
    assert tracker.report()["activations"]["peak"] == untracked
    assert "forward" not in model[0].__dict__ and "forward_relu" not in model[0].__dict__  # undone


@pytest.mark.parametrize("bias", [0.5, [0.25, -0.5, 0.0, 1.0, 2.0]], ids=["float", "list"])
def test_a_bias_that_linear_takes_without_a_shape_works_fused_too(bias):
    rng = np.random.default_rng(4)
    x = md.tensor(rng.standard_normal((3, 4)).astype(np.float32))
    w = md.tensor(rng.standard_normal((5, 4)).astype(np.float32), requires_grad=True)
    assert np.array_equal(linear_relu(x, w, bias).data, F.relu(F.linear(x, w, bias)).data)


def test_a_users_wrapper_over_the_trackers_forward_still_runs():
    # functools.wraps copies a wrapped function's attributes: the tracker's wrappers must not be known by
    # one, or a user's wrapper of them would be skipped as "only observes" too.
    import functools

    from minidist.memory import MemoryTracker

    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    calls = []
    with MemoryTracker(model):
        tracked = model[1].forward

        @functools.wraps(tracked)
        def spy(t):
            calls.append(1)
            return tracked(t)

        object.__setattr__(model[1], "forward", spy)
        y = model(md.tensor(np.ones((2, 4), np.float32), requires_grad=True))
    assert calls == [1] and _ops_of(y) == ["ReLU", "Linear"]
