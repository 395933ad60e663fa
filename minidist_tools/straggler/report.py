"""The straggler report: per rank, the median step split into compute, comm and wait, and a verdict.

    events = world.mpi.gather(trace.events(), root=0)    # every rank's spans (after clock_offsets)
    print(straggler_report(align(events, offsets)))

prints, for a run where rank 2 slept 50 ms in every step (measured, examples/train_mlp.py, 4 ranks)::

    rank   step ms  compute ms  comm ms  wait ms  verdict
       0      61.3         4.1      1.2     53.9  ok (waits for others)
       2      61.0        55.0      1.1      0.4  STRAGGLER: +50.9 ms compute per step (13.4x)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from minidist.trace import Event
from minidist_tools.straggler.breakdown import StepTimes, step_breakdown
from minidist_tools.straggler.clock import ClockOffset, align
from minidist_tools.straggler.verdict import Straggler, find_stragglers


@dataclass(frozen=True)
class RankSummary:
    """One rank's median step, in seconds, over ``steps`` steps (fields as in :class:`StepTimes`)."""

    rank: int
    steps: int
    total: float
    compute: float
    comm: float
    wait: float


def summarize(breakdown: Sequence[Sequence[StepTimes]]) -> list[RankSummary]:
    """Medians per rank of :func:`~minidist_tools.straggler.breakdown.step_breakdown`'s rows (ranks without
    steps are left out)."""
    out = []
    for rank, rows in enumerate(breakdown):
        if rows:
            fields = ("total", "compute", "comm", "wait")
            med = {f: statistics.median(getattr(r, f) for r in rows) for f in fields}
            out.append(RankSummary(rank=rank, steps=len(rows), **med))
    return out


def straggler_report(
    events_per_rank: Sequence[Iterable[Event]],
    offsets: Sequence[ClockOffset] | None = None,
    threshold: float = 1.2,
    min_excess: float = 0.002,
    groups: Sequence[Sequence[int]] | None = None,
) -> str:
    """A table (one line per rank, times in ms, medians over the steps) and the verdict, as text.

    ``events_per_rank[r]``: rank r's ``trace.events()`` with ``trace.STEP`` spans (the monitor records
    them) and, to separate waiting from transfer, ``COLLECTIVE`` spans (``trace.enable(collectives=True)``).
    ``offsets``: from :func:`~minidist_tools.straggler.clock.clock_offsets`, applied first (None: the events
    are
    on one clock already). ``threshold``/``min_excess``:
    :func:`~minidist_tools.straggler.verdict.find_stragglers`.
    ``groups``: lists of ranks that do the same work per step, each compared only within itself (a
    pipeline's last stage also computes the loss and is not slower for it: pass the data-parallel groups,
    ``mesh.dp_group``'s ranks); None: all ranks form one group. Raises ``ValueError`` when no rank
    recorded a step.
    """
    if offsets is not None:
        events_per_rank = align(events_per_rank, offsets)
    summaries = summarize(step_breakdown(events_per_rank))
    if not summaries:
        raise ValueError(
            "no trace.STEP spans in any rank's events: run the loop under StragglerMonitor.step()"
        )
    by_rank = {s.rank: s for s in summaries}
    verdicts: dict[int, Straggler] = {}
    for group in [list(by_rank)] if groups is None else groups:
        members = [r for r in group if r in by_rank]
        for v in find_stragglers([by_rank[r].compute for r in members], threshold, min_excess):
            verdicts[members[v.rank]] = Straggler(members[v.rank], v.compute, v.others)  # a world rank
    lines = [
        f"straggler report: {len(summaries)} ranks, median over {summaries[0].steps} steps (compute: "
        "training thread busy; comm: collectives moving data; wait: for the last peer to arrive)",
        f"{'rank':>4}  {'step ms':>8}  {'compute ms':>10}  {'comm ms':>8}  {'wait ms':>8}  verdict",
    ]
    for s in summaries:
        times = f"{1e3 * s.total:8.1f}  {1e3 * s.compute:10.1f}  {1e3 * s.comm:8.1f}  {1e3 * s.wait:8.1f}"
        lines.append(f"{s.rank:>4}  {times}  {_verdict(verdicts.get(s.rank), s, bool(verdicts))}")
    lines += [verdicts[rank].describe() for rank in sorted(verdicts)]
    if not verdicts:
        bar = f"{threshold}x the others' and +{1e3 * min_excess:g} ms"
        lines.append(f"no straggler (no rank's median compute per step above {bar})")
    if offsets is not None:
        largest, error = max(abs(o.offset) for o in offsets), max(o.error for o in offsets)
        lines.append(
            f"clocks aligned to rank 0 (Cristian): offsets up to {_us(largest)}, error <= {_us(error)}"
        )
    return "\n".join(lines)


def _verdict(straggler: Straggler | None, summary: RankSummary, any_found: bool) -> str:
    if straggler is not None:
        return f"STRAGGLER: +{1e3 * straggler.excess:.1f} ms compute per step ({straggler.ratio:.1f}x)"
    return "ok (waits for others)" if any_found and summary.wait > summary.comm else "ok"


def _us(seconds: float) -> str:
    return f"{1e6 * seconds:.0f} us"
