"""``minidist.amp.GradScaler``: dynamic loss scaling, as ``torch.amp.GradScaler``.

A skipped step leaves parameters and optimizer state untouched and backs the scale off; good steps grow
it after ``growth_interval``; calls out of order raise PyTorch's errors; the state survives a JSON round
trip (train_gpt keeps it in a checkpoint's ``extra``); with a group, all ranks skip together (MPI).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from mpi_utils import run_mpi

import minidist as md
from minidist import nn, optim
from minidist.amp import GradScaler
from minidist.nn import functional as F


def _model_and_batch(seed: int = 0):
    md.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    rng = np.random.default_rng(seed)
    return model, rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6)


def _backward(model, scaler, x, y):
    loss = F.cross_entropy(model(md.tensor(x)), y)
    scaler.scale(loss).backward()
    return loss


OPTIMIZERS = [lambda p: optim.SGD(p, lr=0.1, momentum=0.9), lambda p: optim.AdamW(p, lr=0.01)]


@pytest.mark.parametrize("make_opt", OPTIMIZERS, ids=["sgd", "adamw"])
def test_an_inf_gradient_skips_the_step_and_backs_off_the_scale(make_opt):
    model, x, y = _model_and_batch()
    opt = make_opt(model.parameters())
    scaler = GradScaler(init_scale=2.0**8)
    _backward(model, scaler, x, y)
    scaler.step(opt)  # one real step, so the optimizer has state to keep
    scaler.update()
    opt.zero_grad()
    params = [p.numpy() for p in model.parameters()]
    state = copy.deepcopy(opt.state_dict())
    _backward(model, scaler, x, y)
    next(iter(model.parameters())).grad[0, 0] = np.nan
    assert scaler.step(opt) is None
    scaler.update()
    for p, before in zip(model.parameters(), params):
        np.testing.assert_array_equal(p.data, before)  # untouched, bit for bit
    after = opt.state_dict()
    assert after["step_count"] == state["step_count"]
    for i, buffers in state["state"].items():
        for name, value in buffers.items():
            np.testing.assert_array_equal(after["state"][i][name], value)
    assert scaler.get_scale() == 2.0**7 and scaler.skipped_steps == 1


def test_scaled_float32_training_equals_unscaled_bit_for_bit():
    """A power-of-two scale is exact in float32 (the exponent moves, no mantissa bit changes), so
    scaling the loss and unscaling the gradients trains exactly as without: the scaler adds no error."""
    results = []
    for enabled in (False, True):
        model, x, y = _model_and_batch()
        opt = optim.AdamW(model.parameters(), lr=0.01)
        scaler = GradScaler(init_scale=2.0**12, enabled=enabled)
        for _ in range(3):
            _backward(model, scaler, x, y)
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        results.append([p.numpy() for p in model.parameters()])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_scale_grows_after_growth_interval_good_steps():
    model, x, y = _model_and_batch()
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=4.0, growth_factor=2.0, growth_interval=3)
    scales = []
    for _ in range(7):
        _backward(model, scaler, x, y)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    assert scales == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0] and scaler.skipped_steps == 0


def test_float16_gradients_underflow_without_the_scale_and_survive_with_it():
    """A gradient of 1e-8 is below float16's smallest subnormal (2^-24 ~ 6e-8): it rounds to 0; scaled
    by 2^16 it is 6.6e-4, representable, and unscaled in float32 it is 1e-8 again (Micikevicius §3.2)."""
    w = md.tensor(np.ones((1, 1), np.float32), requires_grad=True)
    x = md.tensor(np.ones((1, 1), np.float32))
    for scale, expected in ((1.0, 0.0), (2.0**16, 1e-8)):
        scaler = GradScaler(init_scale=scale)
        with md.autocast(dtype="float16"):
            loss = F.linear(x, w).sum() * 1e-8  # (sum is on the float32 list: the product stays float16)
        # the gradient reaching the float16 linear output is 1e-8 * scale, rounded to float16
        scaler.scale(loss).backward()
        scaler.unscale_(optim.SGD([w], lr=1.0))
        np.testing.assert_allclose(w.grad, expected, rtol=1e-3)
        w.grad = None


def test_calls_out_of_order_raise_like_pytorch():
    model, x, y = _model_and_batch()
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    _backward(model, scaler, x, y)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) is being called after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()
    for bad in ({"growth_factor": 1.0}, {"backoff_factor": 1.5}, {"growth_interval": 0}, {"init_scale": 0}):
        with pytest.raises(ValueError, match="GradScaler"):
            GradScaler(**bad)


def test_state_dict_round_trips_through_json():
    model, x, y = _model_and_batch()
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=2.0**5, growth_interval=4)
    for step in range(3):
        _backward(model, scaler, x, y)
        if step == 1:
            next(iter(model.parameters())).grad[0, 0] = np.inf
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    saved = json.loads(json.dumps(scaler.state_dict()))  # what checkpoint.save(extra=) stores
    resumed = GradScaler()
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == scaler.state_dict()
    assert (resumed.get_scale(), resumed.skipped_steps, resumed._growth_tracker) == (2.0**4, 1, 1)
    assert GradScaler(enabled=False).state_dict() == {}
    with pytest.raises(RuntimeError, match="disabled instance"):
        GradScaler().load_state_dict({})


def test_all_ranks_skip_when_one_rank_overflows(tmp_path):
    """ZeRO-2 on 2 ranks, rank 1 alone sees an inf in step 2: with group=world both skip it."""
    run_mpi(2, "amp/scaler_agree.py", str(tmp_path), timeout=60)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["scale"] == [2.0**10, 2.0**9, 2.0**9]
        assert report["skipped"] == [0, 1, 1]
        assert report["state_steps"] == [1, 1, 2]  # AdamW's step count did not move in the skipped step
        assert report["params"][1] == report["params"][0]  # the skipped step changed nothing
        assert report["params"][2] != report["params"][1]
    assert reports[0]["params"] == reports[1]["params"]  # the replicas never diverged
