"""A1 public tests of the backward pass (``run_backward`` and ``_count_consumers``, task A1.5).

The graphs are built from two tiny Functions defined here, so these tests do not depend on your ops.
"""

from __future__ import annotations

import numpy as np

import minidist as md


class Scale(md.Function):
    """y = c x."""

    def forward(self, x, c=2.0):
        self.c = c
        return x * c

    def backward(self, grad):
        return (grad * self.c,)


class Mult(md.Function):
    """z = a b."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, grad):
        return grad * self.b, grad * self.a


def leaf(values) -> md.Tensor:
    return md.tensor(np.array(values, dtype=np.float64), dtype=np.float64, requires_grad=True)


def test_diamond_graph():
    """x feeds two branches that meet again: its gradient is the sum over both paths (both input orders)."""
    for order in ("a, b", "b, a"):
        x = leaf([1.0, -2.0, 3.0])
        calls = []
        x.register_post_accumulate_grad_hook(lambda t, calls=calls: calls.append(t.grad.copy()))
        a = Scale.apply(x, c=3.0)  # a = 3x
        b = Scale.apply(a, c=2.0)  # b = 6x
        z = Mult.apply(a, b) if order == "a, b" else Mult.apply(b, a)  # z = 18 x^2, dz/dx = 36 x
        z.backward(np.ones(3))  # a gets a gradient from z directly and one through b
        want = 36 * x.data
        what = f"diamond graph a = 3x, b = 2a, z = Mult({order})"
        assert x.grad is not None, (
            f"{what}: x.grad is None after backward: leaves must receive their gradient"
        )
        assert np.allclose(x.grad, want), f"{what}: x.grad = {x.grad}, expected 36 x = {want}"
        assert len(calls) == 1, (
            f"{what}: x's post-accumulate hook ran {len(calls)} times; it must run once, after ALL "
            "contributions to x have been summed (a tensor is ready only when every op that used it has "
            "sent its gradient)"
        )
        assert np.allclose(calls[0], want), f"{what}: the hook ran before x's gradient was complete"


def test_backward_accumulates():
    """Leaves accumulate into .grad (torch semantics); a tensor used twice by one op counts twice."""
    x = leaf([2.0, 5.0])
    y = Mult.apply(x, x)  # y = x^2, dy/dx = 2x: x is both inputs of the same op
    y.backward(np.ones(2), retain_graph=True)  # keep the graph for a second pass, as in torch
    assert np.allclose(x.grad, 2 * x.data), f"y = x * x: x.grad = {x.grad}, expected 2x = {2 * x.data}"
    y.backward(np.ones(2))
    assert np.allclose(x.grad, 4 * x.data), (
        f"a second backward must ADD to x.grad: got {x.grad}, expected 2 * 2x = {4 * x.data}"
    )
