"""Softmax, log-softmax and the cross-entropy loss, computed stably.

Subtracting the row maximum m before exponentiating changes nothing mathematically
(softmax(x) = softmax(x - m)) but keeps every e^(x - m) <= 1, so float32 never overflows.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import Function
from minidist.backend import array_module as _xp


def _log_softmax(x: Any, axis: int) -> Any:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - _xp(x).log(_xp(x).exp(shifted).sum(axis=axis, keepdims=True))


class LogSoftmax(Function):
    """y_i = x_i - log sum_j e^(x_j) along ``axis``;  dL/dx = g - softmax(x) * sum_j g_j."""

    def forward(self, x, axis=-1):
        self.axis = axis
        y = _log_softmax(x, axis)
        self.softmax = _xp(y).exp(y)
        return y

    def backward(self, grad):
        return (grad - self.softmax * grad.sum(axis=self.axis, keepdims=True),)


class Softmax(Function):
    """y_i = e^(x_i) / sum_j e^(x_j) along ``axis``;  dL/dx = y * (g - sum_j g_j y_j)."""

    def forward(self, x, axis=-1):
        self.axis = axis
        self.y = _xp(x).exp(_log_softmax(x, axis))
        return self.y

    def backward(self, grad):
        return (self.y * (grad - (grad * self.y).sum(axis=self.axis, keepdims=True)),)


class CrossEntropy(Function):
    """L = -(1/N) sum_n log softmax(x_n)[t_n] for logits x (N, C) and integer targets t (N,).

    dL/dx_n = (softmax(x_n) - onehot(t_n)) / N. With ``reduction="sum"`` the 1/N is dropped.
    One fused op instead of log_softmax + indexing + mean: fewer arrays kept for backward.
    """

    def forward(self, logits, targets=None, reduction="mean"):
        xp = _xp(logits)
        n = logits.shape[0]
        log_probs = _log_softmax(logits, axis=1)
        picked = log_probs[xp.arange(n), targets]
        self.targets, self.probs = targets, xp.exp(log_probs)
        self.scale = 1.0 / n if reduction == "mean" else 1.0
        return -picked.sum() * self.scale

    def backward(self, grad):
        # BEGIN SOLUTION A1.4: the gradient of the cross-entropy with respect to the logits
        xp = _xp(grad)
        d_logits = self.probs.copy()
        d_logits[xp.arange(len(self.targets)), self.targets] -= 1
        return (d_logits * (grad * self.scale),)
        # END SOLUTION


def log_softmax(x, axis: int = -1):
    return LogSoftmax.apply(x, axis=axis)


def softmax(x, axis: int = -1):
    return Softmax.apply(x, axis=axis)


def cross_entropy(logits, targets, reduction: str = "mean"):
    """Mean (or summed) cross-entropy of ``logits`` (N, C) against class indices ``targets`` (N,).

    Raises:
        ValueError: logits not 2-D, target count differs from N, a target outside [0, C), an empty
            batch with reduction="mean", or an unknown ``reduction``.
        TypeError: targets are not integers.
    """
    from minidist.autograd import Tensor  # noqa: PLC0415
    from minidist.backend import asarray  # noqa: PLC0415

    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    t = targets.data if isinstance(targets, Tensor) else asarray(targets)
    shape = tuple(logits.shape)
    if len(shape) != 2:
        raise ValueError(f"cross_entropy expects logits of shape (N, C), got {shape}")
    if t.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy expects integer class indices as targets, got dtype {t.dtype}")
    if t.shape != (shape[0],):
        raise ValueError(f"cross_entropy: targets have shape {tuple(t.shape)}, expected ({shape[0]},)")
    if shape[0] == 0 and reduction == "mean":
        raise ValueError("cross_entropy: the mean over an empty batch is undefined")
    if t.size and (int(t.min()) < 0 or int(t.max()) >= shape[1]):
        raise ValueError(
            f"cross_entropy: targets must lie in [0, {shape[1]}), "
            f"got values from {int(t.min())} to {int(t.max())}"
        )
    return CrossEntropy.apply(logits, targets=t, reduction=reduction)
