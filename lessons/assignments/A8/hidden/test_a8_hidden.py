"""A8 hidden tests: hypothesis-drawn shapes, LayerNorm without gamma or beta and over two axes, rows far
from 0, attention with broadcast keys and values, more queries than keys, boolean and float masks, and
inputs that need no gradient."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a8lib.py
from a8lib import check_against_finite_differences, compare, numeric_gradients, run_backward  # noqa: E402
from gradelib import parts  # noqa: E402


@given(st.integers(1, 4), st.integers(2, 9), st.floats(-50, 50), st.integers(0, 99))
def test_layer_norm_any_shape_and_offset(rows, n, offset, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * rng.uniform(0.3, 3) + offset
    w, b, g = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal((rows, n))
    with parts() as part:
        check_against_finite_differences(
            lambda x, w, b: F.layer_norm(x, (n,), w, b),
            [x, w, b],
            g,
            f"LayerNorm ({rows}, {n}), offset {offset:.1f}",
            ["x", "gamma", "beta"],
            part,
        )


def test_layer_norm_without_parameters_and_over_two_axes():
    rng = np.random.default_rng(20)
    x, g = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4))
    w = rng.standard_normal(4)
    w2, b2 = rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    with parts() as part:
        with part("no parameters"):
            check_against_finite_differences(
                lambda x: F.layer_norm(x, (4,)), [x], g, "LayerNorm, no gamma/beta", ["x"]
            )
            check_against_finite_differences(
                lambda x, w: F.layer_norm(x, (4,), w), [x, w], g, "LayerNorm, gamma only", ["x", "gamma"]
            )
            grads = run_backward(
                lambda x, w, b: F.layer_norm(x, (4,), w, b),
                [x, w, rng.standard_normal(4)],
                g,
                requires_grad=[True, False, True],
            )
            assert grads[1] is None, "LayerNorm: gamma does not require a gradient, yet it received one"
        with part("two axes"):
            check_against_finite_differences(
                lambda x, w, b: F.layer_norm(x, (2, 4), w, b),
                [x, w2, b2],
                g,
                "LayerNorm over the last two axes (2, 4)",
                ["x", "gamma", "beta"],
            )


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.booleans(), st.integers(0, 99))
def test_attention_any_shape(heads, width, length, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, heads, length, width)) for _ in range(3))
    g = rng.standard_normal((2, heads, length, width))
    check_against_finite_differences(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        [q, k, v],
        g,
        f"attention (2, {heads}, {length}, {width}), is_causal={causal}",
        ["q", "k", "v"],
    )


def test_attention_broadcast_masks_and_no_grad_inputs():
    rng = np.random.default_rng(21)
    q = rng.standard_normal((2, 3, 4, 2))
    k, v = rng.standard_normal((1, 6, 2)), rng.standard_normal((1, 6, 3))  # shared by batch and heads
    g = rng.standard_normal((2, 3, 4, 3))
    check_against_finite_differences(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [q, k, v],
        g,
        "causal attention, 4 queries, 6 keys, k and v broadcast over (batch, heads)",
        ["q", "k", "v"],
    )
    allowed = rng.random((4, 6)) < 0.6
    allowed[:, 0] = True  # every query sees at least one key
    check_against_finite_differences(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
        [q, k, v],
        g,
        "attention with a boolean mask",
        ["q", "k", "v"],
    )
    bias = rng.standard_normal((4, 6))
    check_against_finite_differences(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
        [q, k, v],
        g,
        "attention with a float mask added to the scores",
        ["q", "k", "v"],
    )

    def forward(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    dq, dk, dv = run_backward(forward, [q, k, v], g, requires_grad=[True, True, False])
    assert dv is None, "attention: value does not require a gradient, yet it received one"
    want_q, want_k, _ = numeric_gradients(forward, [q, k, v], g)
    compare(dq, want_q, "causal attention, value without requires_grad: dL/dq")
    compare(dk, want_k, "causal attention, value without requires_grad: dL/dk")
