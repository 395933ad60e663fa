"""Costs of the PyTorch habits of issue 14 (item 16), as ratios within one run on one process.

    python benchmarks/habits.py

1. ``cross_entropy``'s argument checks (now also: which targets equal ``ignore_index``) against the
   fused op alone (``CrossEntropy.apply``), forward + backward, batch 256 x 10 classes (float32);
2. exact GELU (scipy's erf) against the tanh approximation, forward + backward on 256 x 1024 float32;
3. the general cross-entropy path (``label_smoothing=0.1``) against the fused one.
"""

from __future__ import annotations

import timeit

import numpy as np

import minidist as md
from minidist.nn import functional as F
from minidist.ops.softmax import CrossEntropy


def per_call(fn, number: int) -> float:
    """Best of 5 repeats, seconds per call."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def forward_backward(make_loss, x: np.ndarray):
    def run():
        t = md.tensor(x, requires_grad=True)
        make_loss(t).backward()

    return run


def main() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((256, 10)).astype(np.float32)
    targets = rng.integers(0, 10, size=256)
    fused = per_call(forward_backward(lambda t: CrossEntropy.apply(t, targets=targets), logits), 2000)
    checked = per_call(forward_backward(lambda t: F.cross_entropy(t, targets), logits), 2000)
    smooth = per_call(
        forward_backward(lambda t: F.cross_entropy(t, targets, label_smoothing=0.1), logits), 500
    )
    print(
        f"cross_entropy 256x10: fused op {fused * 1e6:.1f} us, with checks {checked * 1e6:.1f} us "
        f"(x{checked / fused:.2f}); label_smoothing path {smooth * 1e6:.1f} us (x{smooth / fused:.2f})"
    )

    x = rng.standard_normal((256, 1024)).astype(np.float32)
    tanh = per_call(forward_backward(lambda t: F.gelu(t, approximate="tanh").sum(), x), 50)
    exact = per_call(forward_backward(lambda t: F.gelu(t).sum(), x), 50)
    print(
        f"gelu 256x1024 fwd+bwd: tanh {tanh * 1e3:.2f} ms, exact (erf) {exact * 1e3:.2f} ms "
        f"(x{exact / tanh:.2f})"
    )


if __name__ == "__main__":
    main()
