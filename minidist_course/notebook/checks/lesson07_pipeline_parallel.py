"""Checks of lesson 07 (pipeline parallelism): the bubble of a step, and 1F1B's activation memory
(GPipe: Huang et al. 2019; 1F1B: Narayanan et al. 2019). Both compare with minidist's own schedules."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise, holds, same


@exercise(
    "In the text grid of section 1 (p=3, m=4), how many slots of (t_f + t_b) does the whole step last, "
    "and in how many of them is one stage computing?",
    "Count slots: the last microbatch cannot enter stage 0 before the others have, and then it must go "
    "through every stage forward and back. A stage computes in one slot per microbatch. The bubble is "
    "the idle share of the STEP, not a ratio to the compute time.",
)
def bubble_fraction(fn: Callable[[int, int], float]) -> None:
    """bubble_fraction(p, m) is the idle share of the step that minidist's schedule simulator measures,
    for six pipelines."""
    from minidist.parallel.pipeline import one_f_one_b, simulate

    for p, m in [(1, 4), (2, 1), (4, 4), (4, 16), (8, 3), (3, 32)]:
        want = simulate(one_f_one_b(p, m), 1.0, 2.0).bubble_fraction()
        close(call(fn, p, m), want, f"bubble_fraction(p={p}, m={m}) (the simulated step says {want:.4f})")


@exercise(
    "When stage s starts its first backward, how many forwards has it run?",
    "Stage s runs its warm-up forwards (section 1 says how many) and one more forward before its first "
    "backward, and after that it frees one microbatch for every new one; it can never hold more "
    "microbatches than there are.",
)
def peak_activations_1f1b(fn: Callable[[int, int, int], int]) -> None:
    """peak_activations_1f1b(p, m, s) is the most microbatches minidist's 1F1B schedule holds on stage s,
    for five pipelines."""
    from minidist.parallel.pipeline import one_f_one_b, peak_activations

    for p, m in [(4, 8), (4, 2), (2, 5), (6, 6), (1, 3)]:
        peaks = peak_activations(one_f_one_b(p, m))
        for s in range(p):
            got = call(fn, p, m, s)
            context = f"peak_activations_1f1b(p={p}, m={m}, s={s})"
            holds(1 <= got <= m, context, got, f"a stage holds between 1 and all {m} microbatches")
            same(
                got,
                peaks[s],
                context,
                "it is " + ("more" if got > peaks[s] else "fewer") + " than the schedule holds",
            )
