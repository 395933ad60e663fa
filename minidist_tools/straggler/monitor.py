"""StragglerMonitor: a warning during training when one rank is consistently slower than the others.

    monitor = StragglerMonitor(every=20, threshold=1.2)   # collective: every rank of the group
    for xb, yb in loader:
        with monitor.step():                                # one training step
            ...forward, backward, optimizer step...

Each ``step()`` block becomes a ``trace.STEP`` span; when it ends, the monitor takes this rank's compute
in it from this rank's own spans: the step minus the time the training thread spent in ``WAIT``, ``COMM``
or ``COLLECTIVE`` spans (the rule of :mod:`minidist_tools.straggler.breakdown`, without the cross-rank
separation of waiting from transfer, which needs every rank's spans). Every ``every`` steps the ranks
all-gather their median compute per step over those steps (one float each) and, if the rule of
:mod:`minidist_tools.straggler.verdict` names a rank, rank 0 issues a :class:`StragglerWarning`; every rank
keeps the verdict in :attr:`StragglerMonitor.stragglers`.

Cost: tracing must be on (the monitor turns it on with ``collectives=True`` if it is off): a few
microseconds per span, ~10 spans per data-parallel step, plus one small all-gather per ``every`` steps,
made between steps so it is not counted in any step (docs/performance.md, "The straggler monitor").
Not creating a monitor costs nothing. The spans stay in the trace (a few hundred bytes each) so that a
report or a timeline can be made at the end; for a very long run, re-``enable`` the trace from time to
time.
"""

from __future__ import annotations

import statistics
import threading
import warnings

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.distributed.comm import Communicator
from minidist.distributed.world import group_or_world
from minidist_tools.straggler.breakdown import BLOCKING
from minidist_tools.straggler.verdict import Straggler, find_stragglers
from minidist_tools.timeline import merge_intervals


class StragglerWarning(UserWarning):
    """A rank's compute per step was above the others' by the monitor's threshold over a whole window."""


class StragglerMonitor:
    """Watch every rank's compute per step; warn when one is consistently slower (collective to create).

    ``every``: steps per window (each window's verdict uses the medians over its steps, all-gathered at
    its end); ``threshold`` and ``min_excess`` (seconds): see
    :func:`~minidist_tools.straggler.verdict.find_stragglers`; ``patience``: a rank is reported once the rule
    has named it in this many consecutive windows ("consistently slower"); ``group``: the ranks compared
    (default: the world), ranks that do the same work per step (a pipeline: its data-parallel group, as
    stages differ). Raises ``ValueError`` for ``every`` or ``patience`` < 1 or a bad threshold. Ranks
    named (in the warning and :attr:`stragglers`) are world ranks.

    Why ``patience=2``: with more ranks than cores, ranks that wait in MPI spin on a core, and whichever
    rank the scheduler happens to squeeze computes 2-4x slower for a while (measured: a 20-step window
    with one rank at 7.4 ms of compute against 1.8 ms, 4 ranks on 2 busy cores, no slow rank). Such a
    window moves from rank to rank; a real straggler stays. Two windows in a row named the same rank in
    none of our runs without a slow rank, and in every window with one.
    """

    def __init__(
        self, every: int = 20, threshold: float = 1.2, min_excess: float = 0.002, patience: int = 2,
        group: Communicator | None = None,
    ) -> None:  # fmt: skip
        if every < 1 or patience < 1:
            raise ValueError(f"every={every}, patience={patience}: both must be at least 1")
        find_stragglers([], threshold, min_excess)  # checks threshold and min_excess
        self.every, self.threshold, self.min_excess, self.patience = every, threshold, min_excess, patience
        self._named: dict[int, int] = {}  # rank -> consecutive windows that named it
        self.group = group_or_world(group)
        self.steps = 0
        self._start = 0.0  # trace time at which the current step began
        self.stragglers: list[Straggler] = []  # named in the last `patience` windows (empty: none)
        self._compute: list[float] = []  # this rank's compute per step in the current window
        if not trace.is_enabled():
            dist.barrier(self.group)  # every rank's trace clock starts at (nearly) the same instant
            trace.enable(collectives=True)
        self._seen = trace.event_count()

    def step(self) -> StragglerMonitor:
        """``with monitor.step():`` times the block as one training step; at the end of every
        ``every``-th, compares the ranks (an all-gather on ``group``: every rank must run the same number
        of steps). A step that raises is recorded but not compared (the other ranks may be elsewhere)."""
        return self

    def __enter__(self) -> None:
        self._start = trace.now()

    def __exit__(self, error_type: type | None, *_: object) -> None:
        # A plain class, not @contextmanager: a generator would cost microseconds on every step.
        start, end = self._start, trace.now()
        trace.record(f"step {self.steps}", trace.STEP, start, end)
        self.steps += 1
        if trace.event_count() < self._seen:  # someone re-enabled tracing (which clears it): start over
            self._seen = 0
        new = trace.events(self._seen)
        self._seen += len(new)
        # This thread's time blocked in communication or waiting (the breakdown's rule for compute,
        # without its cross-rank part, which needs every rank's spans): a few spans per step.
        thread = threading.get_ident()
        blocked = merge_intervals(
            (max(e["start"], start), min(e["end"], end))
            for e in new
            if e["cat"] in BLOCKING and e["tid"] == thread
        )
        self._compute.append(end - start - sum(b - a for a, b in blocked))
        if error_type is None and len(self._compute) >= self.every:
            self._compare()

    def _compare(self) -> None:
        mine = np.array([statistics.median(self._compute)])
        self._compute.clear()
        everyone = dist.all_gather(mine, group=self.group)
        self._seen = trace.event_count()  # the all-gather's own span belongs to no step
        named = find_stragglers([float(c) for c in everyone], self.threshold, self.min_excess)
        self._named = {s.rank: self._named.get(s.rank, 0) + 1 for s in named}  # others start again at 0
        world_ranks = self.group.collective_channel.calls.world_ranks  # name world ranks, not group ranks
        self.stragglers = [Straggler(world_ranks[s.rank], s.compute, s.others)
                           for s in named if self._named[s.rank] >= self.patience]  # fmt: skip
        if self.stragglers and self.group.rank == 0:
            for s in self.stragglers:
                warnings.warn(f"{s.describe()}, median over steps {self.steps - self.every}-{self.steps - 1}",
                              StragglerWarning, stacklevel=3)  # the user's with line  # fmt: skip
