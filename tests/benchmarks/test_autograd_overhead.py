"""Autograd's fixed Python cost per op, measured in a way the machine's load cannot change.

Timing tests flake on a shared machine; these count work instead: how often the expensive broadcast
check runs, and how many Python functions one op calls (forward + backward). The timed numbers are
in docs/performance.md, "Per-step overhead of autograd".
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import minidist as md


def _chain(a: md.Tensor, b: md.Tensor) -> None:
    """The ``tiny`` workload of the bookkeeping figures: 25 elementwise ops, a sum, backward."""
    y = a
    for _ in range(5):
        y = (y * b + a) / (b * b + 1.0)
    y.sum().backward()


def _python_calls(fn) -> int:
    """How many Python-level function calls ``fn()`` makes (``sys.setprofile``'s "call" events)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_same_shape_and_scalar_operands_skip_the_broadcast_check(monkeypatch):
    calls = []
    real = np.broadcast_shapes
    monkeypatch.setattr(np, "broadcast_shapes", lambda *shapes: calls.append(shapes) or real(*shapes))
    a = md.tensor(np.ones(8), dtype=np.float32, requires_grad=True)
    b = md.tensor(np.ones(8), dtype=np.float32, requires_grad=True)
    _chain(a, b)
    assert calls == [], f"np.broadcast_shapes ran {len(calls)} times for same-shape or scalar operands"
    # Different shapes still get the check, and its clear error.
    assert (md.tensor(np.ones((3, 1))) * md.tensor(np.ones(4))).shape == (3, 4)
    assert calls
    with pytest.raises(ValueError, match="cannot be broadcast together"):
        md.tensor(np.ones(3)) + md.tensor(np.ones(4))


def test_python_calls_per_op_stay_within_budget():
    # Budget: 22 Python-level function calls per op (forward + backward) on this chain; 2fd25c0 (before
    # version counters) made 30.7, f9ff22a (with them) 32.2, this code 18.5. A helper added on the hot path
    # shows up here long before it shows in a timing.
    a = md.tensor(np.arange(8.0), dtype=np.float32, requires_grad=True)
    b = md.tensor(np.arange(8.0) + 1, dtype=np.float32, requires_grad=True)
    _chain(a, b)  # warm up (first-call imports and caches)
    calls = _python_calls(lambda: _chain(a, b))
    ops = 26
    assert calls / ops <= 22, (
        f"{calls / ops:.1f} Python calls per op (budget 22): "
        'docs/performance.md, "Version counters, freed graphs and dtype promotion"'
    )
    assert a.grad is not None and np.all(np.isfinite(a.grad))


def test_python_calls_per_training_step_of_a_small_mlp_stay_within_budget():
    """A whole SGD step (zero_grad, forward of Linear-ReLU-Linear-ReLU-Linear, cross-entropy, backward,
    step): 264 Python-level calls at f346c5e (Linear as transpose + matmul + add), 141 with F.linear one
    op, 156 at 653aa65, 143 at 85e58e7 (no_grad a class, no reshape of 2-D arrays in Linear, SGD's loop
    without a generator). Budget 150: the instruction counts per step are in docs/performance.md,
    "What the cuts took out"."""
    from minidist import nn, optim  # noqa: PLC0415
    from minidist.models import MLP  # noqa: PLC0415

    md.manual_seed(0)
    model = MLP(8, [8, 8], 4)
    opt = optim.SGD(model.parameters(), lr=0.05)
    x, y = md.tensor(np.ones((4, 8), np.float32)), np.zeros(4, np.int64)

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # warm up
    calls = _python_calls(step)
    assert calls <= 150, (
        f'{calls} Python calls per step (budget 150): docs/performance.md, "What the cuts took out"'
    )
