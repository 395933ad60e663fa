"""Pictures of a pipeline step: a text grid and a matplotlib Gantt chart, simulated or measured.

    >>> from minidist.parallel.pipeline import one_f_one_b
    >>> print(text_grid(one_f_one_b(3, 4), backward_time=1))
    stage 0 | F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3
    stage 1 | .. F0 F1 .. B0 F2 B1 F3 B2 .. B3 ..
    stage 2 | .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. ..
    1f1b: p=3, m=4, bubble fraction 0.333 ((p-1)/(m+p-1) = 0.333)

A *timeline* (``minidist.parallel.pipeline.simulate.Timeline``) lists each stage's forward and backward
computations with start and end times. ``simulate`` makes one from a schedule; :func:`timeline_from_trace`
makes one from the spans the executor records into ``minidist.trace`` on real ranks, so the same
pictures and the same ``bubble_fraction`` serve theory and measurement.
matplotlib is imported only inside :func:`draw_gantt` (it is an optional dependency: the ``bench``
extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from minidist.parallel.pipeline.schedules import BACKWARD, FORWARD, Schedule
from minidist.parallel.pipeline.simulate import Slot, Timeline, simulate


def _timeline(what: Schedule | Timeline, forward_time: float, backward_time: float) -> Timeline:
    return simulate(what, forward_time, backward_time) if isinstance(what, Schedule) else what


def text_grid(
    what: Schedule | Timeline, forward_time: int = 1, backward_time: int = 2, formula: bool = True
) -> str:
    """One row per stage, one column per time unit: ``F3``/``B3`` = forward/backward of microbatch 3,
    ``..`` = idle (the bubble). A schedule is simulated with the given integer times; a timeline must
    have integer times. The last line gives the bubble fraction next to ``(p-1)/(m+p-1)`` (interleaved,
    ``v`` chunks per stage: ``F3.1`` is chunk 1, and the bubble overhead is next to ``(p-1)/(v*m)``);
    ``formula=False`` leaves the formula out (lesson 07 asks the student to derive it).
    """
    timeline = _timeline(what, forward_time, backward_time)
    schedule = timeline.schedule
    v = schedule.virtual_stages
    width = len(str(schedule.num_microbatches - 1)) + 1 + (1 + len(str(v - 1)) if v > 1 else 0)
    columns = round(timeline.total)
    rows = []
    for s, slots in enumerate(timeline.slots):
        cells = ["." * width] * columns
        for slot in slots:
            name = f"{slot.microbatch}.{slot.chunk}" if v > 1 else str(slot.microbatch)  # F3.1: chunk 1
            label = ("F" if slot.kind == FORWARD else "B") + name.ljust(width - 1)
            for t in range(round(slot.start), round(slot.end)):
                cells[t] = label
        rows.append(f"stage {s} | " + " ".join(cells))
    p, m = schedule.num_stages, schedule.num_microbatches
    if not formula:
        measure = "bubble overhead" if v > 1 else "bubble fraction"
        value = timeline.bubble_overhead() if v > 1 else timeline.bubble_fraction()
        rows.append(f"{schedule.name}: p={p}, m={m}{f', v={v}' if v > 1 else ''}, {measure} {value:.3f}")
    elif v > 1:  # Narayanan et al. 2021, §2.2.2: the bubble relative to the ideal step
        rows.append(
            f"{schedule.name}: p={p}, m={m}, v={v}, bubble overhead {timeline.bubble_overhead():.3f} "
            f"((p-1)/(v*m) = {(p - 1) / (v * m):.3f}; 1f1b: (p-1)/m = {(p - 1) / m:.3f})"
        )
    else:
        rows.append(
            f"{schedule.name}: p={p}, m={m}, bubble fraction {timeline.bubble_fraction():.3f} "
            f"((p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.3f})"
        )
    return "\n".join(rows)


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
    timeline = _timeline(what, forward_time, backward_time)
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
