"""``MINIDIST_SLOW_RANK=RANK:SECONDS``: make one rank slower on purpose (a teaching and testing aid).

A real straggler is a rank on a throttled or busy machine, a slower GPU or a noisy neighbour. To see
what one does to a job (and to test that :class:`~minidist_tools.straggler.StragglerMonitor` finds it), the
examples' training loops call :func:`injected_delay` once and sleep that long in every step on the named
rank: ``MINIDIST_SLOW_RANK=2:0.05 mpirun -n 4 python examples/train_mlp.py --straggler-report``.
"""

from __future__ import annotations

import os

ENV = "MINIDIST_SLOW_RANK"


def injected_delay(rank: int, value: str | None = None) -> float:
    """Seconds that rank ``rank`` (world rank) must sleep per step: ``SECONDS`` if ``MINIDIST_SLOW_RANK``
    (or ``value``) names this rank, else 0. Unset or empty: 0 on every rank.

    Raises ``ValueError`` (the same on every rank, which all read the same variable) for a value that is
    not ``RANK:SECONDS`` with an integer rank >= 0 and a number of seconds >= 0.
    """
    value = os.environ.get(ENV, "") if value is None else value
    if not value.strip():
        return 0.0
    text, _, seconds = value.partition(":")
    try:
        slow_rank, delay = int(text), float(seconds)
    except ValueError:
        slow_rank, delay = -1, -1.0
    if slow_rank < 0 or not delay >= 0:
        raise ValueError(f"{ENV}={value!r}: expected RANK:SECONDS, e.g. {ENV}=2:0.05 (rank 2 sleeps 50 ms "
                         "in every step); unset it to run at full speed")  # fmt: skip
    return delay if rank == slow_rank else 0.0
