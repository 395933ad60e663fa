"""Counting the bytes that leave this rank, for the trace: which group sent how much, in which call.

Cost formulas (``minidist_tools.perfmodel.transformer``) count the bytes *one rank sends*. To compare, every
point-to-point message minidist sends adds its size to ``bytes_sent`` of the communicator it leaves by
(``host_send``, ``host_sendrecv``, ``host_isend`` of ``comm.py`` and ``watched.py``), always: one integer
addition. A collective's messages leave by its ``collective_channel``, so the channel's count before and
after a call is what the algorithm ``"auto"`` chose really sent (a ring all-reduce of N bytes over n
ranks ``2 (n-1)/n N``, recursive doubling ``log2(n) N``), not the size of the array.

Under ``trace.enable(messages=True)`` the calls also become trace spans (a span costs microseconds; off,
one flag read); ``trace.enable(collectives=True)`` records the first kind only:

* :func:`collective_span`: one ``trace.COLLECTIVE`` span per public collective (``calls.collective_call``
  opens it), named after it, with ``args`` ``group`` (the group's ``name``), ``ranks``, ``first`` (the
  world rank of the group's rank 0: with ``group`` and ``ranks`` it tells groups of one name apart, so
  ``minidist_tools.straggler`` can match a call across ranks), ``payload`` (the array's bytes;
  ``all_gather``: this rank's chunk), ``dtype``, ``algorithm`` and ``bytes`` (None for MPI's built-ins,
  ``algorithm="mpi"``, which send outside these counters);
* :func:`message_span`: one ``trace.MESSAGE`` span per point-to-point send (``send``, ``sendrecv``,
  ``isend``) with ``group``, ``bytes``, ``dtype`` and ``peer``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from minidist import trace


@contextmanager
def collective_span(name: str, group: Any, array: Any) -> Iterator[None]:
    """A ``trace.COLLECTIVE`` span around one call of collective ``name`` on ``group`` (module docstring)."""
    link = group.collective_channel
    details: dict[str, Any] = {"group": group.name, "ranks": group.size, "first": link.calls.world_ranks[0],
                               "payload": getattr(array, "nbytes", 0),
                               "dtype": str(getattr(array, "dtype", ""))}  # fmt: skip
    before, link.algorithm = link.bytes_sent, None  # tuning.resolve notes the algorithm it runs
    with trace.span(name, trace.COLLECTIVE, details):
        try:
            yield
        finally:
            details["algorithm"] = link.algorithm
            details["bytes"] = None if link.algorithm == "mpi" else link.bytes_sent - before


def message_span(group: Any, kind: str, host: Any, peer: int) -> AbstractContextManager[None]:
    """A ``trace.MESSAGE`` span for sending array ``host`` to ``peer`` of ``group`` while messages are
    traced; otherwise the shared do-nothing context, after one flag check."""
    if not trace.messages_enabled():
        return trace.NO_SPAN
    details = {"group": group.name, "bytes": host.nbytes, "dtype": str(host.dtype), "peer": peer}
    return trace.span(kind, trace.MESSAGE, details)
