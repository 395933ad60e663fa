"""Autograd's fixed Python cost per op, measured in a way the machine's load cannot change.

Timing tests flake on a shared machine; these count work instead: how often the expensive broadcast
check runs, and how many Python functions one op calls (forward + backward). The timed numbers are
in benchmarks/README.md, "Autograd bookkeeping" (``python benchmarks/autograd_overhead.py``).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import minidist as md


def _chain(a: md.Tensor, b: md.Tensor) -> None:
    """The ``tiny`` workload of benchmarks/autograd_overhead.py: 25 elementwise ops, a sum, backward."""
    y = a
    for _ in range(5):
        y = (y * b + a) / (b * b + 1.0)
    y.sum().backward()


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
    # issue 14) made 30.7, issue 14's bookkeeping 32.2, this code 18.5. A helper added on the hot path
    # shows up here long before it shows in a timing.
    a = md.tensor(np.arange(8.0), dtype=np.float32, requires_grad=True)
    b = md.tensor(np.arange(8.0) + 1, dtype=np.float32, requires_grad=True)
    _chain(a, b)  # warm up (first-call imports and caches)
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        _chain(a, b)
    finally:
        sys.setprofile(None)
    ops = 26
    assert calls / ops <= 22, f"{calls / ops:.1f} Python calls per op (budget 22): see benchmarks/README.md"
    assert a.grad is not None and np.all(np.isfinite(a.grad))
