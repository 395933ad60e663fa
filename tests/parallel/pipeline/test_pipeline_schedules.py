"""Pipeline schedules as data, without MPI: order, message matching, memory, bubble, deadlock freedom.

Hypothesis draws the number of stages p and of microbatches m (m < p included).
"""

from __future__ import annotations

import pytest
import strategies as S
from hypothesis import given

from minidist.parallel.pipeline import (
    Exchange,
    Instruction,
    Schedule,
    ScheduleDeadlockError,
    gpipe,
    make_schedule,
    one_f_one_b,
    peak_activations,
    simulate,
)
from minidist.parallel.pipeline.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACT,
    RECV_GRAD,
    SEND_ACT,
    SEND_GRAD,
    parts,
)
from minidist_tools.gantt import draw_gantt, text_grid, timeline_from_trace


def instructions(schedule: Schedule, stage: int) -> list[Instruction]:
    return [ins for step in schedule.stages[stage] for ins in parts(step)]


def microbatches_of(schedule: Schedule, stage: int, kind: str) -> list[int]:
    return [ins.microbatch for ins in instructions(schedule, stage) if ins.kind == kind]


@given(S.schedule_names, S.pipeline_stages(), S.microbatches())
def test_every_microbatch_runs_forward_then_backward_once_per_stage(name, p, m):
    schedule = make_schedule(name, p, m)
    for s in range(p):
        order = [
            (ins.kind, ins.microbatch) for ins in instructions(schedule, s) if ins.kind in (FORWARD, BACKWARD)
        ]
        assert sorted(order) == sorted([(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)])
        for i in range(m):
            assert order.index((FORWARD, i)) < order.index((BACKWARD, i))


@given(S.schedule_names, S.pipeline_stages(), S.microbatches())
def test_sends_match_the_neighbours_receives_in_order(name, p, m):
    schedule = make_schedule(name, p, m)
    for s in range(p):
        ins = instructions(schedule, s)
        if s == 0:  # the ends of the pipeline talk to no one beyond them
            assert not [i for i in ins if i.kind in (RECV_ACT, SEND_GRAD)]
        if s == p - 1:
            assert not [i for i in ins if i.kind in (SEND_ACT, RECV_GRAD)]
        if s < p - 1:
            assert microbatches_of(schedule, s, SEND_ACT) == microbatches_of(schedule, s + 1, RECV_ACT)
            assert microbatches_of(schedule, s + 1, SEND_GRAD) == microbatches_of(schedule, s, RECV_GRAD)
            assert microbatches_of(schedule, s, SEND_ACT) == list(range(m))
        # the executor sends the shape header with the first activation: it must travel alone, not in an
        # Exchange (a blocking header send before a sendrecv could wait for a neighbour in its own sendrecv)
        for kind in (SEND_ACT, RECV_ACT):
            first = next((step for step in schedule.stages[s] if kind in [i.kind for i in parts(step)]), None)
            assert first is None or first == Instruction(kind, 0)
        # an activation is sent only after it was computed, a gradient only after its backward
        done: set[tuple[str, int]] = set()
        for i in ins:
            if i.kind == SEND_ACT:
                assert (FORWARD, i.microbatch) in done
            if i.kind == SEND_GRAD:
                assert (BACKWARD, i.microbatch) in done
            done.add((i.kind, i.microbatch))


@given(S.pipeline_stages(), S.microbatches())
def test_1f1b_holds_at_most_p_microbatches_and_gpipe_holds_m(p, m):
    assert peak_activations(one_f_one_b(p, m)) == [min(p - s, m) for s in range(p)]
    assert max(peak_activations(one_f_one_b(p, m))) <= p
    assert peak_activations(gpipe(p, m)) == [m] * p


@given(S.schedule_names, S.pipeline_stages(), S.microbatches(), S.backward_time_ratios)
def test_bubble_fraction_of_the_simulated_schedule_is_p_minus_1_over_m_plus_p_minus_1(name, p, m, tb):
    timeline = simulate(make_schedule(name, p, m), forward_time=1.0, backward_time=tb)  # also: no deadlock
    assert timeline.bubble_fraction() == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert timeline.bubble_overhead() == pytest.approx((p - 1) / m, abs=1e-12)
    assert timeline.total == pytest.approx((m + p - 1) * (1.0 + tb))


def without_exchanges(schedule: Schedule) -> Schedule:
    """The same schedule with every Exchange split into a blocking send followed by a receive."""
    split = tuple(tuple(ins for step in prog for ins in parts(step)) for prog in schedule.stages)
    return Schedule(schedule.name + " unfused", schedule.num_stages, schedule.num_microbatches, split)


@given(S.pipeline_stages(min_stages=2), S.microbatches(min_count=2))
def test_1f1b_needs_its_exchanges_to_avoid_deadlock(p, m):
    """Rule 2 of schedules.py is necessary: with plain blocking send-then-receive, neighbours wait for
    each other in the steady state (stage s sends an activation while s+1 sends a gradient)."""
    schedule = one_f_one_b(p, m)
    assert any(isinstance(step, Exchange) for prog in schedule.stages for step in prog)
    with pytest.raises(ScheduleDeadlockError, match="deadlocks"):
        simulate(without_exchanges(schedule))


def test_simulate_rejects_a_send_that_meets_another_microbatch():
    f0, f1 = Instruction(FORWARD, 0), Instruction(FORWARD, 1)
    first = (f0, Instruction(SEND_ACT, 0), f1, Instruction(SEND_ACT, 1))
    bad = Schedule("bad", 2, 2, (first, (Instruction(RECV_ACT, 1), Instruction(RECV_ACT, 0))))
    with pytest.raises(ValueError, match="wrong microbatch"):
        simulate(bad)


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zigzag'"):
        make_schedule("zigzag", 2, 2)
    with pytest.raises(ValueError, match="microbatches m must be an integer >= 1"):
        one_f_one_b(2, 0)
    with pytest.raises(ValueError, match="stages p must be an integer >= 1"):
        gpipe(0, 4)
    with pytest.raises(ValueError, match="one neighbour"):
        Exchange(Instruction(SEND_ACT, 0), Instruction(RECV_ACT, 1))


def test_text_grid_shows_the_1f1b_pipeline():
    grid = text_grid(one_f_one_b(3, 4), backward_time=1).splitlines()
    assert grid[0] == "stage 0 | F0 F1 F2 .. .. B0 F3 B1 .. B2 .. B3"
    assert grid[2] == "stage 2 | .. .. F0 B0 F1 B1 F2 B2 F3 B3 .. .."
    assert grid[3] == "1f1b: p=3, m=4, bubble fraction 0.333 ((p-1)/(m+p-1) = 0.333)"
    assert str(one_f_one_b(2, 2)).splitlines()[1] == "stage 0: F0 sA0 F1 sA1+rG0 B0 rG1 B1"
    # formula=False (lesson 07 prints grids above the exercise that asks for the formula): same grid,
    # the measured fraction only
    quiet = text_grid(one_f_one_b(3, 4), backward_time=1, formula=False).splitlines()
    assert quiet[:3] == grid[:3] and quiet[3] == "1f1b: p=3, m=4, bubble fraction 0.333"


def test_gantt_chart_is_drawn_to_a_file(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "gantt.png"
    ax = draw_gantt(gpipe(4, 8), path)
    assert path.stat().st_size > 1000
    assert len(ax.patches) == 2 * 4 * 8 or len(ax.collections) == 2 * 4 * 8  # one box per computation


def test_timeline_from_trace_measures_the_bubble_of_recorded_spans():
    """Spans as the executor records them, laid out like a simulated 1F1B: the same bubble comes out."""
    schedule = one_f_one_b(3, 4)
    simulated = simulate(schedule, 1.0, 2.0)
    wait = {"name": "recv_act 0", "cat": "wait", "start": 5.0, "end": 6.0}  # ignored: not computation
    events = [
        [
            {"name": f"{x.kind} {x.microbatch}", "cat": x.kind, "start": 5 + x.start, "end": 5 + x.end}
            for x in stage
        ]
        + [wait]
        for stage in simulated.slots
    ]
    measured = timeline_from_trace(schedule, events)
    assert measured.total == pytest.approx(simulated.total)
    assert measured.bubble_fraction() == pytest.approx(simulated.bubble_fraction())
    with pytest.raises(ValueError, match="2 ranks' events for a schedule of 3 stages"):
        timeline_from_trace(schedule, events[:2])


def test_an_executor_refuses_a_program_whose_first_activation_is_in_an_exchange():
    """The header travels alone before a step's first activation: a program that puts that activation in
    an Exchange is refused when the executor is built (no MPI: __init__ reads only rank and size)."""
    from types import SimpleNamespace

    from minidist import nn
    from minidist.parallel.pipeline.executor import StageExecutor

    exchange = Exchange(Instruction(SEND_ACT, 0), Instruction(RECV_GRAD, 0))
    first = (Instruction(FORWARD, 0), exchange, Instruction(BACKWARD, 0))
    last = (
        Instruction(RECV_ACT, 0),
        Instruction(FORWARD, 0),
        Instruction(BACKWARD, 0),
        Instruction(SEND_GRAD, 0),
    )
    schedule = Schedule("1f1b", 2, 1, (first, last))
    with pytest.raises(ValueError, match=r"first activation of a step travels in an Exchange \(sA0\+rG0\)"):
        StageExecutor([nn.Linear(2, 2)], SimpleNamespace(rank=0, size=2), schedule)
    StageExecutor([nn.Linear(2, 2)], SimpleNamespace(rank=1, size=2), schedule)  # a plain recv_act 0 is fine
    StageExecutor([nn.Linear(2, 2)], SimpleNamespace(rank=0, size=2), one_f_one_b(2, 3))  # as built: fine
