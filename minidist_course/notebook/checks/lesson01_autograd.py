"""Checks of lesson 01 (autograd from scratch): the backward of tanh, and a numerical gradient."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist_course.notebook.checks.harness import call, close, exercise


@exercise(
    "What is the slope of tanh at x, written with the output out = tanh(x) only? And what does the chain "
    "rule do with the gradient that flows in?",
    "Write tanh(x) = sinh(x) / cosh(x), differentiate it with the quotient rule and use "
    "cosh(x)^2 - sinh(x)^2 = 1 to express the slope through tanh alone; then multiply that local slope "
    "by out_grad.",
)
def tanh_backward(fn: Callable[[float, float], float]) -> None:
    """tanh_backward(out, out_grad) gives the gradient for x at four points, negative x included."""
    for x, g in [(0.0, 1.0), (0.5, 2.0), (-1.3, 0.7), (2.0, -1.5)]:
        out = math.tanh(x)
        want = (1 - out**2) * g  # the expected value; the lesson reveals it after the check
        close(call(fn, out, g), want, f"tanh_backward(out=tanh({x}), out_grad={g})")


@exercise(
    "To measure one partial derivative, which coordinate of x do you move, to where, and how do you "
    "turn the change of f into a slope?",
    "Move one coordinate at a time to both sides of its value by eps (the central difference of the "
    "markdown above), divide the change of f by the distance between the two points, and put the "
    "coordinate back before the next one.",
)
def numerical_grad(fn: Callable[..., np.ndarray]) -> None:
    """numerical_grad(f, x, eps) matches the exact gradient of a test function to central-difference
    accuracy, and leaves x as it found it."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5)

    def f(v: np.ndarray) -> float:
        return float(np.sum(np.exp(2 * v)) + v[0] * v[1] ** 2)

    x_before = x.copy()
    got = call(fn, f, x, 1e-3)
    assert np.array_equal(x, x_before), "your function changed x: restore each coordinate after perturbing it"
    want = 2 * np.exp(2 * x)  # the analytic gradient of f above
    want[0] += x[1] ** 2
    want[1] += 2 * x[0] * x[1]
    got = np.asarray(got, dtype=float)
    assert got.shape == x.shape, f"the gradient must have x's shape {x.shape}, got {got.shape}"
    err = np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))
    assert err < 1e-4, (
        f"relative error {err:.1e} with eps=1e-3 is too large for central differences (expected ~1e-6); "
        "a one-sided difference has an error of order eps, a central one of order eps^2."
    )
