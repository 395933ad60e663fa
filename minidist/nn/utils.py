"""``clip_grad_norm_`` on one process (PyTorch's ``torch.nn.utils.clip_grad_norm_``).

Gradient clipping by global norm (Pascanu, Mikolov & Bengio, "On the difficulty of training
recurrent neural networks", ICML 2013, §3.2): if the norm of *all* gradients together, as one long
vector, exceeds ``max_norm``, scale every gradient by ``max_norm / norm``. The direction of the
update is kept; only its length is capped. The tensor-parallel version, which adds up the norms of
sharded parameters across ranks, is ``minidist.parallel.clip_grad_norm_``; it uses the helpers here.

**Non-finite norms.** A NaN or infinite gradient makes the norm NaN or inf, for every ``norm_type``
(including ``inf``: the max propagates NaN, as ``torch.linalg.vector_norm`` does), and the norm is
returned as such so the caller can skip the step (as mixed-precision loss scalers do). The gradients
are then left *unchanged*: scaling by ``max_norm / inf = 0`` would silently zero the finite ones (and
turn inf into NaN), scaling by NaN would poison all of them. (PyTorch multiplies by that coefficient
anyway.) With ``error_if_nonfinite=True`` a ``RuntimeError`` is raised instead, as in PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from minidist.autograd import Tensor


def check_clip_args(max_norm: float, norm_type: float) -> float:
    """Validate the arguments; return ``norm_type`` as a float (``inf`` allowed).

    Raises ``TypeError`` for non-numbers and ``ValueError`` for ``max_norm < 0`` or ``norm_type <= 0``.
    """
    for name, value in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"clip_grad_norm_: {name} must be a number, got {type(value).__name__}")
    if not max_norm >= 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0, got {max_norm}")
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 (or math.inf), got {norm_type}")
    return float(norm_type)


def norm_contribution(grads: Iterable[Any], norm_type: float) -> float:
    """What ``grads`` add to a global norm: sum of |g|^p over all elements, or max |g| for p = inf.

    Computed in float64 so that float32 gradients of many elements do not lose the small ones. For
    p = 2 (the usual case) as a dot product: two passes over each gradient instead of four (abs, power and
    sum each make one), 2.3x faster for a GPT (docs/performance.md, "Changes measured before and after").
    """
    total = 0.0
    for g in grads:
        if g.size == 0:
            continue
        if norm_type == 2.0:
            a = g.astype(np.float64, copy=False).ravel()  # no copy of a contiguous float64 gradient
            total += float(a @ a)
            continue
        a = abs(g.astype(np.float64))
        if math.isinf(norm_type):  # np.maximum, not max(): max(0.0, nan) is 0.0, and NaN must show;
            total = float(np.maximum(total, float(a.max())))  # on host floats: a.max() may be a GPU array
        else:
            total += float((a**norm_type).sum())
    return total


def combine_contributions(parts: Iterable[float], norm_type: float) -> float:
    """Several ``norm_contribution`` results as one: their max for p = inf (NaN wins), else their sum."""
    values = np.asarray(list(parts), np.float64)
    if values.size == 0:
        return 0.0
    return float(values.max() if math.isinf(norm_type) else values.sum())  # ndarray.max propagates NaN


def check_finite(norm: float, norm_type: float, error_if_nonfinite: bool) -> None:
    """Raise ``RuntimeError`` for a NaN or infinite ``norm`` if ``error_if_nonfinite`` (as PyTorch)."""
    if error_if_nonfinite and not math.isfinite(norm):
        raise RuntimeError(
            f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is {norm}, so "
            "they cannot be clipped; some gradient holds NaN or inf (check the loss and learning "
            "rate), or pass error_if_nonfinite=False to get the norm back and skip the step"
        )


def finish_norm(contribution: float, norm_type: float) -> float:
    """The norm from a total contribution: ``contribution ** (1/p)`` (itself for p = inf)."""
    return contribution if math.isinf(norm_type) else contribution ** (1.0 / norm_type)


def scale_grads_(grads: Iterable[Any], max_norm: float, total_norm: float) -> None:
    """Multiply every gradient in place by ``max_norm / (total_norm + 1e-6)`` if that is below 1.

    A NaN or infinite ``total_norm`` leaves the gradients unchanged (module docstring).
    """
    if not math.isfinite(total_norm):
        return
    coefficient = max_norm / (total_norm + 1e-6)  # 1e-6, as PyTorch: no division by a zero norm
    if coefficient < 1.0:
        for g in grads:
            g *= g.dtype.type(coefficient)


def clip_grad_norm_(
    parameters: Iterable[Tensor], max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> float:
    """Scale the ``.grad`` of ``parameters`` in place so that their global ``norm_type``-norm is at most
    ``max_norm``; return the norm before clipping (a Python float; NaN or inf if a gradient is not
    finite, and then the gradients are left unchanged: module docstring). Parameters without a
    gradient are skipped. Raises like :func:`check_clip_args`, and ``RuntimeError`` for a non-finite
    norm if ``error_if_nonfinite``.
    """
    norm_type = check_clip_args(max_norm, norm_type)
    grads = [p.grad for p in parameters if p.grad is not None]
    total = finish_norm(norm_contribution(grads, norm_type), norm_type)
    check_finite(total, norm_type, error_if_nonfinite)
    scale_grads_(grads, max_norm, total)
    return total
