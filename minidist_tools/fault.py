"""``MINIDIST_FAULT``: make one rank fail on purpose at a chosen step (for lessons, demos and tests).

To see what the elastic launcher does after a failure, something must fail, at a known rank and step,
and ``kill -9 <pid>`` by hand is too slow for a run of a few seconds. The examples call
:meth:`Fault.at_step` after every training step; the variable says which rank does what, and when::

    MINIDIST_FAULT=kill:rank=2:step=80      # rank 2 sends itself SIGKILL after step 80
    MINIDIST_FAULT=exit:rank=1:step=40:code=3   # rank 1 leaves with exit code 3 (os._exit: no cleanup)
    MINIDIST_FAULT=freeze:rank=1:step=40    # rank 1 stops (SIGSTOP): a hang (--stall-timeout, watchdog)

Several faults are separated by commas. A fault fires on the first attempt only (under ``minidist
launch``, ``MINIDIST_RESTART_COUNT`` 0), so the restarted job, which passes the same step again, runs on;
``attempt=K`` fires it on attempt K instead. This module imports nothing but ``os`` and ``signal``: the
framework (``minidist``) knows nothing of it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

ENV = "MINIDIST_FAULT"
ACTIONS = ("kill", "exit", "freeze")
_EXAMPLE = (
    f"e.g. {ENV}=kill:rank=2:step=80 (ACTION:rank=R:step=S[:code=C][:attempt=K], ACTION one of {ACTIONS})"
)


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``action`` (kill | exit | freeze) on world rank ``rank`` after step ``step``."""

    action: str
    rank: int
    step: int
    code: int = 1  # for exit
    attempt: int = 0

    def fire(self) -> None:
        """Do it now, to this process."""
        if self.action == "exit":
            os._exit(self.code)  # no atexit, no MPI_Finalize: as a crash in C code would leave
        os.kill(os.getpid(), signal.SIGKILL if self.action == "kill" else signal.SIGSTOP)


def parse(value: str) -> list[Fault]:
    """The faults that ``value`` (``MINIDIST_FAULT``'s grammar) names; [] for an empty value.

    Raises ``ValueError`` naming the variable for anything else (the same on every rank).
    """
    faults = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        action, *fields = item.split(":")
        try:
            pairs = dict(field.split("=", 1) for field in fields)
            numbers = {
                key: int(pairs.pop(key)) for key in ("rank", "step", "code", "attempt") if key in pairs
            }
        except ValueError:
            raise ValueError(f"{ENV}={value!r}: cannot read {item!r}; {_EXAMPLE}") from None
        if action not in ACTIONS or pairs or "rank" not in numbers or "step" not in numbers:
            raise ValueError(f"{ENV}={value!r}: cannot read {item!r}; {_EXAMPLE}")
        if min(numbers.values()) < 0:
            raise ValueError(f"{ENV}={value!r}: rank, step, code and attempt must be >= 0")
        faults.append(Fault(action, **numbers))
    return faults


class FaultPlan:
    """This rank's faults, read once from ``MINIDIST_FAULT``; :meth:`at_step` fires the one due."""

    def __init__(self, rank: int, value: str | None = None) -> None:
        value = os.environ.get(ENV, "") if value is None else value
        attempt = os.environ.get("MINIDIST_RESTART_COUNT", "0").strip() or "0"
        self.faults = [
            f for f in parse(value) if f.rank == rank and str(f.attempt) == attempt
        ]  # an unreadable value raises on every rank, even those it does not name

    def at_step(self, step: int) -> None:
        """Call after each training step (``step`` = steps done): fires a fault set for this step."""
        for fault in self.faults:
            if fault.step == step:
                fault.fire()
