"""Run a schedule on paper: a timeline with given forward/backward times, its bubble, and a picture in text.

    >>> print(text_grid(one_f_one_b(3, 4), backward_time=1))
    stage 0 | F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3
    stage 1 | .. F0 F1 .. B0 F2 B1 F3 B2 .. B3 ..
    stage 2 | .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. ..
    1f1b: p=3, m=4, bubble fraction 0.333 ((p-1)/(m+p-1) = 0.333)

``simulate`` executes every stage's program with the semantics of the MPI executor in the worst case:
computation takes ``forward_time`` / ``backward_time``; a message takes no time but is a *rendezvous*
(a send finishes only when the receiver reaches the matching receive, and vice versa); the two halves
of an :class:`~minidist.parallel.pipeline.schedules.Exchange` are matched independently, as in
``MPI_Sendrecv``. If no stage can move before all are done, the schedule would deadlock on real ranks
and :class:`ScheduleDeadlockError` says where every stage is stuck. A send matched to a receive of a
different microbatch raises ``ValueError`` (the data would go to the wrong microbatch).

The bubble is the idle share of the step: with every stage starting at time 0 and the step ending when
the last stage finishes (time ``T``), stage s is idle ``T - busy_s``. ``bubble_fraction`` is
idle / ``T`` (GPipe and 1F1B: ``(p-1)/(m+p-1)``); ``bubble_overhead`` is idle / busy, the form
Narayanan et al. 2021 (§2.2.1) use: ``(p-1)/m``, and for the interleaved schedule with ``v`` chunks per
stage (each computation ``1/v`` as long) ``(p-1)/(v m)`` (§2.2.2). With interleaving, a message goes to
the next or previous *virtual* stage, round the ranks (``Schedule.peer``), and must meet the same
microbatch and chunk. (A matplotlib Gantt chart of the same timeline, simulated or measured on real
ranks: ``minidist_tools/gantt.py``.)
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    COMPUTE,
    FORWARD,
    RECV_ACT,
    RECV_GRAD,
    SEND_ACT,
    SEND_GRAD,
    Instruction,
    Schedule,
    parts,
)

# the receive that a send must meet on the peer stage
_MATCH = {SEND_ACT: RECV_ACT, RECV_ACT: SEND_ACT, SEND_GRAD: RECV_GRAD, RECV_GRAD: SEND_GRAD}


class ScheduleDeadlockError(RuntimeError):
    """A schedule whose blocking messages can never all complete."""


@dataclass(frozen=True)
class Slot:
    """One computation on the timeline: ``kind`` (forward/backward) of ``microbatch`` on ``stage``
    (model ``chunk`` of it, for interleaved schedules)."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    chunk: int = 0


@dataclass(frozen=True)
class Timeline:
    """The computations of every stage (``slots[s]``, in time order) and the step time ``total``."""

    schedule: Schedule
    slots: tuple[tuple[Slot, ...], ...]
    total: float

    def busy(self, stage: int) -> float:
        """Time units ``stage`` spends computing in the simulated step."""
        return sum(slot.end - slot.start for slot in self.slots[stage])

    def bubble_fraction(self) -> float:
        """Idle time / step time, averaged over stages (every stage has the same idle time here)."""
        if self.total == 0:
            return 0.0
        p = self.schedule.num_stages
        return sum(self.total - self.busy(s) for s in range(p)) / (p * self.total)

    def bubble_overhead(self) -> float:
        """Idle time / computing time, averaged over stages: the bubble relative to an ideal pipeline."""
        p = self.schedule.num_stages
        return sum((self.total - self.busy(s)) / max(self.busy(s), 1e-300) for s in range(p)) / p


def simulate(schedule: Schedule, forward_time: float = 1.0, backward_time: float = 2.0) -> Timeline:
    """Execute ``schedule`` with rendezvous messages and the given compute times (module docstring).

    Raises ``ScheduleDeadlockError`` if the blocking messages cannot all complete, and ``ValueError`` if
    a send meets a receive of another microbatch, or a stage talks to a stage that does not exist.
    """
    p = schedule.num_stages
    durations = {FORWARD: forward_time, BACKWARD: backward_time}
    pc = [0] * p  # index of each stage's current step
    clock = [0.0] * p  # when each stage reached its current step
    pending: list[dict[Instruction, float | None]] = [{} for _ in range(p)]  # halves of the current step
    slots: list[list[Slot]] = [[] for _ in range(p)]

    def current_halves(s: int) -> dict[Instruction, float | None]:
        if not pending[s] and pc[s] < len(schedule.stages[s]):
            step = schedule.stages[s][pc[s]]
            if not (isinstance(step, Instruction) and step.kind in COMPUTE):  # a message: track its halves
                pending[s] = {ins: None for ins in parts(step)}
        return pending[s]

    moved = True
    while moved:
        moved = False
        for s in range(p):
            if pc[s] == len(schedule.stages[s]):
                continue
            step = schedule.stages[s][pc[s]]
            if isinstance(step, Instruction) and step.kind in COMPUTE:
                end = clock[s] + durations[step.kind]
                slots[s].append(Slot(s, step.kind, step.microbatch, clock[s], end, step.chunk))
                clock[s], pc[s], moved = end, pc[s] + 1, True
                continue
            halves = current_halves(s)
            for ins, matched_at in halves.items():
                if matched_at is None and _try_match(s, ins, schedule, pc, clock, pending, current_halves):
                    moved = True
            if all(t is not None for t in halves.values()):
                clock[s] = max([clock[s], *halves.values()])  # type: ignore[list-item]
                pending[s], pc[s], moved = {}, pc[s] + 1, True
    if any(pc[s] < len(schedule.stages[s]) for s in range(p)):
        stuck = [
            f"stage {s} at {schedule.stages[s][pc[s]]}" for s in range(p) if pc[s] < len(schedule.stages[s])
        ]
        raise ScheduleDeadlockError(
            f"{schedule.name} (p={p}, m={schedule.num_microbatches}) deadlocks: " + ", ".join(stuck)
        )
    return Timeline(schedule, tuple(map(tuple, slots)), max(clock))


def _try_match(s, ins, schedule, pc, clock, pending, current_halves) -> bool:
    """Match half ``ins`` of stage s's current step with the peer's current step, if it is there."""
    peer, peer_chunk = schedule.peer(s, ins)  # raises if there is no such (virtual) stage
    if pc[peer] == len(schedule.stages[peer]):
        return False
    for other, matched_at in current_halves(peer).items():
        if other.kind == _MATCH[ins.kind] and matched_at is None and schedule.peer(peer, other)[0] == s:
            if (other.microbatch, other.chunk) != (ins.microbatch, peer_chunk):
                raise ValueError(
                    f"stage {s}'s {ins} meets stage {peer}'s {other}: microbatches or chunks differ, the "
                    "data would go to the wrong microbatch"
                )
            when = max(clock[s], clock[peer])
            pending[s][ins] = pending[peer][other] = when
            return True
    return False


# --- the timeline as text ---------------------------------------------------------------------------


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
