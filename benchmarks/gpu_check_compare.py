"""Is a GPU run the CPU run? The comparison of benchmarks/gpu_check.py, with its tolerances and their
reasons (one place, so the test of the script checks the same rule the script applies).

A run is a dict of arrays as the trainings save them: ``losses`` (one per step), optionally ``val_loss``,
and the final parameters by name. :func:`compare_runs` answers ``{"ok", "problems", "worst"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """``|got - ref| <= atol + rtol * |ref|`` element-wise (``np.allclose``'s rule), per kind of entry."""

    losses: tuple[float, float]  # (rtol, atol) for the per-step training losses
    val_loss: float  # atol of the final validation loss
    weights: tuple[float, float]  # (rtol, atol) for every parameter but the key bias
    key_bias: float  # atol of the attention's key bias (below)


# MLP in float64 (tests/workers/training/gpu_train.py's model): only the order of the sums inside BLAS
# and the reductions differs between the devices, ~1e-16 relative per sum; five AdamW steps keep that
# (the update m / sqrt(v) is scale-free), so tests/backend/test_gpu.py's 1e-9 leaves a margin of 1e6 and is
# still 1e6 times under what a wrong gradient moves a weight (lr = 1e-2 per step).
MLP_FLOAT64 = Tolerance(losses=(1e-9, 1e-12), val_loss=0.0, weights=(1e-9, 1e-12), key_bias=0.0)

# GPT in float32, 50 AdamW steps of examples/train_gpt.py's default model. Measured on the CPU (the
# same float32 run on 1 and on 2 ranks, which changes the order of the gradient sums as another BLAS
# does): weights differ by <= 2.4e-7 (<= 2e-6 of their size), the losses by <= 2.4e-7, the validation loss
# by 5e-8. A GPU changes the order of every matmul and reduction and uses its own exp/erf, so we allow
# 200x that: 5e-5 on the weights, 2e-4 on the losses; the validation loss to 1e-3. All
# stay far under what a real mistake moves: a wrong average or a wrong batch slice changes each step's
# update by ~lr = 2e-3, 40x the weights' atol after one step and ~2000x after 50.
# The key bias (the middle third of ``attn.c_attn.bias``) is the exception: its exact gradient is 0
# (adding one vector to every key adds the same number to every score of a query, which the softmax
# ignores), so its computed gradient is rounding noise, which AdamW scales to steps of up to lr; it ends as
# noise of its own size (measured: 1.4e-5, differing by 2.3e-5 between the two CPU runs), different on
# every device and irrelevant to the loss. It is only held under 1e-3 (half a step of lr).
GPT_FLOAT32 = Tolerance(losses=(0.0, 2e-4), val_loss=1e-3, weights=(0.0, 5e-5), key_bias=1e-3)


def _key_bias_mask(name: str, value: np.ndarray) -> np.ndarray | None:
    """True on the key part of a fused q, k, v bias (``*.attn.c_attn.bias``, 3C values), else None."""
    if not name.endswith("attn.c_attn.bias") or value.ndim != 1 or value.size % 3:
        return None
    mask = np.zeros(value.size, dtype=bool)
    mask[value.size // 3 : 2 * value.size // 3] = True
    return mask


def compare_runs(got: dict[str, Any], ref: dict[str, Any], tol: Tolerance) -> dict[str, Any]:
    """Compare run ``got`` (e.g. the GPU's) with run ``ref`` (the CPU's) under ``tol``.

    Returns ``{"ok": bool, "problems": [str], "worst": {name: max |got - ref|}}``. A problem is a name on
    one side only, a shape that differs, a NaN or infinity, or a value outside the tolerance (named, with
    its largest difference and the allowed one). Never raises for a mismatch: the caller records it.
    """
    problems, worst = [], {}
    if set(got) != set(ref):
        problems.append(f"names differ: {sorted(set(got) ^ set(ref))}")
    for name in sorted(set(got) & set(ref)):
        a, b = np.asarray(got[name], dtype=np.float64), np.asarray(ref[name], dtype=np.float64)
        if a.shape != b.shape:
            problems.append(f"{name}: shape {a.shape} vs {b.shape}")
            continue
        if not np.isfinite(a).all():
            problems.append(f"{name}: not finite (NaN or inf) in the checked run")
            continue
        diff = np.abs(a - b)
        worst[name] = float(diff.max()) if diff.size else 0.0
        if name == "losses":
            rtol, atol = tol.losses
            allowed = atol + rtol * np.abs(b)
        elif name == "val_loss":
            allowed = np.full(b.shape, tol.val_loss)
        else:
            rtol, atol = tol.weights
            allowed = atol + rtol * np.abs(b)
            mask = _key_bias_mask(name, b)
            if mask is not None:
                allowed = np.where(mask, tol.key_bias, allowed)
        bad = diff > allowed
        if bad.any():
            i = int(np.argmax(np.where(bad, diff - allowed, -np.inf)))
            problems.append(
                f"{name}: {int(bad.sum())} of {diff.size} values outside the tolerance; worst at flat index "
                f"{i}: {a.ravel()[i]:.9g} vs {b.ravel()[i]:.9g} (|diff| {diff.ravel()[i]:.2e}, allowed "
                f"{allowed.ravel()[i]:.2e})"
            )
    return {"ok": not problems, "problems": problems, "worst": worst}
