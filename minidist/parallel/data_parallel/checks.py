"""DDP's checks: its options, agreed before it is built, and the bookkeeping that travels with the gradients.

First, :func:`options`, run by ``@agreed_arguments`` before ``DistributedDataParallel.__init__`` (the one
seam between DDP and its construction checks): the options decide which all-reduces a backward pass
runs and in which order, so the ranks compare them (``minidist.distributed.agree``) before anything is
broadcast or allocated.

Two mistakes make the ranks of a data-parallel group disagree about which collectives to run, and so
hang: a parameter that gets no gradient on some rank (its bucket never fills there), and a rank that
runs out of batches before the others. Each rank writes ``P + 1`` flags at the end of its last bucket:
one per parameter (1 = "this backward pass produced its gradient") and one "still training" flag (0
from a rank that called ``join()``). The all-reduce with ``op="avg"`` (the gradients' own: no extra
message per step) turns them into fractions of the group; multiplied by ``n`` they are counts that
*every* rank receives identically, so every rank raises the same error with the same message.

A rank missing a gradient starts the remaining buckets anyway at the end of backward (its own gradient,
or zeros if it has none), so all collectives complete before anyone raises. A rank with no batches left
calls ``DistributedDataParallel.join``, which takes part in the same bucket all-reduces with zeros and a
"not training" flag (:func:`join_pass`): if another rank was still training, both sides learn it from
the same numbers and raise ``CollectiveMismatchError`` instead of hanging.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed import CollectiveMismatchError
from minidist.nn.module import Module
from minidist.parallel.comm_hooks.bucket import CommStats
from minidist.parallel.comm_hooks.registration import CommHook
from minidist.parallel.data_parallel.buckets import Bucket


def options(module: Any, group: Any, **rest: Any) -> dict[str, Any]:
    """The check of ``DistributedDataParallel``'s arguments (``@agreed_arguments(checks.options)``).

    ``TypeError`` (on this rank) if ``module`` is not a Module; then ``group`` None becomes the world and
    the ranks agree on the options (:func:`agree_on_options`, collective), so a rank with a bad or
    different option, or a module without a trainable parameter, raises with all the others before
    anything is broadcast or allocated. Returns the arguments, ``group`` resolved.
    """
    if not isinstance(module, Module):
        raise TypeError(f"DistributedDataParallel wraps a Module, got a {type(module).__name__}")
    group = group if group is not None else dist.init()
    trains = any(p.requires_grad for p in module.parameters())
    agree_on_options(group, rest["bucket_cap_mb"], rest["overlap"], rest["small_bucket_bytes"], trains)
    return {"module": module, "group": group, **rest}


def agree_on_options(
    group: Any, bucket_cap_mb: float, overlap: bool, small_bucket_bytes: int, trains: bool = True
) -> None:
    """Collective over ``group``: raise on every rank if some rank's module has no parameter that requires a
    gradient (``RuntimeError``, torch's message; it would have no bucket), passed a value out of range
    (``ValueError``: ``bucket_cap_mb <= 0``, ``small_bucket_bytes < 0``), or if the ranks passed different
    options (``ValueError``: they decide the bucket plan and which buckets go to the thread, so ranks with
    different ones would hang). One all-gather of a few hundred bytes per DDP."""
    error: Exception | None = None
    if not trains:
        error = RuntimeError(
            "DistributedDataParallel is not needed when a module doesn't have any parameter that requires "
            "a gradient."
        )
    elif not bucket_cap_mb > 0:
        error = ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
    elif not small_bucket_bytes >= 0:
        error = ValueError(f"small_bucket_bytes must be >= 0, got {small_bucket_bytes}")
    options = {"bucket_cap_mb": bucket_cap_mb, "overlap": overlap, "small_bucket_bytes": small_bucket_bytes}
    dist.agree(options, error, group, what="DistributedDataParallel")


def write_flags(extra: Any, ready: Sequence[bool] | None, training: bool) -> None:
    """Fill the ``P + 1`` bookkeeping slots ``extra``: the per-parameter ``ready`` flags (zeros for None)
    and the "still training" flag."""
    extra[:-1] = 0 if ready is None else backend.asarray(ready, dtype=extra.dtype)
    extra[-1] = 1 if training else 0


def all_present(extra: Any) -> bool:
    """After the average: True if every flag is exactly 1, i.e. every rank had every gradient and was
    training, so there is nothing to report and the counts need not be decoded (the common case).

    Exact in any float dtype: ``n`` ones summed and divided by ``n`` give 1, and a 0 from any rank
    leaves the flag at ``(n - 1) / n`` or below (for ``n`` within the dtype's precision, which
    :func:`read_counts` needs too).
    """
    return min(backend.to_numpy(extra).tolist()) == 1


def read_counts(extra: Any, n: int) -> tuple[np.ndarray, int]:
    """After the average over ``n`` ranks: (per parameter, ranks that had its gradient; ranks training)."""
    # flag * n is a count; rint undoes the rounding of the division by n.
    counts = np.rint(backend.to_numpy(extra).astype(np.float64) * n).astype(np.int64)
    return counts[:-1], int(counts[-1])


def join_pass(order: Sequence[Bucket], flags: Any, comm: Any, hook: CommHook | None) -> None:
    """A joined rank's part in one backward pass of the others: every bucket's all-reduce on ``comm``, in
    DDP's launch ``order``, with zeros and a "not training" flag in ``flags`` (the last bucket's
    ``extra``), or the same collectives through the registered ``hook``. Raises
    ``CollectiveMismatchError`` if some rank was still training."""
    write_flags(flags, None, training=False)  # no gradients, not training
    for bucket in order:  # the order of the training ranks' all-reduces
        bucket.pack_zeros()
        if hook is not None:  # the same collectives as the training ranks' hook
            hook.run(bucket, comm, bucket is order[-1], CommStats())
        else:
            dist.all_reduce(bucket.flat, op="avg", group=comm)
    _, training = read_counts(flags, comm.size)
    if training > 0:
        raise uneven_batches_error(training, comm.size)


def uneven_batches_error(training: int, n: int) -> CollectiveMismatchError:
    """``training`` of ``n`` ranks ran a backward pass while the others had called ``join()``."""
    return CollectiveMismatchError(
        f"DistributedDataParallel: the ranks ran different numbers of batches: {n - training} of {n} "
        f"ranks had called join() (no batches left) while {training} ran another backward pass. Give "
        "every rank the same number of batches (e.g. DistributedSampler with drop_last=True) and call "
        "join() on every rank after its last batch"
    )


def check_flags(extra: Any, n: int, named: Sequence[tuple[str, Any]], find_unused_parameters: bool) -> None:
    """After the last bucket's average over ``n`` ranks: nothing if every flag of ``extra`` is 1 (the
    common case), else raise as :func:`check_after_backward` for the ``(name, parameter)`` pairs ``named``."""
    if all_present(extra):
        return
    names = [name for name, _ in named]
    check_after_backward(names, *read_counts(extra, n), n, find_unused_parameters)


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


def check_alone(
    named: Sequence[tuple[str, Any]], ready: Sequence[bool], find_unused_parameters: bool
) -> None:
    """The check after backward on a group of one rank, where nothing travels: raise as
    :func:`check_after_backward` would for the ``(name, parameter)`` pairs ``named`` whose ``ready`` flag
    is False, or (``find_unused_parameters``) give each a ``.grad`` of zeros, the average N ranks give."""
    if all(ready):
        return
    names = [name for name, _ in named]
    check_after_backward(names, np.array(ready, dtype=np.int64), 1, 1, find_unused_parameters)
    for (_, p), got in zip(named, ready):
        if not got and p.grad is None:
            p.grad = backend.xp().zeros_like(p.data)
