"""Inverted dropout (Srivastava et al. 2014, with the 1/(1-p) scaling done at training time).

In training each element is zeroed with probability p and the survivors are multiplied by
1/(1-p), so the expected value is unchanged and evaluation needs no rescaling.

**Which generator draws the mask.** Normally minidist's default generator, which ``md.manual_seed``
puts in the same state on every rank: a tensor that is the same on every rank (replicated) then gets
the same mask everywhere, as it must. A tensor-parallel *shard* (``x.sharded_over`` is set: the ranks
hold different slices of one activation, e.g. the output of ``ColumnParallelLinear(gather_output=
False)``) needs a different mask per rank, or every slice would drop the same units (Shoeybi et al.
2019, §3, last paragraph). Tensor parallelism registers the stream for those here
(:func:`set_sharded_stream`: its RNG tracker's per-rank generator); this layer knows nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from minidist import random
from minidist.autograd.function import Function
from minidist.backend import array_module

# () -> a context in which minidist's default generator draws a shard's masks; None: none registered
_sharded_stream: Callable[[], AbstractContextManager] | None = None


class Dropout(Function):
    """y = x * m / (1 - p), m_i ~ Bernoulli(1 - p);  dL/dx = dL/dy * m / (1 - p)."""

    def forward(self, x, p=0.5):
        self.mask = scaled_keep_mask(x, p)
        return x * self.mask

    def backward(self, grad):
        return (grad * self.mask,)


def scaled_keep_mask(x: Any, p: float) -> Any:
    """m / (1 - p) with m_i ~ Bernoulli(1 - p), an array of x's shape, dtype and device.

    Drawn from minidist's default generator on the host (the same masks on CPU and GPU); also used by
    attention's dropout on its weights (``ops/attention.py``).
    """
    keep = random.generator().random(x.shape) >= p
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    return array_module(x).asarray(keep, dtype=x.dtype) * x.dtype.type(scale)


def mask_stream(x: Any) -> AbstractContextManager:
    """The context to draw the dropout mask of (something computed from) tensor ``x`` in: the per-rank
    stream if ``x`` is a tensor-parallel shard and one is registered, else the default generator."""
    if getattr(x, "sharded_over", None) is not None and _sharded_stream is not None:
        return _sharded_stream()
    return nullcontext()


def set_sharded_stream(stream: Callable[[], AbstractContextManager] | None) -> None:
    """Draw the masks of tensors whose ``sharded_over`` is set inside ``stream()`` (module docstring).

    Called once by ``minidist.parallel.tensor_parallel.random`` with its RNG tracker's ``fork``.
    """
    global _sharded_stream
    _sharded_stream = stream


def dropout(x, p: float = 0.5, training: bool = True):
    """Zero elements of ``x`` (any shape) with probability ``p`` when ``training``, else return ``x``.

    A tensor-parallel shard draws its mask from the per-rank stream (module docstring); that stream
    raises ``ValueError`` if it was never seeded (``model_parallel_manual_seed``). Raises
    ``ValueError`` unless 0 <= p <= 1.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be between 0 and 1, got {p}")
    if not training or p == 0.0:
        return x
    with mask_stream(x):
        return Dropout.apply(x, p=float(p))
