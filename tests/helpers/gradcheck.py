"""Gradients against central finite differences in float64: the check every differentiable op passes.

Used by the op tests (``tests/ops/test_gradcheck.py``) and by every test of a layer or op elsewhere
(attention, autocast, context parallelism, PyTorch habits).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import minidist as md

# Step and tolerances. With x perturbed by ±EPS the central difference (L(x+h) - L(x-h)) / 2h has
# truncation error ~ EPS² |L'''| / 6 ≈ 1e-12 · O(10) for our bounded inputs (|x| ≤ 3, log and 1/x
# inputs kept ≥ 0.2), and rounding error ~ 1e-16 · |L| / EPS ≈ 1e-10 · |L|, with |L| ≲ 100 for
# our sizes. Both sit far below 1e-5, while a wrong derivative (a missing factor, a sign, a
# forgotten broadcast sum) is off by O(0.1–1): 1e-5 separates the two with room on both sides.
EPS = 1e-6
RTOL = 1e-5
ATOL = 1e-5


def numerical_gradient(loss: Callable[[np.ndarray], float], x: np.ndarray) -> np.ndarray:
    """Central-difference gradient of the scalar function ``loss`` at ``x`` (x is restored afterwards)."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        original = x[i]
        x[i] = original + EPS
        plus = loss(x)
        x[i] = original - EPS
        minus = loss(x)
        x[i] = original
        grad[i] = (plus - minus) / (2 * EPS)
    return grad


def gradcheck(
    fn: Callable[..., md.Tensor],
    *inputs: np.ndarray,
    before_each: Callable[[], None] = lambda: None,
    seed: int = 0,
) -> None:
    """Assert that the backward pass of ``fn(*tensors)`` matches finite differences for every input.

    ``before_each`` runs before every evaluation of ``fn`` (used to reseed dropout's generator).
    """
    inputs = tuple(np.array(x, dtype=np.float64) for x in inputs)
    tensors = [md.tensor(x, dtype=np.float64, requires_grad=True) for x in inputs]
    before_each()
    out = fn(*tensors)
    assert out.dtype == np.float64, f"op turned float64 into {out.dtype}"
    r = np.random.default_rng(seed).standard_normal(out.shape)
    out.backward(r)

    for j, (x, t) in enumerate(zip(inputs, tensors)):

        def loss(xj: np.ndarray, j: int = j) -> float:
            args = [md.tensor(a, dtype=np.float64) for a in inputs[:j] + (xj,) + inputs[j + 1 :]]
            before_each()
            with md.no_grad():
                return float(np.sum(fn(*args).numpy() * r))

        assert t.grad is not None, f"input {j} received no gradient"
        assert t.grad.shape == x.shape, f"gradient of input {j} has shape {t.grad.shape}, input {x.shape}"
        np.testing.assert_allclose(
            t.grad, numerical_gradient(loss, x.copy()), rtol=RTOL, atol=ATOL, err_msg=f"input {j}"
        )
