"""Checks for the lessons' "your turn" exercises.

Every check prints one of two markers and never fails on an untouched placeholder, so a new user can
run a notebook top to bottom before doing the exercises:

* ``NOT DONE YET``: the answer is still the placeholder (``None``, or a function that raises
  ``NotImplementedError``);
* ``CORRECT``: the answer passed.

A wrong answer raises ``AssertionError`` with a hint. ``lessons/build.py`` and ``tests/test_lessons.py``
read the markers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np


class _NotDone(Exception):
    pass


def _exercise(check: Callable[..., None]) -> Callable[..., None]:
    """Wrap a check: placeholders print NOT DONE YET; a pass prints CORRECT; a wrong answer raises."""

    @functools.wraps(check)
    def run(*answers: Any) -> None:
        if any(a is None or a is Ellipsis for a in answers):
            print(f"NOT DONE YET: fill in the cell above, then re-run this one ({check.__name__}).")
            return
        try:
            check(*answers)
        except _NotDone:
            print(f"NOT DONE YET: the answer is still the placeholder ({check.__name__}).")
            return
        print(f"CORRECT: {check.__doc__.strip().splitlines()[0]}")

    return run


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        raise _NotDone() from None


def _close(got: Any, want: Any, hint: str, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    got_arr = np.asarray(got, dtype=float)
    want_arr = np.asarray(want, dtype=float)
    assert got_arr.shape == want_arr.shape, f"shape {got_arr.shape}, expected {want_arr.shape}. {hint}"
    assert np.allclose(got_arr, want_arr, rtol=rtol, atol=atol), f"got {got}, expected {want}. {hint}"


# --- lesson 01: autograd -------------------------------------------------------------------------------


@_exercise
def tanh_backward(fn: Callable[[float, float], float]) -> None:
    """the local derivative of tanh is 1 - tanh(x)**2, times the output's gradient."""
    for x, g in [(0.0, 1.0), (0.5, 2.0), (-1.3, 0.7), (2.0, -1.5)]:
        out = math.tanh(x)
        want = (1 - out**2) * g
        got = _call(fn, out, g)
        _close(got, want, "Hint: d tanh(x)/dx = 1 - tanh(x)^2, and the chain rule multiplies by out_grad.")


@_exercise
def numerical_grad(fn: Callable[..., np.ndarray]) -> None:
    """central differences: error O(eps^2), one f(x + eps) and one f(x - eps) per coordinate."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5)

    def f(v: np.ndarray) -> float:
        return float(np.sum(np.exp(2 * v)) + v[0] * v[1] ** 2)

    x_before = x.copy()
    got = _call(fn, f, x, 1e-3)
    assert np.array_equal(x, x_before), "your function changed x: restore each coordinate after perturbing it"
    want = 2 * np.exp(2 * x)
    want[0] += x[1] ** 2
    want[1] += 2 * x[0] * x[1]
    got = np.asarray(got, dtype=float)
    assert got.shape == x.shape, f"the gradient must have x's shape {x.shape}, got {got.shape}"
    err = np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))
    assert err < 1e-4, (
        f"relative error {err:.1e} with eps=1e-3 is too large for central differences (expected ~1e-6). "
        "Hint: use (f(x + eps) - f(x - eps)) / (2 eps); a one-sided difference has an O(eps) error."
    )


# --- lesson 02: MPI ------------------------------------------------------------------------------------


@_exercise
def ring_neighbors(fn: Callable[[int, int], tuple[int, int]]) -> None:
    """rank r receives from (r - 1) % n and sends to (r + 1) % n."""
    for n in (1, 2, 3, 5, 8):
        for r in range(n):
            got = tuple(_call(fn, r, n))
            want = ((r - 1) % n, (r + 1) % n)
            assert got == want, (
                f"ring_neighbors({r}, {n}) = {got}, expected (left, right) = {want}. Hint: the ring wraps "
                "around, so use % size; the last rank's right neighbour is rank 0."
            )


@_exercise
def ring_pass(received: list[Any]) -> None:
    """after one shift around the ring, rank r holds rank (r - 1) % n's token."""
    if any(token is None for token in received):
        raise _NotDone()  # the ring pass was skipped because ring_neighbors is not written yet
    n = len(received)
    for r, token in enumerate(received):
        want = float((r - 1) % n)
        assert float(np.ravel(token)[0]) == want, (
            f"rank {r} holds {np.ravel(token)[0]}, expected the token of rank {(r - 1) % n}. Hint: send your "
            "own token to the right and receive the left neighbour's, both in one sendrecv."
        )


# --- lesson 03: the ring all-reduce --------------------------------------------------------------------


@_exercise
def reduce_scatter_send_chunk(fn: Callable[[int, int, int], int]) -> None:
    """in reduce-scatter step s, rank r sends chunk (r - s) % n to its right neighbour."""
    for n in (2, 3, 4, 7):
        for s in range(n - 1):
            for r in range(n):
                got = _call(fn, r, s, n)
                want = (r - s) % n
                assert got == want, (
                    f"send_chunk(rank={r}, step={s}, n={n}) = {got}, expected {want}. Hint: at step 0 every "
                    "rank sends its own-numbered chunk; each step the index moves one to the left."
                )


@_exercise
def ring_time(fn: Callable[[float, int, float, float], float]) -> None:
    """T = 2 (n-1) alpha + 2 (n-1)/n N beta (Patarasuk & Yuan 2009)."""
    for nbytes, n, alpha, beta in [(1e6, 2, 1e-5, 1e-10), (4e8, 8, 5e-6, 4e-11), (1e3, 64, 2e-6, 1e-9)]:
        want = 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta
        got = _call(fn, nbytes, n, alpha, beta)
        _close(got, want, "Hint: 2(n-1) steps, each one message of N/n bytes: alpha + (N/n) beta.", rtol=1e-9)


# --- lesson 04: data parallelism -----------------------------------------------------------------------


@_exercise
def microbatch_weight(fn: Callable[[list[int], int], float]) -> None:
    """scale microbatch i's mean loss by b_i / B, so the sum is the mean over the whole batch."""
    for sizes in ([32, 32, 32, 32], [43, 43, 42], [5, 1], [7]):
        total = sum(sizes)
        for i, b in enumerate(sizes):
            got = _call(fn, sizes, i)
            _close(
                got,
                b / total,
                f"for sizes {sizes}. Hint: a mean over b_i samples, weighted so that all samples of the "
                "global batch count equally: b_i / sum(sizes) (equal to 1/k only when all sizes are equal).",
            )


# --- lesson 05: ZeRO ------------------------------------------------------------------------------------


@_exercise
def zero_bytes(fn: Callable[..., float]) -> None:
    """ZeRO §5: stage 1 shards the optimizer state, 2 also the gradients, 3 also the parameters."""
    # The ZeRO paper's Figure 1: Psi = 7.5 B parameters, N = 64, mixed-precision Adam (2 + 2 + 12 bytes).
    paper = {0: 120e9, 1: 31.4e9, 2: 16.6e9, 3: 1.875e9}  # the figure rounds the last to 1.9 GB
    for stage, want in paper.items():
        got = _call(fn, 7.5e9, 64, stage, 2, 12)
        _close(
            got,
            want,
            f"for stage {stage} (Psi=7.5e9, N=64, b=2, K=12; ZeRO Figure 1 says {want / 1e9} GB). Hint: "
            "parameters b*Psi, gradients b*Psi, optimizer state K*Psi; stage s divides the first s of "
            "(optimizer state, gradients, parameters) by N.",
            rtol=0.01,
        )
    _close(_call(fn, 1000, 4, 2, 4, 8), 4000 + 12000 / 4, "for Psi=1000, N=4, stage 2, b=4, K=8.", rtol=1e-9)


# --- lesson 09: the scaling model ----------------------------------------------------------------------


@_exercise
def dp_speedup(fn: Callable[..., float]) -> None:
    """speedup(G) = T(1) / (C/G + 2(G-1) alpha + 2(G-1)/G N beta), with T(1) = C."""
    from minidist import perfmodel

    hw = perfmodel.Hardware(flops=1e14, alpha=5e-6, beta=1 / 25e9)
    work = perfmodel.Workload(params=1.3e9, global_batch=1024, tokens_per_sample=2048, bytes_per_value=2)
    for gpus in (1, 8, 256, 1024):
        want = perfmodel.predict(work, hw, dp=gpus).speedup
        got = _call(
            fn, work.flops_per_step, gpus, work.params * work.bytes_per_value, hw.flops, hw.alpha, hw.beta
        )
        _close(
            got,
            want,
            f"for G={gpus}. Hint: compute C / (G flops); the all-reduce of N bytes costs "
            "2(G-1) alpha + 2(G-1)/G N beta; speedup = (time on 1 GPU) / (time on G).",
            rtol=1e-6,
        )
