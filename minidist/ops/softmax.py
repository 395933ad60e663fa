"""Softmax, log-softmax and the cross-entropy loss (with PyTorch's options), computed stably.

Subtracting the row maximum m before exponentiating changes nothing mathematically
(softmax(x) = softmax(x - m)) but keeps every e^(x - m) <= 1, so float32 never overflows.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import autocast
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import array_module as _xp
from minidist.backend import asarray
from minidist.ops.dtypes import autocast_float32


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
        self.rows = xp.arange(n)  # kept: backward indexes the same (row, target) pairs
        picked = log_probs[self.rows, targets]
        self.targets, self.probs = targets, xp.exp(log_probs)
        self.scale = 1.0 / n if reduction == "mean" else 1.0
        return -picked.sum() * self.scale

    def backward(self, grad):
        # BEGIN SOLUTION A1.4: the gradient of the cross-entropy with respect to the logits
        d_logits = self.probs.copy()  # a copy: with retain_graph a second backward reads probs again
        d_logits[self.rows, self.targets] -= 1
        d_logits *= grad * self.scale  # in place on our own copy: no third array
        return (d_logits,)
        # END SOLUTION


def _dim(fn: str, dim: int | None, axis: int | None) -> int:
    """The axis from torch's ``dim=`` or NumPy's ``axis=`` (either works; -1 when neither is given)."""
    if dim is not None and axis is not None and dim != axis:
        raise TypeError(f"{fn}: got dim={dim} and axis={axis}; they are the same argument, pass one")
    return -1 if dim is None and axis is None else (dim if dim is not None else axis)


def log_softmax(x: Tensor, dim: int | None = None, *, axis: int | None = None) -> Tensor:
    """log softmax(x) along ``dim`` (torch's name) or ``axis`` (NumPy's), the last one by default;
    the result has x's shape. Raises ``TypeError`` if ``dim`` and ``axis`` are both given and differ."""
    if autocast.low_dtype is not None:  # on autocast's float32 list (minidist/autograd/autocast.py)
        x = autocast_float32(x)
    return LogSoftmax.apply(x, axis=_dim("log_softmax", dim, axis))


def softmax(x: Tensor, dim: int | None = None, *, axis: int | None = None) -> Tensor:
    """softmax(x) along ``dim`` (torch's name) or ``axis`` (NumPy's), the last one by default;
    the result has x's shape. Raises ``TypeError`` if ``dim`` and ``axis`` are both given and differ."""
    if autocast.low_dtype is not None:  # on autocast's float32 list (minidist/autograd/autocast.py)
        x = autocast_float32(x)
    return Softmax.apply(x, axis=_dim("softmax", dim, axis))


def cross_entropy(
    logits: Tensor,
    targets: Any,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross-entropy of ``logits`` (N, C) against class indices ``targets`` (N,), as
    ``torch.nn.functional.cross_entropy``.

    loss_n = (1 - eps) * (-log p_n[t_n]) + eps * mean_c(-log p_n[c]),  p_n = softmax(logits_n),
    eps = ``label_smoothing`` (Szegedy et al. 2016, "Rethinking the Inception Architecture", §7:
    the target distribution is (1 - eps) onehot + eps / C). A sample whose target is ``ignore_index``
    contributes 0 and is not counted. ``reduction``: "mean" (the sum over the counted samples divided
    by their number; NaN if there are none, as PyTorch), "sum", or "none" (the (N,) per-sample losses).

    Raises:
        ValueError: logits not 2-D, target count differs from N, a target outside [0, C) that is not
            ``ignore_index``, an empty batch with reduction="mean", an unknown ``reduction``, or
            ``label_smoothing`` outside [0, 1].
        TypeError: targets are not integers.
    """
    if autocast.low_dtype is not None:  # on autocast's float32 list (minidist/autograd/autocast.py)
        logits = autocast_float32(logits)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must lie in [0, 1], got {label_smoothing}")
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
    # The common case costs two reductions (docs/performance.md, "What the cuts took out"): every
    # target is a class index and ignore_index (-100 by default) is none, so none is ignored or out of range.
    low, high = (int(t.min()), int(t.max())) if t.size else (0, 0)
    common = 0 <= low and high < shape[1] and not 0 <= ignore_index < shape[1]
    ignored = None if common else t == ignore_index
    any_ignored = not common and bool(ignored.any())
    counted = t[~ignored] if any_ignored else t
    if not common and counted.size and (int(counted.min()) < 0 or int(counted.max()) >= shape[1]):
        raise ValueError(
            f"cross_entropy: targets must lie in [0, {shape[1]}) or equal ignore_index={ignore_index}, "
            f"got values from {int(counted.min())} to {int(counted.max())}"
        )
    if label_smoothing == 0 and reduction != "none" and not any_ignored:
        return CrossEntropy.apply(logits, targets=t, reduction=reduction)  # the common case, fused
    if ignored is None:
        ignored = t == ignore_index
    return _general_cross_entropy(logits, t, ignored, reduction, label_smoothing)


def _general_cross_entropy(logits: Tensor, t: Any, ignored: Any, reduction: str, eps: float) -> Tensor:
    """Ignored targets, label smoothing or per-sample losses, built from differentiable ops (their
    gradients are the ops' own), so only the fused ``CrossEntropy`` needs a hand-written backward."""

    xp = _xp(t)
    log_probs = log_softmax(logits, dim=1)
    safe = xp.where(ignored, 0, t)  # any class index for an ignored row: its loss is masked to 0 below
    per_sample = -log_probs[xp.arange(len(t)), safe]
    if eps:
        per_sample = per_sample * (1 - eps) - log_probs.mean(axis=1) * eps
    per_sample = per_sample * Tensor((~ignored).astype(log_probs.dtype))
    if reduction == "none":
        return per_sample
    total = per_sample.sum()
    if reduction == "sum":
        return total
    count = int((~ignored).sum())
    return total / count if count else total * float("nan")  # PyTorch: 0 / 0 = NaN, without a warning
