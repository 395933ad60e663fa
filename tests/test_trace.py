"""minidist.trace: spans, the Chrome/Perfetto JSON, and the overlap fraction.

The interval arithmetic is checked against hand-made timelines and, with hypothesis, against a brute
force count over unit cells; the JSON against the fields chrome://tracing and Perfetto need; and a real
DDP run on 2 ranks must produce a trace with both ranks, both threads and every bucket, in order.
"""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import run_mpi

from minidist import trace
from minidist_tools import timeline


def ev(name, cat, start, end, tid=1, thread="MainThread"):
    return {"name": name, "cat": cat, "start": start, "end": end, "tid": tid, "thread": thread}


def test_span_records_name_category_thread_and_times():
    trace.enable()
    with trace.span("outer", "forward"):
        with trace.span("inner", "comm"):
            pass

    def in_thread():
        with trace.span("in thread", "comm"):
            pass

    worker = threading.Thread(target=in_thread, name="helper")
    worker.start()
    worker.join()
    trace.disable()
    with trace.span("after disable", "x"):
        pass
    events = trace.events()
    assert [e["name"] for e in events] == ["inner", "outer", "in thread"]  # in the order they ended
    inner, outer, threaded = events
    assert outer["cat"] == "forward" and inner["cat"] == "comm"
    assert 0 <= outer["start"] <= inner["start"] <= inner["end"] <= outer["end"]
    assert outer["thread"] == "MainThread" and threaded["thread"] == "helper"
    assert threaded["tid"] != outer["tid"]
    trace.enable()  # enable() starts a new recording
    assert trace.events() == []
    trace.disable()


def test_span_records_a_block_that_raises():
    trace.enable()
    with pytest.raises(KeyError), trace.span("boom", "x"):
        raise KeyError
    trace.disable()
    assert [e["name"] for e in trace.events()] == ["boom"]


def test_chrome_trace_has_the_fields_perfetto_needs():
    rank0 = [
        ev("backward", "backward", 0.0, 0.5, tid=111),
        ev("allreduce bucket 0", "comm", 0.1, 0.2, 222, "ddp"),
    ]
    rank1 = [ev("forward", "forward", 0.001, 0.25, tid=999)]
    doc = json.loads(json.dumps(timeline.to_chrome_trace([rank0, rank1])))  # JSON-serialisable
    assert doc["displayTimeUnit"] == "ms"
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert len(complete) == 3
    for e in complete:
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid"}
        assert isinstance(e["ts"], float) and e["dur"] >= 0 and isinstance(e["tid"], int)
    bucket = next(e for e in complete if e["name"] == "allreduce bucket 0")
    assert (bucket["pid"], bucket["tid"], bucket["ts"], bucket["dur"]) == (
        0,
        1,
        pytest.approx(1e5),
        pytest.approx(1e5),
    )
    assert {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"} == {
        (0, "rank 0"),
        (1, "rank 1"),
    }
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert threads == {(0, 0, "MainThread"), (0, 1, "ddp"), (1, 0, "MainThread")}


def test_save_chrome_trace_writes_json(tmp_path):
    timeline.save_chrome_trace(tmp_path / "t.json", [[ev("a", "b", 0, 1)]])
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"][-1]["name"] == "a"


@pytest.mark.parametrize(
    "events, expected",
    [
        ([], 0.0),  # no communication at all
        ([ev("bw", "backward", 0, 10), ev("c", "comm", 2, 4)], 1.0),  # fully hidden
        ([ev("bw", "backward", 0, 10), ev("c", "comm", 8, 12)], 0.5),  # half after backward
        ([ev("bw", "backward", 0, 10), ev("c", "comm", 10, 14)], 0.0),  # all after backward
        # The main thread waits from 6 to 10 inside backward: comm during the wait is not hidden.
        ([ev("bw", "backward", 0, 10), ev("w", "wait", 6, 10), ev("c", "comm", 4, 10)], 2 / 6),
        # Two comm spans overlapping each other count once: covered 2..8 (6 s), hidden 2..5 (3 s).
        ([ev("bw", "backward", 0, 5), ev("c0", "comm", 2, 6), ev("c1", "comm", 3, 8)], 0.5),
        # Two backward passes: the comm between them is exposed.
        ([ev("b1", "backward", 0, 2), ev("b2", "backward", 4, 6), ev("c", "comm", 1, 5)], 0.5),
    ],
)
def test_overlap_fraction_on_hand_made_timelines(events, expected):
    assert timeline.overlap_fraction(events) == pytest.approx(expected)


intervals = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)).map(sorted).map(tuple), max_size=6)


def cells(spans) -> set[int]:
    return {t for start, end in spans for t in range(start, end)}


@given(a=intervals, b=intervals)
def test_interval_arithmetic_matches_counting_unit_cells(a, b):
    merged_a, merged_b = timeline.merge_intervals(a), timeline.merge_intervals(b)
    assert cells(merged_a) == cells(a)
    assert all(x[1] < y[0] for x, y in zip(merged_a, merged_a[1:]))  # sorted, disjoint, not touching
    assert timeline.intersection_length(merged_a, merged_b) == len(cells(a) & cells(b))
    assert cells(timeline.subtract_intervals(merged_a, merged_b)) == cells(a) - cells(b)


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [True, False])
def test_ddp_run_gives_a_trace_with_every_bucket_in_order(tmp_path, overlap):
    run_mpi(2, "ddp/ddp_trace.py", tmp_path, int(overlap), timeout=60)
    doc = json.loads((tmp_path / "trace.json").read_text())
    events = doc["traceEvents"]
    thread_names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    expected_threads = {(r, "MainThread") for r in (0, 1)} | (
        {(r, "ddp-comm") for r in (0, 1)} if overlap else set()
    )
    assert thread_names == expected_threads
    for rank in (0, 1):
        mine = sorted((e for e in events if e["ph"] == "X" and e["pid"] == rank), key=lambda e: e["ts"])
        names = [e["name"] for e in mine if e["name"].startswith("allreduce bucket")]
        # 6 parameters, one bucket each; 3 steps; started strictly in bucket order every step.
        assert names == [f"allreduce bucket {i}" for i in range(6)] * 3
        assert [e["name"] for e in mine].count("backward") == 3
        as_spans = [
            {"name": e["name"], "cat": e["cat"], "start": e["ts"], "end": e["ts"] + e["dur"]} for e in mine
        ]
        fraction = timeline.overlap_fraction(as_spans)
        assert 0.0 <= fraction <= 1.0
        if not overlap:
            assert fraction == 0.0  # every all-reduce ran on the main thread, inside the wait
        else:
            starts = [e for e in mine if e["name"].startswith("start bucket")]  # marks on the main thread
            # Buckets 0-4 go to the comm thread; the last one fills when backward is over and runs on
            # the main thread, with no hand-off (DDP's lean path).
            assert [e["name"] for e in starts] == [f"start bucket {i}" for i in range(5)] * 3
            # Overlap: the buckets of layers 2 and 1 (buckets 0-3) were handed to the comm thread while
            # backward still had layer 0 to do (autograd finishes a layer's parameters right after its
            # backward). When the thread then gets a core is up to the OS, so that is not asserted.
            marks = [e["ts"] for e in mine if e["name"] == "backward reached layer 0"]
            fourth = [e["ts"] for e in starts if e["name"] == "start bucket 3"]
            assert len(marks) == 3 and all(b < m for b, m in zip(fourth, marks)), (fourth, marks)


def test_a_span_while_tracing_is_off_is_one_shared_no_op_and_builds_no_name():
    """``trace.span`` is on every pipeline message and DDP bucket: off, it must cost a flag check only."""
    trace.disable()
    names = []
    assert trace.span(lambda: names.append("built") or "x") is trace.span("y")
    with trace.span(lambda: names.append("built") or "x"):
        pass
    assert names == []
    trace.enable()
    with trace.span(lambda: names.append("built") or "lazy", "cat"):
        pass
    trace.disable()
    assert names == ["built"] and [(e["name"], e["cat"]) for e in trace.events()] == [("lazy", "cat")]


def test_span_args_are_kept_read_at_the_end_and_exported():
    trace.enable()
    details = {"bytes": 0}
    with trace.span("send", "message", details):
        details["bytes"] = 4096  # known only when the block ends, as a collective's bytes are
    with trace.span("plain", "x"):
        pass
    trace.disable()
    sent, plain = trace.events()
    assert sent["args"] == {"bytes": 4096} and "args" not in plain
    sent["args"]["bytes"] = 1  # events() hands out copies
    assert trace.events()[0]["args"] == {"bytes": 4096}
    exported = [e for e in timeline.to_chrome_trace([trace.events()])["traceEvents"] if e["ph"] == "X"]
    assert exported[0]["args"] == {"bytes": 4096} and "args" not in exported[1]


def test_collectives_record_their_bytes_only_when_messages_are_traced():
    import numpy as np  # noqa: PLC0415

    import minidist.distributed as dist  # noqa: PLC0415

    world = dist.init()  # one process: a group of one sends nothing, but the call is still recorded
    a = np.ones(10, np.float32)
    trace.enable()
    dist.all_reduce(a)
    trace.disable()
    assert [e for e in trace.events() if e["cat"] == trace.COLLECTIVE] == []
    trace.enable(messages=True)
    dist.all_reduce(a)
    dist.all_gather(a[:3])
    trace.disable()
    assert not trace.messages_enabled()
    spans = [(e["name"], e["args"]) for e in trace.events() if e["cat"] == trace.COLLECTIVE]
    common = {"group": "world", "ranks": world.size, "first": 0, "dtype": "float32", "bytes": 0,
              "algorithm": None}  # fmt: skip
    assert spans == [("all_reduce", {**common, "payload": 40}), ("all_gather", {**common, "payload": 12})]
    # collectives=True (minidist_tools.straggler's setting): the same collective spans, no per-message ones
    trace.enable(collectives=True)
    dist.all_reduce(a)
    trace.disable()
    assert [(e["cat"], e["name"]) for e in trace.events()] == [(trace.COLLECTIVE, "all_reduce")]
