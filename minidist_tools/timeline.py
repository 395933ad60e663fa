"""Reading a run's timeline: every rank's spans in one Perfetto file, and how much communication was hidden.

``minidist.trace`` records spans inside the library (``trace.events()``: one rank's, plain dicts); what
a person or a tool does with them afterwards lives here:

    everyone = world.mpi.gather(trace.events(), root=0)
    timeline.save_chrome_trace("out.json", everyone)  # open in https://ui.perfetto.dev or chrome://tracing
    print(timeline.overlap_fraction(trace.events()))  # share of communication hidden behind backward

Output format: the "Trace Event Format" (complete events, ``"ph": "X"``, times in microseconds), with
ranks as processes (``pid``) and threads as ``tid``, as described in Google's "Trace Event Format"
document used by chrome://tracing and Perfetto. The interval arithmetic below also serves
``straggler/`` (compute, communication and waiting per step).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from minidist.trace import BACKWARD, COMM, WAIT, Event

# --- Chrome / Perfetto JSON --------------------------------------------------------------------------


def to_chrome_trace(events_per_rank: Sequence[Iterable[Event]]) -> dict[str, Any]:
    """Merge every rank's spans into one Chrome trace: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.

    ``events_per_rank[r]`` is rank r's :func:`events` list (e.g. from an MPI gather). Each span becomes a
    complete event ``{"name", "cat", "ph": "X", "ts", "dur", "pid": r, "tid"}`` (and its ``"args"``, if
    it has any) with ``ts``/``dur`` in microseconds. Thread ids are renumbered 0, 1, ... per rank in
    order of first appearance (the OS ids are huge and mean nothing across processes), and metadata
    events (``"ph": "M"``) name each process ``"rank r"`` and each thread by its Python thread name.
    """
    trace_events: list[dict[str, Any]] = []
    for rank, rank_events in enumerate(events_per_rank):
        trace_events.append(_metadata("process_name", rank, 0, f"rank {rank}"))
        trace_events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                             "args": {"sort_index": rank}})  # fmt: skip
        tids: dict[Any, int] = {}
        for e in rank_events:
            if e["tid"] not in tids:
                tids[e["tid"]] = len(tids)
                trace_events.append(_metadata("thread_name", rank, tids[e["tid"]], e["thread"]))
            complete = {"name": e["name"], "cat": e["cat"], "ph": "X", "ts": e["start"] * 1e6,
                        "dur": (e["end"] - e["start"]) * 1e6, "pid": rank, "tid": tids[e["tid"]]}  # fmt: skip
            if "args" in e:
                complete["args"] = e["args"]
            trace_events.append(complete)
    return {"traceEvents": trace_events, "displayTimeUnit": "ms"}


def _metadata(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def save_chrome_trace(path: str | Path, events_per_rank: Sequence[Iterable[Event]]) -> None:
    """Write :func:`to_chrome_trace` ``(events_per_rank)`` as JSON to ``path`` (parent folders must exist)."""
    Path(path).write_text(json.dumps(to_chrome_trace(events_per_rank)))


# --- how much communication was hidden ----------------------------------------------------------------

Interval = tuple[float, float]


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points as ``intervals`` (empty ones dropped)."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def subtract_intervals(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The points of ``a`` not in ``b``; both sorted and disjoint (as from :func:`merge_intervals`)."""
    out: list[Interval] = []
    for start, end in a:
        for b_start, b_end in b:
            if b_end <= start or b_start >= end:
                continue
            if b_start > start:
                out.append((start, b_start))
            start = max(start, b_end)
        if start < end:
            out.append((start, end))
    return out


def intersection_length(a: list[Interval], b: list[Interval]) -> float:
    """Total length of the points in both ``a`` and ``b`` (each sorted and disjoint), by a merge walk."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:  # the interval that ends first cannot meet anything further on
            i += 1
        else:
            j += 1
    return total


def overlap_fraction(events: Iterable[Event]) -> float:
    """Share of communication time hidden behind backward computation, in [0, 1], for ONE rank's spans.

    Hidden = time covered by a ``COMM`` span *and* by a ``BACKWARD`` span but not by a ``WAIT`` span (a
    wait inside backward is the main thread doing nothing but waiting for that communication, so what
    overlaps it was not hidden). The result is hidden time / time covered by ``COMM`` spans, where
    overlapping spans count once (interval union). Returns 0.0 when there is no communication.

    For several ranks, call it on each rank's events and report the mean or the minimum.
    """
    events = list(events)

    def covered(category: str) -> list[Interval]:
        return merge_intervals((e["start"], e["end"]) for e in events if e["cat"] == category)

    comm = covered(COMM)
    comm_time = sum(end - start for start, end in comm)
    if comm_time == 0:
        return 0.0
    computing = subtract_intervals(covered(BACKWARD), covered(WAIT))
    return intersection_length(comm, computing) / comm_time
