"""Inverted dropout (Srivastava et al. 2014, with the 1/(1-p) scaling done at training time).

In training each element is zeroed with probability p and the survivors are multiplied by
1/(1-p), so the expected value is unchanged and evaluation needs no rescaling.
"""

from __future__ import annotations

from minidist import random
from minidist.autograd import Function
from minidist.backend import array_module


class Dropout(Function):
    """y = x * m / (1 - p), m_i ~ Bernoulli(1 - p);  dL/dx = dL/dy * m / (1 - p)."""

    def forward(self, x, p=0.5):
        keep = random.generator().random(x.shape) >= p  # drawn on the host: same masks on CPU and GPU
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        self.mask = array_module(x).asarray(keep, dtype=x.dtype) * x.dtype.type(scale)
        return x * self.mask

    def backward(self, grad):
        return (grad * self.mask,)


def dropout(x, p: float = 0.5, training: bool = True):
    """Zero elements of ``x`` with probability ``p`` when ``training``, else return ``x`` unchanged.

    Raises ``ValueError`` unless 0 <= p <= 1.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return x
    return Dropout.apply(x, p=float(p))
