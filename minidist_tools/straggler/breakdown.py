"""Per step and per rank: time in compute, in communication, and waiting for other ranks, from the trace.

A rank's step time alone cannot tell a slow rank from its victims: in synchronous data parallelism every
rank's step takes as long as the slowest one's, because the others wait for it inside the gradient
all-reduce. What differs is *where* the time goes:

* **compute**: the step's time on the training thread (the one that ran the step) outside every span of
  category ``trace.WAIT``, ``trace.COMM`` or ``trace.COLLECTIVE``: the thread was working, not blocked;
* **wait**: time a collective had been entered by this rank but not yet by every rank of its group. For
  one call, rank r waits from its own entry until the *last* member entered (the others cannot finish
  without that member's data); that is ``max(entry) - entry_r``, cut at the end of r's call;
* **comm**: time covered by communication spans (``COMM``/``COLLECTIVE``, any thread: DDP all-reduces on
  its communication thread) minus the waits: data actually moving, or being packed and reduced.

The straggler has more compute; the others have the matching extra wait. With overlap (DDP's thread),
communication runs *during* backward, so compute + comm + wait need not add up to the step.

Matching the same call across ranks needs ``trace.enable(collectives=True)`` (one ``COLLECTIVE`` span per
call, with its group) and clocks on a common time base (:mod:`minidist_tools.straggler.clock`). MPI's rule
that the ranks of a communicator call its collectives in the same order makes "the k-th call on group g" the
same call on every member. Without collective spans the waits cannot be separated and count as comm.
This module is pure arithmetic on span lists (no MPI): the unit tests feed it made-up spans.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from minidist import trace
from minidist.trace import Event
from minidist_tools.timeline import Interval, intersection_length, merge_intervals, subtract_intervals

BLOCKING = (trace.WAIT, trace.COMM, trace.COLLECTIVE)  # the training thread was not computing
COMMUNICATING = (trace.COMM, trace.COLLECTIVE)  # spans that move (or wait for) data


@dataclass(frozen=True)
class StepTimes:
    """One step of one rank, in seconds: ``total`` (its ``trace.STEP`` span), ``compute``, ``comm``,
    ``wait`` (module docstring for the definitions)."""

    total: float
    compute: float
    comm: float
    wait: float


def call_key(event: Event) -> tuple | None:
    """Which group a ``COLLECTIVE`` span's call ran on: (name, size, world rank of its rank 0), or None
    for a span that does not say (recorded before this field existed, or not a collective)."""
    args = event.get("args") or {}
    if event["cat"] != trace.COLLECTIVE or "first" not in args:
        return None
    return (args.get("group"), args.get("ranks"), args["first"])


def peer_waits(events_per_rank: Sequence[Iterable[Event]]) -> list[list[Interval]]:
    """For every rank, the intervals its collectives waited for the last member of the group to enter.

    ``events_per_rank[r]``: rank r's spans on a common clock (already aligned). A call is matched across
    ranks as the k-th ``COLLECTIVE`` span (by start time) on the same group; a call that not every
    member recorded (tracing started late on one of them) is skipped. Returns sorted disjoint intervals.
    """
    calls: dict[tuple, list[tuple[int, float, float]]] = defaultdict(list)
    for rank, events in enumerate(events_per_rank):
        counter: dict[tuple, int] = defaultdict(int)
        for e in sorted((e for e in events if call_key(e) is not None), key=lambda e: e["start"]):
            key = call_key(e)
            calls[(key, counter[key])].append((rank, e["start"], e["end"]))
            counter[key] += 1
    waits: list[list[Interval]] = [[] for _ in events_per_rank]
    for ((_, size, _), _), members in calls.items():
        if len(members) != size:
            continue
        last_entry = max(start for _, start, _ in members)
        for rank, start, end in members:
            if last_entry > start:
                waits[rank].append((start, min(end, last_entry)))
    return [merge_intervals(w) for w in waits]


def step_breakdown(
    events_per_rank: Sequence[Iterable[Event]], waits: Sequence[list[Interval]] | None = None
) -> list[list[StepTimes]]:
    """Every rank's steps (its ``trace.STEP`` spans, in time order) split into compute, comm and wait.

    ``waits`` defaults to :func:`peer_waits` of the same events (pass ``[[]] * n`` for a single rank's
    view, where waits cannot be told from transfers). Returns ``result[rank][step]``.
    """
    events_per_rank = [list(events) for events in events_per_rank]
    if waits is None:
        waits = peer_waits(events_per_rank)
    result = []
    for events, wait in zip(events_per_rank, waits, strict=True):
        steps = sorted((e for e in events if e["cat"] == trace.STEP), key=lambda e: e["start"])
        training_threads = {e["tid"] for e in steps}
        blocked = _Intervals(
            (e["start"], e["end"]) for e in events if e["cat"] in BLOCKING and e["tid"] in training_threads
        )
        communicating = merge_intervals((e["start"], e["end"]) for e in events if e["cat"] in COMMUNICATING)
        moving = _Intervals(subtract_intervals(communicating, wait))
        waiting = _Intervals(wait)
        rows = []
        for s in steps:
            total = s["end"] - s["start"]
            rows.append(StepTimes(total=total, compute=total - blocked.within(s["start"], s["end"]),
                                  comm=moving.within(s["start"], s["end"]),
                                  wait=waiting.within(s["start"], s["end"])))  # fmt: skip
        result.append(rows)
    return result


class _Intervals:
    """Sorted disjoint intervals that answer "how much of [start, end) do you cover?" in O(log n + k)."""

    def __init__(self, intervals: Iterable[Interval]) -> None:
        self.intervals = merge_intervals(intervals)
        self.ends = [end for _, end in self.intervals]

    def within(self, start: float, end: float) -> float:
        first = bisect.bisect_right(self.ends, start)  # the first interval that ends after start
        last = first
        while last < len(self.intervals) and self.intervals[last][0] < end:
            last += 1
        return intersection_length(self.intervals[first:last], [(start, end)])
