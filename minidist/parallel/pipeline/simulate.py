"""Run a schedule on paper: a timeline with given forward/backward times, and its bubble.

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
microbatch and chunk. (Pictures of a timeline, simulated or measured on real ranks, a text grid and
a matplotlib Gantt chart: ``minidist_tools/gantt.py``.)
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
