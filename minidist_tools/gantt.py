"""Pictures of a pipeline step: a matplotlib Gantt chart of a timeline, simulated or measured.

A *timeline* (``minidist.parallel.pipeline.simulate.Timeline``) lists each stage's forward and backward
computations with start and end times. ``simulate`` makes one from a schedule (and ``text_grid`` prints
it); :func:`timeline_from_trace` makes one from the spans the executor records into ``minidist.trace``
on real ranks, so the same pictures and the same ``bubble_fraction`` serve theory and measurement.
matplotlib is imported only inside :func:`draw_gantt` (it is an optional dependency: the ``bench``
extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from minidist.parallel.pipeline.schedules import BACKWARD, FORWARD, Schedule
from minidist.parallel.pipeline.simulate import Slot, Timeline, simulate


def timeline_from_trace(schedule: Schedule, events_per_rank: Sequence[Iterable[dict[str, Any]]]) -> Timeline:
    """A measured :class:`Timeline` from every stage's ``trace.events()`` of one step (rank = stage).

    Uses the spans named ``"forward i"``/``"backward i"`` (``"forward i.c"`` for chunk c); times are
    shifted so that the earliest span of any stage starts at 0, and ``total`` is the latest end. Raises
    ``ValueError`` if the number of ranks differs from the schedule's stages.
    """
    if len(events_per_rank) != schedule.num_stages:
        raise ValueError(
            f"{len(events_per_rank)} ranks' events for a schedule of {schedule.num_stages} stages"
        )
    raw = [
        [e for e in events if e["cat"] in (FORWARD, BACKWARD) and e["name"].startswith(e["cat"])]
        for events in events_per_rank
    ]
    t0 = min((e["start"] for events in raw for e in events), default=0.0)
    slots = tuple(tuple(_slot(s, e, t0) for e in events) for s, events in enumerate(raw))
    total = max((slot.end for stage in slots for slot in stage), default=0.0)
    return Timeline(schedule, slots, total)


def _slot(stage: int, event: dict[str, Any], t0: float) -> Slot:
    """A span ``"forward 3"`` (chunk 0) or ``"forward 3.1"`` (microbatch 3, chunk 1) as a Slot."""
    microbatch, _, chunk = event["name"].split()[-1].partition(".")
    return Slot(stage, event["cat"], int(microbatch), event["start"] - t0, event["end"] - t0, int(chunk or 0))


def draw_gantt(
    what: Schedule | Timeline,
    path: str | Path | None = None,
    title: str | None = None,
    forward_time: float = 1.0,
    backward_time: float = 2.0,
    ax: Any = None,
) -> Any:
    """Draw a Gantt chart (stage 0 on top, time to the right); save it to ``path`` if given.

    Forward boxes are blue, backward boxes orange, each labelled with its microbatch; white gaps are the
    bubble. Returns the matplotlib Axes. Raises ``ImportError`` naming the extra if matplotlib is
    missing.
    """
    try:
        import matplotlib

        if path is not None and ax is None:
            matplotlib.use("Agg")  # a file, no window: works without a display
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError('draw_gantt needs matplotlib: pip install -e ".[bench]"') from error
    timeline = simulate(what, forward_time, backward_time) if isinstance(what, Schedule) else what
    schedule = timeline.schedule
    fig = None
    if ax is None:
        boxes = 2 * schedule.num_microbatches  # per stage: the width grows with the boxes to label
        fig, ax = plt.subplots(figsize=(min(4 + 0.35 * boxes, 16), 0.6 * schedule.num_stages + 1.2))
    colors = {FORWARD: "#4c72b0", BACKWARD: "#dd8452"}
    for s, slots in enumerate(timeline.slots):
        for slot in slots:
            ax.broken_barh(
                [(slot.start, slot.end - slot.start)],
                (s - 0.4, 0.8),
                color=colors[slot.kind],
                edgecolor="black",
                linewidth=0.5,
            )
            label = f"{slot.microbatch}.{slot.chunk}" if schedule.virtual_stages > 1 else str(slot.microbatch)
            ax.text((slot.start + slot.end) / 2, s, label, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(schedule.num_stages), [f"stage {s}" for s in range(schedule.num_stages)])
    ax.invert_yaxis()
    ax.set_xlim(0, timeline.total)
    ax.set_xlabel("time")
    ax.set_title(
        title
        or f"{schedule.name}, p={schedule.num_stages}, m={schedule.num_microbatches}: "
        f"bubble {timeline.bubble_fraction():.2f}"
    )
    if fig is not None:
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
            plt.close(fig)
    return ax
