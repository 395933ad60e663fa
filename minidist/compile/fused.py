"""The optimizer step of a replayed training step, in place and without temporaries.

``AdamW.step`` and ``SGD.step`` (``minidist/optim``) make a new array for almost every operator of their
formulas: eight temporaries per parameter for AdamW. ``fused_step`` runs the same operations, in the
same order and with the same Python-float scalars (NumPy rounds each to the array's dtype, NEP 50), on
two scratch arrays sized for the largest parameter, with ``out=``: every element goes through the same
sequence of IEEE operations, so the result has the same bits as the eager step (tests/compile). It is
torch's ``foreach`` style (one update loop over all parameters with shared buffers, ``torch.optim.AdamW
(foreach=True)``); not a flat buffer of all parameters, which would have to re-point every parameter's
array. Measured on the GPT, the passes over memory cost, not the allocations (docs/performance.md,
"Changes measured before and after": two scratch arrays instead of eight temporaries gave 0.97x), so
this saves little; any other optimizer runs its own ``step()``.

Each parameter's version counter is bumped, as ``p.data -= ...`` does eagerly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.optim import SGD, AdamW


def supports(optimizer: Any) -> bool:
    """Whether ``fused_step`` has the update of this optimizer (exactly AdamW or SGD, not a subclass)."""
    return type(optimizer) in (AdamW, SGD)


class Scratch:
    """Scratch arrays of the largest parameter's size and dtype for each dtype; ``take(i, a)`` is a view
    of buffer ``i`` shaped like ``a``."""

    def __init__(self) -> None:
        self.buffers: dict[Any, list] = {}

    def take(self, i: int, a: Any) -> Any:
        flats = self.buffers.get(a.dtype)
        if flats is None or flats[0].size < a.size:
            flats = self.buffers[a.dtype] = [np.empty(a.size, a.dtype) for _ in range(3)]
        return flats[i][: a.size].reshape(a.shape)


def fused_step(optimizer: Any, scratch: Scratch) -> None:
    """One ``optimizer.step()`` of AdamW or SGD, bit-identical to it (module docstring)."""
    if type(optimizer) is AdamW:
        _adamw(optimizer, scratch)
    else:
        _sgd(optimizer, scratch)


def _adamw(opt: AdamW, scratch: Scratch) -> None:
    if any(p.grad is not None and "exp_avg" not in opt.state.get(i, ()) for _, i, p in opt.indexed_groups()):
        AdamW.step(opt)  # some parameter's first step: eager's own code makes its state
        return
    opt.step_count += 1
    for d, i, p in opt.indexed_groups():
        g = p.grad
        if g is None:
            continue
        state = opt.state[i]
        beta1, beta2 = d["betas"]
        lr, eps = d["lr"], d["eps"]
        state["step"] += 1
        t = state["step"]
        m, v, a = state["exp_avg"], state["exp_avg_sq"], p._data
        tmp, den = scratch.take(0, a), scratch.take(1, a)
        a *= 1 - lr * d["weight_decay"]
        m *= beta1
        m += np.multiply(g, 1 - beta1, out=tmp)  # (1 - beta1) * g
        v *= beta2
        np.multiply(g, 1 - beta2, out=tmp)
        v += np.multiply(tmp, g, out=tmp)  # (1 - beta2) * g * g
        np.divide(v, 1 - beta2**t, out=den)  # v_hat
        np.sqrt(den, out=den)  # v_hat ** 0.5 (NumPy computes ** 0.5 as sqrt)
        den += eps
        np.divide(m, 1 - beta1**t, out=tmp)  # m_hat
        tmp *= lr
        tmp /= den
        a -= tmp
        p._version_counter[0] += 1


def _sgd(opt: SGD, scratch: Scratch) -> None:
    i = -1
    for group in opt.param_groups:
        lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
        weight_decay, nesterov = group["weight_decay"], group["nesterov"]
        for p in group["params"]:
            i += 1
            g = p.grad
            if g is None:
                continue
            a = p._data
            if weight_decay:  # g + weight_decay * p
                g = np.add(g, np.multiply(a, weight_decay, out=scratch.take(0, a)), out=scratch.take(0, a))
            if momentum:
                state = opt.state.setdefault(i, {})
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = g.copy()
                else:
                    buf = state["momentum_buffer"]
                    buf *= momentum
                    buf += np.multiply(g, 1 - dampening, out=scratch.take(1, a))
                buf = state["momentum_buffer"]
                if nesterov:  # g + momentum * buf
                    g = np.add(g, np.multiply(buf, momentum, out=scratch.take(1, a)), out=scratch.take(1, a))
                else:
                    g = buf
            a -= np.multiply(g, lr, out=scratch.take(2, a))
            p._version_counter[0] += 1
    opt.step_count += 1
