"""Straggler detection: the compute/comm/wait arithmetic on made-up spans, Cristian's offset,
the verdict rule, and examples/train_mlp.py on 4 real ranks with one rank slowed on purpose.

The MPI test makes all its runs in one launch (tests/workers/straggler/straggler_runs.py): a slow rank
under DDP, the same without it (no false positive), and a slow rank under ZeRO (whose collectives run on
the training thread inside optimizer.step, found only through the collective spans).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import REPO, run_mpi

from minidist import trace
from minidist_tools.straggler import (
    ClockOffset,
    align,
    cristian_offset,
    find_stragglers,
    injected_delay,
    peer_waits,
    step_breakdown,
    straggler_report,
)


def span(name, cat, start, end, tid=1, **args):
    e = {"name": name, "cat": cat, "start": start, "end": end, "tid": tid, "thread": f"t{tid}"}
    return dict(e, args=args) if args else e


def all_reduce(start, end, tid=1, group="dp", ranks=2, first=0):
    return span("all_reduce", trace.COLLECTIVE, start, end, tid, group=group, ranks=ranks, first=first)


# --- the breakdown arithmetic ----------------------------------------------------------------------


def test_wait_is_the_time_until_the_last_rank_entered():
    # Rank 1 computes 60 ms, rank 0 10 ms; both leave the all-reduce at 70 ms. Rank 0 waited 50 ms for
    # rank 1 and then moved data for 10 ms, like rank 1.
    events = [
        [span("step 0", trace.STEP, 0, 0.07), all_reduce(0.01, 0.07)],
        [span("step 0", trace.STEP, 0, 0.07), all_reduce(0.06, 0.07)],
    ]
    (r0,), (r1,) = step_breakdown(events)
    assert r0.total == pytest.approx(0.07) and r1.total == pytest.approx(0.07)
    assert (r0.compute, r0.wait, r0.comm) == pytest.approx((0.01, 0.05, 0.01))
    assert (r1.compute, r1.wait, r1.comm) == pytest.approx((0.06, 0.0, 0.01))


def test_communication_on_another_thread_overlaps_compute():
    # DDP: the bucket's all-reduce runs on thread 2 during backward; the training thread (1) blocks
    # only in its "wait for gradients" span at the end. Compute excludes that wait, not thread 2's work.
    events = [[span("step 0", trace.STEP, 0, 1.0, tid=1),
               span("allreduce bucket 0", trace.COMM, 0.2, 0.8, tid=2),
               span("wait for gradients", trace.WAIT, 0.7, 0.8, tid=1)]]  # fmt: skip
    ((times,),) = step_breakdown(events, waits=[[]])
    assert times.compute == pytest.approx(0.9)
    assert times.comm == pytest.approx(0.6) and times.wait == 0


def test_steps_are_cut_at_their_ends():
    # A collective that spans two steps counts in each for the part inside it.
    events = [[span("step 0", trace.STEP, 0, 1), span("step 1", trace.STEP, 1, 2), all_reduce(0.5, 1.5)]]
    (rows,) = step_breakdown(events, waits=[[]])
    assert [x for r in rows for x in (r.compute, r.comm)] == pytest.approx([0.5, 0.5, 0.5, 0.5])


def test_calls_match_only_within_one_group_and_only_when_complete():
    # Two tp groups both named "tp" (world ranks 0,1 and 2,3): their first calls are different calls.
    tp = {"group": "tp", "ranks": 2}
    events = [[all_reduce(0.0, 1.0, **tp, first=0)], [all_reduce(0.5, 1.0, **tp, first=0)],
              [all_reduce(0.2, 1.0, **tp, first=2)], [all_reduce(0.3, 1.0, **tp, first=2)]]  # fmt: skip
    waits = peer_waits(events)
    assert waits == [[(0.0, 0.5)], [], [(0.2, pytest.approx(0.3))], []]
    # A call that rank 1 never recorded (it started tracing later) says nothing about waiting.
    assert peer_waits([[all_reduce(0.0, 1.0)], []]) == [[], []]


@given(st.lists(st.floats(0, 1), min_size=2, max_size=8), st.floats(0, 1))
def test_every_rank_waits_for_the_last_arrival(entries, transfer):
    # One collective; every rank leaves `transfer` after the last one entered (as a ring would).
    last = max(entries)
    events = [[all_reduce(e, last + transfer, ranks=len(entries))] for e in entries]
    waits = peer_waits(events)
    for entry, wait in zip(entries, waits, strict=True):
        assert sum(b - a for a, b in wait) == pytest.approx(last - entry)


def test_step_spans_are_required_for_a_report():
    with pytest.raises(ValueError, match="StragglerMonitor.step"):
        straggler_report([[all_reduce(0, 1)]])


def test_report_names_the_slow_rank_from_made_up_spans():
    events = []
    for compute in [0.010, 0.011, 0.060, 0.010]:
        steps = [span(f"step {i}", trace.STEP, i * 0.1, i * 0.1 + 0.07) for i in range(5)]
        calls = [all_reduce(i * 0.1 + compute, i * 0.1 + 0.07, ranks=4) for i in range(5)]
        events.append(steps + calls)
    report = straggler_report(events)
    assert re.search(r"^\s+2 .*STRAGGLER: \+50\.0 ms", report, re.MULTILINE), report
    assert "rank 2 is a straggler" in report and report.count("STRAGGLER") == 1


# --- the verdict, clocks, the environment variable ---------------------------------------------------


def test_verdict_needs_both_the_ratio_and_the_absolute_excess():
    (slow,) = find_stragglers([0.010, 0.010, 0.050, 0.011])  # against the others' median, 10 ms
    assert slow.rank == 2 and slow.excess == pytest.approx(0.040) and slow.ratio == pytest.approx(5.0)
    assert find_stragglers([0.0010, 0.0010, 0.0025]) == []  # 2.5x but only 1.5 ms: scheduler noise
    assert find_stragglers([1.0, 1.0, 1.15]) == []  # 15 % slower: under the 1.2 threshold
    assert find_stragglers([0.5]) == []
    with pytest.raises(ValueError, match="threshold"):
        find_stragglers([1.0, 2.0], threshold=0.9)


def test_cristian_offset_takes_the_shortest_round_trip():
    # Rank 0's clock is 5 s ahead. A symmetric 1 ms trip each way gives the offset exactly; a trip
    # delayed on the way back (the scheduler) is ignored because its round trip is longer.
    exchanges = [(10.0, 15.001, 10.002), (20.0, 25.001, 20.010)]
    offset, error = cristian_offset(exchanges)
    assert offset == pytest.approx(5.0) and error == pytest.approx(0.001)
    # Asymmetric trips: the estimate is off, but by no more than the error bound.
    offset, error = cristian_offset([(0.0, 5.0001, 0.002)])
    assert abs(offset - 5.0) <= error
    with pytest.raises(ValueError):
        cristian_offset([])


def test_align_moves_every_rank_onto_rank_0s_clock():
    events = [[span("a", "x", 1.0, 2.0)], [span("b", "x", 1.0, 2.0)]]
    moved = align(events, [ClockOffset(0.0, 0.0), ClockOffset(-0.5, 1e-5)])
    assert (moved[1][0]["start"], moved[1][0]["end"]) == (0.5, 1.5) and events[1][0]["start"] == 1.0
    with pytest.raises(ValueError, match="offsets"):
        align(events, [ClockOffset(0.0, 0.0)])


def test_slow_rank_variable():
    assert injected_delay(2, "2:0.05") == 0.05 and injected_delay(1, "2:0.05") == 0.0
    assert injected_delay(0, "") == 0.0
    for bad in ("2", "two:1", "2:-1", "-1:0.1", "2:nan"):
        with pytest.raises(ValueError, match="RANK:SECONDS"):
            injected_delay(0, bad)


def test_trace_record_and_incremental_read():
    trace.enable(collectives=True)
    try:
        assert trace.collectives_enabled() and not trace.messages_enabled()
        trace.record("step 0", trace.STEP, 0.0, trace.now())
        with trace.span("later", "x"):
            pass
        assert trace.event_count() == 2 and [e["name"] for e in trace.events(since=1)] == ["later"]
    finally:
        trace.disable()
    assert not trace.collectives_enabled()


# --- 4 real ranks ------------------------------------------------------------------------------------

SLOW = 0.05  # seconds rank 2 sleeps per step: 50x the ~1 ms compute of this MLP step
BASE = ["--epochs", "2", "--hidden", "32", "--straggler-report", "--straggler-every", "10"]  # 22 steps
ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(.*)$", re.MULTILINE)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("straggler")
    plan = {
        "slow": {"argv": [*BASE, "--trace", str(out / "slow.json")], "slow": f"2:{SLOW}"},
        "even": {"argv": BASE, "slow": ""},
        "zero": {"argv": [*BASE, "--zero", "1"], "slow": f"1:{SLOW}"},
    }
    (out / "runs.json").write_text(json.dumps(plan))
    run_mpi(4, "straggler/straggler_runs.py", out / "runs.json", out, timeout=240)
    return out


def table(output: str) -> dict[int, tuple]:
    """The report's rows: rank -> (step, compute, comm, wait in seconds, verdict)."""
    return {int(m[0]): (*(float(x) / 1e3 for x in m[1:5]), m[5]) for m in ROW.findall(output)}


@pytest.mark.parametrize(("name", "slow_rank"), [("slow", 2), ("zero", 1)])
def test_report_and_warning_name_the_injected_slow_rank(runs, name, slow_rank):
    output = (runs / f"{name}.rank0").read_text()
    rows = table(output)
    assert sorted(rows) == [0, 1, 2, 3], output
    assert [r for r, row in rows.items() if row[4].startswith("STRAGGLER")] == [slow_rank], output
    _, compute, _, _, _ = rows[slow_rank]
    others = sorted(row[1] for r, row in rows.items() if r != slow_rank)[1]
    # The sleep adds at least SLOW; a loaded machine may wake the rank late (measured +5 ms on 2 busy
    # cores), hence the wide upper bound. The others' compute is ~1 ms and cannot hide 50 ms.
    assert SLOW * 0.9 <= compute - others <= SLOW * 2, output
    # The fast ranks spend the slow rank's extra time waiting for it, not moving data.
    assert all(row[3] >= 0.5 * SLOW for r, row in rows.items() if r != slow_rank), output
    warned = json.loads((runs / f"{name}.warnings.json").read_text())
    assert len(warned) == 1 and all(w.startswith(f"rank {slow_rank} is a straggler") for w in warned), warned


def test_no_straggler_no_warning(runs):
    # Threshold 1.2x AND +2 ms on the median of 10 steps: the ranks' ~1 ms compute differs by
    # fractions of a millisecond from scheduling noise, never by 2 ms in most steps of a window.
    output = (runs / "even.rank0").read_text()
    assert "no straggler" in output and "STRAGGLER" not in output, output
    assert json.loads((runs / "even.warnings.json").read_text()) == []


def test_merged_timeline_has_a_track_per_rank_on_one_clock(runs):
    chrome = json.loads((runs / "slow.json").read_text())  # valid JSON in the Trace Event Format
    events = chrome["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)}
    assert all({"ts", "dur", "pid", "tid", "name", "cat"} <= e.keys() for e in events if e["ph"] == "X")
    steps = defaultdict(int)
    for e in events:
        steps[e["pid"]] += e["ph"] == "X" and e["cat"] == trace.STEP
    assert dict(steps) == {r: 22 for r in range(4)}
    # Causality on one clock: no rank leaves a collective before its last member entered it. Allowed
    # slack: the two ranks' alignment errors, which the report prints.
    error = float(re.search(r"error <= (\d+) us", (runs / "slow.rank0").read_text())[1])
    calls = defaultdict(list)
    for pid in range(4):
        mine = sorted(
            (e for e in events if e["pid"] == pid and e.get("cat") == trace.COLLECTIVE), key=lambda e: e["ts"]
        )
        counter = defaultdict(int)
        for e in mine:
            key = (e["args"]["group"], e["args"]["first"])
            calls[key, counter[key]].append(e)
            counter[key] += 1
    assert len(calls) > 22
    for members in calls.values():
        last_entry = max(e["ts"] for e in members)
        assert all(e["ts"] + e["dur"] >= last_entry - 2 * error - 1 for e in members)


def test_slow_rank_variable_is_checked_on_every_rank():
    proc = run_mpi(2, REPO / "examples" / "train_mlp.py", "--epochs", "1", check=False,
                   env={"MINIDIST_SLOW_RANK": "rank2"}, timeout=60)  # fmt: skip
    assert proc.returncode != 0 and "RANK:SECONDS" in proc.stdout + proc.stderr


def test_monitor_warns_only_for_a_rank_named_in_consecutive_windows(monkeypatch):
    # The windows' medians of 4 ranks are made up (the all-gather is replaced); one process runs it.
    import minidist.distributed as dist  # noqa: PLC0415
    from minidist_tools.straggler import StragglerMonitor, StragglerWarning, monitor  # noqa: PLC0415

    dist.init()
    # Rank 1, then rank 2 (scheduler noise moving from rank to rank), then rank 1 twice (a straggler).
    medians = [
        [1e-3, 9e-3, 1e-3, 1e-3],
        [1e-3, 1e-3, 9e-3, 1e-3],
        [1e-3, 9e-3, 1e-3, 1e-3],
        [1e-3, 9e-3, 1e-3, 1e-3],
    ]
    windows = iter(medians)
    monkeypatch.setattr(monitor.dist, "all_gather", lambda mine, group: next(windows))
    m = StragglerMonitor(every=2)
    monkeypatch.setattr(m.group.collective_channel.calls, "world_ranks", [0, 1, 2, 3])  # as 4 ranks
    try:
        with pytest.warns(StragglerWarning, match=r"rank 1 is a straggler: 9\.0 ms .* steps 6-7") as caught:
            for _ in range(8):
                with m.step():
                    pass
        assert len(caught) == 1 and [s.rank for s in m.stragglers] == [1]
    finally:
        trace.disable()


def test_report_compares_only_ranks_that_do_the_same_work():
    # A pipeline: ranks 2 and 3 hold the last stage (it also computes the loss: 5 ms against 1 ms).
    events = []
    for compute in [0.001, 0.001, 0.005, 0.005]:
        steps = [span(f"step {i}", trace.STEP, i * 0.1, i * 0.1 + 0.01) for i in range(3)]
        events.append(steps + [all_reduce(i * 0.1 + compute, i * 0.1 + 0.01, ranks=2) for i in range(3)])
    assert straggler_report(events).count("STRAGGLER") == 2  # stages compared with each other: wrong
    assert "no straggler" in straggler_report(events, groups=[[0, 1], [2, 3]])  # within each stage
