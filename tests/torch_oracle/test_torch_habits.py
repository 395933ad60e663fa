"""What a PyTorch user reaches for first, checked the way they would use it:
exact GELU by default, ``cross_entropy(reduction=, ignore_index=, label_smoothing=)``, ``dim=`` on
softmax, and ``Module.load_state_dict`` taking tensors. Values and gradients against PyTorch itself in
float64 (skipped where torch is not installed) and against central finite differences (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import numerical_gradient
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist as md
from minidist import nn
from minidist.nn import functional as F

CROSS_ENTROPY_CASES = [
    dict(reduction=r, ignore_index=i, label_smoothing=e)
    for r in ("mean", "sum", "none")
    for i in (-100, 1)
    for e in (0.0, 0.1, 1.0)
]


def _ours_and_grad(fn, x: np.ndarray, weights: np.ndarray | None = None):
    """fn(x) and the gradient of sum(fn(x) * weights) with respect to x, in minidist."""
    t = md.tensor(x.copy(), dtype=np.float64, requires_grad=True)
    y = fn(t)
    y.backward(np.ones(y.shape) if weights is None else weights)
    return y.numpy(), t.grad


def _torch_and_grad(fn, x: np.ndarray, weights: np.ndarray | None = None):
    torch = pytest.importorskip("torch")
    t = torch.tensor(x, requires_grad=True)
    y = fn(t)
    y.backward(torch.ones_like(y) if weights is None else torch.tensor(weights))
    return y.detach().numpy(), t.grad.numpy()


# ------------------------------------------------------------------------------------------- GELU
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch_exact_by_default_and_tanh_on_request(approximate):
    torch = pytest.importorskip("torch")
    x = np.linspace(-6, 6, 240).reshape(3, -1)
    kwargs = {} if approximate == "none" else {"approximate": "tanh"}  # the default must be torch's
    ours = _ours_and_grad(lambda t: F.gelu(t, **kwargs), x)
    theirs = _torch_and_grad(lambda t: torch.nn.functional.gelu(t, **kwargs), x)
    module = nn.GELU(**kwargs)(md.tensor(x, dtype=np.float64)).numpy()
    # atol: in the far left tail 1 + tanh(u) cancels, so the tanh form keeps ~1e-15 absolute accuracy
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(module, theirs[0], rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@settings(max_examples=15, deadline=None)
@given(x=st.lists(st.floats(-4, 4), min_size=1, max_size=6))
def test_gelu_gradient_matches_finite_differences(approximate, x):
    x = np.array(x)
    r = np.random.default_rng(0).standard_normal(x.shape)
    _, grad = _ours_and_grad(lambda t: F.gelu(t, approximate=approximate), x, r)

    def loss(a):
        return float((F.gelu(md.tensor(a, dtype=np.float64), approximate=approximate).numpy() * r).sum())

    np.testing.assert_allclose(grad, numerical_gradient(loss, x.copy()), rtol=1e-5, atol=1e-5)


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ValueError, match="approximate must be 'none'.*or 'tanh', got 'erf'"):
        F.gelu(md.tensor(np.ones(2)), approximate="erf")
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU(approximate="fast")


# ---------------------------------------------------------------------------------- cross entropy
@pytest.mark.parametrize("kwargs", CROSS_ENTROPY_CASES, ids=str)
def test_cross_entropy_options_match_torch(kwargs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    logits, targets = rng.standard_normal((7, 4)) * 3, np.array([0, 1, 3, 1, 2, 1, 0])
    weights = rng.standard_normal(7) if kwargs["reduction"] == "none" else None
    ours = _ours_and_grad(lambda t: F.cross_entropy(t, targets, **kwargs), logits, weights)
    theirs = _torch_and_grad(
        lambda t: torch.nn.functional.cross_entropy(t, torch.tensor(targets), **kwargs), logits, weights
    )
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kwargs", CROSS_ENTROPY_CASES, ids=str)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_cross_entropy_gradient_matches_finite_differences(kwargs, data):
    n, c = data.draw(st.integers(1, 5)), data.draw(st.integers(2, 4))
    targets = np.array(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
    targets[: data.draw(st.integers(0, n - 1))] = kwargs["ignore_index"] if kwargs["ignore_index"] < 0 else 0
    logits = np.random.default_rng(n * c).standard_normal((n, c)) * 2
    r = np.random.default_rng(2).standard_normal(n) if kwargs["reduction"] == "none" else None
    _, grad = _ours_and_grad(lambda t: F.cross_entropy(t, targets, **kwargs), logits, r)

    def loss(a):
        y = F.cross_entropy(md.tensor(a, dtype=np.float64), targets, **kwargs).numpy()
        return float((y * (1.0 if r is None else r)).sum())

    np.testing.assert_allclose(grad, numerical_gradient(loss, logits.copy()), rtol=1e-5, atol=1e-5)


def test_cross_entropy_mean_over_only_ignored_targets_is_nan_as_torch():
    loss = F.cross_entropy(md.tensor(np.zeros((2, 3)), dtype=np.float64), np.array([-100, -100]))
    assert np.isnan(loss.numpy())


def test_cross_entropy_rejects_bad_options_with_what_to_pass():
    logits = md.tensor(np.zeros((2, 3)), dtype=np.float64)
    with pytest.raises(ValueError, match="'mean', 'sum' or 'none', got 'avg'"):
        F.cross_entropy(logits, np.array([0, 1]), reduction="avg")
    with pytest.raises(ValueError, match=r"label_smoothing must lie in \[0, 1\], got 1.5"):
        F.cross_entropy(logits, np.array([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"\[0, 3\) or equal ignore_index=-100, got values from -1"):
        F.cross_entropy(logits, np.array([-1, 1]))


# ----------------------------------------------------------------------------------- dim keywords
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_takes_torchs_dim_keyword(name):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((3, 4, 5))
    for dim in (0, 1, -1):
        ours = getattr(F, name)(md.tensor(x, dtype=np.float64), dim=dim).numpy()
        theirs = getattr(torch.nn.functional, name)(torch.tensor(x), dim=dim).numpy()
        np.testing.assert_allclose(ours, theirs, rtol=1e-14, atol=1e-15)
        np.testing.assert_array_equal(
            ours, getattr(F, name)(md.tensor(x, dtype=np.float64), axis=dim).numpy()
        )
    with pytest.raises(TypeError, match="dim=0 and axis=1"):
        getattr(F, name)(md.tensor(x, dtype=np.float64), dim=0, axis=1)


# -------------------------------------------------------------------------------- load_state_dict
def test_load_state_dict_takes_tensors_parameters_lists_and_torch_tensors():
    torch = pytest.importorskip("torch")
    md.manual_seed(0)
    source, target = nn.Linear(3, 2, dtype=np.float64), nn.Linear(3, 2, dtype=np.float64)
    expected = source.state_dict()
    for sd in (
        {k: md.tensor(v, dtype=np.float64) for k, v in expected.items()},
        dict(source.named_parameters()),
        {k: v.tolist() for k, v in expected.items()},
        {k: torch.tensor(v) for k, v in expected.items()},
    ):
        nn.Linear(3, 2, dtype=np.float64).load_state_dict(sd)  # a fresh model each time, and ours:
        target.weight.data[...] = 0
        assert target.load_state_dict(sd) == ([], [])
        for name, value in target.state_dict().items():
            np.testing.assert_array_equal(value, expected[name])


def test_load_state_dict_reports_keys_and_shapes_as_torch():
    model = nn.Linear(3, 2, dtype=np.float64)
    with pytest.raises(
        KeyError, match=r"missing keys \['bias'\], unexpected keys \['b'\]; pass strict=False"
    ):
        model.load_state_dict({"weight": np.zeros((2, 3)), "b": np.zeros(2)})
    result = model.load_state_dict(
        {"weight": md.tensor(np.ones((2, 3)), dtype=np.float64), "b": np.zeros(2)}, strict=False
    )
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["b"]
    np.testing.assert_array_equal(model.weight.data, 1.0)
    with pytest.raises(ValueError, match=r"'weight' has shape \(3, 2\) in the state dict but \(2, 3\)"):
        model.load_state_dict({"weight": md.tensor(np.zeros((3, 2)), dtype=np.float64), "bias": np.zeros(2)})
