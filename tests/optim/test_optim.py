"""minidist.optim against the update rules of PyTorch's documentation, recomputed here in NumPy.

The reference functions below are written from the algorithm boxes of ``torch.optim.SGD`` and
``torch.optim.AdamW`` (not from minidist's code). Parameters are float64 and gradients are set
directly on ``.grad``, so trajectories are compared to ~1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist import nn, optim

STEPS = 3
THETA0 = np.array([[0.5, -1.2, 2.0], [0.0, 0.3, -0.7]])
TARGET = np.array([[1.0, 0.0, -1.0], [0.5, 0.5, 0.5]])


def grad_at(theta: np.ndarray) -> np.ndarray:
    """The gradient of a smooth non-quadratic loss, so it changes from step to step."""
    return np.sin(3 * theta) + (theta - TARGET)


def run_minidist(make_optimizer, steps: int = STEPS, theta0: np.ndarray = THETA0) -> list[np.ndarray]:
    p = nn.Parameter(theta0.copy())
    opt = make_optimizer([p])
    trajectory = []
    for _ in range(steps):
        p.grad = grad_at(p.data)
        opt.step()
        trajectory.append(p.data.copy())
    return trajectory


# ------------------------------------------------------------------------------------ references
def sgd_reference(lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, steps=STEPS):
    """torch.optim.SGD:
    g_t = ∇f(θ_{t-1}) + λ θ_{t-1}
    if μ ≠ 0:  b_t = g_t (t = 1)  or  μ b_{t-1} + (1 - τ) g_t (t > 1);  g_t = g_t + μ b_t (nesterov) or b_t
    θ_t = θ_{t-1} - γ g_t
    """
    theta, b, trajectory = THETA0.copy(), None, []
    for t in range(1, steps + 1):
        g = grad_at(theta) + weight_decay * theta
        if momentum != 0:
            b = g if t == 1 else momentum * b + (1 - dampening) * g
            g = g + momentum * b if nesterov else b
        theta = theta - lr * g
        trajectory.append(theta)
    return trajectory


def adamw_reference(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, steps=STEPS):
    """torch.optim.AdamW (amsgrad=False, maximize=False):
    θ_t = θ_{t-1} - γ λ θ_{t-1}
    m_t = β1 m_{t-1} + (1 - β1) g_t,      v_t = β2 v_{t-1} + (1 - β2) g_t²
    m̂_t = m_t / (1 - β1^t),              v̂_t = v_t / (1 - β2^t)
    θ_t = θ_t - γ m̂_t / (√v̂_t + ε)
    """
    b1, b2 = betas
    theta, m, v, trajectory = THETA0.copy(), np.zeros_like(THETA0), np.zeros_like(THETA0), []
    for t in range(1, steps + 1):
        g = grad_at(theta)
        theta = theta - lr * weight_decay * theta
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
        trajectory.append(theta)
    return trajectory


def assert_trajectories_close(actual, expected):
    assert len(actual) == len(expected)
    for step, (a, e) in enumerate(zip(actual, expected), start=1):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12, err_msg=f"after step {step}")


# ------------------------------------------------------------------------------------------- SGD
SGD_CONFIGS = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "momentum+dampening": dict(lr=0.1, momentum=0.9, dampening=0.3),
    "nesterov": dict(lr=0.05, momentum=0.8, nesterov=True),
    "weight_decay": dict(lr=0.1, weight_decay=0.1),
    "momentum+weight_decay": dict(lr=0.1, momentum=0.9, weight_decay=0.05),
    "nesterov+weight_decay": dict(lr=0.1, momentum=0.5, weight_decay=0.2, nesterov=True),
}


@pytest.mark.parametrize("config", sorted(SGD_CONFIGS))
def test_sgd_matches_pytorch_update_rule(config):
    kwargs = SGD_CONFIGS[config]
    assert_trajectories_close(run_minidist(lambda ps: optim.SGD(ps, **kwargs)), sgd_reference(**kwargs))


def test_sgd_momentum_hand_computed_numbers():
    # θ0 = 1, constant g = 1, γ = 0.1, μ = 0.9:  b = 1, 1.9, 2.71  ->  θ = 0.9, 0.71, 0.439
    p = nn.Parameter(np.array([1.0]))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    thetas = []
    for _ in range(3):
        p.grad = np.array([1.0])
        opt.step()
        thetas.append(p.data[0])
    np.testing.assert_allclose(thetas, [0.9, 0.71, 0.439], rtol=1e-12)


def test_sgd_nesterov_hand_computed_numbers():
    # θ0 = 1, constant g = 1, γ = 0.1, μ = 0.9:  b = 1, 1.9;  step = g + μ b = 1.9, 2.71  ->  θ = 0.81, 0.539
    p = nn.Parameter(np.array([1.0]))
    opt = optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True)
    thetas = []
    for _ in range(2):
        p.grad = np.array([1.0])
        opt.step()
        thetas.append(p.data[0])
    np.testing.assert_allclose(thetas, [0.81, 0.539], rtol=1e-12)


# ----------------------------------------------------------------------------------------- AdamW
ADAMW_CONFIGS = {
    "defaults": dict(lr=1e-3),
    "no_weight_decay": dict(lr=0.1, weight_decay=0.0),
    "strong_decay_and_betas": dict(lr=0.05, betas=(0.5, 0.9), weight_decay=0.3),
    "large_eps": dict(lr=0.1, eps=0.5, weight_decay=0.1),
    "zero_betas": dict(lr=0.1, betas=(0.0, 0.0)),
}


@pytest.mark.parametrize("config", sorted(ADAMW_CONFIGS))
def test_adamw_matches_pytorch_update_rule(config):
    kwargs = ADAMW_CONFIGS[config]
    assert_trajectories_close(run_minidist(lambda ps: optim.AdamW(ps, **kwargs)), adamw_reference(**kwargs))


def test_adamw_first_step_moves_each_coordinate_by_about_lr():
    # With bias correction m̂_1 = g and v̂_1 = g², so the first update is γ g / (|g| + ε) ≈ γ sign(g).
    p = nn.Parameter(np.array([1.0, -2.0, 3.0]))
    opt = optim.AdamW([p], lr=0.01, weight_decay=0.0)
    p.grad = np.array([5.0, -0.001, 1e3])
    opt.step()
    np.testing.assert_allclose(p.data, [0.99, -1.99, 2.99], rtol=1e-6)


def test_adamw_weight_decay_is_decoupled_from_the_gradient():
    # A zero gradient leaves m = v = 0: only the decay θ (1 - γλ) acts, and it is not rescaled by Adam.
    p = nn.Parameter(np.array([2.0, -4.0]))
    opt = optim.AdamW([p], lr=0.1, weight_decay=0.5)
    p.grad = np.zeros(2)
    opt.step()
    np.testing.assert_allclose(p.data, [2.0 * 0.95, -4.0 * 0.95], rtol=1e-12)


def test_adamw_bias_correction_counts_steps_per_parameter():
    # PyTorch keeps a step count per parameter (state["step"]): a parameter that gets its first
    # gradient at the optimizer's 2nd step is bias-corrected with t = 1, so it moves by ≈ lr.
    a = nn.Parameter(np.array([1.0]))
    late = nn.Parameter(np.array([1.0]))
    opt = optim.AdamW([a, late], lr=0.1, weight_decay=0.0)
    a.grad = np.array([1.0])
    opt.step()  # `late` has no gradient yet: skipped
    a.grad, late.grad = np.array([1.0]), np.array([1.0])
    opt.step()
    np.testing.assert_allclose(late.data, [0.9], rtol=1e-6)


# -------------------------------------------------------------------------- shared optimizer rules
OPTIMIZERS = {
    "sgd": lambda ps: optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd_nesterov": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adamw": lambda ps: optim.AdamW(ps, lr=0.05),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_parameter_with_grad_none_is_skipped(name):
    used = nn.Parameter(np.array([1.0, 2.0]))
    unused = nn.Parameter(np.array([3.0, 4.0]))
    opt = OPTIMIZERS[name]([used, unused])
    for _ in range(2):
        used.grad = np.array([0.5, -0.5])
        opt.step()
    np.testing.assert_array_equal(unused.data, [3.0, 4.0])  # no weight decay either
    assert unused.grad is None
    assert not np.array_equal(used.data, [1.0, 2.0])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_zero_grad_sets_grads_to_none_by_default(name):
    p, q = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))
    opt = OPTIMIZERS[name]([p, q])
    p.grad = np.ones(2)
    opt.zero_grad()
    assert p.grad is None and q.grad is None


def test_zero_grad_without_set_to_none_fills_zeros_in_place():
    p, q = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))
    opt = optim.SGD([p, q], lr=0.1)
    p.grad = np.array([3.0, 4.0])
    grad_array = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is grad_array
    np.testing.assert_array_equal(p.grad, [0.0, 0.0])
    assert q.grad is None  # nothing to fill


def test_gradients_do_not_leak_between_steps_after_zero_grad():
    lin = nn.Linear(3, 1, dtype=np.float64)
    opt = optim.SGD(lin.parameters(), lr=0.1)
    x = md.tensor(np.ones((2, 3)), dtype=np.float64)
    lin(x).sum().backward()
    first = lin.weight.grad.copy()
    opt.zero_grad()
    lin(x).sum().backward()
    np.testing.assert_array_equal(lin.weight.grad, first)  # not 2x: the old gradient was cleared


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_float32_parameters_stay_float32(name):
    p = nn.Parameter(np.ones(3, dtype=np.float32))
    opt = OPTIMIZERS[name]([p])
    for _ in range(2):
        p.grad = np.full(3, 0.5, dtype=np.float32)
        opt.step()
    assert p.dtype == np.float32
    buffers = [v for s in opt.state.values() for v in s.values() if getattr(v, "shape", ()) == p.shape]
    assert all(v.dtype == np.float32 for v in buffers)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_parameter_listed_twice_is_updated_once(name):
    p, q = nn.Parameter(np.array([1.0])), nn.Parameter(np.array([1.0]))
    opt_twice = OPTIMIZERS[name]([p, p])
    opt_once = OPTIMIZERS[name]([q])
    p.grad = q.grad = np.array([1.0])
    opt_twice.step()
    opt_once.step()
    np.testing.assert_array_equal(p.data, q.data)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_a_linear_model_decreases_the_loss(name):
    md.manual_seed(0)
    rng = np.random.default_rng(0)
    x = md.tensor(rng.standard_normal((32, 4)), dtype=np.float32)
    y = rng.integers(0, 3, size=32)
    model = nn.Linear(4, 3)
    opt = OPTIMIZERS[name](model.parameters())
    losses = []
    for _ in range(20):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


# ------------------------------------------------------------------------------------ state dict
def _train(opt, params, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for p in params:
            p.grad = np.sin(3 * p.data) + rng.standard_normal(p.shape)
        opt.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_dict_round_trip_continues_the_identical_trajectory(name):
    params = [nn.Parameter(THETA0.copy()), nn.Parameter(np.array([0.3, -0.4]))]
    opt = OPTIMIZERS[name](params)
    _train(opt, params, steps=3, seed=0)
    opt_state = opt.state_dict()
    saved = [p.data.copy() for p in params]

    resumed = [nn.Parameter(a.copy()) for a in saved]
    opt_resumed = OPTIMIZERS[name](resumed)
    opt_resumed.load_state_dict(opt_state)

    _train(opt, params, steps=3, seed=1)
    _train(opt_resumed, resumed, steps=3, seed=1)
    for p, r in zip(params, resumed):
        np.testing.assert_array_equal(p.data, r.data)  # bit-identical (docs/design.md, property 4: resume)


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_optimizer_state_dict_returns_copies(name):
    p, q = nn.Parameter(np.array([1.0, 2.0])), nn.Parameter(np.array([1.0, 2.0]))
    opt, twin = OPTIMIZERS[name]([p]), OPTIMIZERS[name]([q])
    for _ in range(3):
        p.grad, q.grad = np.array([1.0, -1.0]), np.array([1.0, -1.0])
        opt.step()
        twin.step()
        for buffers in opt.state_dict()["state"].values():  # scribbling on the copy
            for array in buffers.values():
                if hasattr(array, "shape"):  # AdamW's per-parameter step counter is an int
                    array[...] = 1e6
    np.testing.assert_array_equal(p.data, q.data)  # ... changes nothing in the optimizer


def test_load_state_dict_rejects_state_of_other_parameters():
    p = nn.Parameter(np.ones(3))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = np.ones(3)
    opt.step()
    sd = opt.state_dict()

    wrong_shape = optim.SGD([nn.Parameter(np.ones(4))], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        wrong_shape.load_state_dict(sd)

    sd["state"][1] = sd["state"][0]
    with pytest.raises(ValueError, match="parameter 1"):
        optim.SGD([nn.Parameter(np.ones(3))], lr=0.1, momentum=0.9).load_state_dict(sd)


# ---------------------------------------------------------------------------------------- errors
# (The hyperparameters' checks, against torch's: test_hyperparameter_checks.py.)
@pytest.mark.parametrize("cls", [optim.SGD, optim.AdamW], ids=["sgd", "adamw"])
def test_empty_parameter_list_raises(cls):
    with pytest.raises(ValueError, match="empty"):
        cls([], lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        cls(iter(()), lr=0.1)


@pytest.mark.parametrize("cls", [optim.SGD, optim.AdamW], ids=["sgd", "adamw"])
def test_an_empty_group_is_allowed_as_in_torch(cls):
    """torch accepts a group without parameters (a pipeline stage may hold no vector for the no-decay
    group); it keeps the group numbering the same on every stage. It updates nothing."""
    p = nn.Parameter(np.ones(2))
    p.grad = np.ones(2)
    opt = cls([{"params": [p]}, {"params": [], "weight_decay": 0.0}], lr=0.1)
    opt.step()
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["params"] == [] and np.all(p.data < 1)
    assert len(opt.state_dict()["param_groups"]) == 2


@pytest.mark.parametrize("cls", [optim.SGD, optim.AdamW], ids=["sgd", "adamw"])
def test_non_tensor_parameter_raises_type_error(cls):
    with pytest.raises(TypeError, match="ndarray"):
        cls([np.ones(2)], lr=0.1)
