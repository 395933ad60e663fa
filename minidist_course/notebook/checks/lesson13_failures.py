"""Checks of lesson 13 (failures at scale): how long each rank waits for the others in one collective
(compared with ``minidist_tools.straggler.peer_waits`` on made-up spans), how often a job on many nodes fails,
and Young's checkpoint interval (both compared with ``minidist_tools.perfmodel.failures``;
``tests/course/test_lessons.py`` also checks those reference answers against sampled failures)."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise, holds

YEAR = 365.25 * 86400.0


@exercise(
    "Can any rank leave the all-reduce before the data of every rank has arrived? Until which moment, "
    "then, is each rank stuck?",
    "Find the moment the slowest rank enters; each rank waits from its own entry until then (the last "
    "one to enter waits for nobody).",
)
def waits(fn: Callable[[list[float]], list[float]]) -> None:
    """waits(entries) is what minidist_tools.straggler.peer_waits measures for one collective entered at those
    times, for 1 to 8 ranks."""
    from minidist import trace
    from minidist_tools.straggler import peer_waits

    cases = [[0.0], [0.0, 0.0], [0.1, 0.35], [2.0, 1.0, 1.5], [0.0, 0.02, 0.021, 0.5], list(range(8, 0, -1))]
    for entries in cases:
        last = max(entries)
        spans = [  # one all-reduce span per rank, from its entry until the data is through
            [{"name": "all_reduce", "cat": trace.COLLECTIVE, "start": float(t), "end": last + 0.01, "tid": 0,
              "args": {"group": "world", "ranks": len(entries), "first": 0}}]
            for t in entries
        ]  # fmt: skip
        want = [sum(end - start for start, end in intervals) for intervals in peer_waits(spans)]
        close(call(fn, list(entries)), want, f"waits({entries})", rtol=1e-9)


@exercise(
    "If each node fails at its own rate, and any one failure stops the job, what happens to the job's "
    "rate of failures when you add nodes?",
    "Failure rates of independent nodes add up (the first of N exponential waits is exponential too); "
    "the mean time between failures is one over the rate.",
)
def system_mtbf(fn: Callable[[float, int], float]) -> None:
    """system_mtbf(node_mtbf, nodes) is minidist_tools.perfmodel.failures.system_mtbf for nodes of 1 hour to
    10
    years on 1 to 100,000 nodes."""
    from minidist_tools.perfmodel.failures import system_mtbf as reference

    for node_mtbf in (3600.0, 5 * YEAR, 10 * YEAR):
        before = None  # (nodes, answer) of the previous, smaller job
        for nodes in (1, 2, 1024, 16384, 100_000):
            want, got = reference(node_mtbf, nodes), call(fn, node_mtbf, nodes)
            context = f"system_mtbf(node_mtbf={node_mtbf:g} s, nodes={nodes})"
            if before is not None and isinstance(got, (int, float)):
                grows = "grows with" if got > before[1] else "does not change with"
                holds(
                    got < before[1],
                    context,
                    got,
                    f"your answer {grows} the number of nodes (it was {before[1]!r} on {before[0]});"
                    " the time between failures should shrink as nodes are added",
                    want,
                )
            close(got, want, context, rtol=1e-9)
            before = (nodes, got)


@exercise(
    "Write the time wasted per second of work as a function of the interval: which part grows with the "
    "interval, which part shrinks, and where is their sum smallest?",
    "Set the derivative of (save cost / interval + interval / (2 x MTBF)) to zero and solve for the "
    "interval; check that the result grows with both the save cost and the MTBF.",
)
def young_interval(fn: Callable[[float, float], float]) -> None:
    """young_interval(save_cost, mtbf) is minidist_tools.perfmodel.failures.young_interval for saves of 1 s to
    30
    min and system MTBFs of 10 minutes to 5 years."""
    from minidist_tools.perfmodel.failures import young_interval as reference

    for save_cost in (1.0, 60.0, 300.0, 1800.0):
        for mtbf in (600.0, 3600.0, 154_089.84375, 5 * YEAR):
            want, got = reference(save_cost, mtbf), call(fn, save_cost, mtbf)
            context = f"young_interval(save_cost={save_cost:g} s, mtbf={mtbf:g} s)"
            dearer = call(fn, 4 * save_cost, mtbf)
            holds(
                dearer > got,
                context,
                got,
                f"with saves 4 times as dear your answer is {dearer!r}; dearer saves should be rarer",
                want,
            )
            close(got, want, context, rtol=1e-9)
