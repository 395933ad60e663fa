"""DDP's bookkeeping: the numbers that travel with the last gradient bucket, and the errors they raise.

Two mistakes make the ranks of a data-parallel group disagree about which collectives to run, and so
hang: a parameter that gets no gradient on some rank (its bucket never fills there), and a rank that
runs out of batches before the others. Each rank writes ``P + 1`` flags at the end of its last bucket:
one per parameter (1 = "this backward pass produced its gradient") and one "still training" flag (0
from a rank that called ``join()``). The all-reduce with ``op="avg"`` turns them into fractions of the
group; multiplied by ``n`` they are counts that *every* rank receives identically, so every rank raises
the same error with the same message, and none is left waiting.
(These flags ride on the gradient all-reduce that runs anyway, so the check costs no extra message
per step; the options, checked once at construction, use ``minidist.distributed.agree`` instead.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed import CollectiveMismatchError


def agree_on_options(group: Any, bucket_cap_mb: float, overlap: bool, small_bucket_bytes: int) -> None:
    """Collective over ``group``: raise ``ValueError`` on every rank if some rank passed a value out of
    range (``bucket_cap_mb <= 0``, ``small_bucket_bytes < 0``) or if the ranks passed different options.

    The options decide which all-reduces a backward pass runs and in which order (the bucket plan, and
    which buckets go to the communication thread), so ranks with different ones would hang. One
    all-gather of a few hundred bytes, once per DDP construction.
    """
    error = None
    if not bucket_cap_mb > 0:
        error = ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
    elif not small_bucket_bytes >= 0:
        error = ValueError(f"small_bucket_bytes must be >= 0, got {small_bucket_bytes}")
    options = {"bucket_cap_mb": bucket_cap_mb, "overlap": overlap, "small_bucket_bytes": small_bucket_bytes}
    dist.agree(options, error, group, what="DistributedDataParallel")


def write_flags(extra: Any, ready: np.ndarray | None, training: bool) -> None:
    """Fill the ``P + 1`` bookkeeping slots ``extra``: the per-parameter ``ready`` flags (zeros for None)
    and the "still training" flag."""
    extra[:-1] = 0 if ready is None else backend.asarray(ready, dtype=extra.dtype)
    extra[-1] = 1 if training else 0


def read_counts(extra: Any, n: int) -> tuple[np.ndarray, int]:
    """After the average over ``n`` ranks: (per parameter, ranks that had its gradient; ranks training)."""
    # flag * n is a count; rint undoes the rounding of the division by n.
    counts = np.rint(backend.to_numpy(extra).astype(np.float64) * n).astype(np.int64)
    return counts[:-1], int(counts[-1])


def uneven_batches_error(training: int, n: int) -> CollectiveMismatchError:
    """``training`` of ``n`` ranks ran a backward pass while the others had called ``join()``."""
    return CollectiveMismatchError(
        f"DistributedDataParallel: the ranks ran different numbers of batches: {n - training} of {n} "
        f"ranks had called join() (no batches left) while {training} ran another backward pass. Give "
        "every rank the same number of batches (e.g. DistributedSampler with drop_last=True) and call "
        "join() on every rank after its last batch"
    )


def check_after_backward(
    names: list[str], have_gradient: np.ndarray, training: int, n: int, find_unused_parameters: bool
) -> None:
    """Raise if some rank had joined, or (unless ``find_unused_parameters``) some rank lacked a gradient.

    Raises ``CollectiveMismatchError`` (uneven batches) or ``RuntimeError`` naming every parameter
    that is missing and on how many of the ``n`` ranks.
    """
    if training < n:
        raise uneven_batches_error(training, n)
    unused = [f"{name!r} (missing on {n - c} of {n} ranks)" for name, c in zip(names, have_gradient) if c < n]
    if unused and not find_unused_parameters:
        raise RuntimeError(
            f"DistributedDataParallel: parameters {', '.join(unused)} received no gradient in this "
            "backward pass. Every parameter must take part in the loss on every rank: remove unused "
            "parameters, freeze them with requires_grad=False before wrapping, or pass "
            "find_unused_parameters=True to average missing gradients as zeros"
        )
