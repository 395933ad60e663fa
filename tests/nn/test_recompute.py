"""Activation recomputation (Chen et al. 2016): same outputs and gradients, fewer stored activations."""

from __future__ import annotations

import json

import numpy as np
import pytest

import minidist as md
from minidist import nn
from minidist import random as md_random
from minidist.nn import functional as F
from minidist.nn.recompute import recompute


def block(seed: int) -> nn.Sequential:
    md.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(5, 7, dtype=np.float64), nn.GELU(), nn.Dropout(0.4), nn.Linear(7, 5, dtype=np.float64)
    )


def run(use_recompute: bool, x_requires_grad: bool) -> tuple[np.ndarray, dict, np.ndarray | None, float]:
    blocks = [block(s) for s in range(3)]
    md.manual_seed(42)  # the dropout masks come from here
    x = md.tensor(
        np.random.default_rng(0).standard_normal((4, 5)), dtype=np.float64, requires_grad=x_requires_grad
    )
    h = x
    for b in blocks:
        h = recompute(lambda t, b=b: b(t).tanh(), h) if use_recompute else b(h).tanh()
    loss = (h * h).mean()
    loss.backward()
    grads = {f"{i}.{n}": p.grad.copy() for i, b in enumerate(blocks) for n, p in b.named_parameters()}
    after = md_random.get_rng_state()
    return h.numpy(), grads, (x.grad.copy() if x_requires_grad else None), str(after)


@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_gradients_equal_the_plain_ones(x_requires_grad):
    out, grads, x_grad, rng_after = run(False, x_requires_grad)
    out_r, grads_r, x_grad_r, rng_after_r = run(True, x_requires_grad)
    # The same ops on the same numbers in the same order: equal to the last bit.
    np.testing.assert_array_equal(out_r, out)
    assert grads_r.keys() == grads.keys()
    for name in grads:
        np.testing.assert_array_equal(grads_r[name], grads[name])
    if x_requires_grad:
        np.testing.assert_array_equal(x_grad_r, x_grad)
    # The recomputation restored the generator, so later draws are unaffected by it.
    assert rng_after_r == rng_after


def test_activations_are_not_kept_and_hooks_fire_once():
    b = block(0)
    x = md.tensor(np.ones((2, 5)), dtype=np.float64, requires_grad=True)
    y = recompute(lambda t: b(t), x)
    assert len(y._ctx.inputs) == 2  # x and the anchor: no graph inside the block is stored
    calls = []
    for p in b.parameters():
        p.register_post_accumulate_grad_hook(lambda p: calls.append(p))
    F.relu(y).sum().backward()
    assert len(calls) == 4 and all(p.grad is not None for p in b.parameters())


def test_after_backward_runs_once_when_the_segments_gradients_are_complete():
    """FSDP's hook: called after the backward through the recomputed segment, once, with
    every parameter's gradient of that segment accumulated (so it can reduce-scatter and free them)."""
    first, second = block(0), block(1)
    seen = []

    def done(b, name):
        seen.append((name, [p.grad is not None for p in b.parameters()]))

    x = md.tensor(np.ones((2, 5)), dtype=np.float64, requires_grad=True)
    h = recompute(first, x, after_backward=lambda: done(first, "first"))
    h = recompute(second, h, after_backward=lambda: done(second, "second"))
    assert seen == []  # nothing in forward
    h.sum().backward()
    assert seen == [("second", [True] * 4), ("first", [True] * 4)]  # backward order, all complete


def test_plain_values_and_bad_fn():
    x = md.tensor(np.ones(3), dtype=np.float64, requires_grad=True)
    y = recompute(lambda t, k: t * k, x, 3.0)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(3, 3.0))
    with pytest.raises(TypeError, match="must return one Tensor"):
        recompute(lambda t: (t, t), x)
    with md.no_grad():  # nothing to differentiate: runs plainly
        assert recompute(lambda t: t * 2, x)._ctx is None


class Counter:
    """A stand-in for a registered generator (the tensor-parallel tracker): its state is one number."""

    def __init__(self) -> None:
        self.n = 0

    def get_states(self) -> dict:
        return {"n": self.n}

    def set_states(self, states: dict) -> None:
        self.n = states["n"]


def test_registered_generators_are_replayed_and_restored(monkeypatch):
    monkeypatch.setattr(md_random, "_registered", {})
    monkeypatch.setattr(md_random, "_waiting", {})
    counter = Counter()
    md_random.register("counter", counter)
    seen = []

    def fn(t):
        seen.append(counter.n)  # a "draw": what the generator's state was
        counter.n += 1
        return t * 2

    x = md.tensor(np.ones(3), dtype=np.float64, requires_grad=True)
    recompute(fn, x).sum().backward()
    assert seen == [0, 0]  # the recomputation drew what the forward drew
    assert counter.n == 1  # and training continues from where the forward left it
    states = md_random.get_all_rng_states()
    assert set(states) == {"rng", "counter"} and json.loads(json.dumps(states)) == states
    with pytest.raises(ValueError, match="already registered as 'counter'"):
        md_random.register("counter", Counter())
    # A state restored before its generator exists is handed to it when it registers.
    md_random.set_all_rng_states({**states, "later": {"n": 7}})
    later = Counter()
    md_random.register("later", later)
    assert later.n == 7


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_the_recomputation_runs_under_the_forwards_autocast(low):
    """A segment run under autocast is recomputed under the same autocast, though backward runs after the
    ``with`` block ended (as torch.utils.checkpoint restores the autocast state): else backward would
    differentiate a float32 forward that never ran, and FSDP (which recomputes every unit) would give
    other gradients than one process under --dtype bfloat16. Same ops, same numbers: equal to the bit."""

    def grads(use_recompute: bool) -> dict:
        md.manual_seed(3)
        b = nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 5))
        x = md.tensor(np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32), requires_grad=True)
        with md.autocast(dtype=low):
            h = recompute(lambda t: b(t), x) if use_recompute else b(x)
            loss = (h * h).mean()  # (mean: a float32 op under autocast)
        loss.backward()
        out = {n: p.grad.copy() for n, p in b.named_parameters()}
        out["x"] = x.grad.copy()
        return out

    plain, recomputed = grads(False), grads(True)
    for name in plain:
        np.testing.assert_array_equal(recomputed[name], plain[name], err_msg=name)
