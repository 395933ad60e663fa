"""Check of lesson 04 (data parallelism): the weight of a microbatch's loss in gradient accumulation."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise


@exercise(
    "In the mean loss over all B samples, how much does one sample count? And how much does it count "
    "in microbatch i's own mean?",
    "The factor turns a mean over microbatch i's samples into their share of the mean over the whole "
    "batch. It equals 1/k only when all k microbatches have the same size: try sizes [5, 1].",
)
def microbatch_weight(fn: Callable[[list[int], int], float]) -> None:
    """microbatch_weight(sizes, i) makes the weighted microbatch losses add up to the whole batch's mean
    loss, for equal and unequal microbatch sizes."""
    for sizes in ([32, 32, 32, 32], [43, 43, 42], [5, 1], [7]):
        total = sum(sizes)
        for i, b in enumerate(sizes):
            close(call(fn, sizes, i), b / total, f"microbatch_weight(sizes={sizes}, i={i})")
