"""StragglerMonitor: a warning during training when one rank is consistently slower than the others.

    monitor = StragglerMonitor(every=20, threshold=1.2)   # collective: every rank of the group
    for xb, yb in loader:
        with monitor.step():                                # one training step
            ...forward, backward, optimizer step...

Each ``step()`` block becomes a ``trace.STEP`` span; when it ends, the monitor splits the step into
compute and blocked time from this rank's own spans (:mod:`minidist.straggler.breakdown`, without the
cross-rank wait analysis, which needs every rank's spans). Every ``every`` steps the ranks all-gather
their median compute per step over those steps (one float each) and, if the rule of
:mod:`minidist.straggler.verdict` names a rank, rank 0 issues a :class:`StragglerWarning`; every rank
keeps the verdict in :attr:`StragglerMonitor.stragglers`.

Cost: tracing must be on (the monitor turns it on with ``collectives=True`` if it is off): a few
microseconds per span, ~10 spans per data-parallel step, plus one small all-gather per ``every`` steps,
made between steps so it is not counted in any step (measured in benchmarks/straggler.py). Not creating a
monitor costs nothing. The spans stay in the trace (a few hundred bytes each) so that a report or a
timeline can be made at the end; for a very long run, re-``enable`` the trace from time to time.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.distributed.comm import Communicator, group_or_world
from minidist.straggler.breakdown import step_breakdown
from minidist.straggler.verdict import Straggler, find_stragglers


class StragglerWarning(UserWarning):
    """A rank's compute per step was above the others' by the monitor's threshold over a whole window."""


class StragglerMonitor:
    """Watch every rank's compute per step; warn when one is consistently slower (collective to create).

    ``every``: steps per window (the verdict uses the median over a window, all-gathered at its end);
    ``threshold`` and ``min_excess`` (seconds): see :func:`~minidist.straggler.verdict.find_stragglers`;
    ``group``: the ranks compared (default: the world). Raises ``ValueError`` for ``every`` < 1 or a bad
    threshold. Ranks named are ranks of ``group``.
    """

    def __init__(
        self, every: int = 20, threshold: float = 1.2, min_excess: float = 0.002,
        group: Communicator | None = None,
    ) -> None:  # fmt: skip
        if every < 1:
            raise ValueError(f"every={every}: the monitor needs at least 1 step per window")
        find_stragglers([], threshold, min_excess)  # checks threshold and min_excess
        self.every, self.threshold, self.min_excess = every, threshold, min_excess
        self.group = group_or_world(group)
        self.steps = 0
        self.stragglers: list[Straggler] = []  # the verdict of the latest window (empty: none)
        self._compute: list[float] = []  # this rank's compute per step in the current window
        if not trace.is_enabled():
            dist.barrier(self.group)  # every rank's trace clock starts at (nearly) the same instant
            trace.enable(collectives=True)
        self._seen = trace.event_count()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time the block as one training step; at the end of every ``every``-th, compare the ranks
        (an all-gather on ``group``: every rank must run the same number of steps)."""
        start = trace.now()
        yield  # an exception skips the rest: the other ranks may be somewhere else now
        end = trace.now()
        trace.record(f"step {self.steps}", trace.STEP, start, end)
        new = trace.events(self._seen)
        self._seen += len(new)
        (times,) = step_breakdown([new], waits=[[]])
        self._compute.append(times[-1].compute if times else end - start)
        self.steps += 1
        if len(self._compute) >= self.every:
            self._compare()

    def _compare(self) -> None:
        mine = np.array([statistics.median(self._compute)])
        self._compute.clear()
        everyone = dist.all_gather(mine, group=self.group)
        self._seen = trace.event_count()  # the all-gather's own span belongs to no step
        self.stragglers = find_stragglers([float(c) for c in everyone], self.threshold, self.min_excess)
        if self.stragglers and self.group.rank == 0:
            for s in self.stragglers:
                warnings.warn(f"{s.describe()}, median over steps {self.steps - self.every}-{self.steps - 1}",
                              StragglerWarning, stacklevel=4)  # the user's with line  # fmt: skip
