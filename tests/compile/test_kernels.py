"""The replay's kernels (minidist/compile/kernels.py) give the bits of the ops they stand for."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist import optim
from minidist.compile import fused
from minidist.compile.kernels import KERNELS


def special_values(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.flat[:8] = [-0.0, 0.0, np.nan, np.inf, -np.inf, 1e-40, -1e-40, 30.0]  # signed zeros, denormals
    return x


@pytest.mark.parametrize("op", list(KERNELS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_kernel_gives_the_ops_bits_forward_and_backward(op, dtype):
    x = special_values((3, 5, 64), 0).astype(dtype)
    grad = special_values((3, 5, 64), 1).astype(dtype)[:, :, ::-1].copy()
    eager, replayed = op(), KERNELS[op]()
    with np.errstate(all="ignore"):
        assert eager.forward(x).tobytes() == replayed.forward(x).tobytes()
        (a,), (b,) = eager.backward(grad), replayed.backward(grad)
    assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def two_optimizers(make):
    """Two copies of the same parameters (one without a gradient) with the optimizer ``make`` builds."""
    copies = []
    for _ in range(2):
        rng = np.random.default_rng(3)
        arrays = [rng.standard_normal(s).astype(np.float32) for s in (7, (5, 3), 4)]
        params = [md.tensor(a, requires_grad=True) for a in arrays]
        copies.append((params, make(params)))
    return copies


@pytest.mark.parametrize("make", [
    lambda ps: optim.AdamW(
        [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}], lr=3e-3, eps=1e-6
    ),
    lambda ps: optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.9), weight_decay=0.0),
])  # fmt: skip
def test_the_fused_update_gives_the_optimizers_bits(make):
    (eager_params, eager), (fused_params, opt) = two_optimizers(make)
    scratch = fused.Scratch()
    rng = np.random.default_rng(4)
    for step in range(4):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in eager_params]
        for params in (eager_params, fused_params):
            for i, (p, g) in enumerate(zip(params, grads)):
                p.grad = None if (i == 1 and step == 0) else g.copy()  # a late first gradient
        eager.step()
        fused.fused_step(opt, scratch)
        for a, b in zip(eager_params, fused_params):
            assert a.data.tobytes() == b.data.tobytes()
    assert opt.step_count == eager.step_count
