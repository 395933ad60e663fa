"""minidist.nn: module registration and naming, state dicts, modes, and the layers' arithmetic.

Reference values are computed by hand in NumPy from the layers' documented formulas.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import strategies as S
from hypothesis import given
from hypothesis import strategies as st

import minidist as md
from minidist import nn
from minidist.nn import functional as F


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Block(3)
        self.scale = nn.Parameter(np.ones(3, dtype=np.float32))
        self.head = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Dropout(0.5), nn.Linear(4, 2))

    def forward(self, x):
        return self.head(self.encoder(x) * self.scale)


NET_NAMES = [
    "scale",
    "encoder.fc1.weight",
    "encoder.fc1.bias",
    "encoder.fc2.weight",
    "head.0.weight",
    "head.0.bias",
    "head.3.weight",
    "head.3.bias",
]


# ----------------------------------------------------------------------------------- registration
def test_named_parameters_use_dotted_torch_style_names():
    names = [name for name, _ in Net().named_parameters()]
    assert names == NET_NAMES  # own parameters first, then submodules in assignment order


def test_parameters_match_named_parameters_and_require_grad():
    net = Net()
    params = list(net.parameters())
    assert [id(p) for p in params] == [id(p) for _, p in net.named_parameters()]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf for p in params)


def test_named_modules_walk_nested_modules():
    names = [name for name, _ in Net().named_modules()]
    assert names == ["", "encoder", "encoder.fc1", "encoder.act", "encoder.fc2", "head"] + [
        f"head.{i}" for i in range(4)
    ]


def test_shared_parameter_is_counted_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)
            self.b.weight = self.a.weight  # weight tying

    tied = Tied()
    names = [name for name, _ in tied.named_parameters()]
    assert names == ["a.weight", "a.bias", "b.bias"]
    assert len(list(tied.parameters())) == 3
    assert set(tied.state_dict()) == set(names)


def test_reassigning_an_attribute_unregisters_the_old_parameter():
    lin = nn.Linear(2, 2)
    lin.bias = None
    assert [name for name, _ in lin.named_parameters()] == ["weight"]
    lin.bias = nn.Parameter(np.zeros(2, dtype=np.float32))
    assert [name for name, _ in lin.named_parameters()] == ["weight", "bias"]


def test_plain_tensors_and_arrays_are_not_registered():
    class WithBuffers(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.ones(2, dtype=np.float32))
            self.const = md.tensor([1.0, 2.0])
            self.table = np.arange(3)

    assert [name for name, _ in WithBuffers().named_parameters()] == ["w"]


def test_setting_attributes_before_super_init_raises():
    class Forgetful(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.ones(2))

    with pytest.raises(RuntimeError, match="super"):
        Forgetful()


def test_module_zero_grad_sets_grads_to_none():
    lin = nn.Linear(3, 2)
    lin(md.tensor(np.ones((4, 3), dtype=np.float32))).sum().backward()
    assert all(p.grad is not None for p in lin.parameters())
    lin.zero_grad()
    assert all(p.grad is None for p in lin.parameters())


# ------------------------------------------------------------------------------------- state dict
def test_state_dict_has_every_parameter_under_its_dotted_name():
    net = Net()
    sd = net.state_dict()
    assert list(sd) == NET_NAMES
    for name, p in net.named_parameters():
        np.testing.assert_array_equal(sd[name], p.data)


def test_state_dict_returns_copies():
    net = Net()
    sd = net.state_dict()
    before = net.encoder.fc1.weight.data.copy()
    sd["encoder.fc1.weight"][...] = 123.0
    np.testing.assert_array_equal(net.encoder.fc1.weight.data, before)
    net.encoder.fc1.weight.data[...] = -1.0  # and the other way round
    assert not np.any(sd["encoder.fc1.weight"] == -1.0)


def test_load_state_dict_round_trip_gives_identical_outputs_and_keeps_parameter_objects():
    md.manual_seed(0)
    src = Net().eval()
    md.manual_seed(1)
    dst = Net().eval()
    params_before = [id(p) for p in dst.parameters()]
    x = md.tensor(np.random.default_rng(0).standard_normal((5, 3)), dtype=np.float32)
    assert not np.array_equal(src(x).numpy(), dst(x).numpy())

    dst.load_state_dict(src.state_dict())
    np.testing.assert_array_equal(src(x).numpy(), dst(x).numpy())
    assert [id(p) for p in dst.parameters()] == params_before  # in place: optimizers keep working
    for name, value in src.state_dict().items():
        np.testing.assert_array_equal(dst.state_dict()[name], value)


def test_load_state_dict_strict_reports_missing_and_unexpected_keys():
    net = Net()
    sd = net.state_dict()
    del sd["head.3.bias"]
    sd["head.9.weight"] = np.zeros(2, dtype=np.float32)
    with pytest.raises(KeyError, match=r"missing.*head\.3\.bias.*unexpected.*head\.9\.weight"):
        net.load_state_dict(sd)


def test_load_state_dict_non_strict_loads_the_keys_present():
    net = Net()
    new_scale = np.array([2.0, 3.0, 4.0], dtype=np.float32)
    net.load_state_dict({"scale": new_scale, "not.a.param": np.zeros(1)}, strict=False)
    np.testing.assert_array_equal(net.scale.data, new_scale)


def test_load_state_dict_shape_mismatch_names_the_key_and_both_shapes():
    net = Net()
    sd = net.state_dict()
    sd["encoder.fc1.weight"] = np.zeros((3, 6), dtype=np.float32)
    with pytest.raises(ValueError, match=r"encoder\.fc1\.weight.*\(3, 6\).*\(6, 3\)"):
        net.load_state_dict(sd)


def test_load_state_dict_keeps_parameter_dtype():
    lin = nn.Linear(2, 2)
    lin.load_state_dict({"weight": np.ones((2, 2), dtype=np.float64), "bias": np.zeros(2, dtype=np.float64)})
    assert lin.weight.dtype == np.float32 and lin.bias.dtype == np.float32


# ----------------------------------------------------------------------------------- train / eval
def test_train_and_eval_propagate_to_every_submodule():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    assert net.train() is net
    assert all(m.training for m in net.modules())
    net.train(False)
    assert not net.head[2].training


def test_dropout_is_identity_in_eval_mode():
    drop = nn.Dropout(0.7).eval()
    x = md.tensor(np.random.default_rng(0).standard_normal((4, 5)))
    np.testing.assert_array_equal(drop(x).numpy(), x.numpy())


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_dropout_in_train_mode_zeroes_and_scales_survivors(p):
    md.manual_seed(3)
    x = np.random.default_rng(1).uniform(1.0, 2.0, size=(200, 100)).astype(np.float32)
    y = nn.Dropout(p)(md.tensor(x)).numpy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-6)
    # 20,000 Bernoulli(1-p) draws: the kept fraction is within 5 standard deviations of 1 - p
    assert abs(kept.mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / kept.size)


def test_dropout_masks_are_reproducible_with_manual_seed():
    x = md.tensor(np.ones((8, 8)))
    md.manual_seed(11)
    a = nn.Dropout(0.5)(x).numpy()
    md.manual_seed(11)
    b = nn.Dropout(0.5)(x).numpy()
    c = nn.Dropout(0.5)(x).numpy()  # the generator moved on: a new mask
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(b, c)


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_dropout_probability_outside_unit_interval_raises(p):
    with pytest.raises(ValueError, match="probability"):
        nn.Dropout(p)
    with pytest.raises(ValueError, match="probability"):
        F.dropout(md.tensor(np.ones(3)), p)


def test_dropout_with_p_one_zeroes_everything_and_p_zero_is_identity():
    x = md.tensor(np.ones((3, 3)))
    np.testing.assert_array_equal(F.dropout(x, 1.0).numpy(), np.zeros((3, 3)))
    np.testing.assert_array_equal(F.dropout(x, 0.0).numpy(), np.ones((3, 3)))


# ----------------------------------------------------------------------------------------- Linear
@given(data=st.data(), in_f=st.integers(1, 5), out_f=st.integers(1, 5), bias=st.booleans())
def test_linear_forward_equals_x_times_w_transpose_plus_b(data, in_f, out_f, bias):
    lead = data.draw(S.shapes(min_dims=1, max_dims=2))
    x = data.draw(S.arrays(lead + (in_f,)))
    lin = nn.Linear(in_f, out_f, bias=bias, dtype=np.float64)
    y = lin(md.tensor(x, dtype=np.float64)).numpy()
    expected = x @ lin.weight.data.T + (lin.bias.data if bias else 0.0)
    assert y.shape == lead + (out_f,)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_linear_gradients_match_hand_formulas():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3))
    g = rng.standard_normal((4, 2))
    lin = nn.Linear(3, 2, dtype=np.float64)
    xt = md.tensor(x, dtype=np.float64, requires_grad=True)
    lin(xt).backward(g)
    # y = x W^T + b:  dL/dW = g^T x,  dL/db = sum_n g_n,  dL/dx = g W
    np.testing.assert_allclose(lin.weight.grad, g.T @ x, rtol=1e-12)
    np.testing.assert_allclose(lin.bias.grad, g.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(xt.grad, g @ lin.weight.data, rtol=1e-12)


@pytest.mark.parametrize(("in_f", "out_f"), [(1, 1), (4, 7), (64, 32)])
def test_linear_init_within_bound_one_over_sqrt_in_features(in_f, out_f):
    lin = nn.Linear(in_f, out_f)
    bound = 1 / math.sqrt(in_f)
    assert lin.weight.shape == (out_f, in_f) and lin.bias.shape == (out_f,)
    assert lin.weight.dtype == np.float32 and lin.bias.dtype == np.float32
    assert np.all(np.abs(lin.weight.data) <= bound) and np.all(np.abs(lin.bias.data) <= bound)


def test_linear_init_spreads_over_the_whole_bound():
    lin = nn.Linear(100, 100)
    bound = 1 / math.sqrt(100)
    w = lin.weight.data
    assert w.max() > 0.9 * bound and w.min() < -0.9 * bound  # uniform, not a narrow normal
    assert abs(w.mean()) < 0.01


def test_linear_init_is_reproducible_with_manual_seed():
    md.manual_seed(42)
    a = nn.Linear(5, 3)
    md.manual_seed(42)
    b = nn.Linear(5, 3)
    c = nn.Linear(5, 3)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    np.testing.assert_array_equal(a.bias.data, b.bias.data)
    assert not np.array_equal(b.weight.data, c.weight.data)


def test_linear_wrong_input_size_raises_and_names_the_expected_size():
    lin = nn.Linear(4, 2)
    with pytest.raises(ValueError, match=r"\(3, 5\).*4"):
        lin(md.tensor(np.ones((3, 5))))


@pytest.mark.parametrize(("in_f", "out_f"), [(0, 2), (2, 0), (-1, 3)])
def test_linear_non_positive_sizes_raise(in_f, out_f):
    with pytest.raises(ValueError, match="positive"):
        nn.Linear(in_f, out_f)


# ------------------------------------------------------------------------------------- Sequential
def test_sequential_indexing_len_and_iteration():
    layers = [nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)]
    seq = nn.Sequential(*layers)
    assert len(seq) == 3
    assert seq[0] is layers[0] and seq[2] is layers[2] and seq[-1] is layers[2]
    assert list(seq) == layers
    assert [name for name, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_sequential_applies_modules_in_order():
    seq = nn.Sequential(nn.Linear(2, 3, dtype=np.float64), nn.Tanh(), nn.Linear(3, 1, dtype=np.float64))
    x = np.array([[0.5, -1.0], [2.0, 0.0]])
    by_hand = np.tanh(x @ seq[0].weight.data.T + seq[0].bias.data) @ seq[2].weight.data.T + seq[2].bias.data
    np.testing.assert_allclose(seq(md.tensor(x, dtype=np.float64)).numpy(), by_hand, rtol=1e-12)


def test_sequential_rejects_non_modules():
    with pytest.raises(TypeError, match="Module"):
        nn.Sequential(nn.ReLU(), lambda x: x)


def test_repr_shows_the_module_tree():
    text = repr(nn.Sequential(nn.Linear(2, 3), nn.Dropout(0.1)))
    assert "(0): Linear(in_features=2, out_features=3, bias=True)" in text
    assert "(1): Dropout(p=0.1)" in text


# ------------------------------------------------------------------------------------- functional
def _gelu_exact(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


FUNCTIONAL_REFERENCES = {
    "relu": (F.relu, lambda x: np.maximum(x, 0.0)),
    "gelu": (F.gelu, _gelu_exact),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), _gelu_tanh),
    "tanh": (F.tanh, np.tanh),
    "sigmoid": (F.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "softmax": (F.softmax, lambda x: np.exp(_log_softmax(x, -1))),
    "log_softmax": (F.log_softmax, lambda x: _log_softmax(x, -1)),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONAL_REFERENCES))
@given(data=st.data())
def test_functional_matches_numpy_reference(name, data):
    fn, reference = FUNCTIONAL_REFERENCES[name]
    x = data.draw(S.arrays(data.draw(S.shapes()), -4.0, 4.0))
    np.testing.assert_allclose(
        fn(md.tensor(x, dtype=np.float64)).numpy(), reference(x), rtol=1e-12, atol=1e-14
    )


def test_module_activations_equal_their_functional_forms():
    x = md.tensor(np.linspace(-3, 3, 13))
    gelu_tanh = (nn.GELU(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"))
    for module, fn in [(nn.ReLU(), F.relu), (nn.GELU(), F.gelu), gelu_tanh, (nn.Tanh(), F.tanh)]:
        np.testing.assert_array_equal(module(x).numpy(), fn(x).numpy())


def test_softmax_sums_to_one_along_the_chosen_axis_and_survives_large_logits():
    x = md.tensor(np.array([[1000.0, 0.0, -1000.0], [3.0, 3.0, 3.0]]))
    for axis in (0, 1, -1):
        np.testing.assert_allclose(F.softmax(x, axis=axis).numpy().sum(axis=axis), 1.0, rtol=1e-6)
    assert np.all(np.isfinite(F.log_softmax(x).numpy()))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@given(batch=S.classification_batches())
def test_cross_entropy_matches_numpy_reference(reduction, batch):
    logits, targets = batch
    picked = _log_softmax(logits, axis=1)[np.arange(len(targets)), targets]
    expected = -picked.mean() if reduction == "mean" else -picked.sum()
    out = F.cross_entropy(md.tensor(logits, dtype=np.float64), targets, reduction=reduction)
    assert out.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_functional_linear_with_and_without_bias():
    x, w, b = np.ones((2, 3)), np.arange(12.0).reshape(4, 3), np.arange(4.0)
    t = lambda a: md.tensor(a, dtype=np.float64)  # noqa: E731
    np.testing.assert_array_equal(F.linear(t(x), t(w)).numpy(), x @ w.T)
    np.testing.assert_array_equal(F.linear(t(x), t(w), t(b)).numpy(), x @ w.T + b)
