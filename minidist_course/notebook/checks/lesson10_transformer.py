"""Checks of lesson 10 (a transformer from the ops up): LayerNorm's backward, a GPT's parameters and FLOPs.

The expected values come from minidist itself (the ``LayerNorm`` op run through autograd, ``GPT``'s
``num_parameters()`` and ``flops_per_token()``) and, for LayerNorm, from central finite differences
too: an answer is marked right when it is what the library computes and what calculus says.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from minidist_course.notebook.checks.harness import call, close, exercise


def _layer_norm_loss(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, dy: np.ndarray, eps: float) -> float:
    """sum(dy * layer_norm(x)) in float64 NumPy: its gradient with respect to x is the backward's dx."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return float(np.sum(dy * ((x - mu) / np.sqrt(var + eps) * gamma + beta)))


def _central_differences(f: Callable[[], float], a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    # One coordinate at a time, put back after each (the lesson 01 exercise).
    grad = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        kept = a[i]
        a[i] = kept + eps
        above = f()
        a[i] = kept - eps
        below = f()
        a[i] = kept
        grad[i] = (above - below) / (2 * eps)
    return grad


def _minidist_layer_norm_grads(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, dy: np.ndarray, eps: float
):
    import minidist as md  # noqa: PLC0415  (the checks module imports without the autograd engine)
    from minidist.nn import functional as F  # noqa: PLC0415

    tx, tg, tb = (md.tensor(a, dtype=np.float64, requires_grad=True) for a in (x, gamma, beta))
    F.layer_norm(tx, (x.shape[-1],), tg, tb, eps=eps).backward(dy)
    return tx.grad, tg.grad, tb.grad


@exercise(
    "y depends on each x_j directly and also through the row's mean and standard deviation: did your dx "
    "follow all three paths? Does each row of your dx sum to zero, as it must when adding a constant to a "
    "row changes no output?",
    "Start from the gradient that reaches xhat: dy times gamma. Then xhat_i = (x_i - mu) / sigma "
    "moves with x_j three ways: through x_i itself (only when i = j), through mu (d mu / d x_j = 1/n) "
    "and through sigma (d sigma / d x_j = xhat_j / n). Add up the three contributions over i, and use "
    "means over the row where a sum over i divided by n appears.",
)
def layer_norm_backward(fn: Callable[..., Any]) -> None:
    """layer_norm_backward(x, gamma, dy, eps) gives dx, dgamma and dbeta equal to minidist's LayerNorm op
    and to central finite differences, for rows of 1 to 16 values, offset rows included."""
    rng = np.random.default_rng(10)
    for rows, n, offset in [(3, 4, 0.0), (2, 16, 5.0), (4, 1, 0.0), (5, 7, -2.0)]:
        x = rng.standard_normal((rows, n)) * rng.uniform(0.5, 3.0) + offset
        gamma, beta, dy = rng.uniform(0.5, 1.5, n), rng.standard_normal(n), rng.standard_normal((rows, n))
        eps = 1e-5
        context = f"layer_norm_backward(x of shape {x.shape}, gamma, dy, eps={eps})"
        got = call(fn, x.copy(), gamma.copy(), dy.copy(), eps)
        assert isinstance(got, tuple) and len(got) == 3, f"{context}: return (dx, dgamma, dbeta), got {got!r}"
        lib = _minidist_layer_norm_grads(x, gamma, beta, dy, eps)
        for name, mine, want in zip(("dx", "dgamma", "dbeta"), got, lib):
            close(mine, want, f"{context}: {name} (compared with minidist's LayerNorm)", rtol=1e-7, atol=1e-9)
        loss = functools.partial(_layer_norm_loss, x, gamma, beta, dy, eps)  # reads x as it is perturbed
        numeric = _central_differences(loss, x)
        close(got[0], numeric, f"{context}: dx (compared with central differences)", rtol=1e-5, atol=1e-6)


# (vocab_size, block_size, n_layer, n_head, n_embd): small models built here, and nanoGPT's CPU config.
_CONFIGS = [(65, 8, 1, 1, 4), (65, 64, 4, 4, 128), (100, 16, 3, 2, 24), (7, 5, 2, 4, 8), (65, 32, 1, 8, 16)]
# GPT-2 small (Radford et al. 2019): 124,439,808 parameters with its tied head, too large to build here.
_GPT2_SMALL = ((50257, 1024, 12, 12, 768), 124_439_808)


def _config(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int):
    from minidist.models import GPTConfig  # noqa: PLC0415

    return GPTConfig(
        vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd
    )


@exercise(
    "Which parameters does one block hold (two LayerNorms, the attention's two Linear layers, the MLP's "
    "two), what shape has each weight and each bias, and which parameters sit outside the blocks?",
    "Write the shape of every weight and bias of one block (c_attn maps C to 3C, c_fc C to 4C), add them "
    "up and multiply by the number of layers; then add the two embedding tables and the final "
    "LayerNorm. The head adds nothing: it is the token embedding's table. The number of heads changes "
    "nothing either.",
)
def count_parameters(fn: Callable[[Any], int]) -> None:
    """count_parameters(config) equals GPT(config).num_parameters() for five small configs and GPT-2
    small's 124,439,808 (biases on, tied head)."""
    from minidist.models import GPT  # noqa: PLC0415

    for sizes in _CONFIGS:
        config = _config(*sizes)
        want = GPT(config).num_parameters()
        close(call(fn, config), want, f"count_parameters(GPTConfig{sizes} as (V, T, L, heads, C))", rtol=0)
    sizes, want = _GPT2_SMALL
    close(call(fn, _config(*sizes)), want, f"count_parameters(GPT-2 small {sizes})", rtol=0)


@exercise(
    "Which matrix products does one token go through in a forward pass (in each block and at the end), "
    "what are their sizes, and how many multiply-adds does each take? How does backward compare?",
    "A product of a (1, a) row with an (a, b) matrix costs 2ab FLOPs. Per block: the four C-to-C "
    "worth of q, k, v and output projections, the MLP's two C-to-4C products, and attention's two "
    "products against T keys of width C; then the head against the vocabulary. Backward costs twice "
    "the forward.",
)
def count_flops(fn: Callable[[Any], int]) -> None:
    """count_flops(config) equals GPT(config).flops_per_token() (matmul FLOPs of forward and backward per
    token) for six configs, GPT-2 small included."""
    from minidist.models import GPT  # noqa: PLC0415

    for sizes in [*_CONFIGS, _GPT2_SMALL[0]]:
        config = _config(*sizes)
        want = GPT.flops_per_token(SimpleNamespace(config=config))  # no weights needed: only the sizes
        close(call(fn, config), want, f"count_flops(GPTConfig{sizes} as (V, T, L, heads, C))", rtol=0)
