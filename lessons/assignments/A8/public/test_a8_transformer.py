"""A8 public tests: the backward of LayerNorm and of causal softmax attention, run through minidist.

Each test runs the op forward (``F.layer_norm``, ``F.scaled_dot_product_attention``) on float64 inputs
that require gradients, calls ``backward(g)`` with a random upstream gradient g, and compares every
input's ``.grad`` with the central difference of sum(g * forward(inputs)) (eps = 1e-6: accurate to about
1e-9 for these smooth functions; rtol 1e-5 still catches any wrong term, factor or sign). Before that,
properties that every correct backward has and typical mistakes break, each failing with its own words
(LayerNorm's dx, dgamma and dbeta are graded as separate parts: a wrong dgamma costs its points only):
a row of LayerNorm's dx sums to 0 and is orthogonal to xhat; attention's key gradients sum to 0 over the
keys; under the causal mask a query's gradient reaches no key it cannot see.

The backward runs under the handout's "Not allowed" rule: minidist's autograd (``Tensor.backward``)
called from inside your backward is recorded and costs the test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import minidist as md
from minidist.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a8lib.py, beside this folder
from a8lib import check_against_finite_differences, run_backward  # noqa: E402
from gradelib import parts  # noqa: E402


def layer_norm(shape, eps=1e-5):
    return lambda x, w, b: F.layer_norm(x, shape, w, b, eps=eps)


def attention(**options):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **options)


def test_layer_norm_backward():
    rng = np.random.default_rng(1)
    n = 8
    x = rng.standard_normal((2, 3, n)) * 3 + 2  # every row of 8 normalised on its own: 6 rows
    w, b, g = rng.uniform(0.5, 1.5, n), rng.standard_normal(n), rng.standard_normal((2, 3, n))
    dx, _, _ = run_backward(layer_norm((n,), eps=1e-12), [x, w, b], g)  # eps ~ 0: the properties are exact
    with parts() as part:  # dx, dgamma and dbeta score separately (A8/tasks.toml)
        with part("dx"):
            _layer_norm_dx_properties(dx, x, n)
        check_against_finite_differences(
            layer_norm((n,)), [x, w, b], g, "LayerNorm (2, 3, 8)", ["x", "gamma", "beta"], part
        )


def _layer_norm_dx_properties(dx, x, n):
    rows, centred = dx.reshape(-1, n), (x - x.mean(-1, keepdims=True)).reshape(-1, n)
    scale = np.abs(rows).max()
    if np.abs(rows.sum(-1)).max() > 1e-8 * scale:
        raise AssertionError(
            f"LayerNorm: each row of dL/dx must sum to 0, but the row sums are {rows.sum(-1).round(6)}: "
            "adding the same constant to every x of a row changes no output. Check the term that carries "
            "the gradient through the row's mean, and how it is normalised by the row length n."
        )
    along = np.einsum("ij,ij->i", rows, centred) / np.linalg.norm(centred, axis=-1)
    if np.abs(along).max() > 1e-8 * scale:
        raise AssertionError(
            "LayerNorm: each row of dL/dx must be orthogonal to that row's xhat (scaling a row about its "
            f"mean changes no output), but its component along xhat is {along.round(6)}. Check the term "
            "that carries the gradient through the standard deviation sigma."
        )


def test_attention_backward():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 2, 5, 4)) for _ in range(3))  # (batch, heads, T, head width)
    g = rng.standard_normal((2, 2, 5, 4))
    _, dk, _ = run_backward(attention(), [q, k, v], g)
    with parts() as part:  # dq, dk and dv score separately (A8/tasks.toml)
        with part("dk"):
            _keys_sum_to_zero(dk)
        check_against_finite_differences(
            attention(), [q, k, v], g, "attention (2, 2, 5, 4)", ["q", "k", "v"], part
        )
        scaled = attention(scale=0.3)
        check_against_finite_differences(
            scaled, [q, k, v], g, "attention with scale=0.3", ["q", "k", "v"], part
        )


def _keys_sum_to_zero(dk):
    total = dk.sum(axis=-2)  # over the 5 keys of every (batch, head)
    if np.abs(total).max() > 1e-8 * np.abs(dk).max():
        raise AssertionError(
            "attention: the key gradients must sum to zero over the keys, for every batch and head, but "
            f"they sum to {total.reshape(-1)[:4].round(6)} ...: adding the same vector to every key shifts "
            "a whole row of scores by one constant, which changes no softmax weight. Check the softmax's "
            "backward: a row's weights depend on every score of the row, not only on their own."
        )


def test_causal_attention_backward():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    only_first = np.zeros((2, 6, 4))
    only_first[:, 0] = rng.standard_normal((2, 4))  # a loss that reads the output of query 0 only
    _, dk, dv = run_backward(attention(is_causal=True), [q, k, v], only_first)
    leaked = max(np.abs(dk[:, 1:]).max(), np.abs(dv[:, 1:]).max())
    if leaked > 0:
        raise AssertionError(
            "causal attention: query 0 cannot see keys 1..5, yet they received gradient (up to "
            f"{leaked:.3g}) from a loss on query 0's output alone. The mask must hold in the backward "
            "too: which weights does your backward use, and are the masked ones exactly 0 there?"
        )
    g = rng.standard_normal((2, 6, 4))
    check_against_finite_differences(
        attention(is_causal=True), [q, k, v], g, "causal attention (2, 6, 4)", ["q", "k", "v"]
    )


def test_attention_backward_with_dropout():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 5, 3)) for _ in range(3))
    g = rng.standard_normal((1, 2, 5, 3))

    def forward(q, k, v):
        md.manual_seed(7)  # the same dropout mask at every call, so finite differences see one function
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, is_causal=True)

    check_against_finite_differences(
        forward, [q, k, v], g, "causal attention with dropout_p=0.4", ["q", "k", "v"]
    )
