"""Helpers of the A8 tests (public and hidden): run an op's backward under the handout's rule, and compare
it with central finite differences, naming a constant factor when that is all that is wrong."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
from gradelib import assert_close, numerical_gradient

import minidist as md

WHY = (
    "the handout asks for the backward written by hand; minidist's autograd run inside an op's backward "
    "(Tensor.backward on a graph rebuilt from other ops, or the Softmax op's own backward) computes it "
    "for you"
)


def _rule():
    import rules  # noqa: PLC0415  (imports mpi4py: only when a test runs a backward)

    return rules.Rule(
        files=("minidist.ops.attention", "minidist.ops.layer_norm"),
        why=WHY,
        mpi_methods=(),
        functions=(
            "minidist.autograd.tensor:Tensor.backward",
            "minidist.autograd.graph:run_backward",
            "minidist.ops.softmax:Softmax.backward",  # the softmax's Jacobian is part of the task
        ),
        through=(),
        callers=("backward",),
        tasks={"LayerNorm.backward": "A8.1", "ScaledDotProductAttention.backward": "A8.2"},
    )


def run_backward(
    forward: Callable[..., md.Tensor],
    arrays: list[np.ndarray],
    g: np.ndarray,
    requires_grad: list[bool] | None = None,
) -> list[np.ndarray | None]:
    """``forward(*tensors).backward(g)`` on float64 copies of ``arrays``; the inputs' ``.grad``.

    Raises AssertionError, explained, when the backward called what the handout forbids."""
    import rules  # noqa: PLC0415

    flags = requires_grad or [True] * len(arrays)
    tensors = [md.tensor(a, dtype=np.float64, requires_grad=f) for a, f in zip(arrays, flags)]
    out = forward(*tensors)
    with rules.watch(_rule(), []) as seen:
        out.backward(g)
    if seen.violations:
        raise AssertionError(seen.messages()[0])
    return [t.grad for t in tensors]


def numeric_gradients(
    forward: Callable[..., md.Tensor], arrays: list[np.ndarray], g: np.ndarray
) -> list[np.ndarray]:
    """Central differences of sum(g * forward(arrays)) with respect to each array (changed, then restored)."""

    def f() -> float:
        with md.no_grad():
            return float(np.sum(g * forward(*[md.tensor(a, dtype=np.float64) for a in arrays]).data))

    return [numerical_gradient(f, a) for a in arrays]


def compare(got: np.ndarray | None, want: np.ndarray, what: str) -> None:
    """``assert_close``, but a gradient that is the right one times a constant is named as such."""
    if got is not None and np.shape(got) == want.shape:
        big = np.abs(want) > 1e-6 * np.abs(want).max()
        if big.any():
            ratio = np.asarray(got)[big] / want[big]
            if np.allclose(ratio, ratio[0], rtol=1e-4) and not np.isclose(ratio[0], 1.0, rtol=1e-4):
                raise AssertionError(
                    f"{what}: every value is {ratio[0]:.4g} times the right one. Which constant factor of "
                    "the forward does your backward miss, or apply twice?"
                )
    assert_close(got, want, what)


def check_against_finite_differences(
    forward: Callable[..., md.Tensor],
    arrays: list[np.ndarray],
    g: np.ndarray,
    what: str,
    names: list[str],
    part: Callable[[str], Any] | None = None,
) -> None:
    """Every input's gradient from the backward equals the central differences (see the test modules).

    ``part`` (from ``gradelib.parts()``): each input's gradient is its own part, ``d<name>`` (``dx``,
    ``dgamma``, ...), so that a wrong dgamma costs dgamma's points only."""
    grads = run_backward(forward, arrays, g)
    for grad, want, name in zip(grads, numeric_gradients(forward, arrays, g), names):
        with part(f"d{name}") if part else nullcontext():
            compare(grad, want, f"{what}: dL/d{name}")
