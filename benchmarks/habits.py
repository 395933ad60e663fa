"""Costs of the PyTorch habits of issue 14 (item 16), as ratios within one run on one process.

    PYTHONPATH=. python benchmarks/habits.py

1. the per-call check ``cross_entropy`` gained (which targets equal ``ignore_index``; range checked on
   the others) against the range check it had before, both against the fused op's forward + backward,
   batch 256 x 10 classes (float32);
2. the general cross-entropy path (``label_smoothing=0.1``, built from ops) against the fused one;
3. exact GELU (scipy's erf) against the tanh approximation, forward + backward on 256 x 1024 float32.
"""

from __future__ import annotations

import timeit

import numpy as np

import minidist as md
from minidist.nn import functional as F
from minidist.ops.softmax import CrossEntropy


def per_call(fn, number: int) -> float:
    """Best of 7 repeats, seconds per call (the minimum is the least disturbed by other processes)."""
    return min(timeit.repeat(fn, number=number, repeat=7)) / number


def forward_backward(make_loss, x: np.ndarray):
    def run():
        t = md.tensor(x, requires_grad=True)
        make_loss(t).backward()

    return run


def main() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((256, 10)).astype(np.float32)
    t = rng.integers(0, 10, size=256)

    def old_check():
        return int(t.min()) < 0 or int(t.max()) >= 10

    def new_check():  # as in cross_entropy now
        ignored = t == -100
        any_ignored = bool(ignored.any())
        counted = t[~ignored] if any_ignored else t
        return counted.size and (int(counted.min()) < 0 or int(counted.max()) >= 10)

    fused = per_call(forward_backward(lambda x: CrossEntropy.apply(x, targets=t), logits), 1000)
    added = per_call(new_check, 5000) - per_call(old_check, 5000)
    print(
        f"cross_entropy 256x10: fused op fwd+bwd {fused * 1e6:.1f} us; the ignore_index check adds "
        f"{added * 1e6:.1f} us ({100 * added / fused:.1f}% of it)"
    )
    smooth = per_call(forward_backward(lambda x: F.cross_entropy(x, t, label_smoothing=0.1), logits), 500)
    plain = per_call(forward_backward(lambda x: F.cross_entropy(x, t), logits), 500)
    print(
        f"cross_entropy 256x10 fwd+bwd: default {plain * 1e6:.1f} us, label_smoothing=0.1 "
        f"{smooth * 1e6:.1f} us (x{smooth / plain:.2f})"
    )

    x = rng.standard_normal((256, 1024)).astype(np.float32)
    tanh = per_call(forward_backward(lambda a: F.gelu(a, approximate="tanh").sum(), x), 20)
    exact = per_call(forward_backward(lambda a: F.gelu(a).sum(), x), 20)
    print(
        f"gelu 256x1024 fwd+bwd: tanh {tanh * 1e3:.2f} ms, exact (erf) {exact * 1e3:.2f} ms "
        f"(x{exact / tanh:.2f})"
    )


if __name__ == "__main__":
    main()
