"""What a DDP communication hook changes in the performance model: bytes, all-reduce rounds, compute.

A hook that compresses the gradients before the all-reduce (``minidist.parallel.comm_hooks``) trades
bytes on the link for compute on the rank. :mod:`minidist_tools.perfmodel.network` prices its effect from
three numbers, a :class:`Compression`:

* **fp16 / bf16** (Micikevicius et al., "Mixed Precision Training", ICLR 2018): 2 bytes per value
  instead of 4, one all-reduce, two casts of the whole gradient.
* **PowerSGD** (Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
  Distributed Optimization", NeurIPS 2019, Algorithm 1): each ``rows x cols`` gradient matrix becomes
  two thin factors ``P`` (rows x r) and ``Q`` (cols x r), all-reduced one after the other (``Q`` is
  computed from the averaged ``P``); tensors too small to gain go whole, in an all-reduce of their own
  before them, as PyTorch's ``powerSGD_hook`` does.

Pure arithmetic, no MPI; bytes and seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral


@dataclass(frozen=True)
class Compression:
    """What a DDP communication hook changes. ``ratio``: plain bytes / bytes all-reduced (2 for fp16 or
    bf16 of float32 gradients); ``seconds``: compute per step to compress and decompress; ``rounds``:
    all-reduces per step where plain DDP makes one (each pays the latency again)."""

    ratio: float = 1.0
    seconds: float = 0.0
    rounds: int = 1
    name: str = "none"


def fp16_compression(grad_bytes: float, seconds_per_byte: float = 0.0) -> Compression:
    """float32 -> float16 (or bfloat16) before the all-reduce and back after: half the bytes, and two
    casts of the whole gradient (``seconds_per_byte`` each, per float32 byte; ``measure_gamma`` is a fair
    estimate, one pass over the data)."""
    return Compression(ratio=2.0, seconds=2 * grad_bytes * seconds_per_byte, rounds=1, name="fp16")


def _powersgd_split(shapes: Sequence[Sequence[int]], rank: int, min_compression_rate: float):
    compressed, whole, flops = 0, 0, 0.0
    for shape in shapes:
        rows, cols = (shape[0] if len(shape) else 1), math.prod(shape[1:])
        factors = (rows + cols) * rank
        if len(shape) >= 2 and factors * min_compression_rate < rows * cols:
            compressed += factors
            # P = M Q, Q = M^T P and the approximation P Q^T (2 rows cols rank each), Gram-Schmidt on P.
            flops += 6.0 * rows * cols * rank + 2.0 * rows * rank * rank
        else:
            whole += rows * cols
    return compressed, whole, flops


def powersgd_values(shapes: Sequence[Sequence[int]], rank: int, min_compression_rate: float = 2) -> int:
    """Values PowerSGD all-reduces per step for parameters of ``shapes``: the factors ``P`` (rows x rank)
    and ``Q`` (cols x rank) of every matrix (first dimension x the product of the others) whose factors
    are more than ``min_compression_rate`` times smaller than it; everything else whole (PyTorch's
    ``powerSGD_hook`` rule; Vogels et al. 2019, §3)."""
    _check_rank(rank)
    compressed, whole, _ = _powersgd_split(shapes, rank, min_compression_rate)
    return compressed + whole


def powersgd_compression(
    shapes: Sequence[Sequence[int]],
    rank: int,
    flops: float,
    min_compression_rate: float = 2,
    seconds_per_byte: float = 0.0,
    bytes_per_value: int = 4,
) -> Compression:
    """PowerSGD as a :class:`Compression`: the ratio of :func:`powersgd_values` to all values, the
    matmuls of Vogels et al. 2019, Algorithm 1 (``6 rows cols rank`` FLOPs per compressed matrix plus
    ``2 rows rank^2`` to orthonormalise P) at ``flops`` FLOP/s (measure them on the thin shapes, far
    from peak), plus :data:`ELEMENTWISE_PASSES` passes over the gradient at ``seconds_per_byte`` (error
    feedback, Algorithm 2: add last step's error, keep a copy, scale the approximation, subtract), and
    2 rounds (P, then Q) or 3 when some tensors go uncompressed (all-reduced first, as PyTorch does)."""
    _check_rank(rank)
    compressed, whole, work = _powersgd_split(shapes, rank, min_compression_rate)
    total = sum(math.prod(s) for s in shapes)
    sent = compressed + whole
    rounds = (2 if compressed else 0) + (1 if whole else 0)
    passes = ELEMENTWISE_PASSES * total * bytes_per_value * seconds_per_byte
    return Compression(
        ratio=total / sent, seconds=work / flops + passes, rounds=max(rounds, 1), name=f"powersgd{rank}"
    )


ELEMENTWISE_PASSES = 4  # buffer += error; local = buffer.copy(); M = P Q^T / n; error = local - buffer


def _check_rank(rank: int) -> None:
    if not isinstance(rank, Integral) or rank < 1:
        raise ValueError(f"rank must be a positive integer, got {rank!r}")
