"""How DDP registers a hook and runs it on a bucket: the checks, the agreement, the call.

Registration is collective (``DistributedDataParallel.register_comm_hook``): every rank checks its own
call, then one :func:`minidist.distributed.agree` compares the ranks' hooks and hyperparameters. A rank
whose hook differs would run other collectives than the others (PowerSGD's three all-reduces against
one) and hang, or silently average differently; so every rank raises the same ``ValueError`` instead,
naming what differs on which ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpi4py import MPI

import minidist.distributed as dist
from minidist.parallel.comm_hooks.bucket import CommStats, GradBucket
from minidist.parallel.comm_hooks.powersgd import PowerSGDState
from minidist.parallel.data_parallel.buckets import Bucket

Hook = Callable[[Any, GradBucket], Any]


class CommHook:
    """A registered ``(state, hook)`` pair, and how DDP calls it on one of its buckets."""

    def __init__(self, state: Any, hook: Hook) -> None:
        self.state, self.hook = state, hook

    def run(self, bucket: Bucket, group: dist.Communicator, is_last: bool, stats: CommStats) -> None:
        """Replace the packed local gradients in ``bucket.flat`` by the hook's average, in place.

        The hook sees only the gradients (``bucket.flat[:numel]``); DDP's bookkeeping flags at the end of
        the last bucket (``data_parallel/checks.py``) must stay an exact average, which a compressing hook
        would not give, so they follow in an all-reduce of their own (one small message per step, only
        when a hook is registered). Raises ``TypeError`` if the hook returns anything but an array of
        the buffer's shape and dtype.
        """
        gradients = bucket.flat[: bucket.numel]
        view = GradBucket(bucket.index, gradients, bucket.params, is_last, group, stats)
        result = self.hook(self.state, view)
        if result is not gradients:
            shape, dtype = getattr(result, "shape", None), getattr(result, "dtype", None)
            if shape != gradients.shape or dtype != gradients.dtype:
                raise TypeError(
                    f"communication hook {describe_hook(self.hook)} returned {type(result).__name__} of "
                    f"shape {shape} and dtype {dtype}; it must return the bucket's averaged flat gradient, "
                    f"an array of shape {gradients.shape} and dtype {gradients.dtype} (e.g. bucket.buffer())"
                )
            gradients[...] = result
        if bucket.extra.size:
            dist.all_reduce(bucket.extra, op="avg", group=group)


def register(
    group: dist.Communicator, state: Any, hook: Any, *, registered: bool, backward_ran: bool
) -> CommHook:
    """Collective over DDP's ``group``: check one rank's ``register_comm_hook(state, hook)`` call, agree
    with the other ranks, and return the :class:`CommHook` to run.

    Raises on every rank: ``RuntimeError`` if some rank had registered a hook already (once only, as in
    PyTorch) or had run a backward pass through DDP (its buckets were averaged without the hook);
    ``TypeError`` if ``hook`` is not callable; ``ValueError`` if ``state`` is (or, for a
    ``PowerSGDState``, its ``process_group`` is) a Communicator with other ranks than DDP's group, or if
    the ranks' hooks or PowerSGD hyperparameters differ. Any other ``state`` (a user hook's own) is
    passed to the hook as it is.
    """
    error = _problem(group, state, hook, registered, backward_ran)
    values = None if error is not None else {"hook": describe_hook(hook), **_describe_state(state)}
    dist.agree(
        values, error, group, what="register_comm_hook", label="DistributedDataParallel group",
        fix="register the same hook, with the same state arguments, on every rank",
    )  # fmt: skip
    return CommHook(state, hook)


def describe_hook(hook: Any) -> str:
    """``module.qualname`` of a hook function (its class name for other callables)."""
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    return f"{getattr(hook, '__module__', None) or type(hook).__module__}.{name}"


def _describe_state(state: Any) -> dict[str, Any]:
    """The state's kind, and a PowerSGDState's hyperparameters one by one (so a difference names one)."""
    kind = None if state is None else type(state).__qualname__
    return {"state": kind, **(state.hyperparameters() if isinstance(state, PowerSGDState) else {})}


def _problem(group: dist.Communicator, state: Any, hook: Any, registered: bool, backward_ran: bool):
    if registered:
        return RuntimeError(
            "register_comm_hook can only be called once per DistributedDataParallel: a hook is registered "
            "already (build a new DDP to change it)"
        )
    if backward_ran:
        return RuntimeError(
            "register_comm_hook must be called before the first backward pass through "
            "DistributedDataParallel: the buckets of that pass were averaged without the hook"
        )
    if not callable(hook):
        return TypeError(f"hook must be a function hook(state, bucket) -> array, got {type(hook).__name__}")
    own = state.process_group if isinstance(state, PowerSGDState) else state
    if isinstance(own, dist.Communicator) and MPI.Comm.Compare(own.mpi, group.mpi) not in (
        MPI.IDENT,
        MPI.CONGRUENT,
    ):
        return ValueError(
            f"the hook's state names a process group of {own.size} ranks that is not DDP's group of "
            f"{group.size} ranks; pass None (DDP's group) or DDP's own group"
        )
    return None
